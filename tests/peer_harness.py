"""Runs insightface's own arcface_torch code (the tests' reference) under the torch interpreter; see tests/peer_util.py.

    peer_harness.py --peer DIR backbone ARCH OUT [--batch N] [--seed S]
        builds the peer's ARCH (r18 r34 r50 r100 mbf) with random weights and random BatchNorm statistics, saves
        OUT/model.pth (torch.save of its state_dict), OUT/inputs.npy and OUT/embeddings.npy (eval mode).
    peer_harness.py --peer DIR ijb ROOT OUT.npz --model MODEL.pth --network mbf [--target IJBC] [--batch-size 4]
        runs eval_ijbc.py itself, as a script, on the IJB set under ROOT with MODEL.pth (its own features, its
        default protocol: flip test, detector scores), and aligns every face with its Embedding.get; saves the
        features, the aligned faces, the scores and the ROC read-off (see run_eval_ijbc).
    peer_harness.py --peer DIR ijb ROOT OUT.npz --features F.npz [--target IJBC]
        the same script with F.npz's features (``plain``, ``flipped``, ``scores``) in place of its model, once per
        protocol variant (flip test on/off x detector-score weighting on/off).

eval_ijbc.py imports pandas, menpo, prettytable and matplotlib and moves tensors to CUDA at module level; the harness
stubs the modules that are missing (only their names are used, for reading text tables, colours, the printed table
and the PDF plot), lets ``.cuda()`` return the tensor or module itself (CPU torch), restores ``np.int`` (removed in
numpy 2), and runs the script's own code otherwise unchanged: its module-level flags (``use_flip_test``,
``use_detector_score``) and, in --features mode, its ``get_image_feature`` are replaced before it runs (an ast edit),
and its ``min`` is wrapped to record which ROC point the TAR table reads.

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
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=gen))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
        for name in ("pos_embed", "mask_token"):  # the ViT's own parameters
            if hasattr(model, name):
                getattr(model, name).copy_(0.5 * torch.randn(getattr(model, name).shape, generator=gen))
    return model


def build_peer(network):
    """The peer's model by its own ``get_model`` name (r18, r34, r50, r100, mbf, vit_t, ...), 512-d, float32."""
    if network.startswith("vit"):  # the peer's vit.py imports three helpers of timm, which is not installed
        import os

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_scripts"))
        from peer_vit import install_timm_stub

        install_timm_stub()
    from backbones import get_model

    return get_model(network, fp16=False, num_features=512, dropout=0.0) if network.startswith("r") \
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


class Anything:
    """A stand-in module / object: every attribute is a callable that returns another stand-in."""

    def __getattr__(self, name):
        return Anything()

    def __call__(self, *args, **kwargs):
        return Anything()


def stub_modules():
    """Stand-ins for the modules eval_ijbc.py imports but this interpreter lacks (never numpy, torch, cv2,
    sklearn or skimage: those are the reference)."""
    import importlib
    import types

    class Table:
        def __init__(self, fields):
            self.rows = [list(fields)]

        def add_row(self, row):
            self.rows.append(list(row))

        def __str__(self):
            return "\n".join(" | ".join(map(str, r)) for r in self.rows)

    def read_csv(path, sep=" ", header=None):
        rows = [line.split(sep) for line in open(path).read().splitlines() if line.strip()]
        return types.SimpleNamespace(values=np.array(rows, dtype=object))

    stubs = {"pandas": {"read_csv": read_csv, "DataFrame": type("DataFrame", (), {}),  # sklearn looks for these
                        "Series": type("Series", (), {})}, "prettytable": {"PrettyTable": Table},
             "menpo": {}, "menpo.visualize": {}, "menpo.visualize.viewmatplotlib": {
                 "sample_colours_from_colourmap": lambda n, name: [(0.0, 0.0, 0.0)] * n},
             "matplotlib": {"use": lambda *a, **k: None}, "matplotlib.pyplot": {"__getattr__": lambda n: Anything()}}
    for name, attrs in stubs.items():
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module
    if "matplotlib.pyplot" in sys.modules and isinstance(sys.modules["matplotlib"], types.ModuleType) and \
            not hasattr(sys.modules["matplotlib"], "pyplot"):
        sys.modules["matplotlib"].pyplot = sys.modules["matplotlib.pyplot"]


