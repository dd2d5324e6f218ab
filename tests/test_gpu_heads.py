"""The margin heads on a GPU, decided on CPU: the chunk size of the device passes, the
fused path's choice and its memory. References: arithmetic of the documented formulas, and the same step with the
CPU's chunking (float64)."""
import math

import numpy as np
import paddle
import pytest

from mtl.core import arrays
from mtl.core.registry import plugin_class
from mtl.headkit import class_rows
from mtl.headkit.class_rows import CHUNK_ROWS, DEVICE_CHUNK_ELEMENTS, chunk_rows

ArcFaceHead = plugin_class("head", "arcface")  # the one way head plug-ins are imported


@pytest.mark.parametrize("width, rows", [(128, 262144), (512, 65536), (4096, 8192), (100000, CHUNK_ROWS)])
def test_gpu_chunks_hold_up_to_the_device_budget_and_cpu_chunks_stay_cache_sized(width, rows):
    assert chunk_rows(width, on_gpu=False) == CHUNK_ROWS
    assert chunk_rows(width, on_gpu=True) == rows == max(CHUNK_ROWS, DEVICE_CHUNK_ELEMENTS // width)


def test_a_million_classes_per_rank_take_16_gpu_chunks_instead_of_123():
    """At 1M classes per rank and max(N, D) = 512 (about 3,000 kernel launches per step with CPU-sized chunks: ~30
    per chunk)."""
    classes = 1_000_000
    assert math.ceil(classes / chunk_rows(512, False)) == 123
    assert math.ceil(classes / chunk_rows(512, True)) == 16


def _step(x, y, sample_ratio):
    head = ArcFaceHead(num_classes=37, feature_size=x.shape[1], sample_ratio=sample_ratio, scale=16.0, seed=2)
    features = paddle.to_tensor(x, stop_gradient=False)
    out = head(features, paddle.to_tensor(y), 0)
    out.loss.backward()
    return float(out.loss), features.grad.numpy(), head.weight_gradient(out), out.metrics["accuracy"].numpy()


@pytest.mark.parametrize("sample_ratio", [1.0, 0.5])
def test_the_device_passes_with_gpu_sized_chunks_equal_cpu_sized_ones(monkeypatch, sample_ratio):
    """The Paddle-op passes (the GPU's) run with the GPU's chunk rule (budget shrunk so that 37 classes make
    several uneven chunks) and with the CPU's: same loss, gradients and top-1 (float64)."""
    monkeypatch.setattr(arrays, "HOST_PATHS", False)
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 3)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((5, 6)), np.array([3, 3, 30, 17, 36])
    paddle.set_default_dtype("float64")
    try:
        cpu = _step(x, y, sample_ratio)
        seen = []
        original = class_rows.chunk_rows
        monkeypatch.setattr(class_rows, "DEVICE_CHUNK_ELEMENTS", 11 * 6)  # 11 rows of max(N, D) = 6
        monkeypatch.setattr(class_rows, "chunk_rows",
                            lambda width, on_gpu: seen.append(width) or original(width, True))
        gpu = _step(x, y, sample_ratio)
    finally:
        paddle.set_default_dtype("float32")
    assert seen and set(seen) == {6}
    assert abs(cpu[0] - gpu[0]) <= 1e-12 * abs(cpu[0])
    for a, b in zip(cpu[1:], gpu[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def _plan(monkeypatch, device, **options):
    monkeypatch.setattr(paddle, "get_device", lambda: device)
    return ArcFaceHead.planned_bytes({"num_classes": 1_000_000, "feature_size": 512, **options}, 512, 1, 0, 1)


def test_the_memory_plan_counts_the_chunk_size_of_the_device(monkeypatch):
    width, item = 512, 4
    cpu, gpu = _plan(monkeypatch, "cpu"), _plan(monkeypatch, "gpu:0")
    assert cpu["chunk buffers"] == 4 * CHUNK_ROWS * width * item
    assert gpu["chunk buffers"] == 4 * (DEVICE_CHUNK_ELEMENTS // width) * width * item  # 512 MiB
    assert {k: v for k, v in cpu.items() if k != "chunk buffers"} == {k: v for k, v in gpu.items()
                                                                      if k != "chunk buffers"}


def test_the_fused_path_is_chosen_only_when_asked_and_planned_dense(monkeypatch):
    """``fused: auto`` took Paddle's margin_cross_entropy on any GPU; it has not run here, so auto is the composed
    path everywhere and ``true`` opts in. Its plan: [N, C_k] logits, softmax and their gradients, a dense weight
    gradient (not the composed path's chunk buffers)."""
    from paddle.base import core

    monkeypatch.setattr(core, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle, "get_device", lambda: "gpu:0")
    cosface = ArcFaceHead(num_classes=5, feature_size=3, margin=[1.0, 0.0, 0.35])
    assert cosface.fused is False
    assert ArcFaceHead(num_classes=5, feature_size=3, margin=[1.0, 0.0, 0.35], fused=True).fused is True
    with pytest.raises(ValueError, match="Partial FC"):
        ArcFaceHead(num_classes=5, feature_size=3, sample_ratio=0.5, fused="true")
    plan = _plan(monkeypatch, "gpu:0", fused="true")
    n, shard, dim, item = 512, 1_000_000, 512, 4
    assert plan == {"weight": shard * dim * item, "optimizer state": shard * dim * item,
                    "logits, softmax and their gradients": 4 * n * shard * item,
                    "dense weight gradient": shard * dim * item}
