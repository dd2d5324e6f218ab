"""Files and folders from elsewhere never run code, damaged checkpoints never silently restart a run, a bug in a
plug-in is reported as a bug, and one output folder holds one run.

Every hostile file here is a pickle whose unpickling would create a marker file; every check asserts the command is
refused in one sentence (exit status 2 through the CLI) and that the marker does not exist.
"""
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from mtl.core.errors import ConfigError, MtlError, PluginError
from mtl.store import integrity
from tests import warm_python
from tests.cli_run import cli
from tests.dist_util import ROOT
from tests.shared_runs import train_here

TRAIN = os.path.join(ROOT, "examples", "train_joint.py")


class Marker:
    """Unpickled, it would create ``path`` (an os.system call)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def plant(path, marker):
    """A ``.pdparams`` whose unpickling runs code."""
    with open(path, "wb") as f:
        pickle.dump({"weight": Marker(marker)}, f, protocol=4)


def job_yaml(folder, **extra):
    """A small job file (two synthetic tasks on a CNN, 4 steps, checkpoints every 2) in ``folder``."""
    job = {"seed": 0, "output_dir": str(folder / "run"), "device": "cpu",
           "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 4,
                                                "shape": [1, 8, 8]}, "head": {"type": "arcface", "scale": 8.0}},
                     {"name": "kind", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 3,
                                                 "shape": [1, 8, 8], "seed": 3}, "head": "softmax"}],
           "backbone": {"type": "cnn", "in_channels": 1, "input_size": 8, "embedding_size": 8},
           "schedule": {"batch_size": 8, "steps": 4}, "checkpoint": {"every": 2, "keep": 3},
           "optimizer": {"lr": 0.02, "clip_norm": 5.0},
           "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}, **extra}
    path = folder / "job.json"  # JSON is YAML
    path.write_text(json.dumps(job))
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-step run with checkpoints at steps 2 and 4 (copied before each test changes it)."""
    folder = tmp_path_factory.mktemp("trained")
    train_here(job_yaml(folder))
    return folder


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run, and its job file."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    data = json.loads((tmp_path / "job.json").read_text())
    data["output_dir"] = str(tmp_path / "run")
    (tmp_path / "job.json").write_text(json.dumps(data))
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    job["output_dir"] = str(tmp_path / "run")
    (tmp_path / "run" / "job.json").write_text(json.dumps(job))
    return tmp_path


def replace_with_manifest(folder, name, marker):
    """Replace a checkpoint file by a hostile one and rewrite its SHA-256 in state.json (as an attacker would)."""
    plant(os.path.join(folder, name), marker)
    state = json.loads(open(os.path.join(folder, "state.json")).read())
    state["files"][name] = {"sha256": integrity.sha256_of(os.path.join(folder, name)),
                            "bytes": os.path.getsize(os.path.join(folder, name))}
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump(state, f)


