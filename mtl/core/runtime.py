"""Process set-up and end: intra-op threads, device selection, the collective process group, a quick exit."""
import os
import sys

from mtl.core.errors import ConfigError


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


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_written = set()  # the thread variables set_threads set in this process (the others are the user's)


def user_environment() -> dict:
    """``os.environ`` without the thread variables :func:`set_threads` wrote: for a child process that sets its own
    from its job (its loader workers, its processes), as the user's shell would have started it."""
    return {k: v for k, v in os.environ.items() if k not in _written}


def set_threads(threads=None, blas_threads=None, loader_workers=0):
    """Set the intra-op thread counts before Paddle starts its pool; returns Paddle's.

    Paddle's OpenMP and MKL pool gets ``threads``, else a user's own OMP_NUM_THREADS, else the cores left after each
    process's ``loader_workers`` (DataLoader worker processes, a core each), split over the local processes, at least
    1. Why leave the workers their cores: the six face datasets' recipe (1 worker decoding images) trained 566-701
    samples/s with 2 threads on 2 cores, 861-880 with 1; a job reading from memory (no worker) 1.45x faster with 2.
    numpy's OpenBLAS (the CPU margin heads' chunk passes, :mod:`mtl.headkit.host_chunks`) gets ``blas_threads``, else
    a user's own OPENBLAS_NUM_THREADS, else 1. Why 1: Paddle's OpenMP threads spin for a while after each op
    (KMP_BLOCKTIME, 200 ms), so a second OpenBLAS thread finds its core taken. A joint step of a CNN and two ArcFace
    heads on 2 cores ran 1.3x faster with one BLAS thread at 2,000 classes, 1.1x at 100,000 and 1.2x at 1,000,000
    with Partial FC 0.1, the same on the six face datasets, and 1.1x slower at 1,000,000 classes of full softmax,
    where the chunk passes are nearly the whole step (``bench/bench_threads.py``). Must run before ``import paddle``;
    numpy reads its variable when it loads, so a numpy already loaded (the command line imports it) is limited
    through threadpoolctl.
    """
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if threads is None and omp.isdigit() and int(omp) > 0:
        threads = int(omp)
    else:
        local = local_process_count()
        threads = threads or max(1, ((os.cpu_count() or 1) - local * loader_workers) // local)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
            _written.add(var)
    if blas_threads is not None or not os.environ.get("OPENBLAS_NUM_THREADS", "").isdigit():
        os.environ["OPENBLAS_NUM_THREADS"] = str(blas_threads or 1)
        _written.add("OPENBLAS_NUM_THREADS")
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(int(os.environ["OPENBLAS_NUM_THREADS"]), user_api="blas")  # (lasts: not a `with`)
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


def gpu_index(environ=None) -> int:
    """This process's GPU id: the first id of ``FLAGS_selected_gpus``, else ``PADDLE_LOCAL_RANK``, else 0.

    ``paddle.distributed.launch`` sets ``FLAGS_selected_gpus`` to one id per process, but to every visible id
    (``"0,1"``) when it starts a single process (``CollectiveController._build_pod_with_master``); Paddle's own
    ``ParallelEnv`` takes the first id, and so does this.
    """
    environ = os.environ if environ is None else environ
    selected = environ.get("FLAGS_selected_gpus", "").split(",")[0].strip()
    if selected:
        return int(selected)
    local = environ.get("PADDLE_LOCAL_RANK", "")
    return int(local) if local.isdigit() else 0


def resolve_device(device: str, has_cuda: bool, compiled_with_cuda: bool, environ=None, source=None):
    """``(Paddle device string, environment variables to set)`` for ``device`` auto|cpu|gpu, without side effects.

    On a CUDA build ``paddle.distributed.init_parallel_env`` (which ``fleet.init`` calls) picks NCCL and the
    process's GPU whenever ``PADDLE_DISTRI_BACKEND`` is unset or ``auto`` (``_is_cpuonly``), overriding a CPU device
    chosen before it; a CPU job on a CUDA build therefore asks for gloo explicitly. gpu without a CUDA device is a
    ConfigError.
    """
    environ = os.environ if environ is None else environ
    if device == "gpu" and not has_cuda:
        raise ConfigError("device 'gpu' was asked for, but this Paddle build has no CUDA device; use 'auto' or "
                          "'cpu'", source, "device")
    if device == "auto":
        device = "gpu" if has_cuda else "cpu"
    if device == "gpu":
        return f"gpu:{gpu_index(environ)}", {}
    backend = environ.get("PADDLE_DISTRI_BACKEND", "auto")
    return "cpu", ({"PADDLE_DISTRI_BACKEND": "gloo"} if compiled_with_cuda and backend in ("auto", "nccl") else {})


def select_device(device: str, source=None) -> str:
    """Resolve ``auto|cpu|gpu`` (:func:`resolve_device`), set the device (and the collective backend a CPU job needs
    on a CUDA build); gpu on a CPU build is a ConfigError. On a GPU, cuDNN is asked for deterministic algorithms
    (``FLAGS_cudnn_deterministic``), which the exact-resume promise needs (docs/gpu.md)."""
    import paddle

    compiled = paddle.device.is_compiled_with_cuda()
    has_cuda = compiled and paddle.device.cuda.device_count() > 0
    name, env = resolve_device(device, has_cuda, compiled, source=source)
    os.environ.update(env)
    paddle.set_device(name)
    if name.startswith("gpu"):
        paddle.set_flags({"FLAGS_cudnn_deterministic": True})
    return name


def on_host_generator(build):
    """``build()`` run with the CPU as Paddle's device, its layer then moved to the current device.

    Paddle's initializers draw from the current device's generator (the CPU's mt19937 or a GPU's Philox), so one
    seed gives other initial weights on a GPU than on the CPU; drawn on the CPU they are the same on both. Returns
    ``build()``'s layer (unchanged on the CPU)."""
    import paddle

    device = paddle.get_device()
    if device == "cpu":
        return build()
    paddle.set_device("cpu")
    try:
        layer = build()
    finally:
        paddle.set_device(device)
    return layer.to(device=device)


def master_endpoint(environ=None):
    """``(host, port)`` of the process group's key-value store, found as ``paddle.distributed.init_parallel_env``
    finds it: ``MASTER_ADDR`` and ``MASTER_PORT``, else ``PADDLE_MASTER``, else the first of
    ``PADDLE_TRAINER_ENDPOINTS``; None without any of them."""
    environ = os.environ if environ is None else environ
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        return environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    endpoint = environ.get("PADDLE_MASTER") or environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    if ":" not in endpoint:
        return None
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)


