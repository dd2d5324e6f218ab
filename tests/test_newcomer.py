"""A newcomer's first hour (issue 30): each stumble reproduced, then checked fixed.

The numbered sections follow the issue's items; the commands' own tests (predict, describe, labels) have their
own files (tests/test_predict.py, tests/test_plugin_reference.py, tests/test_label_names.py).
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import yaml

from mtl.config.loading import load_job
from mtl.errors import ConfigError
from mtl.job import build_job
from mtl.train.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment(**extra):
    """A subprocess environment: this checkout importable, one thread, the quiet console (no MTL_VERBOSE)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **extra)
    env.pop("MTL_VERBOSE", None)
    return env


def mtl(*args, expect=0, cwd=ROOT, **env):
    """``python -m mtl.cli ARGS`` in a subprocess; the finished process (its exit status checked)."""
    proc = subprocess.run([sys.executable, "-m", "mtl.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env=environment(**env))
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def image_job(out, steps=4, **over):
    """Two synthetic image tasks on the small CNN (BatchNorm: per-rank statistics in its checkpoints)."""
    data = {"seed": 0, "output_dir": str(out), "device": "cpu",
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 4,
                                                 "shape": [1, 8, 8]},
                       "head": {"type": "arcface", "scale": 8.0}, "eval": None},
                      {"name": "kind", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 3,
                                                  "shape": [1, 8, 8], "seed": 5},
                       "head": {"type": "softmax"}, "eval": None}],
            "backbone": {"type": "cnn", "in_channels": 1, "input_size": 8, "channels": [4, 8],
                         "embedding_size": 8},
            "schedule": {"batch_size": 8, "steps": steps}, "optimizer": {"lr": 0.05},
            "log": {"progress": False, "plot": False}, "checkpoint": {"every": 0, "keep": 3},
            "data": {"num_workers": 0}}
    data.update(over)
    return data


def train_here(data, **kw):
    """Build and train ``data`` in this process (quiet); the summary."""
    job = build_job(load_job(data=data), announce_plan=False)
    return Trainer(job, console=lambda *a: None, **{k: v for k, v in kw.items() if k != "until"}).run(
        until=kw.get("until"))


# ---- 2. a one-process --resume warns about every backbone parameter ------------------------------------------------
def test_a_resume_restores_the_backbone_without_paddle_warnings(tmp_path):
    data = image_job(tmp_path / "run")
    train_here(data, until=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_here(data, resume=True)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "Skip loading" in m or "state dict is empty" in m], messages
    full = image_job(tmp_path / "full")
    train_here(full)
    for a, b in zip(*(open(os.path.join(d["output_dir"], "metrics.jsonl")).read().splitlines()
                      for d in (full, data))):
        a, b = json.loads(a), json.loads(b)
        assert {k: v for k, v in a.items() if k != "samples_per_s"} == \
            {k: v for k, v in b.items() if k != "samples_per_s"}


# ---- 11. an MLP job (no BatchNorm) warns that its statistics are empty ---------------------------------------------
def test_a_checkpoint_of_a_backbone_without_batchnorm_is_written_without_warnings(tmp_path):
    data = image_job(tmp_path / "run", steps=2)
    data["backbone"] = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [8], "embedding_size": 8}
    data["optimizer"] = {"type": "sgd", "lr": 0.05}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_here(data)
    assert not [str(w.message) for w in caught if "state dict is empty" in str(w.message)]
    assert os.path.isfile(tmp_path / "run" / "checkpoints" / "step_2" / "statistics.rank0.pdparams")