# ---- the table: every row refused in one sentence, nothing executed ----------------------------------
def test_pretrained_weights_that_run_code_are_refused(tmp_path):
    marker = tmp_path / "ran"
    plant(tmp_path / "evil.pdparams", marker)
    config = job_yaml(tmp_path, backbone={"type": "cnn", "in_channels": 1, "input_size": 8, "embedding_size": 8,
                                          "pretrained": str(tmp_path / "evil.pdparams")})
    out = warm_python.run([sys.executable, TRAIN, config], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(r"evil.pdparams' was not loaded: it holds '(posix|os)\.system'", lines[0])
    assert not marker.exists()


def test_eval_of_converted_weights_that_run_code_is_refused(tmp_path, capsys):
    marker = tmp_path / "ran"
    plant(tmp_path / "evil.pdparams", marker)
    (tmp_path / "evil.json").write_text(json.dumps({"backbone": {"type": "cnn", "in_channels": 3, "input_size": 8,
                                                                 "embedding_size": 8}}))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a.png\tb.png\t1\n")
    code, err = cli(["eval", tmp_path / "evil.pdparams", "--sets", pairs], capsys)
    assert code == 2 and "evil.pdparams' was not loaded: it holds" in err and not marker.exists()


@pytest.mark.parametrize("name", ["backbone.pdparams", "optimizer.rank0.pdopt", "heads/ids.shard0of1.pdparams"])
def test_a_run_folder_with_replaced_files_and_manifest_is_refused(run, capsys, name):
    """--resume, mtl export and mtl checkpoint info of a run whose checkpoint files (and SHA-256) were replaced."""
    marker = run / "ran"
    newest = run / "run" / "checkpoints" / "step_4"
    replace_with_manifest(newest, name, marker)
    with pytest.raises(MtlError, match=rf"{re.escape(name)}' was not loaded: it holds '(posix|os)\.system'"):
        train_here(str(run / "job.json"), "--resume")
    for argv in (["export", run / "run", run / "export"], ["checkpoint", "info", newest]):
        if name.startswith("optimizer") and argv[0] == "export":
            continue  # an export reads weights only: a replaced optimizer file is never opened
        code, err = cli(argv, capsys)
        assert code == 2 and "was not loaded: it holds" in err and err.count("\n") == 1, (argv, err)
    assert not marker.exists()


def test_mtl_convert_plsc_refuses_a_pickle_that_runs_code(tmp_path, capsys):
    marker = tmp_path / "ran"
    plant(tmp_path / "evil.pdparams", marker)
    code, err = cli(["convert", "plsc", tmp_path / "evil.pdparams", tmp_path / "out.pdparams", "--arch", "iresnet18"],
                    capsys)
    assert code == 2 and "was not loaded: it holds" in err and not marker.exists()


def test_an_export_folder_with_a_planted_parameter_info_pickle_runs_nothing(run, capsys):
    """Paddle's older program format reads ``backbone.pdiparams.info`` with pickle.load; our exports are the PIR
    program (backbone.json) and nothing reads that file."""
    code, _ = cli(["export", run / "run", run / "export"], capsys)
    assert code == 0
    marker = run / "ran"
    plant(run / "export" / "backbone.pdiparams.info", marker)
    import numpy as np

    np.save(run / "x.npy", np.zeros((2, 1, 8, 8), np.float32))
    code, err = cli(["embed", run / "export", run / "x.npy", "-o", run / "e.npy"], capsys)
    assert code == 0, err
    assert not marker.exists()


# ---- plug-in code of a run folder ------------------------------------------------------------------------------
PLUGIN = '''
import os
from mtl.core.registry import register_reader, plugin_class
open(os.path.join(os.path.dirname(__file__), "imported"), "w").close()
Synthetic = plugin_class("reader", "synthetic")


@register_reader("tb_trusted_reader")
class Trusted(Synthetic):
    """The synthetic reader under another name."""
'''


def test_plugins_of_a_run_folder_are_imported_only_when_trusted(tmp_path, capsys):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "their_reader.py").write_text(PLUGIN)
    config = job_yaml(tmp_path, plugins=[str(plugins)])
    data = json.loads(open(config).read())
    data["tasks"][1]["reader"]["type"] = "tb_trusted_reader"
    data["schedule"]["steps"] = 2
    open(config, "w").write(json.dumps(data))
    train_here(config)
    os.remove(plugins / "imported")  # what training (with one's own config) imported
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a.png\tb.png\t1\n")
    for argv in (["export", tmp_path / "run", tmp_path / "export"], ["overlap", tmp_path / "run"],
                 ["eval", tmp_path / "run", "--sets", pairs]):
        code, err = cli(argv, capsys)
        assert code == 2 and "was trained with plug-in code (" in err and "their_reader.py" in err, (argv, err)
        assert "--trust-plugins" in err and not (plugins / "imported").exists()
    out = warm_python.run([sys.executable, "-m", "mtl.cli", "export", str(tmp_path / "run"), str(tmp_path / "export"),
                          "--trust-plugins"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))  # a fresh process: training imported it here
    assert out.returncode == 0, out.stderr
    assert (plugins / "imported").exists()


# ---- damaged checkpoints -----------------------------------------------------------------------------------------
def test_a_fallback_to_an_older_checkpoint_is_said_on_the_console(run, capfd):
    newest = run / "run" / "checkpoints" / "step_4" / "backbone.pdparams"
    newest.write_bytes(newest.read_bytes()[:100])
    train_here(str(run / "job.json"), "--resume")
    err = capfd.readouterr().err
    assert re.search(r"warning: checkpoint '.*step_4' is damaged \(backbone.pdparams has 100 bytes, \d+ were written "
                     r"\(truncated or replaced\)\); using '.*step_2' instead", err), err


