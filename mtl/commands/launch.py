"""``mtl launch [--verbose] [launcher options] SCRIPT [ARGS]``: ``python -m paddle.distributed.launch`` with a quiet
console and the exit status a single process has.

Paddle 3.3's launcher, stopped by Ctrl-C or SIGTERM, forwards SIGTERM to its workers, waits for them (30 s) and then
exits with the signal's number (2 or 15) whatever they did; it also prints ~37 ``LAUNCH INFO`` lines. This command
runs the launcher as a child in a session of its own and forwards every SIGINT, SIGTERM and SIGHUP it gets (a
terminal's Ctrl-C then reaches the launcher once, as when the launcher runs in the foreground), and exits with
75 (``EX_TEMPFAIL``, as a single pre-empted process: run it again) when the workers saved a checkpoint and stopped on
request, else with the launcher's own status. Unless ``--verbose`` (or ``MTL_VERBOSE=1``, or a ``--log_level`` of
your own) it passes ``--log_level WARNING`` (the launcher's INFO lines go) and hides the launcher's "No ccache found"
warning. Every other argument goes to the launcher unchanged.
"""
import os
import signal
import subprocess
import sys
import tempfile

STATUS_ENV = "MTL_LAUNCH_STATUS"  # a file each pre-empted worker appends its rank to (see :func:`report_preempted`)
QUIET_LAUNCHER = ["--log_level", "WARNING"]
# the launcher imports paddle (and its C++ extension helper) before it parses anything: a -W filter for it
LAUNCHER_WARNINGS = "ignore:No ccache found:UserWarning:paddle.utils.cpp_extension.extension_utils"
USAGE = ("usage: mtl launch [--verbose] [paddle.distributed.launch options] SCRIPT [ARGS]\n\n"
         + __doc__.split("\n\n")[1].strip()
         + "\n\nThe launcher's own options: python -m paddle.distributed.launch --help")


def report_preempted(rank):
    """In a worker started by ``mtl launch``: record that this rank saved a checkpoint and stopped on request."""
    path = os.environ.get(STATUS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{rank}\n")


def launcher_command(args, verbose):
    """The ``python -m paddle.distributed.launch`` command of ``args`` (quiet unless ``verbose``)."""
    quiet = [] if verbose or any(a == "--log_level" or a.startswith("--log_level=") for a in args) \
        else QUIET_LAUNCHER
    return [sys.executable, "-m", "paddle.distributed.launch", *quiet, *args]


def launcher_environment(status_path, verbose):
    """The launcher's (and so its workers') environment: the status file, ``MTL_VERBOSE``, the warning filter."""
    env = dict(os.environ, **{STATUS_ENV: status_path})
    if verbose:
        env["MTL_VERBOSE"] = "1"
    else:
        env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), LAUNCHER_WARNINGS]))
    return env


def run_launcher(args, verbose=False) -> int:
    """Run the launcher on ``args`` until it ends, forwarding signals; the exit status described above."""
    with tempfile.TemporaryDirectory(prefix="mtl_launch_") as folder:
        status_path = os.path.join(folder, "preempted")
        proc = subprocess.Popen(launcher_command(args, verbose), env=launcher_environment(status_path, verbose),
                                start_new_session=True)

        def forward(signum, frame):
            proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        preempted = os.path.isfile(status_path) and os.path.getsize(status_path) > 0
    from mtl.train.preemption import PREEMPTED_EXIT_STATUS

    if preempted:
        return PREEMPTED_EXIT_STATUS
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


def launch_main(argv) -> int:
    """``mtl launch``: our options first (``--verbose``, ``-h``), everything else is the launcher's."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    verbose = os.environ.get("MTL_VERBOSE") == "1" or "--verbose" in argv
    if argv[0] == "--verbose":
        argv = argv[1:]
    return run_launcher(argv, verbose)


def add_cli(sub):
    """Register ``mtl launch`` (for ``mtl --help``; :func:`mtl.cli.main` hands its arguments over unparsed)."""
    p = sub.add_parser("launch", help="paddle.distributed.launch with a quiet console and exit status 75 when "
                                      "pre-empted (Ctrl-C, SIGTERM)", add_help=False)
    p.add_argument("args", nargs="*", help="[--verbose] [paddle.distributed.launch options] SCRIPT [ARGS]")
    p.set_defaults(func=lambda args: sys.exit(launch_main(args.args)))
