"""Small array helpers every layer shares: numpy views of tensors, unit rows, the norm floor, the host switch.

``host_view`` / ``on_host``: numpy on the memory of CPU tensors, which the margin head's chunk passes and the
row-sparse update use where Paddle's CPU kernels are slow (``docs/paddle-notes.md``); ``HOST_PATHS`` turns every such
host path off at once (Paddle ops everywhere, as on a device). ``NORM_FLOOR``: a row's L2 norm is floored at 1e-12
wherever rows are normalised, as ``paddle.nn.functional.normalize`` does.
"""
import sys

import numpy as np

NORM_FLOOR = 1e-12
NORM_FLOOR_SQUARED = NORM_FLOOR * NORM_FLOOR
HOST_PATHS = True  # CPU tensors: the margin head's passes and the row-sparse update in numpy; False: Paddle ops


def to_numpy(x) -> np.ndarray:
    """A numpy array from a Paddle tensor (copied to the host; bfloat16/float16 as float32) or from anything
    array-like."""
    paddle = sys.modules.get("paddle")
    if paddle is not None and isinstance(x, paddle.Tensor):
        if x.dtype in (paddle.bfloat16, paddle.float16):  # bfloat16's .numpy() is its uint16 bit patterns
            x = x.astype("float32")
        return x.numpy()
    return np.asarray(x)


def host_floats(values) -> list:
    """``values`` (tensors of one element, or numbers) as Python floats, the tensors read in one host transfer: each
    ``float(tensor)`` of a device tensor is a synchronisation of its own (the CPU waits for the GPU every time).
    Exact: float32 and float64 values pass through float64 unchanged."""
    values = list(values)
    paddle = sys.modules.get("paddle")
    positions = [i for i, v in enumerate(values) if paddle is not None and isinstance(v, paddle.Tensor)]
    if positions:
        read = paddle.stack([values[i].reshape([]).astype("float64") for i in positions]).numpy()
        for i, value in zip(positions, read):
            values[i] = value
    return [float(v) for v in values]


def tensor_from(data, dtype=None):
    """A new tensor on the current device holding ``data`` (a numpy array, a list or a number; ``dtype`` a numpy
    dtype name), without ``paddle.to_tensor``: in Paddle 3.3 every tensor built from host data by the Tensor
    constructor (``to_tensor``, ``paddle.Tensor(array)``, dlpack) keeps 64-112 bytes of Python objects for good, which
    a training step that converts a few small arrays each step turns into a steady growth (bench/bench_soak.py). An
    empty tensor with the array's values set into it keeps nothing, and takes no longer (8.9 us against 10.3 us for
    33 floats here)."""
    import paddle

    array = np.asarray(data, dtype=dtype)
    if array.ndim == 0:  # (paddle.empty([]) has shape [1])
        return paddle.full([], array.item(), dtype=str(array.dtype))
    tensor = paddle.empty(list(array.shape), dtype=str(array.dtype))
    if array.size:
        tensor.set_value(np.ascontiguousarray(array))
    return tensor


def unit_rows(x) -> np.ndarray:
    """Rows of ``x`` scaled to unit L2 norm, ``x / max(||x||, NORM_FLOOR)``, in float64 unless ``x`` is float32."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        x = x.astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), NORM_FLOOR).astype(x.dtype)


def host_view(tensor) -> np.ndarray:
    """A numpy array sharing the memory of a dense CPU tensor (writes go to the tensor; no copy)."""
    return np.from_dlpack(tensor.detach())


def on_host(tensor) -> bool:
    """Whether the host paths take ``tensor``: ``HOST_PATHS`` is on and it is a float32/float64 tensor on the CPU
    (numpy has no bfloat16)."""
    import paddle

    return HOST_PATHS and tensor.place.is_cpu_place() and tensor.dtype in (paddle.float32, paddle.float64)


def load_problem(exc: Exception) -> str:
    """Why ``np.load(..., allow_pickle=False)`` refused a file, in words for the user: numpy's own message for a
    pickle advises loading it unsafely, which a file from elsewhere must never be."""
    text = " ".join(str(exc).split())
    if "pickle" in text.lower() or "object arrays" in text.lower():
        return "it holds pickled Python objects, which are never loaded: their code could run"
    return text[:120]
