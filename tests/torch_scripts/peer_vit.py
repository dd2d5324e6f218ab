"""Run by the python of a separate torch virtual environment (torch is never a project dependency): the peer's
(insightface arcface_torch, ../shared/peers/arcface_torch/backbones/vit.py, unmodified) ViT sizes and a small ViT's
weights, input and output, for tests/test_vit.py.

Usage: ``TORCH_PYTHON peer_vit.py PEERS_DIR OUT_DIR``; writes ``OUT_DIR/sizes.json`` ({name: {parameters, output}})
and ``OUT_DIR/small.npz`` (state_dict entries, ``input``, ``output`` of the model in eval mode). The peer imports
three helpers from timm (not installed): they are provided here with timm's definitions.
"""
import json
import os
import sys
import types

import numpy as np
import torch


def drop_path(x, p, training):
    """timm's drop_path: per-sample Bernoulli(1 - p) mask, kept samples scaled by 1 / (1 - p)."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = torch.floor(keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype))
    return x / keep * mask


class DropPath(torch.nn.Module):
    def __init__(self, p=None):
        super().__init__()
        self.p = p or 0.0

    def forward(self, x):
        return drop_path(x, self.p, self.training)


def install_timm_stub():
    layers = types.ModuleType("timm.models.layers")
    layers.DropPath = DropPath
    layers.to_2tuple = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    layers.trunc_normal_ = lambda t, mean=0.0, std=1.0, a=-2.0, b=2.0: torch.nn.init.trunc_normal_(t, mean, std, a, b)
    models, timm = types.ModuleType("timm.models"), types.ModuleType("timm")
    models.layers, timm.models = layers, models
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers})


def main(peers, out):
    install_timm_stub()
    sys.path.insert(0, os.path.join(peers, "arcface_torch"))
    from backbones import get_model
    from backbones.vit import VisionTransformer

    torch.manual_seed(0)
    sizes = {}
    for name in ("vit_t", "vit_s", "vit_b"):
        model = get_model(name, num_features=512).eval()
        with torch.no_grad():
            output = model(torch.randn(2, 3, 112, 112))
        sizes[name] = {"parameters": int(sum(p.numel() for p in model.parameters())), "output": list(output.shape)}
        del model
    with open(os.path.join(out, "sizes.json"), "w") as f:
        json.dump(sizes, f)
    small = VisionTransformer(img_size=18, patch_size=9, num_classes=8, embed_dim=16, depth=2, num_heads=2,
                              mask_ratio=0.0, drop_path_rate=0.0).eval()
    with torch.no_grad():
        for module in small.modules():  # running statistics away from (0, 1), so that eval mode uses them
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
        x = torch.randn(3, 3, 18, 18)
        y = small(x)
    arrays = {k: v.numpy() for k, v in small.state_dict().items() if v.dtype.is_floating_point}
    np.savez(os.path.join(out, "small.npz"), input=x.numpy(), output=y.numpy(), **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
