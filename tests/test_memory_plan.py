"""The memory plan against hand computations and built heads, the refusal of a job that cannot fit (its figures from
the plan's formula, its peak memory measured on its own process), and the bounded-buffer pieces (block-wise weight
build, chunked row-sparse update) against references."""
import math
import os
import re
import subprocess
import sys
import tempfile
import threading

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core import arrays, registry
from mtl.headkit import sharded
from mtl.optimizer import sparse
from mtl.optimizer.sparse import RowSparseOptimizer
from mtl.train import memory_plan
from tests.dist_util import ROOT

ArcFaceHead = registry.plugin_class("head", "arcface")

JOB = os.path.join(ROOT, "tests", "dist_scripts", "partial_fc_job.yaml")


def test_head_plan_is_the_hand_computation_and_the_built_head():
    """C = 1000, D = 16, r = 0.1, 4 rows, momentum: K = ceil(0.1 * 1000) + 4 rows, float32, in the reused work
    buffer with 2 % headroom (int(104 * 16 * 1.02) + 1 = 1698 floats); chunk buffers 4 K D."""
    options = {"num_classes": 1000, "feature_size": 16, "sample_ratio": 0.1}
    plan = ArcFaceHead.planned_bytes(options, global_rows=4, world_size=1, rank=0, optimizer_slots=1)
    assert plan == {"weight": 1000 * 16 * 4, "optimizer state": 1000 * 16 * 4,
                    "sampled rows: exp values, then gradient": 1698 * 4, "chunk buffers": 4 * 104 * 16 * 4}
    head = ArcFaceHead(**options)
    assert head.weight.numel() * head.weight.element_size() == plan["weight"]
    features = paddle.randn([4, 16])
    features.stop_gradient = False
    out = head(features, paddle.to_tensor([1, 5, 5, 999]), 0)
    out.loss.backward()
    optimizer = RowSparseOptimizer({"type": "momentum", "momentum": 0.9, "weight_decay": 0.0})
    optimizer.step(out.rows, 0.1)
    velocity = optimizer.velocity(head.weight)
    assert velocity.numel() * velocity.element_size() == plan["optimizer state"]
    grad = out.rows[0].grad
    assert grad.numel() * grad.element_size() <= plan["sampled rows: exp values, then gradient"]  # 100 of <= 104
    buffer = head._workspace.flat  # the buffer the head keeps from step to step
    assert buffer.numel() * buffer.element_size() <= plan["sampled rows: exp values, then gradient"]
    full = ArcFaceHead.planned_bytes({"num_classes": 7, "feature_size": 16}, 4, 2, 1, 0)
    assert full == {"weight": 3 * 16 * 4, "optimizer state": 0, "exp values, then the gradient": 3 * 16 * 4,
                    "chunk buffers": 4 * 3 * 16 * 4}  # rank 1 of 2 holds 3 of 7 classes; max(N, D) = D = 16


def test_job_plan_counts_backbone_heads_and_the_averagers_copies():
    cfg = load_job(JOB, ["averaging.type=window", "averaging.average_window_rate=0.1"])
    registry.load_builtin()
    backbone = registry.build("backbone", dict(cfg["backbone"]))
    entries = memory_plan.plan_job(cfg, backbone, lambda t: {"num_classes": t["reader"]["num_classes"]}, 1)
    names = [e.name for e in entries]
    assert names == ["backbone", "task 'arc11' head 'arcface'", "task 'cos3' head 'cosface'", "averager 'window'"]
    params = sum(int(p.numel()) * 4 for p in backbone.parameters())
    assert entries[0].parts == {"parameters": params, "gradients": params, "optimizer state": params}
    assert entries[1].parts["weight"] == 11 * 16 * 4 and entries[2].parts["weight"] == 3 * 16 * 4
    assert entries[3].parts == {"4 copies": 4 * (params + 11 * 16 * 4 + 3 * 16 * 4)}


