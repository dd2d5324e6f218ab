"""Task weighting in training: 1 vs 2 processes agree for every strategy, and stopped-and-resumed runs are exact.

Two arcface heads whose class counts do not split evenly over 2 processes (7 and 5 classes, sharded) and one
softmax head on one MLP backbone, joint mode (tests/dist_scripts/weighting_all.py). Gradient-based strategies
combine the per-task backbone gradients after summing them over the processes, so every rank applies the same
update as the single process does; the per-step task losses and weights must agree to 1e-4 (float32 rounding of
a different summation order is all that differs). The 2-process run is in the session's one launch of 2-process runs
(tests/shared_runs.py); the 1-process runs and the stopped-and-resumed runs (compared bit for bit) train in this
process, every strategy in turn.
"""
import json
import os

import numpy as np
import pytest

from tests.dist_scripts import weighting_all
from tests.dist_scripts.weighting_all import STRATEGIES
from tests.dist_util import ROOT
from tests.shared_runs import two_process_run

SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "weighting_all.py")
STEPS = 12  # a resume is exact or not at 12 steps as at 20; 1 vs 2 processes differ from step 1 if they differ
UNTIL = 6  # the resumed runs stop after this step
TWO_STEPS = 6  # the 2-process runs: the first 6 steps of the 1-process runs (constant lr; every strategy's phases)
RESUMED = ["uncertainty", "dwa", "rlw", "famo", "gradnorm", "pcgrad"]  # stopped after step UNTIL and resumed


def records(out, name):
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def run_single(out, *args):
    """``weighting_all.py OUT STEPS ARGS`` at 1 process, in this process."""
    weighting_all.main(out, STEPS, *args)


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("weighting") / "one")
    run_single(out)
    return out


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """Every strategy of RESUMED stopped after step UNTIL and resumed (each in a fresh Trainer)."""
    out = str(tmp_path_factory.mktemp("weighting") / "resumed")
    run_single(out, str(UNTIL), ",".join(RESUMED))
    return out


@two_process_run("weighting_all")
def _two_processes(folder):
    return {"call": [SCRIPT, "main", str(folder), str(TWO_STEPS)]}, str(folder)


def _compare(a, b, keys, rtol):
    worst = 0.0
    for ra, rb in zip(a, b):
        for key in keys:
            x, y = ra[key], rb[key]
            worst = max(worst, abs(x - y) / max(abs(x), 1e-6))
    assert worst <= rtol, worst
    return worst


@pytest.mark.distributed
@pytest.mark.two_process_runs("weighting_all")
def test_every_strategy_agrees_between_one_and_two_processes(single_runs, two_process):
    two = two_process["weighting_all"]
    for name in STRATEGIES:
        a, b = records(single_runs, name)[:TWO_STEPS], records(two, name)
        assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, TWO_STEPS + 1)), name
        keys = [k for k in a[0] if k.startswith(("loss/", "weight/"))]
        assert len([k for k in keys if k.startswith("weight/")]) == 3, name
        _compare(a, b, keys, 1e-4)


@pytest.mark.slow  # the module's 1-process runs: every strategy, STEPS steps, twice
@pytest.mark.parametrize("name", RESUMED)
def test_stopped_and_resumed_runs_are_bit_identical(single_runs, resumed_runs, name):
    a, b = records(single_runs, name), records(resumed_runs, name)
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if key.startswith(("loss", "weight/", "alpha/")):
                assert rb[key] == value, (name, ra["step"], key)


@pytest.mark.slow
def test_weights_move_where_the_strategy_says(single_runs):
    """Static keeps loss_weight; the adaptive strategies change the weights away from it."""
    static = records(single_runs, "static")
    assert all(r[f"weight/{t}"] == 1.0 for r in static for t in ("arc7", "arc5", "soft3"))
    for name in ("uncertainty", "dwa", "rlw", "famo", "gradnorm"):
        last = records(single_runs, name)[-1]
        weights = np.array([last[f"weight/{t}"] for t in ("arc7", "arc5", "soft3")])
        assert np.all(np.isfinite(weights)) and not np.allclose(weights, 1.0), (name, weights)
