"""The same small jobs trained by any checkout of mtl: the reference that issue 56's typed step (rows declared in the
heads' output, accumulation owned by the optimizer, cross-head negatives as a step hook, the step as an argument)
changed nothing in what the code computes (tests/test_step_reference.py).

It imports only what every checkout since 842ea44 has (``mtl.commands.train``, the safe reader) and reads the
job files of the checkout it sits in, so the code on PYTHONPATH decides what is computed, not the jobs:

    mkdir /tmp/mtl_before && git archive 842ea44 | tar -x -C /tmp/mtl_before
    PYTHONPATH=/tmp/mtl_before OMP_NUM_THREADS=1 python tests/step_reference.py one /tmp/before_one.npz
    PYTHONPATH=/tmp/mtl_before OMP_NUM_THREADS=1 python -m paddle.distributed.launch --nproc_per_node 2 \\
        tests/step_reference.py two /tmp/before_two.npz /tmp/before_two_runs

The jobs (:data:`ONE`, :data:`TWO`): the demo (three heads, two of them ArcFace, a CNN with BatchNorm, averaging);
gradient accumulation with Partial FC under momentum and AdamW, with a Gram-based (PCGrad) and a loss-based (FAMO)
weighting; cross-head negatives with ``update: both`` at a sampled rate beside a Partial FC head, at K = 1 with a
loss-based weighting (uncertainty) and at K = 2 with PCGrad; the online rule stopped and resumed. What is kept:
every step record's numbers, the final evaluation's numbers and every array of the final checkpoint (weights,
optimizer state with the row-sparse slots, averaged weights).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "configs", "demo.yaml")
ACCUMULATE = os.path.join(ROOT, "tests", "dist_scripts", "accumulate_job.yaml")
EQUIVALENCE = os.path.join(ROOT, "tests", "dist_scripts", "equivalence_job.yaml")

QUIET = ["log.every=1", "log.progress=false", "log.plot=false", "data.num_workers=0", "device=cpu"]
DEMO_SET = ["schedule.steps=6", "schedule.batch_size=60", "optimizer.warmup_steps=2", "eval.every=0",
            "checkpoint.every=3", "averaging.min_average_window=2", "averaging.max_average_window=4"]
CROSS = ["schedule.steps=8", "optimizer.clip_norm=2.0", "cross_negatives.rate=0.5", "cross_negatives.mask=none",
         "cross_negatives.update=both", "cross_negatives.warmup=2", "tasks.0.head.sample_ratio=0.5"]
ONLINE = ["schedule.steps=8", "cross_negatives.rate=0.5", "cross_negatives.mask=online", "cross_negatives.warmup=3",
          "cross_negatives.update=both", "checkpoint.every=4"]
ADAMW = ["optimizer.type=adamw", "optimizer.lr=0.003", "optimizer.weight_decay=0.01"]

# name: (job file, overrides, the step a first start stops at (then --resume), or None)
ONE = {
    "demo": (DEMO, DEMO_SET, None),
    "accumulate_pcgrad": (ACCUMULATE, ["schedule.accumulate=2", "weighting=pcgrad"], None),
    "accumulate_famo_adamw": (ACCUMULATE, ["schedule.accumulate=2", "weighting=famo"] + ADAMW, None),
    "cross_both_uncertainty": (EQUIVALENCE, CROSS + ["weighting=uncertainty"], None),
    "cross_both_accumulate": (EQUIVALENCE, CROSS + ["schedule.accumulate=2", "weighting=pcgrad"] + ADAMW, None),
    "cross_online_resumed": (EQUIVALENCE, ONLINE, 4),
}
TWO = {name: ONE[name] for name in ("demo", "cross_both_accumulate", "accumulate_famo_adamw")}



def ground_module(name):
    """``mtl.core.<name>`` in a checkout after issue 56's moves, else ``mtl.<name>`` (the code before them). Chosen
    by the checkout's folders, not by trying: the editable install of this checkout would otherwise hand an older
    checkout on PYTHONPATH this checkout's module."""
    import importlib

    import mtl

    moved = os.path.isdir(os.path.join(os.path.dirname(mtl.__file__), "core"))
    return importlib.import_module(f"mtl.core.{name}" if moved else f"mtl.{name}")

def train(*argv):
    """Train in this process as ``examples/train_joint.py ARGV`` does."""
    from mtl.commands.train import add_train_args
    from mtl.commands.train import train as run

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    return run(parser.parse_args([str(a) for a in argv]))


def numbers(tree):
    """Every number of a JSON tree, in order (not the timings)."""
    if isinstance(tree, dict):
        return [x for k, v in tree.items() if "seconds" not in k and "time" not in k for x in numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in numbers(v)]
    return [float(tree)] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def step_records(folder):
    """``[steps, keys]`` of every number of the step records (losses, norm, rate, weights, accuracies), and the keys."""
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        records = [r for r in map(json.loads, f) if "lr" in r]
    keys = sorted(k for k, v in records[0].items() if isinstance(v, (int, float)) and "time" not in k
                  and "per_s" not in k and "seconds" not in k)
    return np.array([[np.nan if r.get(k) is None else r[k] for k in keys] for r in records], np.float64), keys


def checkpoint_arrays(folder):
    """Every array of the newest checkpoint's files, by file and name."""
    load_paddle_file = ground_module("safe_pickle").load_paddle_file

    root = os.path.join(folder, "checkpoints")
    newest = max((d for d in os.listdir(root) if d.startswith("step_")), key=lambda d: int(d.split("_")[1]))
    out = {}
    for base, _, files in os.walk(os.path.join(root, newest)):
        for name in sorted(files):
            if name.endswith((".pdparams", ".pdopt")):
                path = os.path.join(base, name)
                for key, value in load_paddle_file(path).items():
                    if isinstance(value, np.ndarray) or hasattr(value, "shape"):
                        out[f"{os.path.relpath(path, root)}:{key}"] = np.asarray(value)
    return out


def train_all(root, runs):
    """``{key: array}`` of every job of ``runs`` trained under ``root``."""
    out = {}
    for name, (job, overrides, stop) in runs.items():
        folder = os.path.join(root, name)
        argv = [job, "--set", f"output_dir={folder}", *QUIET, *overrides]
        if stop is not None:
            train(*argv, "--until", str(stop))
            summary = train(*argv, "--resume")
        else:
            summary = train(*argv)
        records, keys = step_records(folder)
        out[f"{name}/records"] = records
        out[f"{name}/record_keys"] = np.array(keys)
        out[f"{name}/eval"] = np.array(numbers(summary.get("tasks", {})), np.float64)
        for key, value in checkpoint_arrays(folder).items():
            out[f"{name}/{key}"] = value
    return out


def main(which, path, root=None):
    """Train :data:`ONE` (``one``) or :data:`TWO` (``two``, under the launcher) in ``root`` (a new temporary folder
    by default; the ranks of a launch need the same one) and write rank 0's arrays to ``path``."""
    import mtl

    print(f"mtl from {os.path.dirname(mtl.__file__)}")  # which checkout trained (the test checks)
    runs = ONE if which == "one" else TWO
    if root is None:
        with tempfile.TemporaryDirectory() as scratch:
            return main(which, path, scratch)
    got = train_all(root, runs)
    if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0:
        np.savez_compressed(path, **got)


if __name__ == "__main__":
    main(*sys.argv[1:])