# ---- 3. the memory plan's advice is a command that works -----------------------------------------------------------
def write_task_job(folder, head, averaging=None, backbone=None):
    """A job whose one task comes from a task file (the case where the head's key path is not ``tasks.0.head``)."""
    (folder / "tasks").mkdir()
    (folder / "tasks" / "faces.yaml").write_text(yaml.safe_dump(
        {"name": "faces", "reader": {"type": "synthetic", "num_samples": 16, "num_classes": 4, "shape": [1, 8, 8]},
         "head": head}))
    job = image_job(folder / "run", tasks=["tasks/faces.yaml"])
    job["averaging"] = averaging or {"type": "none"}
    job["backbone"] = backbone or job["backbone"]
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def refusal(path, overrides=(), available=1000):
    """The ConfigError of the memory plan of ``path`` with ``available`` bytes per process."""
    from mtl import registry
    from mtl.train import memory_plan

    cfg = load_job(path, list(overrides))
    backbone = registry.build("backbone", dict(cfg["backbone"]))
    original = memory_plan.available_bytes
    memory_plan.available_bytes = lambda: available
    try:
        memory_plan.check_job_memory(cfg, backbone, lambda t: {"num_classes": 4}, announce=False)
    except ConfigError as exc:
        return str(exc)
    finally:
        memory_plan.available_bytes = original
    return None


def suggested_sets(message):
    """The ``KEY=VALUE`` of every ``--set KEY=VALUE`` in ``message``, as the shell passes them."""
    import shlex

    return [shlex.split(part.replace(")", " "))[0] for part in message.split("--set ")[1:]]


@pytest.mark.parametrize("head", [{"type": "arcface", "scale": 8.0}, {"type": "softmax"}])
def test_the_memory_plans_advice_for_a_head_is_a_set_command_the_job_accepts(tmp_path, head):
    path = write_task_job(tmp_path, {**head, "num_classes": 4})
    message = refusal(path)
    assert message and "tasks.0.head" in message, message
    if head["type"] == "arcface":
        sets = suggested_sets(message)
        assert sets == ["tasks.0.head.sample_ratio=0.1"], message
        cfg = load_job(path, sets)  # accepted: the key exists where the message says
        assert cfg["tasks"][0]["head"]["sample_ratio"] == 0.1
        assert "more processes" in message
    else:  # the softmax head has no sample_ratio: no command that the job would refuse
        assert "sample_ratio" not in message and "more processes" in message, message


def test_the_memory_plans_advice_for_the_averager_is_a_set_command_the_job_accepts(tmp_path):
    backbone = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [64], "embedding_size": 8}
    window = {"type": "window", "average_window_rate": 0.5}
    path = write_task_job(tmp_path, {"type": "softmax", "num_classes": 4}, window, backbone)
    message = refusal(path)
    assert message.startswith(f"{path}: averaging: averager 'window'"), message
    sets = suggested_sets(message)
    assert sets == ["averaging={type: ema}", "averaging={type: none}"], message
    for command in sets:
        load_job(path, [command])  # every suggestion is accepted


# ---- 11. the memory plan of a small job is not printed -------------------------------------------------------------
def test_a_small_jobs_memory_plan_is_not_printed_a_large_ones_is(tmp_path, capsys, monkeypatch):
    import mtl.job

    data = image_job(tmp_path / "run")
    build_job(load_job(data=data))
    assert "memory plan" not in capsys.readouterr().out
    monkeypatch.setattr(mtl.job, "PLAN_SHOWN_FROM", 1)
    build_job(load_job(data=data))
    out = capsys.readouterr().out
    assert out.startswith("memory plan per process") and "task 'ids' head 'arcface'" in out, out


# ---- 10. messages that mislead ---------------------------------------------------------------------------------
def test_too_few_head_classes_says_how_many_the_labels_need(tmp_path):
    data = image_job(tmp_path / "run")
    data["tasks"][1]["head"] = {"type": "softmax", "num_classes": 2}
    with pytest.raises(ConfigError) as refused:
        build_job(load_job(data=data), announce_plan=False)
    message = str(refused.value)
    assert "tasks.1.head.num_classes" in message and "labels are 0..2 (3 classes)" in message, message
    assert "set num_classes to 3" in message and "go up to" not in message
