"""Config validation at load time: one line naming the file and the key path, exit status 2, no traceback."""
import os
import sys

import pytest
import yaml

from mtl.config.loading import load_job
from mtl.config.overrides import apply_overrides
from mtl.core.errors import ConfigError
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE = {
    "tasks": [{"name": "reg", "reader": {"type": "synthetic", "target": "regression", "num_samples": 32},
               "head": {"type": "regression"}}],
    "backbone": {"type": "mlp"},
    "schedule": {"batch_size": 8, "steps": 2},
}


def write(tmp_path, data, name="job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def error_of(tmp_path, overrides=(), data=None):
    path = write(tmp_path, data or BASE)
    with pytest.raises(ConfigError) as err:
        load_job(path, overrides)
    return str(err.value), path


def test_valid_job_gets_defaults(tmp_path):
    job = load_job(write(tmp_path, BASE))
    assert job["schedule"]["mode"] == "joint" and job["optimizer"]["type"] == "momentum"
    assert job["tasks"][0]["ratio"] == 1.0 and job["tasks"][0]["loss_weight"] == 1.0


@pytest.mark.parametrize("override,key,words", [
    ("schedul.steps=3", "schedul", "did you mean 'schedule'"),
    ("schedule.stepz=3", "schedule.stepz", "did you mean 'steps'"),
    ("schedule.steps=abc", "schedule.steps", "expected an integer"),
    ("schedule.mode=mixed", "schedule.mode", "must be one of joint, sample"),
    ("optimizer.lr=0", "optimizer.lr", "must be > 0"),
    ("device=tpu", "device", "must be one of auto, cpu, gpu"),
    ("tasks.0.ratio=-1", "tasks.0.ratio", "must be > 0"),
    ("tasks.0.head.type=regresion", "tasks.0.head.type", "did you mean 'regression'"),
    ("tasks.0.head.los=l1", "tasks.0.head.los", "did you mean 'loss'"),
    ("backbone.type=mpl", "backbone.type", "did you mean 'mlp'"),
    ("tasks.0.reader.type=digit", "tasks.0.reader.type", "did you mean 'digits'"),
    ("plugins=[no_such_folder]", "plugins.0", "does not exist"),
    ("tasks=[no_such_task.yaml]", "tasks.0", "does not exist"),
    # nan passed every bound ('ratio: .nan' then failed in max() of the scheduler); inf is no setting
    ("tasks.0.ratio=.nan", "tasks.0.ratio", "must be a finite number, got nan"),
    ("tasks.0.loss_weight=.inf", "tasks.0.loss_weight", "must be a finite number, got inf"),
    ("optimizer.lr=.nan", "optimizer.lr", "must be a finite number"),
    # a task name is a file name of the run: '../../x' wrote its head's weights outside the run folder
    ("tasks.0.name=../../escaped", "tasks.0.name", "a task name may hold letters, digits, '_' and '-'"),
    ("tasks.0.name=a/b", "tasks.0.name", "got 'a/b'"),
    ("tasks.0.name=-x", "tasks.0.name", "not starting with '-'"),
    ('tasks.0.name="a\\n"', "tasks.0.name", "got 'a\\n'"),  # '$' of a regex let a trailing newline through
])
def test_bad_values_name_file_and_key(tmp_path, override, key, words):
    msg, path = error_of(tmp_path, [override])
    assert path in msg and f"{key}:" in msg and words in msg, msg


def test_task_file_errors_name_the_task_file(tmp_path):
    task = tmp_path / "tasks" / "t1.yaml"
    task.parent.mkdir()
    task.write_text(yaml.safe_dump({"name": "t1", "reader": {"type": "synthetic"}, "head": {"type": "softmx"},
                                    "ratio": 1}))
    data = dict(BASE, tasks=["t1"])
    msg, _ = error_of(tmp_path, data=data)
    assert str(task) in msg and "head.type" in msg and "did you mean 'softmax'" in msg, msg


def test_task_found_by_name_in_tasks_folder(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "reg2.yaml").write_text(yaml.safe_dump(dict(BASE["tasks"][0], name="reg2")))
    job = load_job(write(tmp_path, dict(BASE, tasks=["reg2"])))
    assert job["tasks"][0]["name"] == "reg2" and job["tasks"][0]["source"].endswith("reg2.yaml")


def test_python_task_file_registers_its_own_head(tmp_path):
    plug = tmp_path / "myplugins"
    plug.mkdir()
    (plug / "custom_task.py").write_text(
        "from mtl.core.registry import plugin_class\n"
        "RegressionHead = plugin_class('head', 'regression')\n"
        "from mtl.core.registry import register_head\n"
        "@register_head('my_regression')\n"
        "class MyRegression(RegressionHead):\n"
        "    '''A custom head from a plug-in file.'''\n"
        "TASK = {'name': 'custom', 'reader': {'type': 'synthetic', 'target': 'regression'},\n"
        "        'head': {'type': 'my_regression'}}\n")
    job = load_job(write(tmp_path, dict(BASE, plugins=["myplugins"], tasks=["myplugins/custom_task.py"])))
    assert job["tasks"][0]["head"]["type"] == "my_regression"


def test_a_key_named_twice_in_a_file_is_refused_with_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys without a word: a second 'ratio:' at the bottom of a task file won
    (found by a fuzzing helper). YAML itself forbids it."""
    task = tmp_path / "t1.yaml"
    task.write_text("name: t1\nreader: {type: synthetic}\nhead: {type: softmax}\nratio: 1.0\nloss_weight: 1\n"
                    "ratio: 2.0\n")
    msg, _ = error_of(tmp_path, data=dict(BASE, tasks=[str(task)]))
    assert msg == f"{task}: is not valid YAML at line 6: key 'ratio' appears twice (lines 4 and 6)", msg
    nested = dict(BASE, schedule={"batch_size": 8, "steps": 2})
    text = yaml.safe_dump(nested).replace("steps: 2", "steps: 2\n  steps: 3")
    (tmp_path / "job.yaml").write_text(text)
    with pytest.raises(ConfigError, match="key 'steps' appears twice"):
        load_job(str(tmp_path / "job.yaml"))
    from mtl.config.yaml_files import load_yaml_text  # a merge key's values may be overridden, as YAML allows

    for text in ("a: &x {k: 1, j: 3}\nb:\n  <<: *x\n  k: 2\n",
                 # chained merges (found by a review): b merges a and overrides ratio, use merges b
                 "defs:\n  a: &a {lr: 0.1, ratio: 1.0}\n  b: &b\n    <<: *a\n    ratio: 2.0\nuse:\n  <<: *b\n"
                 "  name: t1\n",
                 "1: one\ntrue: yes\n"):  # keys of other tags are other keys
        assert load_yaml_text(text) == yaml.safe_load(text)


def test_duplicate_task_names(tmp_path):
    data = dict(BASE, tasks=[BASE["tasks"][0], BASE["tasks"][0]])
    msg, _ = error_of(tmp_path, data=data)
    assert "used by more than one task" in msg


def test_overrides_parse_yaml_values():
    out = apply_overrides({"a": {"b": 1}, "l": [1, 2]}, ["a.b=2.5", "a.c=[1, 2]", "l.1=x", "new.key=true"])
    assert out == {"a": {"b": 2.5, "c": [1, 2]}, "l": [1, "x"], "new": {"key": True}}


@pytest.mark.subprocess
def test_cli_exits_2_with_one_line(tmp_path):
    path = write(tmp_path, BASE)
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), path, "--set",
                           "schedule.batch_size=zero"], capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "schedule.batch_size" in lines[0] and "Traceback" not in proc.stderr


def test_set_reaches_tasks_named_by_file(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "reg2.yaml").write_text(yaml.safe_dump(dict(BASE["tasks"][0], name="reg2")))
    path = write(tmp_path, dict(BASE, tasks=["reg2"]))
    job = load_job(path, ["tasks.0.ratio=2.5", "tasks.0.head.loss=l1"])
    assert job["tasks"][0]["ratio"] == 2.5 and job["tasks"][0]["head"]["loss"] == "l1"
    with pytest.raises(ConfigError, match="tasks.3: --set names task 3, but the job lists 1 tasks"):
        load_job(path, ["tasks.3.ratio=1"])
    with pytest.raises(ConfigError, match=r"^--set: tasks.0.ratio: must be > 0.* \(a value given by --set, not by "
                                          r"the task file\)$"):  # the task file has no such value
        load_job(path, ["tasks.0.ratio=0"])


@pytest.mark.subprocess
def test_mtl_train_command_runs_a_job(tmp_path):
    path = write(tmp_path, dict(BASE, output_dir=str(tmp_path / "run"), log={"progress": False, "plot": False},
                                data={"num_workers": 0}))
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", "train", path, "--set", "schedule.steps=3"],
                           capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| reg " in proc.stdout and (tmp_path / "run" / "summary.json").is_file()
    again = warm_python.run([sys.executable, "-m", "mtl.cli", "train", path], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr


def test_readme_config_reference_is_generated_from_the_schema():
    """README's key tables are `python -m mtl.config.reference --write` output: a schema change updates them."""
    from mtl.config.reference import readme_reference, reference

    assert readme_reference() == reference().strip(), "run: python -m mtl.config.reference --write"


@pytest.mark.parametrize("weighting,mode,words", [
    ("{type: dwa, temperature: -1}", "joint", "'temperature' must be a number > 0.0"),
    ("{type: pcgrad}", "sample", "cannot run with schedule.mode: sample"),
    ("{type: pcgrd}", "joint", "did you mean 'pcgrad'"),
])
def test_weighting_errors_at_load_time(weighting, mode, words):
    """A bad weighting is one line naming the key, before anything is built."""
    with pytest.raises(ConfigError) as info:
        load_job(os.path.join(ROOT, "examples", "configs", "demo.yaml"),
                 [f"weighting={weighting}", f"schedule.mode={mode}"])
    assert "weighting" in str(info.value) and words in str(info.value)
