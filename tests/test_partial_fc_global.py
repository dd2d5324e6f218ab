"""Partial FC's class sample is drawn over all classes from (seed, step): exact count, every positive, uniform,
deterministic, O(count) memory, and the same at any process count (1 vs 2 processes train identically: the
2-process run is in the session's one launch, the 1-process run trains in this process, tests/shared_runs.py)."""
import json
import math
import os
import tracemalloc

import numpy as np
import pytest

from mtl.headkit.sharded import sample_classes_globally, shard_of_sample
from mtl.parallel import distributed
from tests.dist_util import ROOT
from tests.shared_runs import train_here, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "partial_fc_job.yaml")


@pytest.mark.parametrize("num_classes,count,positives", [
    (20, 6, [3, 3, 17]), (20, 15, [0, 1]), (20, 19, []), (1000, 100, list(range(0, 1000, 50))),
    (10, 2, [1, 2, 3, 4, 5]),  # positives outnumber the sample: all of them, nothing else
])
def test_sample_has_the_exact_count_every_positive_and_distinct_sorted_ids(num_classes, count, positives):
    for step in range(5):
        sampled = sample_classes_globally(positives, num_classes, count, seed=7, step=step)
        assert len(sampled) == max(count, len(set(positives)))
        assert set(positives) <= set(sampled.tolist())
        assert np.all(np.diff(sampled) > 0) and sampled[0] >= 0 and sampled[-1] < num_classes


def test_sample_is_a_function_of_seed_and_step_only():
    first = sample_classes_globally([4], 500, 50, seed=1, step=3)
    assert np.array_equal(first, sample_classes_globally(np.array([4, 4]), 500, 50, seed=1, step=3))
    assert not np.array_equal(first, sample_classes_globally([4], 500, 50, seed=1, step=4))
    assert not np.array_equal(first, sample_classes_globally([4], 500, 50, seed=2, step=3))


@pytest.mark.parametrize("count", [4, 7])  # 3 of 8 negatives (drawn directly), 6 of 8 (complement drawn)
def test_every_negative_is_equally_likely(count):
    """Inclusion frequency of each negative against the exact probability (count - P) / (C - P), within 5 sigma."""
    positives, num_classes, draws = [2, 9], 10, 4000
    hits = np.zeros(num_classes)
    for step in range(draws):
        hits[sample_classes_globally(positives, num_classes, count, seed=0, step=step)] += 1
    p = (count - len(positives)) / (num_classes - len(positives))
    negatives = np.setdiff1d(np.arange(num_classes), positives)
    sigma = math.sqrt(draws * p * (1 - p))
    assert np.all(np.abs(hits[negatives] - draws * p) < 5 * sigma), hits
    assert np.all(hits[positives] == draws)


def test_sampling_twenty_million_classes_stays_order_count_in_memory():
    """C = 2e7, count 2e4: the peak of numpy allocations is a few bytes per sampled class, nothing of size C."""
    tracemalloc.start()
    sampled = sample_classes_globally(np.arange(0, 20_000_000, 200_000), 20_000_000, 20_000, seed=3, step=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(sampled) == 20_000
    assert peak < 64 * 20_000, f"{peak} bytes"  # a [C] float32 vector alone would be 80 MB


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_partition_the_global_sample(world):
    num_classes = 23
    sampled = sample_classes_globally([0, 22, 5], num_classes, 9, seed=4, step=2)
    kept = []
    for rank in range(world):
        start, size = distributed.shard_range(num_classes, world, rank)
        local = shard_of_sample(sampled, start, size)
        assert np.all((local >= 0) & (local < size))
        kept.append(local + start)
    assert np.array_equal(np.concatenate(kept), sampled)


def _losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


@two_process_run("partial_fc")
def _two_processes(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}"]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("partial_fc")
def test_partial_fc_trains_identically_at_one_and_two_processes(two_process, tmp_path):
    one = str(tmp_path / "one")
    train_here(JOB, "--set", f"output_dir={one}")
    two = two_process["partial_fc"]
    a, b = _losses(one), _losses(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 13))
    worst = 0.0
    for ra, rb in zip(a, b):
        for key in ("loss", "loss/arc11", "loss/cos3", "grad_norm"):
            assert np.isfinite(ra[key]) and np.isfinite(rb[key]), (ra["step"], key)
            worst = max(worst, abs(ra[key] - rb[key]) / max(abs(ra[key]), 1e-8))
    assert worst <= 1e-4, f"largest relative difference {worst:.3g}"
