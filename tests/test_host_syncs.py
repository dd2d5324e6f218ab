"""Host synchronisations per training step, counted and held to a budget.

Every ``Tensor.numpy()``, ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` of a device tensor stops the CPU until
the GPU has run everything queued before it (tests/host_syncs.py counts them). The job (tests/dist_scripts/
host_syncs.py) has an ArcFace head, an ArcFace head with Partial FC, a sharded softmax and a regression head, and
runs the device path (the Paddle-op passes a GPU runs). Per step the budget is:

* 1 read of every task's global loss (the weighting and the non-finite guard need them before the backward),
* 1 read of the global gradient norm (skip, clip, loss scale),
* 1 read of the pending step records when the step writes the log (``log.every``),
* 1 per Partial FC head (its class sample is drawn in numpy from the gathered labels),
* at 2 processes also: 1 for the step's agreement (errors, stop requests, every task's row count), 1 per head
  that gathers rows (its label ids, and on gloo the row counts, checked in one read), and 1 for which replicated
  parameters got a gradient on some rank (``ParallelStrategy.fill_missing_gradients``: a parameter
  whose use depends on the rank's rows must be in every rank's fused all-reduce).

Before the budget existed the same step read every loss 3 times and every metric once (20 reads at 1 process, every step
logged), and at 2 processes each margin head added 3 more reads, and every replicated parameter one (``int(numel)``
of a device tensor in the gradient all-reduce).
"""
import json
import os

import numpy as np
import paddle
import pytest

from mtl.arrays import host_floats
from tests.dist_scripts import host_syncs as job
from tests.host_syncs import HostSyncCounter
from tests.shared_runs import two_process_run

PARTIAL_FC_HEADS, GATHERING_HEADS = 1, 3  # pfc; arc, pfc, soft


def budget(logged: bool, world: int) -> int:
    """The per-step budget of the module docstring."""
    step = 2 + int(logged) + PARTIAL_FC_HEADS
    return step + (2 + GATHERING_HEADS if world > 1 else 0)


def _check(result, log_every, world):
    assert len(result["counts"]) == job.STEPS
    for step, (count, sites) in enumerate(zip(result["counts"], result["sites"]), start=1):
        expected = budget(step % log_every == 0, world)
        assert count == expected, f"step {step}: {count} host reads, budget {expected}: {sites}"


@pytest.mark.parametrize("log_every", [1, 3])
def test_one_process_step_stays_within_its_host_read_budget(tmp_path, log_every):
    _check(job.count_steps(tmp_path / "run", log_every), log_every, world=1)


@two_process_run("host_syncs")
def _two_ranks(folder):
    return {"call": [job.__file__, "main", str(folder)]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("host_syncs")
def test_two_process_step_stays_within_its_host_read_budget(two_process):
    for rank in range(2):
        with open(os.path.join(two_process["host_syncs"], f"rank{rank}.json")) as f:
            _check(json.load(f), log_every=1, world=2)


def test_one_read_gives_the_values_float_gives():
    """The batched read changes no value: float32 and float64 tensors (nan, inf, subnormal included) and plain
    numbers, against ``float(t)`` one by one."""
    values = [paddle.to_tensor(np.float32(v)) for v in (0.1, -3.5e-42, np.inf, np.nan, 7.0)]
    values += [paddle.to_tensor(np.float64(1 / 3)), paddle.to_tensor(np.float64(-2e-310)), 2.5, 3]
    with HostSyncCounter() as syncs:
        got = host_floats(values)
    assert syncs.count == 1
    expected = [float(v) for v in values]
    assert np.array_equal(np.array(got), np.array(expected), equal_nan=True)
    assert [type(v) for v in got] == [float] * len(values)


def test_the_counter_counts_each_way_a_value_reaches_python():
    t = paddle.to_tensor(2.0)
    with HostSyncCounter() as syncs:
        t.numpy()
        float(t)
        int(t)
        bool(t > 1)
        t.item()
        t.tolist()
        np.asarray(t)
    assert syncs.count == 7 and all(site.startswith("tests/test_host_syncs.py") for site in syncs.sites)
    with HostSyncCounter() as syncs:
        int(paddle.ones([3, 2]).numel())  # on a GPU numel's output is a device tensor (phi's numel kernel)
    assert syncs.count == 1
