"""Determinism and random state on a GPU, decided on CPU: the margin head's device backward
scatters without an atomic add, initial weights are drawn on the CPU's generator whatever the device, and a
checkpoint's random state of another device is refused with a sentence instead of being set into the wrong
generator. References: numpy, Paddle's own generator draws, and Paddle's ``set_rng_state``."""
import numpy as np
import paddle
import pytest

from mtl.core import arrays
from mtl.core.runtime import on_host_generator
from mtl.headkit import class_rows
from mtl.store import checkpoint


def test_the_device_backward_scatters_target_terms_without_index_add(monkeypatch):
    """Root cause: Paddle's GPU ``index_add`` is an atomic add (``CudaAtomicAdd`` in phi's index_add_kernel.cu;
    with FLAGS_cudnn_deterministic it runs on one GPU thread). Rows that share a target class now write their own
    (class, row) entry of G' once; the gradients still match numpy's (float64, duplicated targets)."""
    from mtl.core.registry import plugin_class

    ArcFaceHead = plugin_class("head", "arcface")

    def refuse(*args, **kwargs):
        raise AssertionError("index_add_ in the margin head's device path")

    monkeypatch.setattr(paddle, "index_add_", refuse)
    monkeypatch.setattr(arrays, "HOST_PATHS", False)
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 4)
    paddle.set_default_dtype("float64")
    try:
        head = ArcFaceHead(num_classes=11, feature_size=5, scale=8.0, margin=[1.0, 0.3, 0.1], seed=3)
        rng = np.random.default_rng(4)
        x = rng.standard_normal((6, 5))
        y = np.array([2, 2, 7, 2, 10, 7])  # shared targets, in several chunks
        features = paddle.to_tensor(x, stop_gradient=False)
        head(features, paddle.to_tensor(y)).loss.backward()
        dx, dw = features.grad.numpy(), head.weight.grad.numpy()
        ref_dx, ref_dw = _reference_gradients(x, y, head.weight.numpy(), 8.0, (1.0, 0.3, 0.1))
    finally:
        paddle.set_default_dtype("float32")
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-6, atol=1e-8)  # central differences: ~1e-9 accurate
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-6, atol=1e-8)


def _reference_gradients(x, y, w, scale, margin, eps=1e-6):
    """Central differences of the margin softmax cross-entropy in numpy (float64)."""
    m1, m2, m3 = margin

    def loss(x, w):
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        cos = xn @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
        target = cos[np.arange(len(y)), y]
        logits = cos.copy()
        logits[np.arange(len(y)), y] = np.cos(m1 * np.arccos(np.clip(target, -1, 1)) + m2) - m3
        logits *= scale
        logits -= logits.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])

    grads = []
    for array, other in ((x, w), (w, x)):
        grad = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            up, down = array.copy(), array.copy()
            up[index] += eps
            down[index] -= eps
            pair = (up, other) if array is x else (other, up), (down, other) if array is x else (other, down)
            grad[index] = (loss(*pair[0]) - loss(*pair[1])) / (2 * eps)
        grads.append(grad)
    return grads


class _Device:
    """``paddle.get_device`` / ``set_device`` of a process that runs on ``gpu:0``, and ``Layer.to`` recorded."""

    def __init__(self):
        self.current, self.moves, self.built_on = "gpu:0", [], None

    def get(self):
        return self.current

    def set(self, name):
        self.current = name

    def mover(self):
        """A stand-in for ``Layer.to`` that records the device."""
        def to(layer, device=None, **kwargs):
            self.moves.append(device)
            return layer
        return to


def test_weights_are_drawn_on_the_cpu_generator_then_moved(monkeypatch):
    """Root cause: Paddle's initializers draw from the current device's generator (mt19937 on the CPU, Philox on a
    GPU): one seed, two sets of weights. The layer is built with the CPU as the device and then moved; its weights
    equal a CPU build with the same seed."""
    device = _Device()
    monkeypatch.setattr(paddle, "get_device", device.get)
    monkeypatch.setattr(paddle, "set_device", device.set)
    monkeypatch.setattr(paddle.nn.Layer, "to", device.mover())

    def build():
        device.built_on = paddle.get_device()
        return paddle.nn.Linear(4, 3)

    paddle.seed(7)
    layer = on_host_generator(build)
    assert device.built_on == "cpu" and device.current == "gpu:0" and device.moves == ["gpu:0"]
    monkeypatch.undo()
    paddle.seed(7)
    reference = paddle.nn.Linear(4, 3)
    np.testing.assert_array_equal(layer.weight.numpy(), reference.weight.numpy())


def _draws():
    return paddle.rand([4]).numpy()


def test_a_cpu_checkpoints_random_state_resumes_the_same_draws():
    paddle.seed(3)
    _draws()
    state = checkpoint.random_state()
    expected = _draws()
    assert state["device"] == "cpu" and checkpoint.restore_random_state(state) is None
    np.testing.assert_array_equal(_draws(), expected)
    paddle.seed(11)
    assert checkpoint.restore_random_state({"paddle": state["paddle"]}) is None  # the format before the keys
    np.testing.assert_array_equal(_draws(), expected)


def test_a_gpu_checkpoints_random_state_is_not_set_into_the_cpu_generator():
    """Root cause: a GPU state is one ``GeneratorState`` per GPU of the machine, ``set_rng_state`` on the CPU takes
    exactly one (a ValueError), and one would be a CUDA generator's state. The CPU generator comes back from the
    file's ``cpu`` entry; the sentence says that the device generator keeps its seed."""
    paddle.seed(5)
    cpu_state = paddle.get_rng_state("cpu")
    expected = _draws()
    gpu_like = paddle.get_rng_state() * 2  # stands in for the states of a 2-GPU machine
    with pytest.raises(ValueError, match="Length of cpu state list should be equal to 1"):
        paddle.set_rng_state(gpu_like)
    paddle.seed(9)
    note = checkpoint.restore_random_state({"device": "gpu", "index": 1, "paddle": gpu_like, "cpu": cpu_state})
    assert note.startswith("the checkpoint's random state is a gpu generator's and this process runs on cpu")
    np.testing.assert_array_equal(_draws(), expected)


def test_on_a_gpu_the_saving_ranks_generator_goes_to_this_processs_gpu(monkeypatch):
    """A checkpoint of a 4-GPU machine resumed by a process on gpu:1 of a 2-GPU machine: the state of the GPU the
    saving rank used (its ``index``) replaces this process's own; a CPU checkpoint there keeps the seed."""
    states = {"current": ["own0", "own1"], "set": None}
    monkeypatch.setattr(paddle, "get_device", lambda: "gpu:1")
    monkeypatch.setattr(paddle, "get_rng_state", lambda device=None: list(states["current"]))
    monkeypatch.setattr(paddle, "set_rng_state", lambda s, device=None: states.update(set=(list(s), device)))
    saved = {"device": "gpu", "index": 3, "paddle": ["g0", "g1", "g2", "g3"], "cpu": ["c"]}
    assert checkpoint.restore_random_state(saved) is None
    assert states["set"] == (["own0", "g3"], None)
    note = checkpoint.restore_random_state({"paddle": ["c"]})
    assert "is a cpu generator's and this process runs on gpu" in note and states["set"] == (["c"], "cpu")
