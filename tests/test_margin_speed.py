"""The chunked margin softmax (no ``[N, C_k]`` logits; with Partial FC nothing ``[K, D]`` but the rows'
gradient) over many class chunks against the independent numpy reference of
tests/test_margin_heads.py, with the passes in numpy (host) and in Paddle ops (device): full softmax and Partial FC,
targets in different chunks, duplicated targets, a chunk holding only a target, the sphere fallback; and float32
over many chunks against the float64 reference."""
import numpy as np
import paddle
import pytest

from mtl.core import arrays
from mtl.core.registry import plugin_class
from mtl.headkit import class_rows
from tests.references.margin import MARGINS, assert_close, np_margin_head, run_head

ArcFaceHead = plugin_class("head", "arcface")


@pytest.fixture(params=["host", "device"], autouse=True)
def passes(request, monkeypatch):
    """Every test runs the chunk passes both in numpy on the host (the CPU default) and in Paddle ops (the device
    path, which runs on CPU too)."""
    monkeypatch.setattr(arrays, "HOST_PATHS", request.param == "host")
    return request.param


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
@pytest.mark.parametrize("name", ["arcface", "sphere_fallback"])
def test_full_softmax_over_chunks_matches_numpy(monkeypatch, float64, chunk, name):
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", chunk)
    rng = np.random.RandomState(4)
    x = rng.randn(9, 6)
    y = np.array([0, 12, 12, 5, 6, 3, 10, 0, 1])  # classes in several chunks, duplicates, chunk ends
    if name == "sphere_fallback":
        x[:3] = -x[:3]
    head = ArcFaceHead(num_classes=13, feature_size=6, margin=list(MARGINS[name]), scale=16.0, seed=2)
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    loss, ref_dx, ref_dw, cos = np_margin_head(x, w, y, MARGINS[name], 16.0)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "centre gradient")
    assert float(out.metrics["accuracy"]) == np.mean(cos.argmax(axis=1) == y)


@pytest.mark.parametrize("chunk", [1, 2, 7])
def test_partial_fc_over_chunks_matches_numpy_on_the_sample(monkeypatch, float64, chunk):
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", chunk)
    rng = np.random.RandomState(5)
    x, y = rng.randn(6, 5), np.array([3, 3, 17, 40, 0, 22])
    head = ArcFaceHead(num_classes=41, feature_size=5, sample_ratio=0.3, scale=16.0, seed=8)
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    sampled = head.last_sampled_classes.numpy()
    assert len(sampled) == 13 and set(y) <= set(sampled.tolist())
    loss, ref_dx, ref_dw, _ = np_margin_head(x, w[sampled], np.searchsorted(sampled, y), (1.0, 0.5, 0.0), 16.0)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw[sampled], ref_dw, 1e-10, "sampled centre gradient")
    assert np.all(dw[np.setdiff1d(np.arange(41), sampled)] == 0.0)
    assert head.weight.grad is None  # the sampled rows' gradient goes to the optimizer as a row gradient


def test_float32_chunks_agree_with_the_float64_reference_at_scale(monkeypatch):
    """2000 classes in chunks of 256, scale 64, float32: the loss to 1e-5 and gradients to 1e-4 (relative)."""
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 256)
    rng = np.random.RandomState(6)
    x, y = rng.randn(32, 16), rng.randint(0, 2000, size=32)
    head = ArcFaceHead(num_classes=2000, feature_size=16, seed=1)
    w = head.weight.numpy().astype(np.float64)
    out, dx, dw = run_head(head, x, y)
    loss, ref_dx, ref_dw, _ = np_margin_head(x, w, y, (1.0, 0.5, 0.0), 64.0)
    assert abs(float(out.loss) - loss) <= 1e-5 * abs(loss)
    assert_close(dx, ref_dx, 1e-4, "feature gradient")
    assert_close(dw, ref_dw, 1e-4, "centre gradient")


@pytest.mark.parametrize("sample_ratio", [1.0, 0.5])
@pytest.mark.parametrize("rows,dim", [(3, 10), (10, 3), (4, 4)])  # D > N: chunks run backwards in the buffer
def test_shared_buffer_for_exp_values_and_gradient_rows_in_either_shape(monkeypatch, float64, sample_ratio,
                                                                        rows, dim):
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 2)
    rng = np.random.RandomState(7)
    x, y = rng.randn(rows, dim), rng.randint(0, 11, size=rows)
    head = ArcFaceHead(num_classes=11, feature_size=dim, sample_ratio=sample_ratio, scale=8.0, seed=3)
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    sampled = head.last_sampled_classes.numpy()
    loss, ref_dx, ref_dw, _ = np_margin_head(x, w[sampled], np.searchsorted(sampled, y), (1.0, 0.5, 0.0), 8.0)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw[sampled], ref_dw, 1e-10, "scored centre gradient")


