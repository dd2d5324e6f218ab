"""A module imported on first use (``sklearn.metrics`` and friends: the references of a few tests), so that collecting
the suite, which every pytest-xdist worker does, does not import scikit-learn and SciPy (1.8 s a worker)."""
import importlib


class LazyModule:
    """``LazyModule("sklearn.metrics").roc_curve`` imports ``sklearn.metrics`` at that first attribute."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attribute):
        return getattr(importlib.import_module(self._name), attribute)
