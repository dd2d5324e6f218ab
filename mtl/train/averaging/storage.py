"""Where an averager keeps its sums: next to the parameter (Paddle tensors) or in host memory (numpy arrays).

Both stores expose the same handful of operations, so the averaging math is written once. Sums are float32 for
float16, bfloat16 and float32 parameters (float64 for float64 ones): low-precision weights are accumulated in
float32 and cast back to their own dtype only when written into the parameter.
"""
import numpy as np
import paddle

from mtl.core.arrays import to_numpy

FLOAT_DTYPES = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def is_floating(tensor) -> bool:
    """True for the floating dtypes an averager can average."""
    return tensor.dtype in FLOAT_DTYPES


def accumulation_dtype(param) -> str:
    """Dtype of the sums of ``param``: float64 for float64 parameters, float32 for every other floating dtype."""
    return "float64" if param.dtype == paddle.float64 else "float32"


def nbytes(value) -> int:
    """Bytes held by one stored array (a Paddle tensor or a numpy array); 0 for None."""
    if value is None:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return int(np.prod(value.shape)) * value.element_size()


class DeviceStore:
    """Sums are Paddle tensors on the parameter's own place; the restore copy is a clone on that place."""

    host = False

    def copy(self, param):
        """A new accumulation-dtype copy of the live value of ``param``."""
        dtype = accumulation_dtype(param)
        return param.detach().clone() if param.dtype == getattr(paddle, dtype) else param.detach().astype(dtype)

    def zeros(self, param):
        """A new zero array shaped like ``param``."""
        return paddle.zeros_like(param.detach(), dtype=accumulation_dtype(param))

    def add_param_(self, acc, param):
        """``acc += param`` in place (cast to the accumulation dtype first)."""
        value = param if param.dtype == acc.dtype else param.astype(acc.dtype)
        acc.add_(value)
        return acc

    def add_(self, acc, other):
        """``acc += other`` in place."""
        acc.add_(other)
        return acc

    def zero_(self, acc):
        """``acc = 0`` in place."""
        acc.zero_()
        return acc

    def blend_factors(self, decay, dtype):
        """``(a, b)`` that ``blend_param_`` really applies, ``acc = a * acc + b * param``, as exact Python floats.

        The scalars are rounded to the accumulation dtype, so ``a + b`` is not exactly 1; an EMA divides by the
        running sum of these weights to cancel that drift.
        """
        ratio, weight = np.dtype(dtype).type(decay / (1.0 - decay)), np.dtype(dtype).type(1.0 - decay)
        return float(ratio) * float(weight), float(weight)

    def blend_param_(self, acc, param, decay):
        """``acc = decay * acc + (1 - decay) * param`` in place, for ``0 <= decay < 1``.

        Written as ``(1 - decay) * (acc * decay / (1 - decay) + param)``: three in-place kernels and no temporary
        (Paddle's ``lerp_`` and ``add_(alpha=)`` are 10-20x slower than ``add_`` on CPU).
        """
        value = param if param.dtype == acc.dtype else param.astype(acc.dtype)
        acc.scale_(decay / (1.0 - decay)).add_(value).scale_(1.0 - decay)
        return acc

    def divide(self, acc, denominator):
        """``acc / denominator`` as a new array (an IEEE division, as Paddle's own apply does)."""
        return acc / float(denominator)  # Paddle divides by a Python scalar (no reciprocal), on acc's own place

    def total(self, arrays):
        """Sum of the non-None arrays, left to right, as a new array."""
        arrays = [a for a in arrays if a is not None]
        out = arrays[0].clone()
        for a in arrays[1:]:
            out = out + a
        return out

    def write_(self, param, value):
        """Copy ``value`` into ``param`` in place, cast to the parameter's dtype."""
        param.copy_(value if value.dtype == param.dtype else value.astype(param.dtype), True)

    def backup(self, param):
        """A copy of the live value of ``param`` (same dtype), kept until restore."""
        return param.detach().clone()

    def restore_(self, param, saved):
        """Copy a backup made by ``backup`` back into ``param``."""
        param.copy_(saved, True)

    def load(self, value, param):
        """A stored array of ``param`` made from a saved one (numpy array or tensor on any place)."""
        array = to_numpy(value).astype(accumulation_dtype(param), copy=False)
        return paddle.to_tensor(array, place=param.place)


class HostStore(DeviceStore):
    """Sums are numpy arrays in host memory; the restore copy made by ``apply()`` is a numpy array too.

    The device then holds no extra copy of any parameter; each ``step()`` moves the live weights to the host.
    """

    host = True

    def copy(self, param):
        return param.detach().astype(accumulation_dtype(param)).numpy()

    def zeros(self, param):
        return np.zeros(param.shape, dtype=accumulation_dtype(param))

    def add_param_(self, acc, param):
        acc += param.detach().astype(accumulation_dtype(param)).numpy()
        return acc

    def add_(self, acc, other):
        acc += other
        return acc

    def zero_(self, acc):
        acc[...] = 0
        return acc

    def blend_factors(self, decay, dtype):
        return float(np.dtype(dtype).type(decay)), float(np.dtype(dtype).type(1.0 - decay))

    def blend_param_(self, acc, param, decay):
        value = param.detach().astype(accumulation_dtype(param)).numpy()
        value *= acc.dtype.type(1.0 - decay)
        acc *= acc.dtype.type(decay)
        acc += value
        return acc

    def divide(self, acc, denominator):
        return acc / acc.dtype.type(denominator)

    def total(self, arrays):
        arrays = [a for a in arrays if a is not None]
        out = arrays[0].copy()
        for a in arrays[1:]:
            out += a
        return out

    def write_(self, param, value):
        tensor = paddle.to_tensor(value, place=param.place)
        DeviceStore.write_(self, param, tensor)

    def backup(self, param):
        return param.numpy()  # a host copy; bfloat16 comes back as its uint16 bit pattern, which set_value accepts

    def restore_(self, param, saved):
        param.set_value(saved)

    def load(self, value, param):
        return np.array(to_numpy(value), dtype=accumulation_dtype(param))
