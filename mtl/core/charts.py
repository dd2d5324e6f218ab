"""Where a chart the user names can be written: checked before anything is read or trained, so that a typo in a
``--plot`` or ``--sheet`` path is one sentence, not a traceback from matplotlib after the work is done."""
import os

from mtl.core.errors import ConfigError

# the file types matplotlib's Agg canvas writes, by extension
CHART_TYPES = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")


def check_chart_path(path: str, key: str):
    """ConfigError (``key``, the option that gave ``path``) when a chart cannot be written at ``path``: a folder, a
    missing parent folder, a file type matplotlib does not write."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"'{path}' is a folder; name the chart's file (e.g. {os.path.join(path, 'chart.png')})",
                          key=key)
    if not os.path.isdir(folder):
        raise ConfigError(f"cannot write '{path}': the folder '{folder}' does not exist", key=key)
    if os.path.splitext(path)[1].lower().lstrip(".") not in CHART_TYPES:
        raise ConfigError(f"'{path}' does not end in a chart type ({', '.join('.' + k for k in CHART_TYPES)})",
                          key=key)