def _head_step(head, x, y, host, step=0):
    """Loss, dx, the scored rows' gradient and the top-1 state of one forward + backward at ``step`` with host or
    device passes (the autouse fixture's choice is overridden here)."""
    arrays.HOST_PATHS = host
    out, dx, dw = run_head(head, x, y, step)
    return float(out.loss), dx, dw, float(out.metrics["accuracy"])


@pytest.mark.parametrize("sample_ratio", [1.0, 0.4])
@pytest.mark.parametrize("rows,dim", [(6, 6), (9, 4), (3, 8)])
def test_host_and_device_passes_agree(monkeypatch, float64, sample_ratio, rows, dim):
    """The numpy host passes against the Paddle-op passes directly: loss, feature and centre gradients, top-1."""
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 4)
    rng = np.random.RandomState(11)
    x, y = rng.randn(rows, dim), rng.randint(0, 23, size=rows)
    y[1] = y[0]  # a duplicated target
    results = []
    for host in (True, False):
        head = ArcFaceHead(num_classes=23, feature_size=dim, sample_ratio=sample_ratio, scale=16.0, seed=5)
        results.append(_head_step(head, x, y, host))
    (loss_h, dx_h, dw_h, acc_h), (loss_d, dx_d, dw_d, acc_d) = results
    assert abs(loss_h - loss_d) <= 1e-12 * abs(loss_d)
    assert_close(dx_h, dx_d, 1e-10, "feature gradient")
    assert_close(dw_h, dw_d, 1e-10, "centre gradient")
    assert acc_h == acc_d


def test_partial_fc_workspace_across_steps_of_changing_size(monkeypatch, float64):
    """One head, several Partial FC steps whose sample size changes (more positives than negatives at step 2):
    the reused buffer grows, and every step equals the same step with a fresh buffer (device passes, no reuse)."""
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 3)
    rng = np.random.RandomState(12)
    reused = ArcFaceHead(num_classes=40, feature_size=5, sample_ratio=0.1, scale=8.0, seed=2)
    labels = [np.array([1, 2, 3]), np.arange(0, 40, 3), np.array([7, 7])]
    sizes = []
    for step, y in enumerate(labels):
        x = rng.randn(len(y), 5)
        fresh = ArcFaceHead(num_classes=40, feature_size=5, sample_ratio=0.1, scale=8.0, seed=2)
        fresh.weight.set_value(reused.weight.numpy())
        loss_r, dx_r, dw_r, _ = _head_step(reused, x, y, True, step)
        sizes.append(reused._workspace.flat.shape[0])
        loss_f, dx_f, dw_f, _ = _head_step(fresh, x, y, False, step)
        assert abs(loss_r - loss_f) <= 1e-12 * abs(loss_f)
        assert_close(dx_r, dx_f, 1e-10, f"step {step} feature gradient")
        assert_close(dw_r, dw_f, 1e-10, f"step {step} centre gradient")
    assert sizes[1] > sizes[0] and sizes[2] == sizes[1]  # grown for the larger sample, then reused


def test_a_second_forward_before_backward_is_refused_with_partial_fc():
    """Partial FC reuses one buffer per head: backward after a later forward of the same head would read values
    that are gone, so it raises instead of returning wrong gradients."""
    head = ArcFaceHead(num_classes=50, feature_size=4, sample_ratio=0.2, seed=1)
    x = paddle.randn([3, 4])
    x.stop_gradient = False
    first = head(x, paddle.to_tensor([1, 2, 3]), 0)
    head(x, paddle.to_tensor([4, 5, 6]), 1)
    # Paddle wraps an error raised in a PyLayer backward into an OSError that keeps its message
    with pytest.raises((RuntimeError, OSError), match="ran forward again before this step.s backward"):
        first.loss.backward()


def test_host_passes_without_stride_kernels(monkeypatch, float64):
    """With Paddle's view slicing off (FLAGS_use_stride_kernel=0) slices are copies; the host passes do not rely
    on them and still match the numpy reference."""
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 2)
    rng = np.random.RandomState(13)
    x, y = rng.randn(5, 6), np.array([0, 4, 4, 9, 2])
    head = ArcFaceHead(num_classes=11, feature_size=6, sample_ratio=0.5, scale=8.0, seed=3)
    w = head.weight.numpy().copy()
    paddle.set_flags({"FLAGS_use_stride_kernel": False})
    try:
        out, dx, dw = run_head(head, x, y)
    finally:
        paddle.set_flags({"FLAGS_use_stride_kernel": True})
    sampled = head.last_sampled_classes.numpy()
    loss, ref_dx, ref_dw, _ = np_margin_head(x, w[sampled], np.searchsorted(sampled, y), (1.0, 0.5, 0.0), 8.0)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw[sampled], ref_dw, 1e-10, "scored centre gradient")
