"""Build an averager from the job config's ``averaging`` section: ``{type: window | ema | none, ...}``."""
from collections.abc import Mapping

from mtl.errors import ConfigError
from mtl.train.averaging.base import InvalidOption
from mtl.train.averaging.ema import EMA
from mtl.train.averaging.window import ModelAverage

COMMON_KEYS = ("offload", "average_batchnorm")
KINDS = {
    "window": (ModelAverage, ("average_window_rate", "min_average_window", "max_average_window") + COMMON_KEYS),
    "ema": (EMA, ("decay", "warmup", "bias_correction") + COMMON_KEYS),
}
REQUIRED = {"window": ("average_window_rate",), "ema": ()}


def build_averager(cfg, parameters, source=None, buffers=None):
    """The averager ``cfg`` describes over ``parameters`` (a Layer, ``named_parameters()`` or a dict), or None.

    ``cfg`` None, ``{}`` without a type, or ``{type: none}`` means no averaging. ``source`` (the config file)
    only goes into error messages. An unknown type or key, a missing required key or a bad value raises
    ``ConfigError`` naming ``averaging.<key>``.
    """
    if cfg is None:
        return None
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a mapping with a 'type' (window, ema or none), got {type(cfg).__name__}",
                          source, "averaging")
    options = dict(cfg)
    if "type" not in options and options:
        raise ConfigError("required when other averaging keys are given (window, ema or none)", source,
                          "averaging.type")
    kind = options.pop("type", "none")
    kind = "none" if kind is None else kind
    if kind == "none":  # the other keys may stay (so `--set averaging.type=none` switches a job off) but must exist
        known = {key for _, keys in KINDS.values() for key in keys}
        for key in sorted(options):
            if key not in known:
                raise ConfigError(f"unknown averaging key; known keys: {', '.join(sorted(known))}", source,
                                  f"averaging.{key}")
        return None
    if kind not in KINDS:
        raise ConfigError(f"unknown averager type {kind!r}; expected one of window, ema, none", source,
                          "averaging.type")
    factory, allowed = KINDS[kind]
    for key in options:
        if key not in allowed:
            raise ConfigError(f"unknown key for type {kind}; allowed keys: {', '.join(allowed)}", source,
                              f"averaging.{key}")
    for key in REQUIRED[kind]:
        if key not in options:
            raise ConfigError(f"required for type {kind}", source, f"averaging.{key}")
    if options.get("offload") in ("none", "None"):
        options["offload"] = None
    try:
        return factory(parameters, buffers=buffers, **options)
    except InvalidOption as error:
        raise ConfigError(str(error).split(": ", 1)[1], source, f"averaging.{error.key}") from None
