"""Runs insightface's own arcface_torch code (the tests' reference) under the torch interpreter; see tests/peer_util.py.

    peer_harness.py --peer DIR backbone ARCH OUT [--batch N] [--seed S]
        builds the peer's ARCH (r18 r34 r50 r100 mbf) with random weights and random BatchNorm statistics, saves
        OUT/model.pth (torch.save of its state_dict), OUT/inputs.npy and OUT/embeddings.npy (eval mode).
    peer_harness.py --peer DIR ijb ROOT OUT --target IJBC --model OUT/model.pth --network mbf [--features F.npz]
        runs eval_ijbc.py itself, as a script, on the IJB layout under ROOT (see run_eval_ijbc).

Nothing here imports the project: it is the independent side of the comparison.
"""
import argparse
import sys

import numpy as np


def randomize(model, seed):
    """Random weights (variance-preserving normals), random BatchNorm affine and running statistics, random PReLU
    slopes, so that a conversion that drops or misplaces any tensor changes the embedding."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) / fan_in ** 0.5)
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                n = module.num_features
                module.weight.copy_(0.5 + torch.rand(n, generator=gen))
                module.bias.copy_(0.1 * torch.randn(n, generator=gen))
                module.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
                module.running_var.copy_(0.5 + torch.rand(n, generator=gen))
                module.num_batches_tracked.fill_(7)
            elif isinstance(module, torch.nn.PReLU):
                module.weight.copy_(0.5 * torch.rand(module.weight.shape, generator=gen))
    return model


def build_peer(network):
    """The peer's model by its own ``get_model`` name (r18, r34, r50, r100, mbf), 512-d, float32."""
    from backbones import get_model

    return get_model(network, fp16=False, num_features=512, dropout=0.0) if network != "mbf" \
        else get_model(network, fp16=False, num_features=512)


def cmd_backbone(args):
    """Random-weight peer model: state_dict, inputs and eval-mode embeddings."""
    import os

    import torch

    torch.manual_seed(args.seed)
    model = randomize(build_peer(args.arch), args.seed).eval()
    os.makedirs(args.out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pth"))
    x = np.random.default_rng(args.seed).standard_normal((args.batch, 3, 112, 112)).astype(np.float32)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()
    np.save(os.path.join(args.out, "inputs.npy"), x)
    np.save(os.path.join(args.out, "embeddings.npy"), y)


def main(argv=None):
    """Parse the command line and run one sub-command."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("backbone")
    p.add_argument("arch")
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_backbone)
    args = parser.parse_args(argv)
    sys.path.insert(0, args.peer)
    args.func(args)


if __name__ == "__main__":
    main()
