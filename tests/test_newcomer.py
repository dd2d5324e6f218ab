"""A newcomer's first hour (issue 30): each stumble reproduced, then checked fixed.

The numbered sections follow the issue's items; the commands' own tests (predict, describe, labels) have their
own files (tests/test_predict.py, tests/test_plugin_reference.py, tests/test_label_names.py).
"""
import json
import os
import subprocess
import sys
import warnings

from mtl.config.loading import load_job
from mtl.job import build_job
from mtl.train.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment(**extra):
    """A subprocess environment: this checkout importable, one thread, the quiet console (no MTL_VERBOSE)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **extra)
    env.pop("MTL_VERBOSE", None)
    return env


def mtl(*args, expect=0, cwd=ROOT, **env):
    """``python -m mtl.cli ARGS`` in a subprocess; the finished process (its exit status checked)."""
    proc = subprocess.run([sys.executable, "-m", "mtl.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env=environment(**env))
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def image_job(out, steps=4, **over):
    """Two synthetic image tasks on the small CNN (BatchNorm: per-rank statistics in its checkpoints)."""
    data = {"seed": 0, "output_dir": str(out), "device": "cpu",
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 4,
                                                 "shape": [1, 8, 8]},
                       "head": {"type": "arcface", "scale": 8.0}, "eval": None},
                      {"name": "kind", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 3,
                                                  "shape": [1, 8, 8], "seed": 5},
                       "head": {"type": "softmax"}, "eval": None}],
            "backbone": {"type": "cnn", "in_channels": 1, "input_size": 8, "channels": [4, 8],
                         "embedding_size": 8},
            "schedule": {"batch_size": 8, "steps": steps}, "optimizer": {"lr": 0.05},
            "log": {"progress": False, "plot": False}, "checkpoint": {"every": 0, "keep": 3},
            "data": {"num_workers": 0}}
    data.update(over)
    return data


def train_here(data, **kw):
    """Build and train ``data`` in this process (quiet); the summary."""
    job = build_job(load_job(data=data), announce_plan=False)
    return Trainer(job, console=lambda *a: None, **{k: v for k, v in kw.items() if k != "until"}).run(
        until=kw.get("until"))


# ---- 2. a one-process --resume warns about every backbone parameter ------------------------------------------------
def test_a_resume_restores_the_backbone_without_paddle_warnings(tmp_path):
    data = image_job(tmp_path / "run")
    train_here(data, until=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_here(data, resume=True)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "Skip loading" in m or "state dict is empty" in m], messages
    full = image_job(tmp_path / "full")
    train_here(full)
    for a, b in zip(*(open(os.path.join(d["output_dir"], "metrics.jsonl")).read().splitlines()
                      for d in (full, data))):
        a, b = json.loads(a), json.loads(b)
        assert {k: v for k, v in a.items() if k != "samples_per_s"} == \
            {k: v for k, v in b.items() if k != "samples_per_s"}


# ---- 11. an MLP job (no BatchNorm) warns that its statistics are empty ---------------------------------------------
def test_a_checkpoint_of_a_backbone_without_batchnorm_is_written_without_warnings(tmp_path):
    data = image_job(tmp_path / "run", steps=2)
    data["backbone"] = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [8], "embedding_size": 8}
    data["optimizer"] = {"type": "sgd", "lr": 0.05}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_here(data)
    assert not [str(w.message) for w in caught if "state dict is empty" in str(w.message)]
    assert os.path.isfile(tmp_path / "run" / "checkpoints" / "step_2" / "statistics.rank0.pdparams")
