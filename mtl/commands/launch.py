"""``mtl launch [--verbose] [launcher options] SCRIPT [ARGS]``: ``python -m paddle.distributed.launch`` with a quiet
console and the exit status a single process has.

Paddle 3.3's launcher, stopped by Ctrl-C or SIGTERM, forwards SIGTERM to its workers, waits for them (30 s) and then
exits with the signal's number (2 or 15) whatever they did; it also prints ~37 ``LAUNCH INFO`` lines. This command
runs the launcher as a child in a session of its own and forwards every SIGINT, SIGTERM and SIGHUP it gets (a
terminal's Ctrl-C then reaches the launcher once, as when the launcher runs in the foreground), and exits with
75 (``EX_TEMPFAIL``, as a single pre-empted process: run it again) when the workers saved a checkpoint and stopped on
request, else with the launcher's own status. Unless ``--verbose`` (or ``MTL_VERBOSE=1``, or a ``--log_level`` of
your own) it passes ``--log_level WARNING`` (the launcher's INFO lines go) and hides the launcher's "No ccache found"
warning. The launcher's own log folder (``--log_dir``; Paddle's default is ``./log``) is ``output_dir/launcher_logs``
of the job the script trains (read from its config and ``--set``), else a temporary folder that is removed after a
successful launch (kept, and named, after a failure); the process environment is never written into it
(:mod:`mtl.commands.launcher_entry`; ``MTL_LAUNCH_SAVE_ENV=1`` keeps Paddle's behaviour). Every other argument goes
to the launcher unchanged.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

STATUS_ENV = "MTL_LAUNCH_STATUS"  # a file each pre-empted worker appends its rank to (see :func:`report_preempted`)
PARENT_ENV = "MTL_LAUNCH_PID"  # this command's process: its launcher gets SIGTERM when it ends, however it ends
QUIET_LAUNCHER = ["--log_level", "WARNING"]
# the launcher imports paddle (and its C++ extension helper) before it parses anything: a -W filter for it
LAUNCHER_WARNINGS = "ignore:No ccache found:UserWarning:paddle.utils.cpp_extension.extension_utils"
USAGE = """usage: mtl launch [--verbose] [LAUNCHER OPTIONS] SCRIPT [ARGS]

Train on several processes (and machines) with Paddle's launcher (python -m paddle.distributed.launch), with the
console of a single process: one progress line, one error line when a process fails, and its exit status (75 after
Ctrl-C or SIGTERM once every process saved a checkpoint: continue with the same command and --resume).

examples:
  mtl launch --nproc_per_node 2 examples/train_joint.py examples/configs/demo.yaml --set output_dir=runs/demo_2
  mtl launch --nproc_per_node 2 examples/train_joint.py examples/configs/demo.yaml --set output_dir=runs/demo_2 --resume
  mtl launch --nnodes 2 --master HOST:PORT --nproc_per_node 8 examples/train_joint.py CONFIG   (on each machine)

options:
  --verbose             also show the launcher's and Paddle's own log lines (hidden by default)
  LAUNCHER OPTIONS      passed on unchanged; the usual ones: --nproc_per_node N (processes on this machine),
                        --nnodes N and --master HOST:PORT (several machines), --devices 0,1 (GPUs), --log_dir DIR
                        (default: output_dir/launcher_logs of the job); all of them:
                        python -m paddle.distributed.launch --help
  SCRIPT [ARGS]         the training script and its arguments, e.g. examples/train_joint.py CONFIG --set ...