def test_resume_refuses_when_every_checkpoint_is_damaged_and_touches_nothing(run):
    root = run / "run" / "checkpoints"
    for step in ("step_2", "step_4"):
        path = root / step / "backbone.pdparams"
        path.write_bytes(path.read_bytes()[:100])
    before = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"--resume: every checkpoint under .* is damaged \(2; the newest, "
                                          r"'.*step_4': backbone.pdparams has 100 bytes.*start again with --overwrite"):
        train_here(str(run / "job.json"), "--resume")
    after = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    assert after == before
    assert train_here(str(run / "job.json"), "--overwrite")["steps"] == 4  # the way to start again


def test_resume_and_overwrite_together_are_refused(run):
    with pytest.raises(ConfigError, match="--resume continues the run in output_dir and --overwrite removes it"):
        train_here(str(run / "job.json"), "--resume", "--overwrite")


# ---- bugs are bugs -------------------------------------------------------------------------------------------------
BUGGY = '''
from mtl.core.registry import register_reader, plugin_class
Synthetic = plugin_class("reader", "synthetic")


@register_reader("tb_buggy_reader")
class Buggy(Synthetic):
    """Divides by zero when built."""

    def __init__(self, **kwargs):
        1 / 0
'''


def test_a_plugin_that_raises_is_a_bug_with_its_file_and_traceback_in_the_log(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "buggy.py").write_text(BUGGY)
    config = job_yaml(tmp_path, plugins=[str(plugins)])
    data = json.loads(open(config).read())
    data["tasks"][0]["reader"]["type"] = "tb_buggy_reader"
    open(config, "w").write(json.dumps(data))
    out = warm_python.run([sys.executable, TRAIN, config], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert re.search(r"^error: reader 'tb_buggy_reader' \(.*buggy.py\) raised ZeroDivisionError: division by zero "
                     r"while it was built; this is a bug in the plug-in, not a mistake in the config \(traceback in "
                     r".*rank0.log\)$", lines[0]), lines[0]
    assert "config error" not in lines[0].lower() and "tasks.0" not in lines[0]
    log = (tmp_path / "run" / "logs" / "rank0.log").read_text()
    assert "Traceback (most recent call last)" in log and "1 / 0" in log


def test_a_taken_registry_name_is_refused_naming_both_files(tmp_path):
    from mtl.core import registry

    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same_name.py").write_text(
            "from mtl.core.registry import register_reader, plugin_class\n"
            "@register_reader('tb_same_name')\nclass Same(plugin_class('reader', 'synthetic')):\n"
            "    '''Registered twice.'''\n")
    registry.load_file(str(tmp_path / "one" / "same_name.py"))
    with pytest.raises(ConfigError, match=r"reader 'tb_same_name' is registered twice: by .*one/same_name.py \(Same\) "
                                          r"and by .*two/same_name.py \(Same\)"):
        registry.load_file(str(tmp_path / "two" / "same_name.py"))
    assert not issubclass(PluginError, ConfigError)  # a bug never reads as a config error


@pytest.mark.parametrize("code, line, words", [
    ("x = 1\nTASK = {\n", 2, "SyntaxError: '{' was never closed ('TASK = {')"),
    ("import numpy\n\nTASK = {'name': undefined_name}\n", 3, "NameError: name 'undefined_name' is not defined"),
    ("import not_a_module_of_this_suite\n", 1, "ModuleNotFoundError: No module named 'not_a_module_of_this_suite'"),
    ("def f():\n    return 1 / 0\n\nf()\n", 2, "ZeroDivisionError: division by zero"),
])
def test_a_plug_in_file_that_fails_to_import_is_one_sentence_with_its_line(tmp_path, code, line, words):
    """Reference: the line Python's own traceback (or the syntax error) points at in the file; the file is not left
    half-imported (fixed, it loads)."""
    from mtl.core import registry

    path = tmp_path / "task_plugin.py"
    path.write_text(code)
    with pytest.raises(PluginError) as caught:
        registry.load_file(str(path))
    assert str(caught.value) == (f"plug-in file '{path}' line {line}: {words} when it was imported; this is a bug "
                                 f"in the file, not a mistake in the config")
    assert f'File "{path}", line {line}' in caught.value.traceback_text or "SyntaxError" in words
    path.write_text("TASK = {'name': 'fixed'}\n")
    assert registry.load_file(str(path)).TASK == {"name": "fixed"}


# ---- one run per output folder ---------------------------------------------------------------------------------------
def _train(config, *extra):
    return subprocess.Popen([sys.executable, TRAIN, config, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT))


