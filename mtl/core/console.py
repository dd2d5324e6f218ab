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
    # fleet.init builds every group of its (pipeline, model, sharding) topology, also those of other ranks
    (r"Current global rank \d+ is not in group _default_pg", r"paddle\.distributed\.communication\.group"),
)
# Printed (not warned) by ``paddle.base.__bootstrap__`` on import whenever OMP_NUM_THREADS > 1, which we set on purpose.
PADDLE_STDERR_LINES = ("WARNING: OMP_NUM_THREADS set to ", "PLEASE USE OMP_NUM_THREADS WISELY.")
# Written to sys.stderr by ``paddle.distributed.init_parallel_env`` (fleet.init): a header line, one ``FLAGS(...)``
# line per flag whose value differs from its default (Paddle sets some itself), a closing line of "=".
PADDLE_STDERR_BLOCK = ("=" * 23 + " Modified FLAGS detected", "FLAGS(", "=" * 71)
# glog: 0 INFO, 1 WARNING, 2 ERROR. Paddle's INFO/WARNING lines are its executor's ("New Executor is Running",
# "pir interpreter is running by multi-thread mode", "PIR not support input out tensor"); errors still show.
# OpenCV's own log: "[ WARN:0@0.2] global grfmt_png.cpp ..." lines about an image that our decoder reports itself.
QUIET_ENV = {"GLOG_minloglevel": "2", "GLOG_v": "0", "OPENCV_LOG_LEVEL": "OFF"}
# Paddle's fleet logger (``paddle.distributed.fleet.utils.log_util``): "distributed strategy initialized" and the
# topology lines of fleet.init ("Total 2 pipe comm group(s) create successfully!", "HybridParallelInfo: ...").
FLEET_LOG_LEVEL = "WARNING"


class _DropLines:
    """A stand-in for ``sys.stderr`` that drops whole ``print`` calls starting with one of ``prefixes``.

    ``print(text, file=stream)`` writes ``text`` and then ``"\\n"``: a dropped text also drops the newline after it.
    Everything else (tqdm's carriage-return updates included) goes straight through, unbuffered.
    """

    def __init__(self, stream, prefixes, block=None):
        self._stream = stream
        self._prefixes = tuple(prefixes)
        self._block = block  # (first line, inner lines, last line) of a block written piece by piece
        self._drop_newline = False
        self._in_block = False

    def write(self, text):
        """Write ``text`` unless it is one of the dropped lines (or the newline that ends one)."""
        if self._drop_newline and text == "\n":
            self._drop_newline = False
            return len(text)
        self._drop_newline = False
        if self._dropped_block_part(text) or text.startswith(self._prefixes):
            self._drop_newline = not text.endswith("\n")
            return len(text)
        return self._stream.write(text)

    def _dropped_block_part(self, text) -> bool:
        """True for a piece of the block: its first line, an inner line, or its last line (which ends it). Anything
        else ends the block and is written, so an unexpected format never hides other output."""
        if self._block is None:
            return False
        first, inner, last = self._block
        if text.startswith(first):
            self._in_block = True
        elif self._in_block and not text.startswith((inner, last)):
            self._in_block = False
        elif self._in_block and text.startswith(last):
            self._in_block = False
            return True
        return self._in_block

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
        sys.stderr = _DropLines(sys.stderr, PADDLE_STDERR_LINES, PADDLE_STDERR_BLOCK)
    quiet_matplotlib()
    return True


def fleet_log_level() -> str:
    """The ``log_level`` to give ``fleet.init`` (its documented parameter; it sets Paddle's fleet logger, whose
    start-up INFO lines are not about the user's job): warnings and errors only, INFO with ``--verbose``."""
    return "INFO" if os.environ.get("MTL_VERBOSE") == "1" else FLEET_LOG_LEVEL


# the launcher's module: Paddle's own, or ``mtl launch``'s entry to it (mtl.commands.launcher_entry)
LAUNCHERS = (b"paddle.distributed.launch", b"mtl.commands.launcher_entry")


