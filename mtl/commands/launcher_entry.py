"""``python -m mtl.commands.launcher_entry ARGS``: Paddle's launcher (``paddle.distributed.launch``) that never
writes the process environment to disk.

Paddle 3.3's launcher writes every variable of its environment into its log folder: the whole ``os.environ`` as
the first line of ``<job>.<pod>.log`` (``Controller.save_pod_log``), each worker's environment into
``envlog.<rank>`` (``Controller.save_pod_env``) and again into ``backup_env.<rank>.json`` (``ProcessContext._start``),
where any secret a user keeps in the environment lands on disk. Here the pod log keeps its own lines without the
environment, no ``envlog`` is written, and a worker's backup file holds only what it is for: the variables of
``LIMIT_LEN_ENVS`` too long to pass in the environment (``PADDLE_ENV_LIMIT_LEN``), which the worker reads back
(``paddle.distributed.backup_env``). ``MTL_LAUNCH_SAVE_ENV=1`` keeps Paddle's behaviour. Everything else is the
launcher's own.
"""
import os

SAVE_ENV = "MTL_LAUNCH_SAVE_ENV"


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


def main():
    """Run Paddle's launcher with the environment kept off the disk (module docstring)."""
    from paddle.distributed.launch.controllers import controller
    from paddle.distributed.launch.main import launch
    from paddle.distributed.launch.utils import process_context

    if os.environ.get(SAVE_ENV) != "1":
        controller.Controller.save_pod_log = _pod_log_without_environment
        controller.Controller.save_pod_env = lambda self: None
        process_context.ProcessContext._start = _start_without_environment_file
    launch()


if __name__ == "__main__":
    main()