def run_measured(cmd, timeout, **options):
    """Run ``cmd`` to its end: (exit code, stdout, stderr, peak resident memory in KiB of that process, read from
    its own ``wait4`` record: the processes it started and waited for are included, no other child of this one)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, **options)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(), err.read().decode(), usage.ru_maxrss


@pytest.mark.subprocess
def test_a_job_that_cannot_fit_stops_before_allocating_with_one_line(tmp_path):
    """10^9 classes x 16 floats, Partial FC 0.3, momentum, 4 rows: exit 2, one error line naming the head and its
    figures as the plan's formula gives them (weight C D, velocity C D, the sampled rows' buffer
    int(K max(N, D) 1.02) + 1 floats with K = ceil(0.3 C) + N), and a small peak: nothing large was allocated."""
    code, out, err, peak_kib = run_measured(
        [sys.executable, "-m", "mtl.cli", "train", JOB, "--set", f"output_dir={tmp_path / 'run'}", "--set",
         "tasks.0.head.num_classes=1000000000"], timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    found = re.search(r"tasks.0.head: task 'arc11' head 'arcface' needs ([\d.]+) GiB per process \(weight "
                      r"([\d.]+) GiB, optimizer state ([\d.]+) GiB, sampled rows: exp values, then gradient "
                      r"([\d.]+) GiB, chunk buffers ([\d.]+) MiB\)", errors[0])
    assert found, errors[0]
    total, weight, velocity, sampled, chunks = map(float, found.groups())
    classes, dim, rows, gib = 10 ** 9, 16, 4, 2 ** 30
    sample = math.ceil(0.3 * classes) + rows
    for printed, expected in ((weight, classes * dim * 4), (velocity, classes * dim * 4),
                              (sampled, (int(sample * max(rows, dim) * 1.02) + 1) * 4)):
        assert abs(printed - expected / gib) <= 0.005, (printed, expected / gib)
    assert abs(total - (weight + velocity + sampled + chunks / 1024)) <= 0.02
    assert "--set tasks.0.head.sample_ratio=0.1" in errors[0]
    assert "memory plan per process" not in out  # one line: the plan itself only with --verbose
    assert peak_kib < 4 * 2 ** 20, f"peak {peak_kib} KiB: something large was allocated"


def test_weight_built_by_blocks_equals_the_reference_initialisation(monkeypatch):
    monkeypatch.setattr(sharded, "INIT_WRITE_ROWS", 5)
    head = ArcFaceHead(num_classes=23, feature_size=3, seed=4)
    assert np.array_equal(head.weight.numpy(), sharded.initial_class_rows(23, 3, 4, 0, 23))


@pytest.mark.parametrize("host", [True, False])
@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 0.01), (0.0, 0.0)])
def test_chunked_row_update_equals_numpy(monkeypatch, momentum, weight_decay, host):
    """Momentum with L2 decay on rows [7, 2, 9, 4, 0] in chunks of 2: g' = g + wd w, v = mu v + g', w -= lr v; in
    numpy on the host and in Paddle ops (the device path)."""
    monkeypatch.setattr(sparse, "UPDATE_CHUNK_ROWS", 2)
    monkeypatch.setattr(arrays, "HOST_PATHS", host)
    rng = np.random.default_rng(0)
    w, v, g = rng.standard_normal((10, 3)), rng.standard_normal((10, 3)), rng.standard_normal((5, 3))
    index = np.array([7, 2, 9, 4, 0])
    weight, velocity = paddle.to_tensor(w), paddle.to_tensor(v)
    sparse.row_sparse_momentum_(weight, velocity, paddle.to_tensor(index), paddle.to_tensor(g), 0.5, momentum,
                                weight_decay)
    step = g + weight_decay * w[index]
    if momentum:
        v[index] = momentum * v[index] + step
        step = v[index]
    w[index] -= 0.5 * step
    np.testing.assert_allclose(weight.numpy(), w, rtol=1e-12)
    np.testing.assert_allclose(velocity.numpy(), v, rtol=1e-12)
