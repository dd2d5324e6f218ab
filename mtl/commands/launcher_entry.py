"""``python -m mtl.commands.launcher_entry ARGS``: Paddle's launcher (``paddle.distributed.launch``) that never
writes the process environment to disk.

Paddle 3.3's launcher writes every variable of its environment into its log folder: the whole ``os.environ`` as
the first line of ``<job>.<pod>.log`` (``Controller.save_pod_log``), each worker's environment into
``envlog.<rank>`` (``Controller.save_pod_env``) and again into ``backup_env.<rank>.json`` (``ProcessContext._start``),
where any secret a user keeps in the environment lands on disk. Here the pod log keeps its own lines without the
environment, no ``envlog`` is written, and a worker's backup file holds only what it is for: the variables of
``LIMIT_LEN_ENVS`` too long to pass in the environment (``PADDLE_ENV_LIMIT_LEN``), which the worker reads back
(``paddle.distributed.backup_env``). ``MTL_LAUNCH_SAVE_ENV=1`` keeps Paddle's behaviour.

The console, unless ``MTL_VERBOSE=1``, is a single process's: the launcher copies the log of the machine's first
process (``workerlog.0``) with its carriage returns (Paddle reads it in text mode, which turns every ``\r`` of a
progress bar into a new line: one line per refresh), and a failed process is reported once: not the launcher's
"Container failed !!!" record and the last 3000 characters of the process's log again, but the rest of the first
process's log, then the error lines of the process that failed when it is another one and they are not on the
console yet (its exit status and last lines when it printed none; that it was killed, and by which signal, when a
signal ended it: it wrote no error, and its log may be empty), and its exit status, which ``mtl launch`` exits with
(:data:`FAILED_SUFFIX`). Everything else is the launcher's own.

The launcher looks at its processes every :data:`WATCH_INTERVAL` seconds instead of every second
(``Pod.watch(interval=1)``): a launch ends, or stops its other processes after a failure, when its processes do
(a launch of a 2-process script that only prints: 2.4 s before, most of it asleep).
"""
import logging
import os
import sys

SAVE_ENV = "MTL_LAUNCH_SAVE_ENV"
FAILED_SUFFIX = ".failed"  # beside mtl launch's status file: "<rank> <exit status>" of the first process that failed
TAIL_LINES = 20  # lines of a failed process's log shown when it printed no error line
WATCH_INTERVAL = 0.1  # seconds between two looks of the launcher at its processes' status (Paddle's: 1)


def _pod_log_without_environment(self, info):
    """``Controller.save_pod_log`` without its first line (the launcher's environment)."""
    if not self.ctx.args.log_dir:
        return
    path = os.path.join(self.ctx.args.log_dir, f"{self.job.id}.{self.pod.name}.log")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a+") as f:
            f.write(f"{info}\n")
    except OSError as exc:
        self.ctx.logger.error(f"save log failed because {exc}")


def _start_without_environment_file(self):
    """``ProcessContext._start`` whose backup file holds only the variables too long for the environment."""
    import json
    import subprocess

    from paddle.distributed.launch.utils import process_context

    env = dict(self._env)
    rank = env.get("PADDLE_TRAINER_ID")
    if rank is not None:
        os.makedirs(env["PADDLE_LOG_DIR"], exist_ok=True)
        limit = int(os.getenv("PADDLE_ENV_LIMIT_LEN", 48000))
        long = {k: v for k, v in env.items() if k in process_context.LIMIT_LEN_ENVS and len(v) >= limit}
        if long:
            path = os.path.join(env["PADDLE_LOG_DIR"], f"backup_env.{int(rank)}.json")
            with open(path, "w") as f:
                json.dump(long, f)
            env = {k: v for k, v in env.items() if k not in long}
            env["PADDLE_BACKUP_ENV_PATH"] = path
    self._proc = subprocess.Popen(self._cmd, env=env, stdout=self._stdout, stderr=self._stderr,
                                  preexec_fn=self._preexec_fn or (os.setsid if self._group else None),
                                  shell=self._shell)


_STARTED = {}  # log file -> the container writing it (the console shows the one of CONSOLE_LOG)
CONSOLE_LOG = "workerlog.0"  # the log of this machine's first process, the one Paddle copies to the console


def _start_keeping_carriage_returns(start):
    """``Container.start`` whose copy of the log to the console keeps ``\r`` (a progress bar updates in place)."""
    def started(self):
        result = start(self)
        handler = self._log_handler
        if handler is not None and handler.newlines is None:  # the text-mode handle start opened, not read yet
            offset = self._log_start_offset
            handler.close()
            self._log_handler = open(self._out, newline="")  # no newline translation
            self._log_handler.seek(offset)
        if self._out:
            _STARTED[os.path.basename(self._out)] = self
        return result
    return started


