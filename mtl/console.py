"""A quiet console: Paddle's start-up and glog noise silenced at the source, before Paddle is imported.

Nothing here is about the user's job; ``--verbose`` (``MTL_VERBOSE=1``) shows everything again.
"""
import os

# Paddle's own start-up and graph-compiler noise, none of it about the user's job. Each entry names the warning's text
# and the Paddle module that raises it, so that a warning of ours (or any other) with a similar text still shows.
PADDLE_WARNINGS = (
    # paddle.utils.cpp_extension looks for ccache on import, for compiling custom operators we never compile
    (r"No ccache found", r"paddle\.utils\.cpp_extension"),
    # paddle.to_tensor on a tensor the DataLoader already made: the copy is what we want
    (r"To copy construct from a tensor", r"paddle\.tensor\.creation"),
    # BatchNorm's reminder of its (documented) training-mode statistics
    (r"When training, we now always track global mean and variance", r"paddle\.nn\.layer\.norm"),
)
# Printed (not warned) by ``paddle.base.__bootstrap__`` on import whenever OMP_NUM_THREADS > 1, which we set on purpose.
PADDLE_STDERR_LINES = ("WARNING: OMP_NUM_THREADS set to ", "PLEASE USE OMP_NUM_THREADS WISELY.")
# glog: 0 INFO, 1 WARNING, 2 ERROR. Paddle's INFO/WARNING lines are its executor's ("New Executor is Running",
# "pir interpreter is running by multi-thread mode", "PIR not support input out tensor"); errors still show.
QUIET_ENV = {"GLOG_minloglevel": "2", "GLOG_v": "0"}


class _DropLines:
    """A stand-in for ``sys.stderr`` that drops whole ``print`` calls starting with one of ``prefixes``.

    ``print(text, file=stream)`` writes ``text`` and then ``"\\n"``: a dropped text also drops the newline after it.
    Everything else (tqdm's carriage-return updates included) goes straight through, unbuffered.
    """

    def __init__(self, stream, prefixes):
        self._stream = stream
        self._prefixes = tuple(prefixes)
        self._drop_newline = False

    def write(self, text):
        """Write ``text`` unless it is one of the dropped lines (or the newline that ends one)."""
        if self._drop_newline and text == "\n":
            self._drop_newline = False
            return len(text)
        self._drop_newline = False
        if text.startswith(self._prefixes):
            self._drop_newline = not text.endswith("\n")
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def configure_console(verbose=False):
    """Quiet by default: silence Paddle's start-up and glog noise at the source, before Paddle is imported.

    Sets the glog level (a user's own ``GLOG_*`` variables win), adds precise warning filters (message and module,
    never a blanket ignore) and drops Paddle's OMP_NUM_THREADS notice from stderr. ``verbose=True`` (``--verbose``)
    changes nothing, so everything shows; it is passed on to child processes as ``MTL_VERBOSE=1``.
    Returns True when the console was quietened.
    """
    import sys
    import warnings

    if verbose or os.environ.get("MTL_VERBOSE") == "1":
        os.environ["MTL_VERBOSE"] = "1"
        return False
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for message, module in PADDLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning, module=module)
    if not isinstance(sys.stderr, _DropLines) and "paddle" not in sys.modules:
        sys.stderr = _DropLines(sys.stderr, PADDLE_STDERR_LINES)
    return True
