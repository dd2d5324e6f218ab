"""Memory over a long run (issue 55): a training step leaves nothing behind. A run's Python allocations (tracemalloc)
must not grow from one step to the next: they grew by about 3 KB a step, the step records kept in memory for the
summary and the plot (now read back from metrics.jsonl) and the tensors built from host arrays with Paddle 3.3's
``to_tensor``, which keeps about 100 bytes for good each time (now ``mtl.core.arrays.tensor_from``). The resident memory
of a long run is bench/bench_soak.py's."""
import gc
import tracemalloc

import numpy as np
import paddle
import pytest

from mtl.core.arrays import tensor_from
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests.small_runs import job_cfg

MARKS = (100, 250, 400)  # snapshots after these steps (the last step's checkpoint and summary come after it)


class Snapshots(Trainer):
    """A trainer that takes a tracemalloc snapshot after the steps of MARKS."""

    taken = {}

    def _after_step(self, step, result, loop):
        super()._after_step(step, result, loop)
        if step in MARKS:
            gc.collect()  # garbage in reference cycles is not memory kept: how much waits for the collector varies
            Snapshots.taken[step] = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])  # (not the snapshots themselves)


def growth(first, last) -> float:
    """Bytes a step of the Python allocations still alive, from the snapshot after step ``first`` to ``last``."""
    diff = Snapshots.taken[last].compare_to(Snapshots.taken[first], "filename")
    return sum(stat.size_diff for stat in diff) / (last - first)


@pytest.mark.slow  # (tracemalloc slows every Python allocation: about 10 s)
def test_a_training_step_keeps_no_python_memory(tmp_path):
    """Two windows of 150 steps: a steady growth shows in both; Python's free lists of floats and dicts (a few
    kilobytes, counted where they were first allocated) fill once, in the first. (Before: about 3 KB a step.)"""
    arc = {"name": "arc", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 5, "seed": 3},
           "head": {"type": "arcface", "scale": 8.0}, "eval": None}
    cfg = job_cfg(tmp_path, tasks=[arc], schedule={"steps": MARKS[-1] + 1, "batch_size": 8},
                  log={"every": 1, "progress": False, "plot": False}, checkpoint={"every": 0})
    tracemalloc.start()
    try:
        Snapshots(build_job(cfg), console=lambda *a, **k: None).run()
    finally:
        tracemalloc.stop()
    first, second = growth(*MARKS[:2]), growth(*MARKS[1:])
    assert second < 100, f"{first:.0f} then {second:.0f} bytes a step"


def test_tensors_from_host_arrays_keep_nothing():
    """The same values and dtype as ``paddle.to_tensor``, and nothing left after 2,000 of them."""
    for data, dtype in ((np.arange(6, dtype=np.int64).reshape(2, 3), None), (np.float32(2.5), None),
                        ([1.0, 2.0], "float32"), (np.array([True, False]), None)):
        made, reference = tensor_from(data, dtype=dtype), paddle.to_tensor(data, dtype=dtype)
        assert made.dtype == reference.dtype and made.shape == reference.shape and made.stop_gradient
        np.testing.assert_array_equal(made.numpy(), reference.numpy())
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(2000):
        tensor_from(np.zeros(33, np.float32))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert sum(stat.size_diff for stat in after.compare_to(before, "filename")) < 10_000
