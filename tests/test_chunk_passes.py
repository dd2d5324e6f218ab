"""The two back-ends of the margin softmax's chunk passes (``mtl.headkit.chunked_softmax``: Paddle ops, what a GPU
runs; ``mtl.headkit.host_chunks``: numpy on the CPU tensors' memory) on the same inputs at every chunk boundary.

Why two definitions (docs/architecture.md, "One loss, several executions"): the host passes work in place on the
tensors' memory with numpy's BLAS and ufuncs (``out=``), 0.40x (full) and 0.71x (Partial FC 0.1) the CPU step time
of the Paddle-op passes at 100k classes; the Paddle-op passes are what a device runs, where numpy cannot. One
definition over both would need an array layer with in-place BLAS for Paddle's CPU kernels, which are what is slow.
So the two are held equal here instead: a class count one below, at and one above a multiple of the chunk, fewer,
as many and more rows than the feature size (they once disagreed at D == N), with inter-class filtering, Partial
FC, and another head's rows that learn (cross-head negatives, ``update: both``): loss, feature gradient, the own
rows' gradient, the other head's rows' gradient and top-1 agree to 1e-10 in float64.
"""
import numpy as np
import paddle
import pytest

from mtl.core import arrays
from mtl.core.registry import plugin_class
from mtl.headkit import class_rows
from mtl.headkit.cross_negatives import CrossNegatives
from mtl.headkit.row_gradients import dense_gradient
from mtl.optimizer.sparse import StepRows
from tests.references.margin import assert_close

ArcFaceHead = plugin_class("head", "arcface")
CHUNK = 4
CROSS = {"rate": 1.0, "tasks": "all", "mask": "none", "pairs": None, "update": "both", "warmup": 0,
         "quantile": 0.05, "momentum": 0.9, "floor": 0.2, "rows": "drawn"}
SETTINGS = {
    "plain": {},
    "filtering": {"interclass_filtering_threshold": 0.2},
    "filtering_remove": {"interclass_filtering_threshold": 0.2, "interclass_filtering_mode": "remove"},
    "partial_fc": {"sample_ratio": 0.6},
    "cross_both": {},
}


def one_step(host, classes, rows, dim, setting, seed=0):
    """Loss, feature gradient, the own and the other head's centre gradients (dense) and top-1 accuracy of one
    forward and backward with the host (numpy) or the device (Paddle-op) passes."""
    arrays.HOST_PATHS = host
    rng = np.random.RandomState(seed)
    head = ArcFaceHead(num_classes=classes, feature_size=dim, scale=16.0, seed=2, **SETTINGS[setting])
    head.weight.set_value(rng.randn(classes, dim))
    other = None
    if setting == "cross_both":
        other = ArcFaceHead(num_classes=classes + 1, feature_size=dim, scale=16.0, seed=3)
        other.weight.set_value(rng.randn(classes + 1, dim))
        cross = CrossNegatives(CROSS, {"a": head, "b": other}, seed=9)
        head.attach_cross_negatives(cross, "a")
        other.attach_cross_negatives(cross, "b")
    x = paddle.to_tensor(rng.randn(rows, dim), stop_gradient=False)
    y = paddle.to_tensor(rng.randint(0, classes, size=rows))
    out = head(x, y, 0)
    out.loss.backward()
    step_rows = StepRows()
    step_rows.add(out.rows)
    if other is not None:
        step_rows.add(cross.settle())  # the other head's rows: into its weight.grad (it learns whole)
    own = dense_gradient(head.weight, step_rows.merged())
    other_grad = other.weight.grad.numpy() if other is not None else np.zeros(1)
    return float(out.loss), x.grad.numpy(), own, other_grad, float(out.metrics["accuracy"])


@pytest.fixture(autouse=True)
def restore_host_paths(monkeypatch):
    monkeypatch.setattr(arrays, "HOST_PATHS", arrays.HOST_PATHS)
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", CHUNK)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("rows,dim", [(3, 5), (5, 5), (6, 4)])  # N < D, N == D, N > D
@pytest.mark.parametrize("classes", [2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1, 3 * CHUNK, CHUNK - 1])
def test_host_and_device_passes_agree_at_every_chunk_boundary(float64, setting, rows, dim, classes):
    host = one_step(True, classes, rows, dim, setting)
    device = one_step(False, classes, rows, dim, setting)
    assert abs(host[0] - device[0]) <= 1e-10 * max(abs(device[0]), 1.0), "loss"
    for what, a, b in zip(("feature gradient", "own centre gradient", "other head's centre gradient"), host[1:4],
                          device[1:4]):
        assert a.shape == b.shape, what
        assert_close(a, b, 1e-10, what)
    assert host[4] == device[4], "top-1"
    assert np.abs(host[2]).sum() > 0 and (setting != "cross_both" or np.abs(host[3]).sum() > 0)  # not vacuous


def test_the_comparison_sees_a_planted_difference(float64, monkeypatch):
    """Host passes whose inverse row norms are off by 1e-7 (relative) fail the comparison above."""
    from mtl.headkit import host_chunks

    exact = host_chunks.inverse_norm
    monkeypatch.setattr(host_chunks, "inverse_norm", lambda block: exact(block) * (1 + 1e-7))
    host = one_step(True, 9, 5, 5, "plain")
    device = one_step(False, 9, 5, 5, "plain")
    with pytest.raises(AssertionError):
        assert_close(host[2], device[2], 1e-10, "own centre gradient")
