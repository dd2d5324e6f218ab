"""mtl: multi-task learning on one backbone with model-parallel heads, on PaddlePaddle.

``build_reader``, ``build_backbone`` and ``build_head`` build a registered component from its config dict
(``{"type": name, ...params}``); the built-in plug-ins are loaded on first use.
"""

import logging

__version__ = "0.1.0"

# A library's logger stays silent until the application gives it a handler (training: the run's log files,
# mtl.train.reporting). Without this, Python's last-resort handler printed every warning a second time next to the
# "warning: ..." line a tool already prints for the user.
logging.getLogger("mtl").addHandler(logging.NullHandler())


def _build(kind, cfg, **context):
    from mtl.core import registry

    registry.load_all()
    return registry.build(kind, cfg, **context)


def build_reader(cfg, **context):
    """Build a reader from ``{"type": name, ...params}`` (context such as ``split`` may be passed as keywords)."""
    return _build("reader", cfg, **context)


def build_backbone(cfg, **context):
    """Build a backbone from ``{"type": name, ...params}``."""
    return _build("backbone", cfg, **context)


def build_head(cfg, **context):
    """Build a head from ``{"type": name, ...params}`` (``feature_size`` and ``num_classes`` may come as keywords)."""
    return _build("head", cfg, **context)