def run_eval_ijbc(peer, argv, flags, functions):
    """Execute eval_ijbc.py as ``__main__`` with ``argv``; module-level assignments of ``flags`` and definitions of
    ``functions`` are replaced by the given values; returns (its namespace, the ROC indices its TAR table read)."""
    import ast
    import builtins
    import os

    import sklearn.preprocessing  # noqa: F401  (the script calls sklearn.preprocessing.normalize after import sklearn)
    import torch

    np.int = int  # the script's np.int (removed in numpy 2)
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    stub_modules()
    path = os.path.join(peer, "eval_ijbc.py")
    tree = ast.parse(open(path).read(), path)
    tree.body = [node for node in tree.body if not (
        isinstance(node, ast.FunctionDef) and node.name in functions) and not (
        isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in flags)]
    chosen = []

    def recording_min(*args, **kwargs):
        found = builtins.min(*args, **kwargs)
        chosen.append(found[1])
        return found

    namespace = {"__name__": "__main__", "__file__": path, "min": recording_min, **flags, **functions}
    sys.argv = [path, *argv]
    exec(compile(tree, path, "exec"), namespace)
    return namespace, chosen


def peer_result(namespace, chosen):
    """What the tests compare: the pair scores, the (flipped) ROC, the TAR at each FAR its table shows, the AUC."""
    tpr = namespace["tpr"]
    return {"score": namespace["score"], "fpr": namespace["fpr"], "tpr": tpr, "auc": namespace["roc_auc"],
            "tar": np.array([tpr[i] for i in chosen[-len(namespace["x_labels"]):]])}


def cmd_ijb(args):
    """eval_ijbc.py on the IJB set: with the model (features, aligned faces) or with given features (4 variants)."""
    import os

    import cv2

    argv = ["--image-path", args.root, "--result-dir", os.path.dirname(os.path.abspath(args.out)), "--target",
            args.target, "--batch-size", str(args.batch_size), "--job", "peer"]
    out = {}
    if args.model:
        namespace, chosen = run_eval_ijbc(args.peer, argv + ["--model-prefix", args.model, "--network",
                                                              args.network], {}, {})
        out.update({f"default_{k}": v for k, v in peer_result(namespace, chosen).items()})
        out["img_feats"], out["faceness_scores"] = namespace["img_feats"], namespace["faceness_scores"]
        embedding = namespace["Embedding"](args.model, (3, 112, 112), 1)
        faces = []
        for line in open(namespace["img_list_path"]).readlines():  # its own list ("files" is reused later)
            fields = line.strip().split(" ")
            img = cv2.imread(os.path.join(args.root, "loose_crop", fields[0]))
            faces.append(embedding.get(img, np.array([float(x) for x in fields[1:-1]], np.float32).reshape(5, 2)))
        out["aligned"] = np.stack(faces)  # [N, 2, 3, 112, 112] uint8: the face and its mirror image, RGB CHW
    if args.features:
        given = np.load(args.features)
        feats = np.concatenate([given["plain"], given["flipped"]], axis=1).astype(np.float32)
        scores = given["scores"].astype(np.float32)
        for flip in (True, False):
            for detector in (True, False):
                namespace, chosen = run_eval_ijbc(args.peer, argv, {
                    "use_flip_test": flip, "use_detector_score": detector},
                    {"get_image_feature": lambda *a: (feats, scores)})
                key = f"{int(flip)}{int(detector)}"
                out.update({f"{key}_{k}": v for k, v in peer_result(namespace, chosen).items()})
    np.savez(args.out, **out)


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
    p = sub.add_parser("ijb")
    p.add_argument("root")
    p.add_argument("out")
    p.add_argument("--target", default="IJBC")
    p.add_argument("--model")
    p.add_argument("--network", default="mbf")
    p.add_argument("--features")
    p.add_argument("--batch-size", type=int, default=4)
    p.set_defaults(func=cmd_ijb)
    args = parser.parse_args(argv)
    sys.path.insert(0, args.peer)
    args.func(args)


if __name__ == "__main__":
    main()
