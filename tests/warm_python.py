"""A Python with Paddle already imported that runs a test's ``[sys.executable, ...]`` command in a fork of itself.

Every Python process of the suite paid ``import paddle`` (and mtl's) again, and Python's teardown of those modules at
exit: of a 2-step training run, 3.9 CPU-seconds in a new interpreter against 1.65 s in a fork. :func:`run` is
``subprocess.run`` for such a command: it asks this module's server (one per test process, started by :func:`start`
and running this file as a script) to fork. The child takes the command's working folder, environment, argv,
standard streams, a session of its own and fresh random seeds (Python's, numpy's, Paddle's), runs the script,
``-m`` module or ``-c`` code as ``python`` would (sys.argv, sys.path, ``__main__``), and exits as Python's shutdown
does (threads joined, atexit, exit status, an uncaught exception's traceback), without finalising each module.
A child's own ``subprocess.run`` of a ``[sys.executable, ...]`` command (a report script trains each run in a
process of its own) goes to the same server under the same rules: the multimnist report's test, 12 runs, went from
24.5 to 4.3 CPU-seconds.

What a child inherits beyond a new interpreter: the modules of :data:`PRELOAD`, imported under mtl's quiet glog
(``mtl.core.console.QUIET_ENV``, which every entry point of mtl sets before it imports Paddle), the interpreter's own
warning filters, and the server's hash seed.

A command that a fork could run differently starts a new interpreter through ``subprocess.run``, unchanged: an
interpreter other than ``sys.executable`` or a flag other than ``-m``, ``-c`` and ``-u``; ``--verbose`` or
``MTL_VERBOSE=1`` (Paddle's glog would show); an environment that differs from the server's in a variable read when
Paddle is imported (:data:`READ_AT_IMPORT`: threads, flags, devices, paths), other than those the imports set
themselves; an option of ``subprocess.run`` beyond the common ones; and any command with ``MTL_TESTS_COLD=1`` in the
tests' environment. The tests of what a newcomer types (the README), of what happens before Paddle is imported, of
Paddle's import warning, and every command a test signals or reads while it runs (``Popen``) call ``subprocess``.
"""
import io
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

PRELOAD = ("numpy", "yaml", "sklearn", "paddle", "mtl.cli", "mtl.train.job", "mtl.train.trainer")
# environment variables whose value at ``import paddle`` (or at Python's start) decides how the process behaves
READ_AT_IMPORT = ("FLAGS_", "GLOG_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "CUDA", "NVIDIA_", "PADDLE_", "PYTHON",
                  "LD_", "MALLOC_", "LC_", "LANG")
# of those, the ones a child applies itself (its sys.path from PYTHONPATH, its streams unbuffered)
APPLIED_BY_CHILD = ("PYTHONPATH", "PYTHONUNBUFFERED")
SUPPORTED = {"capture_output", "text", "check", "cwd", "env", "timeout", "stdout", "stderr", "input",
             "universal_newlines"}
_HEADER = 8  # bytes of a request's length
_new_interpreter = subprocess.run  # subprocess's own (a child's subprocess.run becomes :func:`run`)

_server = None  # (Popen, socket path, the environment it started with) of this test process


def start():
    """Start this process's server (in the background: its imports take a few seconds); a second call is a no-op."""
    global _server
    if _server is None and os.environ.get("MTL_TESTS_COLD") != "1":
        folder = tempfile.mkdtemp(prefix="warm-python-")
        path = os.path.join(folder, "socket")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        _server = {"proc": proc, "path": path, "environ": None}
    return _server


def stop():
    """Stop this process's server (the commands it is running go on to their end)."""
    global _server
    if _server is not None:
        _server["proc"].kill()
        _server["proc"].wait()
        _server["proc"].stdout.close()
        shutil.rmtree(os.path.dirname(_server["path"]), ignore_errors=True)
        _server = None


def server_pid():
    """The process id of this process's server (started if need be)."""
    return start()["proc"].pid


def _ready():
    """This process's server once it has finished its imports (waiting for it if need be): its socket path, its
    environment before them and the variables they set (Paddle's import sets some of its own)."""
    server = start()
    if server["environ"] is None:
        line = server["proc"].stdout.readline()
        if not line.startswith(b"ready "):
            raise RuntimeError(f"the warm Python server ({__file__}) did not start: exit {server['proc'].poll()}")
        before, after = json.loads(line[len(b"ready "):])
        server["environ"] = before, {k: v for k, v in after.items() if before.get(k) != v}
    return server["path"], server["environ"]