MASTER_PROBE_INTERVAL = 0.02  # s between two connection attempts to rank 0's store
MASTER_WAIT = 60.0  # s; then Paddle's own connection (its retries, its timeout and its error message) takes over


def wait_for_master(endpoint, timeout=MASTER_WAIT, interval=MASTER_PROBE_INTERVAL) -> int:
    """Wait until rank 0's key-value store accepts connections at ``endpoint``; return the failed attempts.

    A rank other than 0 that reaches ``init_parallel_env`` before rank 0 has opened its store finds nobody there,
    and Paddle's TCP client then sleeps 3 s before it tries again (``tcp_utils.cc``, "Retry to connect"): a launch
    whose rank 0 imported Paddle a little later started 3 s late (2 of 6 launches of 2 processes on this idle machine,
    more when it is busy). A
    plain connection opened and closed at once is what the store sees of this probe; it serves the real client
    after it as before. After ``timeout`` seconds without a store the wait ends and Paddle's own connection runs as
    it always did."""
    import socket
    import time

    host, port = endpoint
    failed, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=max(interval, 1.0)):
                return failed
        except OSError:
            failed += 1
            time.sleep(interval)
    return failed


def store_without_delay(endpoint) -> int:
    """Set ``TCP_NODELAY`` on this process's connections to the key-value store at ``endpoint`` (``(host, port)``);
    return how many.

    Paddle's store client (3.3) leaves Nagle's algorithm on, and it writes a request in several pieces: the second
    piece waits for the server's delayed acknowledgement of the first, 40 ms on Linux. Every ``store.add`` took 44 ms
    (0.1 ms with the option set), and each :func:`mtl.parallel.distributed.wait_for_all` makes two or more of them: a
    2-process checkpoint of a small model spent 0.3 s waiting. The process's sockets are found in ``/proc/self/fd``
    (Linux; elsewhere nothing is changed) and only the TCP connections whose peer is the store's port are touched (the
    port alone: on several machines a connection to another host's same port gets the option too, which is harmless).
    Connections Paddle opens to the store later than this call keep its default."""
    import socket

    folder = "/proc/self/fd"
    if not os.path.isdir(folder):
        return 0
    changed, port = 0, int(endpoint[1])
    for name in os.listdir(folder):
        try:
            copy = os.dup(int(name))
        except (OSError, ValueError):
            continue  # closed since the listing
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)  # not a socket
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and sock.getpeername()[1] == port:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                changed += 1
        except OSError:
            pass  # a listening or unconnected socket has no peer
        finally:
            sock.close()
    return changed


PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, signum: int) -> bool:
    """Ask the system to send ``signum`` to this process when its parent ``parent_pid`` ends, however it ends (SIGKILL
    included): ``prctl(PR_SET_PDEATHSIG)`` on Linux; elsewhere a daemon thread that looks at ``os.getppid()`` once a
    second (it changes when the parent dies). A parent already gone sends it at once. False when nothing could be
    set up."""
    import ctypes
    import ctypes.util
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # it ended before the call
                    signal.raise_signal(signum)
                return True
        except (OSError, AttributeError):
            pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        signal.raise_signal(signum)

    threading.Thread(target=watch, daemon=True, name="mtl-parent-watch").start()
    return True


def die_with_launcher() -> bool:
    """A rank started by a launcher (``paddle.distributed.launch`` or ``mtl launch``'s) gets SIGTERM when that
    launcher ends, however (SIGKILL included): it then stops as a pre-empted run does (a checkpoint of its step, exit
    status 75) instead of training on, re-parented, holding its output folder. False when this process was not
    started by a launcher."""
    import signal

    from mtl.core.console import launcher_pid

    parent = launcher_pid()
    return parent is not None and die_with_parent(parent, signal.SIGTERM)


def init_distributed():
    """Start the collective process group when launched with more than one process; return (rank, world).

    Ranks other than 0 first wait for rank 0's store (:func:`wait_for_master`); then every rank's connection to the
    store sends at once (:func:`store_without_delay`)."""
    import paddle.distributed as dist

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if world > 1 and not dist.is_initialized():
        from paddle.distributed import fleet

        from mtl.core.console import fleet_log_level

        endpoint = master_endpoint()
        if os.environ.get("PADDLE_TRAINER_ID", "0") != "0" and endpoint is not None:
            wait_for_master(endpoint)
        fleet.init(is_collective=True, log_level=fleet_log_level())
        if endpoint is not None:
            store_without_delay(endpoint)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def run_as_process(func, *args):
    """Run the process's command ``func(*args)`` and end the process with its exit status (:func:`exit_process`).

    A ``sys.exit(code)`` inside gives the status Python gives it (a message is printed to stderr and gives 1); any
    other exception goes on to Python's own handling (its traceback, status 1, the normal shutdown). Under a program
    that runs this one and has work left after it (``python -m cProfile`` writing its profile, pdb, a test), the
    process is not ended here: ``func`` runs, and its ``SystemExit`` goes on as usual."""
    import sys

    if not _owns_the_process(sys._getframe(1)):
        func(*args)
        return
    try:
        func(*args)
        code = 0
    except SystemExit as stop:
        code = exit_status(stop.code)
    exit_process(code)


def exit_status(code) -> int:
    """The exit status ``sys.exit(code)`` gives: None is 0, an int itself, anything else is printed to stderr and
    gives 1."""
    import sys

    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _owns_the_process(frame) -> bool:
    """True when ``frame``'s program is the process's own: the only module-level code on the stack below it is the
    ``__main__`` that started it (runpy's start-up of ``python -m`` aside), not a profiler, debugger or test runner
    that runs it as part of itself."""
    modules = 0
    while frame is not None:
        modules += frame.f_code.co_name == "<module>"
        frame = frame.f_back
    return modules == 1


def exit_process(code: int):
    """End the process as Python's shutdown does (non-daemon threads joined, ``atexit`` handlers run, the standard
    streams flushed), without finalising every module one by one, which costs about 0.5 CPU-seconds once Paddle is
    loaded: then ``os._exit(code)``. What is still referenced is not finalised (as after ``os._exit``), so
    everything the command writes is closed (or flushed) by the command itself. ``code`` ``-SIGINT``: the process
    dies of SIGINT, as Python does after an uncaught KeyboardInterrupt."""
    import atexit
    import signal
    import sys
    import threading

    threading._shutdown()  # what Python's shutdown calls first: joins every non-daemon thread
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)
