"""The same small jobs trained by any checkout of mtl: the reference that ``architecture: hard`` is bit-identical
to the model before architectures existed (tests/test_arch_training.py).

Regenerate the fixture (this file runs against the checkout on PYTHONPATH; commit 26a3f02 is main's last one before
the architecture layer was merged: its weighting step sums the Gram matrix in float64 row pairs, so PCGrad and
MGDA-UB differ from 92daa20's in the last bits):

    mkdir /tmp/mtl_before && git archive 26a3f02 | tar -x -C /tmp/mtl_before
    PYTHONPATH=/tmp/mtl_before OMP_NUM_THREADS=1 python tests/hard_reference.py tests/fixtures/hard_reference.npz

The jobs: three tasks (ArcFace with sharded-style classes, softmax, regression) on an MLP and on a small CNN with
BatchNorm, 6 steps of momentum SGD, static weights, PCGrad and MGDA-UB; what is kept: every step's task losses, the
final evaluation and every weight of the final checkpoint.
"""
import json
import os
import sys
import tempfile

import numpy as np

WEIGHTINGS = {"static": {"type": "static"}, "pcgrad": {"type": "pcgrad"},
              "mgda_ub": {"type": "mgda", "representation": True}}
BACKBONES = {"mlp": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "embedding_size": 8},
             "cnn": {"type": "cnn", "channels": [4, 8], "embedding_size": 8}}



def checkout_module(new, old):
    """Module ``new`` in a checkout after issue 56's moves, else ``old`` (the code before them). Chosen by the
    checkout's files, not by trying: the editable install of this checkout would otherwise hand an older checkout on
    PYTHONPATH this checkout's module."""
    import importlib

    import mtl

    here = os.path.join(os.path.dirname(mtl.__file__), *new.split(".")[1:]) + ".py"
    return importlib.import_module(new if os.path.isfile(here) else old)


def ground_module(name):
    """``mtl.core.<name>`` after issue 56's moves, else ``mtl.<name>``."""
    return checkout_module(f"mtl.core.{name}", f"mtl.{name}")


def job(out, weighting, backbone, extra=None):
    """The raw config of one job."""
    return {"seed": 7, "device": "cpu", "output_dir": out, "weighting": weighting, "backbone": backbone,
            "tasks": [{"name": "arc", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 7, "seed": 1},
                       "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}},
                      {"name": "soft", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 3, "seed": 2},
                       "head": {"type": "softmax"}},
                      {"name": "reg", "reader": {"type": "synthetic", "num_samples": 40, "seed": 3,
                                                 "target": "regression"}, "head": {"type": "regression"}}],
            "schedule": {"mode": "joint", "batch_size": 12, "steps": 6},
            "optimizer": {"type": "momentum", "lr": 0.05, "decay": "none"},
            "log": {"every": 1, "progress": False, "plot": False}, "checkpoint": {"keep": 1},
            "data": {"num_workers": 0}, **(extra or {})}


def train_all(root, extra=None):
    """``{key: array}``: losses per step, final evaluation and final weights of every (backbone, weighting) job."""
    from mtl.config.loading import load_job
    build_job = checkout_module("mtl.train.job", "mtl.job").build_job
    from mtl.train.trainer import Trainer

    out = {}
    for bname, backbone in BACKBONES.items():
        for wname, weighting in WEIGHTINGS.items():
            folder = os.path.join(root, f"{bname}_{wname}")
            summary = Trainer(build_job(load_job(data=job(folder, weighting, backbone, extra)), announce_plan=False),
                              console=lambda *a: None, overwrite=True).run()
            with open(os.path.join(folder, "metrics.jsonl")) as f:
                records = [r for r in map(json.loads, f) if "loss" in r and "step" in r and "lr" in r]
            keys = sorted(k for k in records[0] if k.startswith("loss/"))
            out[f"{bname}_{wname}/losses"] = np.array([[r[k] for k in keys] for r in records], np.float64)
            out[f"{bname}_{wname}/eval"] = np.array(_floats(summary["tasks"]), np.float64)  # not the timings
            for name, value in model_weights(folder).items():
                out[f"{bname}_{wname}/{name}"] = value
    return out


def _floats(tree):
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _floats(v)]
    return [float(tree)] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def model_weights(folder):
    """Every array of the final checkpoint's backbone and head files, by file and name."""
    load_paddle_file = ground_module("safe_pickle").load_paddle_file

    ckpt = os.path.join(folder, "checkpoints", "step_6")
    out = {}
    for path in sorted([os.path.join(ckpt, "backbone.pdparams")] +
                       [os.path.join(ckpt, "heads", f) for f in os.listdir(os.path.join(ckpt, "heads"))]):
        for name, value in load_paddle_file(path).items():
            out[f"{os.path.basename(path)}:{name}"] = np.asarray(value)
    return out


if __name__ == "__main__":
    import mtl
    select_device = ground_module("runtime").select_device

    print(f"mtl from {os.path.dirname(mtl.__file__)}")  # which checkout trained (tests/test_arch_training.py checks)

    select_device("cpu")
    with tempfile.TemporaryDirectory() as root:
        np.savez_compressed(sys.argv[1], **train_all(root))