def forkable(cmd, env, options) -> bool:
    """True when a fork of the server runs ``cmd`` with environment ``env`` as a new interpreter would (never with
    ``MTL_TESTS_COLD=1`` in the tests' environment: every command in a new interpreter, to compare)."""
    if os.environ.get("MTL_TESTS_COLD") == "1" or set(options) - SUPPORTED:
        return False
    if not isinstance(cmd, (list, tuple)) or len(cmd) < 2:
        return False
    if os.fspath(cmd[0]) != sys.executable or env.get("MTL_VERBOSE") == "1":
        return False
    args = [os.fspath(a) for a in cmd[1:]]
    if "--verbose" in args:
        return False
    while args and args[0] == "-u":
        args = args[1:]
    if not args or (args[0].startswith("-") and args[0] not in ("-m", "-c")) or (args[0] in ("-m", "-c")
                                                                                 and len(args) < 2):
        return False
    base, set_by_import = _ready()[1]
    keys = {k for k in set(env) | set(base) if k.startswith(READ_AT_IMPORT) and k not in APPLIED_BY_CHILD}
    return all(env.get(k) == base.get(k) or (k in set_by_import and env.get(k) == set_by_import[k]) for k in keys)


def run(cmd, *, input=None, capture_output=False, timeout=None, check=False, cwd=None, env=None, stdout=None,
        stderr=None, text=False, universal_newlines=None, **options):
    """``subprocess.run(cmd, ...)``, in a fork of the warm server when :func:`forkable` says it may be."""
    text = bool(text or universal_newlines)
    environ = dict(os.environ if env is None else env)
    if not forkable(cmd, environ, options):
        return _new_interpreter(cmd, input=input, capture_output=capture_output, timeout=timeout, check=check,
                                cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, **options)
    if capture_output:
        stdout = stderr = subprocess.PIPE
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        if input is not None:
            inp.write(input.encode() if isinstance(input, str) else input)
            inp.seek(0)
        opened = []
        out_fd = _stream_fd(stdout, out, 1, opened)
        err_fd = out_fd if stderr == subprocess.STDOUT else _stream_fd(stderr, err, 2, opened)
        fds = [inp.fileno() if input is not None else _devnull(os.O_RDONLY, opened), out_fd, err_fd]
        args = [os.fspath(a) for a in cmd]
        environ.update(_ready()[1][1])  # as the child's own import of Paddle would set them
        request = json.dumps({"argv": args, "cwd": os.path.abspath(os.fspath(cwd or os.getcwd())), "env": environ})
        try:
            code = _ask(_ready()[0], request.encode(), fds, timeout, cmd, out, err, text)
        finally:
            for fd in opened:
                os.close(fd)
        result = subprocess.CompletedProcess(cmd, code, _read(out, stdout, text), _read(err, stderr, text))
    if check:
        result.check_returncode()
    return result


def _devnull(mode, opened):
    """A descriptor of /dev/null, noted in ``opened`` to be closed after the run."""
    opened.append(os.open(os.devnull, mode))
    return opened[-1]


def _stream_fd(option, temp, inherited, opened):
    """The descriptor a child's stream goes to: the temporary file for PIPE, /dev/null, a file, or ours."""
    if option == subprocess.PIPE:
        return temp.fileno()
    if option == subprocess.DEVNULL:
        return _devnull(os.O_WRONLY, opened)
    return option.fileno() if option is not None and not isinstance(option, int) else (option or inherited)


def _read(temp, option, text):
    """What the child wrote to ``temp`` (None when the stream was not captured)."""
    if option != subprocess.PIPE:
        return None
    temp.seek(0)
    data = temp.read()
    if not text:
        return data
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _ask(path, request, fds, timeout, cmd, out, err, text):
    """Send ``request`` with the child's streams ``fds``; the child's exit status (killing it after ``timeout``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(path)
        except OSError as error:
            raise RuntimeError(f"the warm Python server ({__file__}) at {path} is gone ({error}); run the tests "
                               "again, or with MTL_TESTS_COLD=1 to start a new interpreter for every command") from None
        socket.send_fds(conn, [len(request).to_bytes(_HEADER, "big") + request], fds)
        reply = conn.makefile("rb")
        pid = int(reply.readline())
        conn.settimeout(timeout)
        try:
            line = reply.readline()
        except (socket.timeout, TimeoutError):
            os.killpg(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(cmd, timeout, _read(out, subprocess.PIPE, text),
                                            _read(err, subprocess.PIPE, text)) from None
        return int(line)


# ---- the server (this file run as a script) ----------------------------------------------------------------------

def _serve(path, before):
    """Accept requests until the test process that started the server is gone; in a child, return its request.
    ``before``: the environment before the imports (the ready line gives it and the one after)."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    os.write(1, b"ready " + json.dumps([before, dict(os.environ)]).encode() + b"\n")
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                request, fds = _receive(conn)
                pid = os.fork()
                if pid == 0:
                    for waiting in list(selector.get_map().values()):
                        if waiting.data is not None:  # another child's pidfd and its client's connection
                            os.close(waiting.fileobj)
                            waiting.data[1].close()
                    selector.close()
                    listener.close()
                    conn.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"{pid}\n".encode())
                except OSError:
                    pass
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:
                pid, conn = key.data
                selector.unregister(key.fileobj)
                os.close(key.fileobj)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:  # a client that stopped waiting (its timeout killed the child)
                    pass
                conn.close()
    sys.exit(0)


