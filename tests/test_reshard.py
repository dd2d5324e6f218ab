"""Resume at another process count: 2 -> 1 and 1 -> 2 processes continue like an uninterrupted run; offline
re-sharding round-trips exactly; `mtl checkpoint info` says what a checkpoint holds."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.job import build_job
from mtl.train import checkpoint
from mtl.train.checkpoint import merged_head_state
from mtl.train.optim import JointOptimizer
from tests.dist_util import ROOT, run_distributed

JOB = os.path.join(ROOT, "tests", "dist_scripts", "equivalence_job.yaml")
TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
SHARDED = ("arc7", "arc1", "cos5", "soft3")
COMMON = ["checkpoint.every=5", "checkpoint.keep=5"]


def train(out, world, *args):
    args = [JOB, "--set", f"output_dir={out}", *COMMON, *args]
    if world == 1:
        proc = subprocess.run([sys.executable, TRAIN, *args], capture_output=True, text=True, cwd=ROOT,
                              env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        code, output = run_distributed(TRAIN, world, args, timeout=300)
        assert code == 0, output


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def mtl(*args):
    proc = subprocess.run([sys.executable, "-m", "mtl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("reshard") / "full")
    train(out, 1)
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_resume_at_another_process_count(uninterrupted, tmp_path, first, second):
    out = str(tmp_path / "cut")
    train(out, first, "--until", "10")
    ckpt = os.path.join(out, "checkpoints", "step_10")
    switch = {t: merged_head_state(ckpt, t) for t in SHARDED}
    train(out, second, "--resume")
    a, b = losses(uninterrupted), losses(out)
    assert [r["step"] for r in b] == list(range(1, 21))
    keys = [k for k in a[0] if k.startswith("loss/")]
    worst = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-6) for ra, rb in zip(a, b) for k in keys if k in rb)
    assert worst <= 1e-4, worst
    if first == 2:  # loading the 2-process checkpoint in this (1-process) test gives exactly the merged shards
        job = build_job(load_job(JOB, [f"output_dir={tmp_path / 'probe'}"]))
        optimizer = JointOptimizer(job.cfg["optimizer"], job.model, job.cfg["schedule"]["steps"])
        checkpoint.load(ckpt, job.model, optimizer, job.schedule)
        for task in SHARDED:
            for key, value in job.model.heads[task].state_dict().items():
                np.testing.assert_array_equal(value.numpy(), switch[task][key], err_msg=f"{task}.{key}")


def test_reshard_round_trip_is_exact(uninterrupted, tmp_path):
    ckpt = os.path.join(uninterrupted, "checkpoints", "step_20")
    three, back = str(tmp_path / "three"), str(tmp_path / "back")
    mtl("checkpoint", "reshard", ckpt, "--world", "3", three)
    mtl("checkpoint", "reshard", three, "--world", "1", back)
    expected = [f"{t}.shard{k}of3{s}" for t in SHARDED for k in range(3) for s in (".pdparams", ".averaged.pdparams")]
    assert sorted(os.listdir(os.path.join(three, "heads"))) == sorted(expected + ["reg.averaged.pdparams",
                                                                                 "reg.pdparams"])
    for task in SHARDED:  # 3 shards of 7, 1, 5, 3 classes: balanced split, some empty
        sizes = [paddle.load(os.path.join(three, "heads", f"{task}.shard{k}of3.pdparams"))["weight"].shape[0]
                 for k in range(3)]
        total = merged_head_state(ckpt, task)["weight"].shape[0]
        assert sizes == [total // 3 + (k < total % 3) for k in range(3)]
    for name in os.listdir(ckpt):
        if name.startswith("rng."):  # generator states: the same bytes
            with open(os.path.join(ckpt, name), "rb") as f, open(os.path.join(back, name), "rb") as g:
                assert f.read() == g.read(), name
        elif name.endswith((".pdopt", ".pdparams")):
            original, again = paddle.load(os.path.join(ckpt, name)), paddle.load(os.path.join(back, name))
            _assert_same(original, again, name)
    for name in os.listdir(os.path.join(ckpt, "heads")):
        _assert_same(paddle.load(os.path.join(ckpt, "heads", name)), paddle.load(os.path.join(back, "heads", name)),
                     name)
    info = mtl("checkpoint", "info", three)
    assert "written by  3 process(es)" in info or "3 process(es)" in info
    assert "head arc7" in info and "[7, 16]" in info


def _assert_same(a, b, where):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (paddle.Tensor, np.ndarray)):
        x = a.numpy() if isinstance(a, paddle.Tensor) else a
        y = b.numpy() if isinstance(b, paddle.Tensor) else np.asarray(b)
        np.testing.assert_array_equal(x, y, err_msg=where)
    else:
        assert a == b, where