def launcher_pid():
    """The pid of the ``paddle.distributed.launch`` process that started this one (its parent), or None."""
    if "PADDLE_LOG_DIR" not in os.environ or "PADDLE_TRAINER_ID" not in os.environ:  # set by the launcher
        return None
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            command = f.read()
        return parent if any(name in command for name in LAUNCHERS) else None
    except OSError:  # no /proc (not Linux) or the parent is gone
        return None


def _launcher_copies_my_log(pid) -> bool:
    """True while the launcher ``pid`` still reads this worker's log file (it opens it read-only and copies rank 0's
    lines to its console; a signalled launcher closes that file first, before it signals the workers)."""
    try:
        mine, fds = os.readlink("/proc/self/fd/2"), os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != mine:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):  # closed meanwhile
            continue
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return True
    return False


def to_launcher_console(line) -> bool:
    """Under ``paddle.distributed.launch``, write ``line`` (on a line of its own) to the launcher's stderr when the
    launcher no longer copies this worker's log to its console: a launcher stopped by Ctrl-C or SIGTERM closes the
    worker logs first, so the sentence a worker ends with would otherwise be only in ``workerlog.N``. Linux only
    (``/proc``); call it on rank 0. Returns True when written."""
    pid = launcher_pid()
    if pid is None or _launcher_copies_my_log(pid):
        return False
    try:
        with open(f"/proc/{pid}/fd/2", "a") as console:  # append: a redirected log file is not overwritten
            console.write(f"\n{line}\n")  # "\n" first: the launcher stopped mid progress bar
        return True
    except OSError:
        return False


# set by ``mtl launch`` for its workers: the command line it was started with, and a file it writes the name of the
# signal it was stopped by into, before it passes the stop on to the launcher (which signals the workers SIGTERM)
LAUNCH_COMMAND_ENV = "MTL_LAUNCH_COMMAND"
LAUNCH_SIGNAL_ENV = "MTL_LAUNCH_SIGNAL"


def launch_command():
    """The command line of the launcher that started this worker: ``mtl launch ...`` as it was typed (from
    ``mtl launch``), else the ``python -m paddle.distributed.launch ...`` of the parent process (Linux); None when
    this process was not started by a launcher (or it cannot be told)."""
    import shlex

    if os.environ.get(LAUNCH_COMMAND_ENV):
        return os.environ[LAUNCH_COMMAND_ENV]
    pid = launcher_pid()
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode() for w in f.read().split(b"\0") if w]
    except OSError:
        return None
    if words[1:3] != ["-m", "paddle.distributed.launch"]:
        return None
    return shlex.join(["python", *words[1:]])


def launch_signal():
    """The name of the signal ``mtl launch`` was stopped by (``SIGINT`` for a Ctrl-C), which its launcher passed on
    to this worker as SIGTERM; None outside ``mtl launch`` or before it was signalled."""
    path = os.environ.get(LAUNCH_SIGNAL_ENV)
    try:
        with open(path) as f:
            return f.read().strip() or None
    except (OSError, TypeError):
        return None


class NativeOutput:
    """While entered, what native code writes to this process's file descriptors 1 and 2 (stdout, stderr) goes to
    a temporary file instead (Python's own streams are flushed first); ``text`` holds it afterwards, so that a
    caller can show it when the native call failed. ``MTL_VERBOSE=1``: nothing is captured."""

    def __init__(self):
        self.text = ""
        self._saved = None

    def __enter__(self):
        import sys
        import tempfile

        if os.environ.get("MTL_VERBOSE") == "1":
            return self
        sys.stdout.flush()
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = [os.dup(1), os.dup(2)]
        for fd in (1, 2):
            os.dup2(self._file.fileno(), fd)
        return self

    def __exit__(self, *exc):
        if self._saved is None:
            return False
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()
        self._saved = None
        return False


FONT_CACHE_NOTICE = "Matplotlib is building the font cache"


def quiet_matplotlib():
    """Drop matplotlib's one-time "building the font cache" notice (a first plot on a fresh machine), nothing else."""
    import logging

    logger = logging.getLogger("matplotlib.font_manager")
    if not any(isinstance(f, _FontCacheFilter) for f in logger.filters):
        logger.addFilter(_FontCacheFilter())


class _FontCacheFilter:
    """A logging filter that drops the records of :data:`FONT_CACHE_NOTICE`."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(FONT_CACHE_NOTICE)