HELD = '''
import os
import time
from mtl.core.registry import register_reader, plugin_class

RELEASE = {release!r}


@register_reader("tb_held_reader")
class Held(plugin_class("reader", "synthetic")):
    """The synthetic reader, holding its job at its 13th sample (step 3) until the file RELEASE exists (at most
    120 s): a job that is still running, whatever the machine's load, while a second one is refused."""

    reads = 0

    def __getitem__(self, index):
        Held.reads += 1
        deadline = time.time() + 120
        while Held.reads > 12 and not os.path.exists(RELEASE) and time.time() < deadline:
            time.sleep(0.02)
        return super().__getitem__(index)
'''


@pytest.mark.subprocess
def test_a_second_job_on_a_held_output_dir_is_refused_and_the_first_runs_on(tmp_path):
    """The first job is held at step 3 (its reader waits for the release file) while the second one starts and is
    refused; released, the first finishes every step."""
    release = tmp_path / "release"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "held.py").write_text(HELD.format(release=str(release)))
    config = job_yaml(tmp_path, plugins=[str(tmp_path / "plugins")])
    data = json.loads(open(config).read())
    data["schedule"]["steps"], data["checkpoint"]["every"], data["log"]["every"] = 8, 0, 1
    data["tasks"][0]["reader"]["type"] = "tb_held_reader"  # 4 samples a step: held in step 3 until released
    open(config, "w").write(json.dumps(data))
    first = _train(config)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "run" / ".run.lock").exists() and time.time() < deadline:
            time.sleep(0.1)
        second = _train(config)
        _, err = second.communicate(timeout=120)
        assert first.poll() is None, "the first job ended before the second was refused"
    finally:
        release.touch()
    assert second.returncode == 2, err
    assert re.search(rf"output_dir '.*run' is held by a running job \(host \S+, process {first.pid}, since ", err), err
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    steps = [json.loads(line)["step"] for line in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in line]
    assert steps == list(range(1, 9))  # each step once: nothing of the refused job
    assert not (tmp_path / "run" / ".run.lock").exists()  # given back when the run ended


@pytest.mark.subprocess
def test_the_hold_of_a_killed_job_is_taken_over(tmp_path):
    config = job_yaml(tmp_path)
    data = json.loads(open(config).read())
    data["schedule"]["steps"] = 2000
    open(config, "w").write(json.dumps(data))
    killed = _train(config)
    deadline = time.time() + 60
    while not (tmp_path / "run" / ".run.lock").exists() and time.time() < deadline:
        time.sleep(0.2)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert (tmp_path / "run" / ".run.lock").exists()  # left behind
    data["schedule"]["steps"] = 2
    open(config, "w").write(json.dumps(data))
    out = _train(config, "--overwrite")
    _, err = out.communicate(timeout=120)
    assert out.returncode == 0, err


def test_a_job_killed_while_taking_the_hold_leaves_none_or_a_complete_one(tmp_path, monkeypatch):
    """CI killed a job right after the hold was created and before its record was written: the empty hold was
    judged alive for a minute and the next run refused (``host None, process None``). The hold now appears with its
    record or not at all; a hold that is there is read whole."""
    from mtl.store import run_lock

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies while writing the record

    monkeypatch.setattr(run_lock.json, "dump", killed)
    with pytest.raises(KeyboardInterrupt):
        run_lock.RunLock(str(tmp_path)).acquire()
    assert os.listdir(tmp_path) == []  # neither the hold nor the taker's own file
    monkeypatch.undo()
    hold = run_lock.RunLock(str(tmp_path)).acquire()
    try:
        assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text()) == hold.record
        assert os.listdir(tmp_path) == [run_lock.LOCK_FILE]
    finally:
        hold.release()
    assert os.listdir(tmp_path) == []


@pytest.mark.distributed
def test_mtl_launch_keeps_its_logs_in_the_run_and_the_environment_off_the_disk(tmp_path):
    """The launcher's own logs go to output_dir/launcher_logs (nothing in the working directory) and no file holds
    the process environment (a variable planted in it is found in no file)."""
    config = job_yaml(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    secret = "tb-secret-value-7f3a"
    out = warm_python.run([sys.executable, "-m", "mtl.cli", "launch", "--nproc_per_node", "2", TRAIN, config, "--set",
                          f"output_dir={tmp_path / 'run'}", "schedule.steps=2"], cwd=work, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, TB_SECRET=secret))
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(os.listdir(work)) == []  # no ./log
    logs = tmp_path / "run" / "launcher_logs"
    assert (logs / "workerlog.0").is_file()
    holding = [str(p) for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert holding == [], holding
