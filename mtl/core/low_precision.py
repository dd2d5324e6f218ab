"""Weights and features in bfloat16/float16 outside training (``amp_level: O2`` casts the backbone's weights):
running such a layer, reading its outputs as numbers, and writing and reading its state in float32.

Training's mixed precision (autocast of the step, the loss scaler) is :mod:`mtl.train.precision`; this module is
what evaluation, export and checkpoints share with it, below all of them.
"""
import contextlib


def low_precision_dtype(layer):
    """``'bfloat16'`` / ``'float16'`` when ``layer`` holds parameters of that dtype (``amp_level`` O2 casts the
    backbone's weights, BatchNorm's excepted), else None."""
    import paddle

    names = {paddle.bfloat16: "bfloat16", paddle.float16: "float16"}
    return next((names[p.dtype] for p in layer.parameters() if p.dtype in names), None)


def inference_autocast(layer):
    """The context to run ``layer`` in outside training: ``auto_cast`` O2 in the low precision of its weights when it
    has some (O2: a float32 input next to bfloat16 weights fails in the kernels), else nothing. Heads, margins and
    numpy never see the result: :func:`float32` it first."""
    dtype = low_precision_dtype(layer)
    if dtype is None:
        return contextlib.nullcontext()
    import paddle

    return paddle.amp.auto_cast(enable=True, level="O2", dtype=dtype)


def float32(tensor):
    """``tensor`` in float32 when it is bfloat16/float16 (``.numpy()`` of a bfloat16 tensor returns its uint16 bit
    patterns, which numpy would read as numbers), else unchanged."""
    import paddle

    return tensor.astype("float32") if tensor.dtype in (paddle.bfloat16, paddle.float16) else tensor


def portable_state(state: dict) -> dict:
    """A state dict to write to a file: low-precision tensors as float32 (exact), so that export, evaluation and a
    resume in any precision read float32 weights; the rest unchanged (float64 stays float64)."""
    import paddle

    return {k: float32(v) if isinstance(v, paddle.Tensor) else v for k, v in state.items()}


def state_for(layer, state: dict) -> dict:
    """``state`` (tensors or the numpy arrays of :mod:`mtl.core.safe_pickle`) with every entry cast to the dtype of
    ``layer``'s own entry of the same key (``set_state_dict`` refuses another dtype: "Variable dtype not match"):
    float32 files into an O2 (bfloat16) backbone, and the bfloat16 files older O2 checkpoints hold (their uint16 bit
    patterns, as a numpy array) into a float32 one."""
    import numpy as np
    import paddle

    own = layer.state_dict()
    out = {}
    for key, value in state.items():
        target = own.get(key)
        if target is not None and isinstance(value, np.ndarray):
            if value.dtype == np.uint16 and target.dtype != paddle.uint16:  # bfloat16 bits
                value = (value.astype(np.uint32) << 16).view(np.float32)
            value = paddle.to_tensor(value)
        if target is not None and isinstance(value, paddle.Tensor) and value.dtype != target.dtype:
            value = value.astype(target.dtype)
        out[key] = value
    return out
