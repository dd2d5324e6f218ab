"""Fitting the ecosystem: the Paddle wheel choice (dry run, fake nvidia-smi), a quiet console, -c/-o, --until."""
import json
import os
import re
import shlex
import sys

import pytest

from mtl.cli import build_parser
from mtl.commands.train import continue_command, resolve_config
from mtl.core.errors import ConfigError
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELECT = os.path.join(ROOT, "tools", "select_paddle.py")
INDEX = "https://www.paddlepaddle.org.cn/packages/stable/{}/"


def pinned():
    """(Paddle version, other requirement lines) read from requirements.txt."""
    lines = [ln.split("#")[0].strip() for ln in open(os.path.join(ROOT, "requirements.txt"))]
    lines = [ln for ln in lines if ln]
    (paddle,) = [ln for ln in lines if ln.startswith("paddlepaddle==")]
    return paddle.split("==")[1], [ln for ln in lines if not ln.startswith("paddlepaddle==")]


def fake_smi(folder, cuda="12.8", status=0):
    """An ``nvidia-smi`` that prints a header with ``CUDA Version: <cuda>`` and exits with ``status``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "nvidia-smi")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho '| NVIDIA-SMI 570.86  Driver Version: 570.86  CUDA Version: {cuda} |'\n"
                f"exit {status}\n")
    os.chmod(path, 0o755)
    return folder


def dry_run(tmp_path, *args, smi_dir=None):
    """The lines ``select_paddle.py --dry-run`` prints, with only ``smi_dir`` (or an empty folder) on PATH."""
    path = smi_dir or str(tmp_path / "empty")
    os.makedirs(path, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "CUDA")}
    env["PATH"] = path
    proc = warm_python.run([sys.executable, SELECT, "--dry-run", "--python", str(tmp_path / "venv" / "python"),
                           "--requirements", os.path.join(ROOT, "requirements.txt"), *args],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def install_commands(out):
    return [shlex.split(line[len("would run: "):]) for line in out.splitlines() if line.startswith("would run: ")]


@pytest.mark.parametrize("cuda, build", [("12.8", "cu126"), ("12.4", "cu118"), ("13.0", "cu129"),
                                         ("11.8", "cu118")])
def test_gpu_wheel_when_nvidia_smi_works(tmp_path, cuda, build):
    version, others = pinned()
    out = dry_run(tmp_path, smi_dir=fake_smi(str(tmp_path / "bin"), cuda))
    commands = install_commands(out)
    assert commands[-1][1:] == ["-m", "pip", "install", "--quiet", f"paddlepaddle-gpu=={version}", "-i",
                                INDEX.format(build)]
    assert commands[-2][-len(others):] == others  # the rest of requirements.txt, without the CPU wheel
    assert not any(f"paddlepaddle=={version}" in c for c in commands[-2])


def test_cpu_wheel_without_gpu_or_when_forced(tmp_path):
    version, _ = pinned()
    for out in (dry_run(tmp_path),  # no nvidia-smi at all
                dry_run(tmp_path, smi_dir=fake_smi(str(tmp_path / "broken"), status=9)),  # nvidia-smi fails
                dry_run(tmp_path, "--device", "cpu", smi_dir=fake_smi(str(tmp_path / "bin")))):  # DEVICE=cpu
        commands = install_commands(out)
        assert commands[-1][-1] == f"paddlepaddle=={version}"
        assert not any("paddlepaddle-gpu" in " ".join(c) for c in commands)


def test_forced_gpu_and_chosen_cuda(tmp_path):
    version, _ = pinned()
    assert install_commands(dry_run(tmp_path, "--device", "gpu"))[-1][-3:] == [
        f"paddlepaddle-gpu=={version}", "-i", INDEX.format("cu118")]
    out = dry_run(tmp_path, "--cuda", "cu129", smi_dir=fake_smi(str(tmp_path / "bin"), "12.4"))
    assert install_commands(out)[-1][-1] == INDEX.format("cu129")


def test_make_paddle_wheel_is_a_dry_run(tmp_path):
    version, _ = pinned()
    env = dict(os.environ, PATH=fake_smi(str(tmp_path / "bin"), "12.6") + os.pathsep + os.environ["PATH"])
    env.pop("DEVICE", None)
    proc = warm_python.run(["make", "-s", "-C", ROOT, "paddle-wheel", f"PYTHON={sys.executable}"],
                           capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"paddlepaddle-gpu=={version} -i {INDEX.format('cu126')}" in proc.stdout
    proc = warm_python.run(["make", "-s", "-C", ROOT, "paddle-wheel", f"PYTHON={sys.executable}", "DEVICE=cpu"],
                           capture_output=True, text=True, env=env)
    assert f"install --quiet paddlepaddle=={version}" in proc.stdout and "paddlepaddle-gpu" not in proc.stdout


# ---- -c / -o -------------------------------------------------------------------------------------------------
def test_c_and_o_are_aliases_of_config_and_set():
    parser = build_parser()
    paddle_style = parser.parse_args(["train", "-c", "job.yaml", "-o", "a.b=1", "-o", "c=2", "d=3"])
    ours = parser.parse_args(["train", "job.yaml", "--set", "a.b=1", "c=2", "--set", "d=3"])
    assert resolve_config(paddle_style) == resolve_config(ours) == "job.yaml"
    assert paddle_style.overrides == ours.overrides == ["a.b=1", "c=2", "d=3"]
    with pytest.raises(ConfigError, match="two job configs"):
        resolve_config(parser.parse_args(["train", "one.yaml", "-c", "other.yaml"]))


def test_continue_command_drops_until_and_overwrite():
    argv = ["examples/train_joint.py", "-c", "j.yaml", "--overwrite", "--until", "30", "-o", "x=1"]
    assert continue_command(argv) == "python examples/train_joint.py -c j.yaml -o x=1 --resume"
    assert continue_command(["/venv/bin/mtl", "train", "j.yaml", "--until=5"]) == "mtl train j.yaml --resume"


# ---- a quiet console, --until --------------------------------------------------------------------------------
PADDLE_NOISE = ("No ccache found", "OMP_NUM_THREADS set to", "PLEASE USE OMP_NUM_THREADS WISELY",
                "To copy construct from a tensor", "When training, we now always track global mean and variance",
                "pir_interpreter", "New Executor is Running")


def train_digits(args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="2")  # > 1: Paddle's OMP notice would print
    for key in ("GLOG_minloglevel", "GLOG_v", "MTL_VERBOSE"):
        env.pop(key, None)
    return warm_python.run(shlex.split(args) if isinstance(args, str) else args, capture_output=True, text=True,
                           env=env, cwd=cwd)


@pytest.mark.subprocess
def test_digits_run_is_quiet_and_until_says_how_to_continue(tmp_path):
    out = tmp_path / "run"
    base = [sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), "-c",
            os.path.join(ROOT, "examples", "configs", "demo.yaml"), "-o", "schedule.steps=4", f"output_dir={out}",
            "-o", "checkpoint.every=2", "eval.every=0", "log.progress=false", "log.plot=false"]
    proc = train_digits(base + ["--until", "3"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in PADDLE_NOISE if line in proc.stderr] == [], proc.stderr
    assert proc.stderr.strip() == ""
    match = re.search(r"stopped by --until after step 3 of 4\. To continue from the latest checkpoint (\S+), run: "
                      r"(.+)$", proc.stdout, re.M)
    assert match, proc.stdout
    assert match.group(1).endswith("step_3")  # --until saves the step it stops at
    command = shlex.split(match.group(2))
    assert command[0] == "python" and command[-1] == "--resume" and "--until" not in command
    proc = train_digits([sys.executable] + command[1:], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.load(open(out / "summary.json"))
    assert summary["steps"] == 4 and summary["resumed_from"].endswith("step_3")
    assert "stopped by --until" not in proc.stdout


@pytest.mark.subprocess
def test_verbose_shows_paddle_lines(tmp_path):
    """The lines the quiet run hides are real: --verbose shows them."""
    proc = train_digits([sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), "--set",
                         "schedule.steps=2", f"output_dir={tmp_path / 'run'}", "log.progress=false",
                         "log.plot=false", "eval.every=0", "--verbose"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for line in ("OMP_NUM_THREADS set to 2", "PLEASE USE OMP_NUM_THREADS WISELY",
                 "When training, we now always track global mean and variance"):
        assert line in proc.stderr
