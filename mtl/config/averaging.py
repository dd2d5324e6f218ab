"""The ``averaging`` section of a job: which keys each averager type takes, checked when the job loads.

The averagers themselves are :mod:`mtl.train.averaging`; this module only knows their keys, so that a wrong one
is refused before anything (Paddle included) starts.
"""
from collections.abc import Mapping

from mtl.core.errors import ConfigError

COMMON_KEYS = ("offload", "average_batchnorm")
KEYS = {
    "window": ("average_window_rate", "min_average_window", "max_average_window") + COMMON_KEYS,
    "ema": ("decay", "warmup", "bias_correction") + COMMON_KEYS,
}
REQUIRED = {"window": ("average_window_rate",), "ema": ()}


def averaging_options(cfg, source=None, key="averaging"):
    """``(kind, options)`` of an ``averaging`` mapping, its keys checked against its type (None values dropped).

    ``cfg`` None, ``{}`` without a type, or ``{type: none}`` means no averaging (kind ``"none"``). An unknown type or
    key, a key of another type or a missing required key raises ``ConfigError`` naming ``averaging.<key>``.
    """
    if cfg is None:
        return "none", {}
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a mapping with a 'type' (window, ema or none), got {type(cfg).__name__}",
                          source, key)
    options = {k: v for k, v in cfg.items() if v is not None or k == "type"}
    if "type" not in options and options:
        raise ConfigError("required when other averaging keys are given (window, ema or none)", source,
                          f"{key}.type")
    kind = options.pop("type", "none")
    kind = "none" if kind is None else kind
    known = {k for keys in KEYS.values() for k in keys}
    if kind == "none":  # the other keys may stay (so `--set averaging.type=none` switches a job off) but must exist
        unknown = sorted(k for k in options if k not in known)
        if unknown:
            raise ConfigError(f"unknown averaging key; known keys: {', '.join(sorted(known))}", source,
                              f"{key}.{unknown[0]}")
        return "none", {}
    if kind not in KEYS:
        raise ConfigError(f"unknown averager type {kind!r}; expected one of window, ema, none", source, f"{key}.type")
    allowed = KEYS[kind]
    for name in options:
        if name not in allowed:
            raise ConfigError(f"unknown key for type {kind}; allowed keys: {', '.join(allowed)}", source,
                              f"{key}.{name}")
    for name in REQUIRED[kind]:
        if name not in options:
            raise ConfigError(f"required for type {kind}", source, f"{key}.{name}")
    if options.get("offload") in ("none", "None"):
        options["offload"] = None
    return kind, options


def check_averaging(cfg, source=None, key="averaging"):
    """Load-time check of a validated ``averaging`` section (the schema's hook): keys fit the type."""
    averaging_options(cfg, source, key)
