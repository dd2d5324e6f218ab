"""Counting device-to-host synchronisations: every way a Paddle tensor's value reaches Python.

On a GPU each of ``Tensor.numpy()``, ``.item()``, ``.tolist()``, ``np.asarray(t)``, ``float(t)``, ``int(t)``,
``bool(t)`` (``if t:``) and ``operator.index(t)`` copies device memory to the host and waits for every kernel queued
before it: the CPU stops running ahead of the GPU. :class:`HostSyncCounter` wraps those methods of ``paddle.Tensor``
(the outermost call only: ``float(t)`` calls ``np.array(t)`` inside) and records where each call came from, so that a
test can hold a training step to a budget on any device. ``np.from_dlpack`` (the host paths on CPU tensors) is not a
conversion of a device tensor and is not counted.
"""
import collections
import os
import traceback

import paddle

METHODS = ("numpy", "item", "tolist", "__array__", "__float__", "__int__", "__index__", "__bool__", "__nonzero__",
           "__complex__")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class HostSyncCounter:
    """``with HostSyncCounter() as syncs:`` counts the conversions above in the block; ``syncs.count`` and
    ``syncs.sites`` (``{"file:line function": count}`` of the project's frame that asked)."""

    def __init__(self):
        self.count = 0
        self.sites = collections.Counter()
        self._depth = 0
        self._saved = {}

    def _wrap(self, name, original):
        counter = self

        def wrapped(tensor, *args, **kwargs):
            if counter._depth == 0:
                counter.count += 1
                counter.sites[_caller()] += 1
            counter._depth += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                counter._depth -= 1

        wrapped.__name__ = name
        return wrapped

    def __enter__(self):
        for name in METHODS:
            original = getattr(paddle.Tensor, name, None)
            if original is not None:
                self._saved[name] = original
                setattr(paddle.Tensor, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(paddle.Tensor, name, original)
        self._saved = {}
        return False

    def reset(self):
        """Start counting from zero again."""
        self.count = 0
        self.sites = collections.Counter()


def _caller() -> str:
    """``path:line function`` of the innermost frame of this repository (outside this file) that converted."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(ROOT) and os.path.abspath(frame.filename) != os.path.abspath(__file__):
            return f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno} {frame.name}"
    return "outside the repository"
