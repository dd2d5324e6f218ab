"""numpy on the memory of CPU tensors: the host paths of the margin head and the row-sparse update use it where
Paddle's CPU kernels are slow (``docs/paddle-notes.md``)."""
import numpy as np


def host_view(tensor) -> np.ndarray:
    """A numpy array sharing the memory of a dense CPU tensor (writes go to the tensor; no copy)."""
    return np.from_dlpack(tensor.detach())


def on_host(tensor) -> bool:
    """Whether numpy can work on ``tensor``'s memory: a float32/float64 tensor on the CPU (numpy has no bfloat16)."""
    import paddle

    return tensor.place.is_cpu_place() and tensor.dtype in (paddle.float32, paddle.float64)
