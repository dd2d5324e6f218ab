"""Non-finite steps: ``on_nonfinite: stop`` ends the job before the bad update, ``skip`` leaves it out; metrics.jsonl
stays strict JSON either way."""
import json
import os
import sys

import numpy as np
import pytest
import yaml

from mtl.config.loading import load_job
from mtl.core.safe_pickle import load_paddle_file
from mtl.data.steps import StepDataset
from mtl.train.guard import NonFiniteError, ordinal
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests import warm_python
from tests.references.steps import step_samples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strict_records(path):
    """Parse JSON lines refusing NaN / Infinity (what strict parsers do)."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    with open(path) as f:
        return [json.loads(line, parse_constant=refuse) for line in f]


@pytest.mark.subprocess
def test_a_diverging_job_stops_at_the_first_bad_step(tmp_path):
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"),
           "tasks": [{"name": "cls", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 5},
                      "head": "softmax", "eval": None}],
           "backbone": {"type": "mlp", "hidden": [32], "embedding_size": 16},
           "schedule": {"batch_size": 16, "steps": 60}, "optimizer": {"type": "sgd", "lr": 1e5, "decay": "none"},
           "log": {"every": 1, "progress": False, "plot": False}, "checkpoint": {"every": 1, "keep": 3},
           "data": {"num_workers": 0}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", "train", str(path)], capture_output=True, text=True,
                           cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    records = strict_records(tmp_path / "run" / "metrics.jsonl")
    bad = [r for r in records if r.get("nonfinite")]
    assert len(bad) == 1 and bad[-1] is records[-1]  # stopped right after the first bad step
    step = bad[0]["step"]
    assert line.startswith(f"error: step {step}: ") and "not finite" in line and "on_nonfinite" in line
    checkpoints = sorted(os.listdir(tmp_path / "run" / "checkpoints"), key=lambda n: int(n.split("_")[1]))
    newest = checkpoints[-1]
    assert int(newest.split("_")[1]) == step - 1 and f"step_{step - 1}" in line
    for name in ("backbone.pdparams", os.path.join("heads", "cls.shard0of1.pdparams")):
        for value in load_paddle_file(str(tmp_path / "run" / "checkpoints" / newest / name)).values():
            assert np.all(np.isfinite(value)), name
    assert not (tmp_path / "run" / "summary.json").exists()  # no evaluation or summary from the bad state


def regression_job(folder, bad_rows, **options):
    """A 12-step regression job (40 samples, batches of 8) whose target is NaN in ``bad_rows``, with the steps that
    read one of them (1-based, from the schedule by tests/references/steps.py): (job, bad steps)."""
    rng = np.random.RandomState(0)
    x = rng.randn(40, 8).astype("float32")
    target = (x[:, :2] * 0.5).astype("float32")
    target[list(bad_rows)] = np.nan
    np.savez(folder / "data.npz", features=x, target=target)
    data = {"seed": 1, "device": "cpu", "output_dir": str(folder / "run"), "on_nonfinite": "skip",
            "tasks": [{"name": "reg", "reader": {"type": "numpy", "path": str(folder / "data.npz")},
                       "head": {"type": "regression", "num_outputs": 2}, "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [8], "input_field": "features", "hidden": [16],
                         "embedding_size": 8},
            "schedule": {"batch_size": 8, "steps": 12}, "optimizer": {"type": "momentum", "lr": 0.05},
            "log": {"every": 4, "progress": False, "plot": False}, "data": {"num_workers": 0}, **options}
    cfg = load_job(data=data)
    job = build_job(cfg)
    order = StepDataset(job.schedule, {"reg": job.task("reg").reader}, cfg["seed"], 0, 12)
    return job, [s + 1 for s in range(12) if set(bad_rows) & set(step_samples(order, s)["reg"].tolist())]


def test_skip_leaves_one_bad_step_out(tmp_path):
    job, bad_steps = regression_job(tmp_path, [13])  # one bad sample
    summary = Trainer(job, console=lambda *a: None).run()
    assert summary["nonfinite_steps_skipped"] == len(bad_steps) >= 1
    records = [r for r in strict_records(tmp_path / "run" / "metrics.jsonl") if "lr" in r]
    assert [r["step"] for r in records if r.get("nonfinite")] == bad_steps
    assert all(r["loss/reg"] is None for r in records if r.get("nonfinite"))
    assert all(np.all(np.isfinite(p.numpy())) for p in job.model.parameters())


def first_stop(bad_steps, limit):
    """(step, run length) where a run of consecutive bad steps first reaches ``limit``, or None."""
    run, previous = 0, None
    for step in bad_steps:
        run = run + 1 if previous == step - 1 else 1
        previous = step
        if run >= limit:
            return step, run
    return None


@pytest.mark.parametrize("limit, words", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, None)])
def test_skip_stops_after_max_consecutive_nonfinite_bad_steps_in_a_row(tmp_path, limit, words):
    """``max_consecutive_nonfinite`` K: the job goes on past shorter runs of bad steps (the count starts again after
    a good step) and stops at the step where a run reaches K, naming it; rows 2 and 13 make steps 1, 5, 6, 7 bad."""
    job, bad_steps = regression_job(tmp_path, [2, 13], max_consecutive_nonfinite=limit)
    assert bad_steps == [1, 5, 6, 7]  # the premise: a run of 1, then a run of 3
    stop = first_stop(bad_steps, limit)
    trainer = Trainer(job, console=lambda *a: None)
    if stop is None:
        assert trainer.run()["nonfinite_steps_skipped"] == len(bad_steps)
        return
    with pytest.raises(NonFiniteError) as caught:
        trainer.run()
    step, run = stop
    assert str(caught.value).startswith(f"step {step}: the loss of task(s) 'reg' is not finite for the {words} step "
                                        f"in a row (max_consecutive_nonfinite {limit}); stopped;")
    records = [r for r in strict_records(tmp_path / "run" / "metrics.jsonl") if "lr" in r]
    assert records[-1]["step"] == step and [r["step"] for r in records if r.get("nonfinite")] == \
        [s for s in bad_steps if s <= step]


@pytest.mark.parametrize("n, words", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                      (13, "13th"), (21, "21st"), (22, "22nd"), (23, "23rd"), (101, "101st"),
                                      (111, "111th"), (112, "112th")])
def test_ordinals_of_the_guards_message(n, words):
    assert ordinal(n) == words
