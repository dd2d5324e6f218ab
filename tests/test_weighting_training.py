"""Task weighting in training: 1 vs 2 processes agree for every strategy, and stopped-and-resumed runs are exact.

Two arcface heads whose class counts do not split evenly over 2 processes (7 and 5 classes, sharded) and one
softmax head on one MLP backbone, joint mode (tests/dist_scripts/weighting_all.py). Gradient-based strategies
combine the per-task backbone gradients after summing them over the processes, so every rank applies the same
update as the single process does; the per-step task losses and weights must agree to 1e-4 (float32 rounding of
a different summation order is all that differs).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.dist_scripts.weighting_all import STRATEGIES
from tests.dist_util import ROOT, run_distributed

SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "weighting_all.py")
STEPS = 20


def records(out, name):
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def run_single(out, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, SCRIPT, out, str(STEPS), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("weighting") / "one")
    run_single(out)
    return out


def _compare(a, b, keys, rtol):
    worst = 0.0
    for ra, rb in zip(a, b):
        for key in keys:
            x, y = ra[key], rb[key]
            worst = max(worst, abs(x - y) / max(abs(x), 1e-6))
    assert worst <= rtol, worst
    return worst


@pytest.mark.distributed
def test_every_strategy_agrees_between_one_and_two_processes(single_runs, tmp_path):
    two = str(tmp_path / "two")
    code, output = run_distributed(SCRIPT, 2, [two, str(STEPS)], timeout=900)
    assert code == 0, output
    for name in STRATEGIES:
        a, b = records(single_runs, name), records(two, name)
        assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1)), name
        keys = [k for k in a[0] if k.startswith(("loss/", "weight/"))]
        assert len([k for k in keys if k.startswith("weight/")]) == 3, name
        _compare(a, b, keys, 1e-4)


@pytest.mark.parametrize("name", ["uncertainty", "dwa", "rlw", "famo", "gradnorm", "pcgrad"])
def test_stopped_and_resumed_runs_are_bit_identical(single_runs, tmp_path, name):
    out = str(tmp_path / "resumed")
    run_single(out, "10", name)
    a, b = records(single_runs, name), records(out, name)
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if key.startswith(("loss", "weight/", "alpha/")):
                assert rb[key] == value, (name, ra["step"], key)


def test_weights_move_where_the_strategy_says(single_runs):
    """Static keeps loss_weight; the adaptive strategies change the weights away from it."""
    static = records(single_runs, "static")
    assert all(r[f"weight/{t}"] == 1.0 for r in static for t in ("arc7", "arc5", "soft3"))
    for name in ("uncertainty", "dwa", "rlw", "famo", "gradnorm"):
        last = records(single_runs, name)[-1]
        weights = np.array([last[f"weight/{t}"] for t in ("arc7", "arc5", "soft3")])
        assert np.all(np.isfinite(weights)) and not np.allclose(weights, 1.0), (name, weights)
