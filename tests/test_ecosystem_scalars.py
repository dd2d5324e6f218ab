"""VisualDL scalars: what a run writes under output_dir/vdl/ reads back equal to its metrics.jsonl records."""
import json
import os

import pytest

from mtl.config.loading import load_job
from mtl.train.job import build_job
from mtl.train.trainer import Trainer

pytest.importorskip("visualdl")
from mtl.train.scalars import read_scalars  # noqa: E402


def job_cfg(out, **log):
    return {"seed": 0, "output_dir": str(out),
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 6,
                                                 "shape": [1, 8, 8]}, "head": {"type": "arcface", "scale": 8.0}},
                      {"name": "kind", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 4,
                                                  "shape": [1, 8, 8], "seed": 5}, "head": {"type": "softmax"}}],
            "backbone": {"type": "cnn", "in_channels": 1, "input_size": 8, "embedding_size": 16},
            "schedule": {"batch_size": 16, "steps": 8}, "optimizer": {"lr": 0.05},
            "checkpoint": {"every": 4}, "eval": {"every": 4},
            "log": {"progress": False, "plot": False, "every": 1, **log}, "data": {"num_workers": 0}}


def train(out, until=None, resume=False, **log):
    job = build_job(load_job(data=job_cfg(out, **log)))
    Trainer(job, resume=resume, console=lambda *a: None).run(until=until)


def expected_scalars(out):
    """{tag: [(step, value)]} from metrics.jsonl, the independent record of what was logged."""
    expected = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    expected.setdefault(key, []).append((record["step"], float(value)))
    return expected


def assert_same(written, expected):
    assert set(written) == set(expected)
    for tag, points in expected.items():
        got = sorted(written[tag])
        assert [s for s, _ in got] == [s for s, _ in points], tag
        for (_, a), (_, b) in zip(got, points):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-7), tag  # stored as float32


def test_visualdl_scalars_match_metrics_log(tmp_path):
    out = tmp_path / "run"
    train(out, visualdl=True)
    written = read_scalars(str(out / "vdl"))
    expected = expected_scalars(out)
    for tag in ("loss", "loss/ids", "loss/kind", "lr", "eval/ids/accuracy", "eval/kind/accuracy"):
        assert tag in expected
    assert len(written["loss"]) == 8
    assert_same(written, expected)


def test_resumed_run_writes_each_step_once(tmp_path):
    out = tmp_path / "run"
    train(out, until=6, visualdl=True)  # stops after step 6; the checkpoint is at step 4
    train(out, resume=True, visualdl=True)
    written = read_scalars(str(out / "vdl"))
    assert [s for s, _ in sorted(written["loss"])] == list(range(1, 9))
    assert_same(written, expected_scalars(out))


def test_off_by_default(tmp_path):
    out = tmp_path / "run"
    train(out)
    assert not (out / "vdl").exists()
