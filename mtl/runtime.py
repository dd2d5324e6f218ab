"""Process set-up: intra-op threads, device selection and the collective process group."""
import os

from mtl.errors import ConfigError


def local_process_count() -> int:
    """Processes of this job on this machine (from the launcher's environment; 1 without it)."""
    for var in ("PADDLE_LOCAL_SIZE", "PADDLE_NPROC_PER_NODE"):
        if os.environ.get(var, "").isdigit():
            return max(1, int(os.environ[var]))
    endpoints = os.environ.get("PADDLE_TRAINER_ENDPOINTS")
    current = os.environ.get("PADDLE_CURRENT_ENDPOINT")
    if endpoints and current:
        host = current.split(":")[0]
        return max(1, sum(1 for e in endpoints.split(",") if e.split(":")[0] == host))
    return 1


def set_threads(threads=None):
    """Set the intra-op thread count before Paddle starts its pool: ``threads`` or cores / local processes.

    Must run before ``import paddle``. A user's own OMP_NUM_THREADS wins over the default (not over ``threads``).
    """
    if threads is None:
        if "OMP_NUM_THREADS" in os.environ:
            return int(os.environ["OMP_NUM_THREADS"])
        threads = max(1, (os.cpu_count() or 1) // local_process_count())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    return threads


def tune_malloc():
    """Keep freed memory in the process instead of returning it to the OS (glibc only; no-op elsewhere).

    Paddle on CPU allocates and frees large buffers every step; with glibc's defaults each one is a fresh mmap and
    costs page faults. ``mallopt(M_MMAP_MAX, 0)`` and a 1 GiB ``M_TRIM_THRESHOLD`` make them reuse the heap:
    a 100k-class ArcFace step (D=128, B=128) went from 0.57-0.79 s to 0.46 s here. The price is resident memory:
    freed buffers stay in the process, so the head's peak RSS measured 1.7-2x higher (bench/bench_margin_head.py).
    ``tune_malloc: false`` in the job turns it off. Returns True when applied.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4
        return bool(libc.mallopt(m_trim_threshold, 1 << 30)) and bool(libc.mallopt(m_mmap_max, 0))
    except (OSError, AttributeError):
        return False


def select_device(device: str, source=None) -> str:
    """Resolve ``auto|cpu|gpu`` to a Paddle device string and set it; gpu on a CPU build is a ConfigError."""
    import paddle

    has_cuda = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_cuda:
        raise ConfigError("device 'gpu' was asked for, but this Paddle build has no CUDA device; use 'auto' or "
                          "'cpu'", source, "device")
    if device == "auto":
        device = "gpu" if has_cuda else "cpu"
    name = f"gpu:{int(os.environ.get('FLAGS_selected_gpus', os.environ.get('PADDLE_LOCAL_RANK', 0)) or 0)}" \
        if device == "gpu" else "cpu"
    paddle.set_device(name)
    return name


def init_distributed():
    """Start the collective process group when launched with more than one process; return (rank, world)."""
    import paddle.distributed as dist

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if world > 1 and not dist.is_initialized():
        from paddle.distributed import fleet

        fleet.init(is_collective=True)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ---- a quiet console -------------------------------------------------------------------------------------------
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
