"""Host synchronisations per training step, counted and held to a budget.

Every ``Tensor.numpy()``, ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` of a device tensor stops the CPU until
the GPU has run everything queued before it (tests/host_syncs.py counts them). The job (tests/dist_scripts/
host_syncs.py) has an ArcFace head, an ArcFace head with Partial FC, a sharded softmax and a regression head, and
runs the device path (the Paddle-op passes a GPU runs). Per step the budget is:

* 1 read of every task's global loss (the weighting and the non-finite guard need them before the backward),
* 1 read of the global gradient norm (skip, clip, loss scale),
* 1 read of the pending step records when the step writes the log (``log.every``),
* 1 per Partial FC head (its class sample is drawn in numpy from the gathered labels),
* 1 per head with inter-class filtering (its mask is built from the gathered labels),
* a step read as K micro-batches: the losses and each gathering head's labels once per micro-batch; Partial FC's
  one sample of the step once; the metrics summed where they are,
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

from mtl.core.arrays import host_floats
from tests.dist_scripts import host_syncs as job
from tests.host_syncs import HostSyncCounter
from tests.shared_runs import two_process_run

PARTIAL_FC_HEADS, GATHERING_HEADS, FILTERING_HEADS = 1, 3, 1  # pfc; arc, pfc, soft; arc (variant filtering)


def budget(logged: bool, world: int, variant: str = "plain") -> int:
    """The per-step budget of the module docstring; ``variant`` (tests/dist_scripts/host_syncs.py): ``accumulate``
    reads 2 micro-batches (the losses and each gathering head's labels once per micro-batch; Partial FC draws its
    one sample of the step once), ``filtering``: the filtering head reads its gathered labels once more (its
    mask's rows)."""
    micro = 2 if variant == "accumulate" else 1
    step = micro + 1 + int(logged) + PARTIAL_FC_HEADS + (FILTERING_HEADS if variant == "filtering" else 0)
    return step + (2 + GATHERING_HEADS * micro if world > 1 else 0)


def _check(result, log_every, world, variant="plain"):
    assert len(result["counts"]) == job.STEPS
    for step, (count, sites) in enumerate(zip(result["counts"], result["sites"]), start=1):
        expected = budget(step % log_every == 0, world, variant)
        assert count == expected, f"{variant} step {step}: {count} host reads, budget {expected}: {sites}"


@pytest.mark.parametrize("log_every", [1, 3])
def test_one_process_step_stays_within_its_host_read_budget(tmp_path, log_every):
    _check(job.count_steps(tmp_path / "run", log_every), log_every, world=1)


@pytest.mark.parametrize("variant", ["accumulate", "filtering"])
def test_accumulation_and_filtering_stay_within_the_budget(tmp_path, variant):
    """Gradient accumulation (before: every metric of every micro-batch read on the host, 12 reads a step here, and
    the step's mean losses read back) and inter-class filtering are held to the budget too."""
    _check(job.count_steps(tmp_path / "run", 1, variant), 1, world=1, variant=variant)


@two_process_run("host_syncs")
def _two_ranks(folder):
    return {"call": [job.__file__, "main", str(folder)]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("host_syncs")
@pytest.mark.parametrize("variant", job.VARIANTS)
def test_two_process_step_stays_within_its_host_read_budget(two_process, variant):
    for rank in range(2):
        with open(os.path.join(two_process["host_syncs"], f"{variant}_rank{rank}.json")) as f:
            _check(json.load(f), log_every=1, world=2, variant=variant)


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
