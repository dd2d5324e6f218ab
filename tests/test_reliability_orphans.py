"""No orphans: after ``kill -9`` of a training process, none of its DataLoader workers (nor, under the launcher, any
other process of the run) is alive 15 s later. Before, two workers of a killed run were still alive 26 min later."""
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.dist_util import ROOT, _descendants, start_launcher

TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
GRACE = 15.0


def write_job(tmp_path):
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"),
           "tasks": [{"name": "faces", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 5},
                      "head": {"type": "arcface", "scale": 8.0}, "eval": None}],
           "backbone": {"type": "mlp"}, "schedule": {"batch_size": 8, "steps": 100000},
           "log": {"every": 1000, "progress": False, "plot": False}, "checkpoint": {"every": 0},
           "data": {"num_workers": 2}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def alive(pid):
    """True for a running process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
@pytest.mark.subprocess
def test_workers_exit_when_their_trainer_is_killed(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    trainer = subprocess.Popen([sys.executable, TRAIN, write_job(tmp_path)], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        assert wait_for(lambda: len(_descendants(trainer.pid)) >= 2, 60), "the DataLoader workers never started"
        workers = _descendants(trainer.pid)
        trainer.kill()
        trainer.wait()
        assert wait_for(lambda: not any(map(alive, workers)), GRACE), \
            f"workers {[p for p in workers if alive(p)]} outlived their trainer by {GRACE} s"
    finally:  # a failed test leaves nothing behind either
        trainer.kill()
        kill_all(workers + _descendants(trainer.pid))


@pytest.mark.distributed
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
def test_no_process_of_a_two_process_run_survives_kill_9_of_one_rank(tmp_path):
    log_dir = str(tmp_path / "launch_logs")  # removed with tmp_path (was a folder of its own, never removed)
    launcher = start_launcher(TRAIN, 2, [write_job(tmp_path)], log_dir)
    everything = []
    try:  # launcher -> 2 ranks -> 2 workers each
        assert wait_for(lambda: len(_descendants(launcher.pid)) >= 6, 90), "the run never reached its workers"
        everything = [launcher.pid] + _descendants(launcher.pid)
        ranks = [p for p in everything if p in _children(launcher.pid)]
        os.kill(ranks[-1], signal.SIGKILL)
        assert wait_for(lambda: launcher.poll() is not None and not any(map(alive, everything[1:])), GRACE), \
            f"still alive {GRACE} s after kill -9 of a rank: {[p for p in everything if alive(p)]}"
        assert launcher.returncode != 0
    finally:
        launcher.kill()
        kill_all(everything[1:])
        launcher.communicate()


def _children(pid):
    return [p for p in _descendants(pid) if _parent(p) == pid]


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None
