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

MARKS = (100, 200, 300, 400)  # snapshots after these steps (the last step's checkpoint and summary come after it)


class Snapshots(Trainer):
    """A trainer that takes a tracemalloc snapshot after the steps of MARKS."""

    taken = {}

    def _after_step(self, step, result, loop):
        super()._after_step(step, result, loop)
        if step in MARKS:
            gc.collect()  # garbage in reference cycles is not memory kept: how much waits for the collector varies
            Snapshots.taken[step] = tracemalloc.take_snapshot().filter_traces([not_tracemalloc()])


def growth(first, last) -> float:
    """Bytes a step of the Python allocations still alive, from the snapshot after step ``first`` to ``last``."""
    diff = Snapshots.taken[last].compare_to(Snapshots.taken[first], "filename")
    return sum(stat.size_diff for stat in diff) / (last - first)


def not_tracemalloc():
    """A filter that leaves out tracemalloc's own allocations (the snapshots themselves)."""
    return tracemalloc.Filter(False, tracemalloc.__file__)


@pytest.mark.slow  # (tracemalloc slows every Python allocation: about 10 s)
def test_a_training_step_keeps_no_python_memory(tmp_path):
    """Three windows of 100 steps: a steady growth shows in every one. Python's free lists of floats and dicts (a few
    kilobytes, counted where they were first allocated) fill once, and in a pytest worker that ran other tests before,
    other threads and caches move a few kilobytes in one window or another: the smallest window is the one read.
    (Before: about 3 KB a step.)"""
    arc = {"name": "arc", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 5, "seed": 3},
           "head": {"type": "arcface", "scale": 8.0}, "eval": None}
    cfg = job_cfg(tmp_path, tasks=[arc], schedule={"steps": MARKS[-1] + 1, "batch_size": 8},
                  log={"every": 1, "progress": False, "plot": False}, checkpoint={"every": 0})
    tracemalloc.start()
    try:
        Snapshots(build_job(cfg), console=lambda *a, **k: None).run()
    finally:
        tracemalloc.stop()
    windows = [growth(first, last) for first, last in zip(MARKS, MARKS[1:])]
    assert min(windows) < 100, f"bytes a step in windows of 100 steps: {windows}"


def bytes_kept_a_call(make, calls=1000, windows=3) -> list:
    """Bytes of Python allocations left alive per call of ``make(array)``, in each of ``windows`` windows of ``calls``
    calls after as many calls of warm-up."""
    for _ in range(calls):
        make(np.zeros(33, np.float32))
    kept = []
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces([not_tracemalloc()])
        for _ in range(windows):
            for _ in range(calls):
                make(np.zeros(33, np.float32))
            gc.collect()
            after = tracemalloc.take_snapshot().filter_traces([not_tracemalloc()])
            kept.append(sum(stat.size_diff for stat in after.compare_to(before, "filename")) / calls)
            before = after
    finally:
        tracemalloc.stop()
    return kept


def test_tensors_from_host_arrays_keep_nothing():
    """The same values and dtype as ``paddle.to_tensor``, and nothing kept a call where ``paddle.to_tensor`` keeps
    about 100 bytes (three windows of 1,000 calls; the smallest is read, as above)."""
    for data, dtype in ((np.arange(6, dtype=np.int64).reshape(2, 3), None), (np.float32(2.5), None),
                        ([1.0, 2.0], "float32"), (np.array([True, False]), None)):
        made, reference = tensor_from(data, dtype=dtype), paddle.to_tensor(data, dtype=dtype)
        assert made.dtype == reference.dtype and made.shape == reference.shape and made.stop_gradient
        np.testing.assert_array_equal(made.numpy(), reference.numpy())
    ours, reference = bytes_kept_a_call(tensor_from), bytes_kept_a_call(paddle.to_tensor)
    assert min(reference) > 50, f"paddle.to_tensor keeps nothing now ({reference} bytes a call): the check is blind"
    assert min(ours) < 10, f"tensor_from keeps {ours} bytes a call (paddle.to_tensor: {reference})"