def _report_failure(self):
    """Instead of ``Container.tail`` (the failed process's last 3000 characters): the rest of the console's log,
    then the failed process's error lines the console does not hold yet when it is another process (its status and
    last lines when it printed no error line); its rank and exit status go to ``mtl launch``."""
    status = os.environ.get("MTL_LAUNCH_STATUS")
    if status:
        with open(status + FAILED_SUFFIX, "a") as f:
            f.write(f"{self.rank} {self.exit_code}\n")
    console = _STARTED.get(CONSOLE_LOG)
    if console is not None:
        while console.logs():  # what the console's process wrote since the launcher's last copy
            pass
        sys.stdout.flush()
    if self.exit_code is not None and self.exit_code < 0:  # killed: it wrote no error, whatever its log holds
        print(killed_sentence(self.rank, -self.exit_code), flush=True)
        return
    if not self._out or os.path.basename(self._out) == CONSOLE_LOG or not os.path.isfile(self._out):
        return
    lines = _log_lines(self._out)
    shown = {_message(line) for line in _log_lines(os.path.join(os.path.dirname(self._out), CONSOLE_LOG))
             if line.startswith("error")}  # what the console holds (all of the first process's log, copied above)
    errors = [line for line in lines if line.startswith("error")]
    new = [line for line in errors if _message(line) not in shown]
    if new:
        print("\n".join(new), flush=True)
    elif not errors and lines:
        print(f"rank {self.rank} failed with exit status {self.exit_code}; the end of its log ({self._out}):",
              *lines[-TAIL_LINES:], sep="\n", flush=True)
    elif not errors:
        print(f"rank {self.rank} failed with exit status {self.exit_code} and wrote nothing to its log ({self._out})",
              flush=True)


SIGNAL_CAUSES = {9: "out of memory, or by hand", 15: "stopped by the system or by hand", 11: "a crash in native code",
                 6: "aborted by native code"}  # what usually sends it to a training process


def killed_sentence(rank, signum: int) -> str:
    """The line for a process ended by signal ``signum``: it could write no error, so none is promised."""
    import signal

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "an unknown signal"
    cause = f": {SIGNAL_CAUSES[signum]}" if signum in SIGNAL_CAUSES else ""
    return f"rank {rank} was killed by signal {signum} ({name}{cause}); it could write no error of its own"


def _log_lines(path):
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip("\n") for line in f]
    except OSError:
        return []


def _message(line: str) -> str:
    """An error line without its ``error (rank k): `` prefix (the same sentence on two ranks is one error)."""
    return line.split(": ", 1)[1] if line.startswith("error (rank ") and ": " in line else line


class _NoContainerRecord(logging.Filter):
    """Drops the launcher's "Container failed !!!" record (the failure is reported by :func:`_report_failure`)."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Container failed")


def quiet_console():
    """The patches of the module docstring that make the launcher's console a single process's."""
    from paddle.distributed.launch.job import container

    container.Container.start = _start_keeping_carriage_returns(container.Container.start)
    container.Container.tail = _report_failure
    logging.getLogger("LAUNCH").addFilter(_NoContainerRecord())


def watch_often():
    """``Pod.watch`` looking every :data:`WATCH_INTERVAL` seconds (the controller passes no interval)."""
    import functools

    from paddle.distributed.launch.job import pod

    pod.Pod.watch = functools.partialmethod(pod.Pod.watch, interval=WATCH_INTERVAL)


def stop_with_mtl_launch():
    """Started by ``mtl launch``: SIGTERM to this launcher when ``mtl launch`` ends, however it ends (SIGKILL
    included); the launcher then stops its processes as it does on SIGTERM (they save a checkpoint and stop), and a
    rerun does not find the output folder held by ranks training on, re-parented."""
    import signal

    from mtl.core.runtime import die_with_parent

    parent = os.environ.get("MTL_LAUNCH_PID", "")
    if parent.isdigit():
        die_with_parent(int(parent), signal.SIGTERM)


def main():
    """Run Paddle's launcher with the environment kept off the disk, a quiet console and a prompt watch of its
    processes (module docstring); it ends when ``mtl launch`` does."""
    stop_with_mtl_launch()
    user_threads = os.environ.get("OMP_NUM_THREADS", "")
    from paddle.distributed.launch.controllers import controller
    from paddle.distributed.launch.main import launch
    from paddle.distributed.launch.utils import process_context

    watch_often()
    if os.environ.get(SAVE_ENV) != "1":
        controller.Controller.save_pod_log = _pod_log_without_environment
        controller.Controller.save_pod_env = lambda self: None
        process_context.ProcessContext._start = _start_without_environment_file
    if os.environ.get("MTL_VERBOSE") != "1":
        quiet_console()
    if not user_threads:  # Paddle's import set it to 1, which every rank would read as the user's: each rank sets
        os.environ.pop("OMP_NUM_THREADS", None)  # its own (from its cores, processes and loader workers: set_threads)
    launch()


if __name__ == "__main__":
    from mtl.core.runtime import run_as_process

    run_as_process(main)  # Paddle's launcher ends with sys.exit(status); no module teardown after it