"""


def report_preempted(rank):
    """In a worker started by ``mtl launch``: record that this rank saved a checkpoint and stopped on request."""
    path = os.environ.get(STATUS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{rank}\n")


def launcher_command(args, verbose, log_dir=None):
    """The launcher command of ``args`` (quiet unless ``verbose``; ``--log_dir log_dir`` unless ``args`` set one)."""
    quiet = [] if verbose or _option(args, ("--log_level",)) is not None else QUIET_LAUNCHER
    logs = ["--log_dir", log_dir] if log_dir and _option(args, ("--log_dir",)) is None else []
    return [sys.executable, "-m", "mtl.commands.launcher_entry", *quiet, *logs, *args]


def job_output_dir(args):
    """The ``output_dir`` of the job the launched script trains (its config file and ``--set``/``-o``
    overrides, as ``mtl train`` reads them), or None when it cannot be told without running anything."""
    script = next((i for i, a in enumerate(args) if a.endswith(".py")), None)
    if script is None:
        return None
    rest = args[script + 1:]
    config, overrides, i = None, [], 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("--set", "-o"):
            i += 1
            while i < len(rest) and not rest[i].startswith("-"):
                overrides.append(rest[i])
                i += 1
            continue
        if arg in ("-c", "--config") and i + 1 < len(rest):
            config, i = rest[i + 1], i + 2
            continue
        if config is None and arg.endswith((".yaml", ".yml", ".json")):
            config = arg
        i += 1
    explicit = [o.split("=", 1)[1] for o in overrides if o.startswith("output_dir=")]
    if explicit:
        return explicit[-1]
    try:
        from mtl.config.yaml_files import read_job_yaml

        value = read_job_yaml(config).get("output_dir") if config and os.path.isfile(config) else None
    except Exception:  # noqa: BLE001 - an unreadable config is reported by the job itself, with its sentence
        return None
    return value if isinstance(value, str) else None


def launcher_environment(status_path, verbose, args=(), signal_path=None):
    """The launcher's (and so its workers') environment: the status file, this command's process id (the launcher
    stops when it ends, even by SIGKILL), ``MTL_VERBOSE``, the warning filter, the command as typed (``mtl launch
    ARGS``: what a worker's stop sentence tells to run again) and the file this command writes the name of a
    stopping signal into (the launcher passes every stop on as SIGTERM)."""
    from mtl.core.console import LAUNCH_COMMAND_ENV, LAUNCH_SIGNAL_ENV

    env = dict(os.environ, **{STATUS_ENV: status_path, PARENT_ENV: str(os.getpid())})
    env[LAUNCH_COMMAND_ENV] = shlex.join(["mtl", "launch", *(["--verbose"] if verbose else []), *args])
    if signal_path:
        env[LAUNCH_SIGNAL_ENV] = signal_path
    if verbose:
        env["MTL_VERBOSE"] = "1"
    else:
        env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), LAUNCHER_WARNINGS]))
    return env


def run_launcher(args, verbose=False) -> int:
    """Run the launcher on ``args`` until it ends, forwarding signals; the exit status described above."""
    output_dir = job_output_dir(args)
    given = _option(args, ("--log_dir",))  # the user's own: used as it is, never removed
    log_dir = given or (os.path.join(output_dir, "launcher_logs") if output_dir else
                        tempfile.mkdtemp(prefix="mtl_launch_logs_"))
    with tempfile.TemporaryDirectory(prefix="mtl_launch_") as folder:
        status_path, signal_path = os.path.join(folder, "preempted"), os.path.join(folder, "signal")
        proc = subprocess.Popen(launcher_command(args, verbose, log_dir),
                                env=launcher_environment(status_path, verbose, args, signal_path),
                                start_new_session=True)

        def forward(signum, frame):
            with open(signal_path, "w") as f:  # before the workers get the launcher's SIGTERM
                f.write(signal.Signals(signum).name)
            proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        preempted = os.path.isfile(status_path) and os.path.getsize(status_path) > 0
        failed = first_failure(status_path)
    from mtl.train.preemption import PREEMPTED_EXIT_STATUS

    if not output_dir and not given:
        if code == 0:
            shutil.rmtree(log_dir, ignore_errors=True)
        elif not preempted:
            print(f"the launcher's logs are in {log_dir}", file=sys.stderr, flush=True)
    if preempted:
        return PREEMPTED_EXIT_STATUS
    if failed is not None and failed != 0:
        code = failed  # the process that failed first, not the launcher's pick (rank 0's, stopped by the launcher)
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


def first_failure(status_path):
    """The exit status of the first process that failed (written by :mod:`mtl.commands.launcher_entry`), or None."""
    from mtl.commands.launcher_entry import FAILED_SUFFIX

    try:
        with open(status_path + FAILED_SUFFIX) as f:
            return int(f.readline().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def launcher_options(args):
    """The part of ``args`` before the training script: the launcher's own options. Every option of Paddle's
    launcher takes a value (``--name V`` or ``--name=V``), so the script is the first word that is neither."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1 if "=" in args[i] else 2
    return list(args[:i])


def _option(args, names):
    """The value of the launcher option ``names`` (``--name V`` or ``--name=V``) in ``args``, or None; the training
    script's own arguments (after it) are not the launcher's."""
    args = launcher_options(args)
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def count_problem(args):
    """The sentence to stop with when ``--nproc_per_node`` asks for fewer than one process, else None: Paddle's
    launcher would start one process anyway, silently (0 and -1 both run one)."""
    nproc = _option(args, ("--nproc_per_node",))
    if nproc is not None and nproc.lstrip("-").isdigit() and int(nproc) < 1:
        return f"--nproc_per_node must be at least 1 (processes on this machine), got {nproc}"
    return None


def device_problem(args, gpu_build: bool, visible_gpus):
    """The sentence to stop with when Paddle's launcher would fail on ``args``, else None.

    On a GPU build the launcher labels one device per visible GPU (``CUDA_VISIBLE_DEVICES``'s entries, an empty
    value counting as one) and gives process i the i-th label (``CollectiveController._build_pod_with_master``):
    more processes than labels end in an IndexError inside the launcher. ``visible_gpus`` None: unknown (no check).
    """
    nproc = _option(args, ("--nproc_per_node",))
    devices = _option(args, ("--devices", "--gpus"))
    if not gpu_build or nproc is None or not nproc.isdigit():
        return None
    labels = len(devices.split(",")) if devices else visible_gpus
    if not labels or int(nproc) <= labels:
        return None
    where = f"--devices lists {labels}" if devices else f"this machine shows {labels} GPU(s)"
    return (f"--nproc_per_node {nproc} asks for more processes than devices ({where}); Paddle's GPU launcher gives "
            f"every process a device of its own: use --nproc_per_node {labels} or fewer (CPU processes on a GPU "
            f"build: one label per process, e.g. --devices {','.join(['0'] * int(nproc))}, and device: cpu in the job)")


def visible_gpu_count(environ=None):
    """GPUs the launcher will label: ``CUDA_VISIBLE_DEVICES``'s entries (as Paddle's ``Device.parse_device`` counts
    them), else ``nvidia-smi -L``'s lines; None when neither says."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible != "all":
        return len(visible.split(","))
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len(re.findall(r"^GPU \d+", out.stdout, flags=re.M)) if out.returncode == 0 else None


def gpu_build() -> bool:
    """Whether the installed Paddle is the GPU wheel (read from the package metadata: Paddle is not imported)."""
    import importlib.metadata

    try:
        importlib.metadata.version("paddlepaddle-gpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def launch_main(argv) -> int:
    """``mtl launch``: our options first (``--verbose``, ``-h``), everything else is the launcher's."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    verbose = os.environ.get("MTL_VERBOSE") == "1" or "--verbose" in argv
    if argv[0] == "--verbose":
        argv = argv[1:]
    problem = count_problem(argv) or (device_problem(argv, gpu_build(), visible_gpu_count()) if gpu_build() else None)
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        return 2
    return run_launcher(argv, verbose)


def add_cli(sub):
    """Register ``mtl launch`` (for ``mtl --help``; :func:`mtl.cli.main` hands its arguments over unparsed)."""
    p = sub.add_parser("launch", help="paddle.distributed.launch with a quiet console and exit status 75 when "
                                      "pre-empted (Ctrl-C, SIGTERM)", add_help=False)
    p.add_argument("args", nargs="*", help="[--verbose] [paddle.distributed.launch options] SCRIPT [ARGS]")
    p.set_defaults(func=lambda args: sys.exit(launch_main(args.args)))
