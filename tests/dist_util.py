"""Run a script under ``python -m paddle.distributed.launch`` on CPU (gloo) and collect what every rank printed.

``CUDA_VISIBLE_DEVICES=""`` cannot be used to force the CPU: Paddle 3.3's launcher reads an empty value as one
device named "" and fails with an IndexError for ``--nproc_per_node`` > 1. On a CPU-only build the variable is
removed and the launcher picks gloo by itself; on a CUDA build the environment is passed on as it is (``env`` may
override it), and the launcher places one process per visible GPU.
"""
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import paddle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_logs(log_dir):
    """Every rank's ``workerlog.N`` and the launcher's own ``*.log`` (not its environment dumps)."""
    text = []
    for path in sorted(glob.glob(os.path.join(log_dir, "workerlog.*")) + glob.glob(os.path.join(log_dir, "*.log"))):
        with open(path, errors="replace") as f:
            text.append(f"===== {os.path.basename(path)} =====\n{f.read()}")
    return "\n".join(text)


def _descendants(pid):
    """Process ids below ``pid`` (read from /proc; the launcher puts each worker in its own session)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stop(proc):
    """Stop a timed-out launch: SIGTERM to the launcher, then SIGKILL to it and every worker it started."""
    workers = _descendants(proc.pid) if os.path.isdir("/proc") else []
    proc.terminate()
    try:
        output, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return output


def launcher_env(env=None):
    """The environment of a launch on CPU: one intra-op thread, this repository importable, ``env`` on top."""
    run_env = dict(os.environ)
    run_env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, run_env.get(
        "PYTHONPATH")]))})
    if not paddle.is_compiled_with_cuda():
        run_env.pop("CUDA_VISIBLE_DEVICES", None)
    run_env.update(env or {})
    return run_env


def start_launcher(script_path, nproc, args, log_dir, env=None, launch_args=()):
    """Start (without waiting) ``python -m paddle.distributed.launch [launch_args] --nproc_per_node nproc``."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", *launch_args, "--nproc_per_node", str(nproc),
           "--log_dir", log_dir, script_path, *[str(a) for a in args]]
    return subprocess.Popen(cmd, env=launcher_env(env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def run_distributed(script_path, nproc=2, args=(), timeout=120, env=None):
    """Launch ``script_path`` on ``nproc`` CPU processes; return (returncode, launcher output + per-rank logs).

    On timeout the launcher and every worker it started are killed, and the returncode is -9.
    """
    log_dir = tempfile.mkdtemp(prefix="mtl_launch_")
    proc = start_launcher(script_path, nproc, args, log_dir, env)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        output = f"timed out after {timeout} s\n{_stop(proc)}"
        code = -9
    logs = _read_logs(log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    return code, f"{output}\n{logs}"


def assert_success(code, output):
    """Fail with the launcher output and every rank's log unless the launch exited 0."""
    assert code == 0, f"distributed run failed with exit code {code}:\n{output[-20000:]}"


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now (for a launcher's --master or --start_port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
