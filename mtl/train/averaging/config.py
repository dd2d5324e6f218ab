"""Build an averager from the job config's ``averaging`` section: ``{type: window | ema | none, ...}``."""
from mtl.config.averaging import averaging_options
from mtl.core.errors import ConfigError
from mtl.train.averaging.base import InvalidOption
from mtl.train.averaging.ema import EMA
from mtl.train.averaging.window import WindowAverage

KINDS = {"window": WindowAverage, "ema": EMA}


def build_averager(cfg, parameters, source=None, buffers=None):
    """The averager ``cfg`` describes over ``parameters`` (a Layer, ``named_parameters()`` or a dict), or None.

    See :func:`averaging_options` for ``cfg``; ``source`` (the config file) only goes into error messages. A bad value
    raises ``ConfigError`` naming ``averaging.<key>``.
    """
    kind, options = averaging_options(cfg, source)
    if kind == "none":
        return None
    try:
        return KINDS[kind](parameters, buffers=buffers, **options)
    except InvalidOption as error:
        raise ConfigError(str(error).split(": ", 1)[1], source, f"averaging.{error.key}") from None