def _receive(conn):
    """One request (its JSON and the three stream descriptors)."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    size = int.from_bytes(data[:_HEADER], "big")
    while len(data) < _HEADER + size:
        data += conn.recv(1 << 20)
    return json.loads(data[_HEADER:_HEADER + size]), fds


def _become(request, fds):
    """Turn this fork into the process the request describes: session, streams, folder, environment, seeds, argv."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    unbuffered = "-u" in request["argv"][1:2] or bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding)
    sys.stdout = _writer(1, encoding, "strict", unbuffered, line=False)
    sys.stderr = _writer(2, encoding, "backslashreplace", unbuffered, line=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    _reseed()


def _forward_nested_runs(path, before, set_by_import):
    """Let this child's own ``subprocess.run`` of ``[sys.executable, ...]`` (a report script training each run in a
    process of its own) go to the same server, under the same rules (``Popen`` stays as it is)."""
    global _server
    _server = {"proc": None, "path": path, "environ": (before, set_by_import)}
    subprocess.run = run


def _writer(fd, encoding, errors, unbuffered, line):
    """A text stream on ``fd`` as Python sets up its standard streams (``-u``: nothing kept in a buffer)."""
    raw = io.FileIO(fd, "w", closefd=False)
    if unbuffered:
        return io.TextIOWrapper(raw, encoding, errors, write_through=True, line_buffering=line)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding, errors, line_buffering=line)


def _reseed():
    """Fresh seeds from the OS, as a new interpreter draws them (the fork would share the server's state)."""
    import random

    import numpy
    import paddle

    random.seed()
    numpy.random.seed()
    paddle.base.core.default_cpu_generator().manual_seed(int.from_bytes(os.urandom(6), "big"))


def _python_path(first, base_environ):
    """sys.path as Python builds it for this child: ``first``, then its PYTHONPATH, then the server's site paths."""
    def entries(environ):
        return [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]

    sys.path[:] = [first, *entries(os.environ), *sys.path[1 + len(entries(base_environ)):]]


def _execute(argv, base_environ):
    """Run ``python argv[1:]``: a script, ``-m module`` or ``-c code``, with sys.argv and sys.path[0] as Python sets."""
    import builtins
    import runpy
    import types

    args = argv[1:]
    while args and args[0] == "-u":
        args = args[1:]
    sys.orig_argv = list(argv)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        _python_path(os.getcwd(), base_environ)
        sys.modules.pop(args[1], None)  # a preloaded module runs as __main__ only (as in a new interpreter)
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        _python_path("", base_environ)
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(args[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = args
        _python_path(os.path.dirname(os.path.realpath(args[0])), base_environ)
        runpy.run_path(args[0], run_name="__main__")


def _main():
    """The server: import :data:`PRELOAD`, then serve; a child runs its command and exits as Python exits."""
    import importlib
    import warnings

    before = dict(os.environ)
    filters = list(warnings.filters)
    # Paddle's glog reads its level once, at import: the server imports Paddle as every entry point of mtl does,
    # under mtl.core.console's quiet glog; a command with --verbose or MTL_VERBOSE=1 starts a new interpreter instead
    from mtl.core.console import QUIET_ENV

    os.environ.update({k: v for k, v in QUIET_ENV.items() if k.startswith("GLOG_")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the interpreter each child stands for prints these at its own import
        for name in PRELOAD:
            importlib.import_module(name)
    warnings.filters[:] = filters  # what the imports added; the children start from the interpreter's own
    base_environ = dict(os.environ)
    set_by_import = {k: v for k, v in os.environ.items() if before.get(k) != v}
    from mtl.core.runtime import exit_process, exit_status

    request, fds = _serve(sys.argv[1], before)
    _become(request, fds)
    _forward_nested_runs(sys.argv[1], before, set_by_import)
    try:
        _execute(request["argv"], base_environ)
        code = 0
    except SystemExit as stop:
        code = exit_status(stop.code)
    except BaseException as error:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        error = error.with_traceback(_outside_this_file(error.__traceback__))
        sys.excepthook(type(error), error, error.__traceback__)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    exit_process(code)  # as mtl's entry points end: threads joined, atexit, no module teardown


def _outside_this_file(tb):
    """The traceback without its first frames in this file (the server's, which a new interpreter does not have)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == os.path.abspath(__file__):
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    _main()
