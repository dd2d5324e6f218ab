"""1 process vs 2 processes (paddle.distributed.launch, gloo): same per-step losses, same final weights."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from mtl.train.checkpoint import merged_head_state
from tests.dist_util import ROOT, run_distributed

pytestmark = pytest.mark.distributed

JOB = os.path.join(ROOT, "tests", "dist_scripts", "equivalence_job.yaml")
TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
SHARDED = {"arc7": 7, "arc1": 1, "cos5": 5, "soft3": 3}


def train_single(out, overrides):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, TRAIN, JOB, "--set", f"output_dir={out}", *overrides],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def train_two(out, overrides):
    code, output = run_distributed(TRAIN, 2, [JOB, "--set", f"output_dir={out}", *overrides], timeout=300)
    assert code == 0, output


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def final_weights(out, averaged=False):
    """Backbone and every head's full weight (shards concatenated) from the final checkpoint."""
    ckpt = os.path.join(out, "checkpoints", "step_20")
    name = "backbone.averaged.pdparams" if averaged else "backbone.pdparams"
    state = {f"backbone.{k}": v.numpy() for k, v in paddle.load(os.path.join(ckpt, name)).items()}
    for task in list(SHARDED) + ["reg"]:
        for k, v in merged_head_state(ckpt, task, averaged).items():
            state[f"{task}.{k}"] = v
    return state


@pytest.mark.parametrize("mode", ["joint", "sample"])
def test_one_and_two_processes_agree(tmp_path, mode):
    # joint mode also clips gradients: the global norm must include every rank's shard exactly once
    overrides = [f"schedule.mode={mode}"] + (["schedule.batch_size=8"] if mode == "sample" else
                                             ["optimizer.clip_norm=2.0"])
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    train_single(one, overrides)
    train_two(two, overrides)
    a, b = losses(one), losses(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 21))
    worst = 0.0
    tasks_seen = set()
    for ra, rb in zip(a, b):
        keys = {k for k in ra if k.startswith("loss/")}
        assert keys == {k for k in rb if k.startswith("loss/")}, (ra["step"], keys)
        tasks_seen |= keys
        for k in keys | {"loss"} | ({"grad_norm"} if mode == "joint" else set()):
            assert np.isfinite(ra[k]) and np.isfinite(rb[k]), (ra["step"], k, ra[k], rb[k])
            worst = max(worst, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8))
    assert worst <= 1e-4, f"largest relative loss difference {worst:.3g}"
    assert len(tasks_seen) == 5
    for averaged in (False, True):
        wa, wb = final_weights(one, averaged), final_weights(two, averaged)
        assert wa.keys() == wb.keys()
        for k in wa:
            np.testing.assert_allclose(wb[k], wa[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} averaged={averaged}")
    # each rank holds only its shard: C_k rows
    ckpt = os.path.join(two, "checkpoints", "step_20", "heads")
    for task, classes in SHARDED.items():
        for k in range(2):
            shard = paddle.load(os.path.join(ckpt, f"{task}.shard{k}of2.pdparams"))
            assert shard["weight"].shape[0] == classes // 2 + (k < classes % 2), (task, k)
    s2 = json.load(open(os.path.join(two, "summary.json")))
    s1 = json.load(open(os.path.join(one, "summary.json")))
    assert s2["world_size"] == 2 and s1["world_size"] == 1
    for task, info in s1["tasks"].items():
        for metric, value in (info["eval"] or {}).items():
            assert s2["tasks"][task]["eval"][metric] == pytest.approx(value, rel=1e-3, abs=1e-3), (task, metric)
