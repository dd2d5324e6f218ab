"""Pre-emption: SIGTERM (to the process, or to the launcher of a 2-process job) saves the current step and exits
with status 75; ``--resume`` then continues bit-identically to an uninterrupted run. The uninterrupted 2-process run
is in the session's one launch of 2-process runs (tests/shared_runs.py); the signalled run and its resume are
launches of their own."""
import json
import os
import signal
import subprocess
import sys
import time

import paddle
import pytest
import yaml

from tests import warm_python
from tests.dist_util import ROOT
from tests.shared_runs import train_here, two_process_run

STEPS = 150  # 1 process: a step takes milliseconds, and the signal (sent after step 20) must arrive before the end
STEPS_AT_TWO = 60  # 2 processes: ~20-70 ms a step (gloo), stopped at step 21-22: 38 steps, 1-3 s, of margin


def job(out, steps=STEPS):
    return {"seed": 2, "device": "cpu", "output_dir": str(out),
            "tasks": [{"name": "arc", "reader": {"type": "synthetic", "num_samples": 96, "num_classes": 7, "seed": 1},
                       "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}, "eval": None},
                      {"name": "soft", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 3, "seed": 2},
                       "head": "softmax", "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [64], "embedding_size": 16},
            "schedule": {"batch_size": 8, "steps": steps},
            "optimizer": {"type": "momentum", "lr": 0.02, "warmup_steps": 5},
            "averaging": {"type": "ema", "decay": 0.9},
            "log": {"every": 1, "progress": False, "plot": False}, "checkpoint": {"every": 0, "keep": 2},
            "data": {"num_workers": 0}}


def launch_command(nproc, script_args, log_dir):
    """``python -m paddle.distributed.launch`` of ``script_args`` on ``nproc`` CPU processes."""
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", log_dir,
            *script_args]


def environment():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    if not paddle.is_compiled_with_cuda():
        env.pop("CUDA_VISIBLE_DEVICES", None)  # see tests/dist_util.py
    return env


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def write_job(tmp_path, name, steps=STEPS):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job(tmp_path / name, steps)))
    return str(path), str(tmp_path / name)


def train_command(config, *extra):
    return [os.path.join(ROOT, "examples", "train_joint.py"), config, *extra]


def signal_after(proc, out, steps, sig=signal.SIGTERM, timeout=240):
    """Send ``sig`` to ``proc`` once ``out/metrics.jsonl`` holds ``steps`` records; return its exit status."""
    path = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.isfile(path) and sum(1 for _ in open(path)) >= steps:
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    return proc.wait(timeout=timeout)


def run(cmd, **kw):
    proc = warm_python.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=environment(), **kw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def assert_same_run(full, resumed, steps=STEPS):
    a, b = records(full), records(resumed)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if key.startswith(("loss", "lr", "grad_norm", "accuracy")):
                assert rb[key] == value, (ra["step"], key)


@pytest.mark.subprocess
def test_sigterm_saves_and_resume_is_bit_identical(tmp_path):
    config, out = write_job(tmp_path, "cut")
    full_config, full = write_job(tmp_path, "full")
    train_here(full_config)  # the uninterrupted reference: nothing about it needs a process of its own
    proc = subprocess.Popen([sys.executable, *train_command(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=environment())
    code = signal_after(proc, out, 20)
    stderr = proc.stderr.read()
    assert code == 75, stderr
    stopped = records(out)[-1]["step"]
    assert stopped < STEPS and f"stopped after step {stopped} on request (SIGTERM)" in stderr
    assert os.path.isdir(os.path.join(out, "checkpoints", f"step_{stopped}"))
    run([sys.executable, *train_command(config, "--resume")])
    assert_same_run(full, out)


@two_process_run("preemption_full")
def _full_at_two(folder):
    config, out = write_job(folder, "full", STEPS_AT_TWO)
    return {"train": [config]}, out


@pytest.mark.distributed
@pytest.mark.two_process_runs("preemption_full")
def test_sigterm_to_the_launcher_of_two_processes(two_process, tmp_path):
    config, out = write_job(tmp_path, "cut", STEPS_AT_TWO)
    full = two_process["preemption_full"]
    proc = subprocess.Popen(launch_command(2, train_command(config), str(tmp_path / "log_cut")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=environment(), start_new_session=True)
    signal_after(proc, out, 20)
    stopped = records(out)[-1]["step"]
    assert stopped < STEPS_AT_TWO
    assert os.path.isdir(os.path.join(out, "checkpoints", f"step_{stopped}")), proc.stdout.read()
    logs = "".join(open(os.path.join(tmp_path, "log_cut", f)).read() for f in os.listdir(tmp_path / "log_cut")
                   if f.startswith("workerlog"))
    assert logs.count(f"stopped after step {stopped} on request") == 2, logs[-3000:]
    run(launch_command(2, train_command(config, "--resume"), str(tmp_path / "log_resume")))
    assert_same_run(full, out, STEPS_AT_TWO)
