"""bench/bench_weighting_faces.py's arithmetic on made-up finished runs: Δm (Maninis et al. 2019) and the verdict
against twice the seed-to-seed spread, computed here by hand; --finished-only tabulates what finished and names the
rest."""
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_weighting_faces as bench  # noqa: E402

from tests import warm_python  # noqa: E402

TASKS = ["a", "b"]
ALONE = {0: {"a": 0.80, "b": 0.90}, 1: {"a": 0.82, "b": 0.88}}


def fake_run(folder, accuracy, rate=100.0, peak=500.0):
    """A finished run's files: summary.json with averaged verification per task, metrics.jsonl, bench.json."""
    os.makedirs(folder)
    tasks = {t: {"eval": {"verification_accuracy": 0.0}, "eval_averaged": {"verification_accuracy": a}}
             for t, a in zip(TASKS, accuracy)}
    json.dump({"tasks": tasks}, open(os.path.join(folder, "summary.json"), "w"))
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for r in (rate * 0.5, rate, rate * 2):
            f.write(json.dumps({"samples_per_s": r}) + "\n")
    json.dump({"peak_mib": peak}, open(os.path.join(folder, "bench.json"), "w"))


def test_delta_m_and_the_verdict_equal_the_formulas(tmp_path):
    runs = {}
    # seed means: static 0.85, 0.87 (spread 0.01, so anything within 0.02 of 0.86 is noise); close 0.855, 0.865
    plan = {"static": ([0.80, 0.90], [0.84, 0.90]), "better": ([0.90, 0.95], [0.91, 0.96]),
            "close": ([0.81, 0.90], [0.83, 0.90])}
    for name, per_seed in plan.items():
        runs[name] = []
        for seed, accuracy in enumerate(per_seed):
            fake_run(tmp_path / name / f"seed{seed}", accuracy, rate=100.0 if name == "static" else 50.0)
            runs[name].append(bench.figures(tmp_path / name / f"seed{seed}", 500.0))
    rows = bench.summarise(runs, ALONE, [0, 1])
    for name, per_seed in plan.items():
        expected = [100 * np.mean([(acc[i] - ALONE[s][t]) / ALONE[s][t] for i, t in enumerate(TASKS)])
                    for s, acc in enumerate(per_seed)]
        np.testing.assert_allclose(rows[name]["delta_m"], expected)
        np.testing.assert_allclose(rows[name]["accuracy"], [np.mean(a) for a in per_seed])
    assert rows["better"]["step_time"] == pytest.approx(2.0)  # half the samples per second
    assert bench.verdict(rows["better"], rows["static"]) == "better"
    assert bench.verdict(rows["close"], rows["static"]) == "noise"
    assert bench.verdict(rows["static"], rows["better"]) == "worse"


def test_finished_only_tabulates_what_finished_and_names_the_rest(tmp_path):
    for seed in (0, 1):
        fake_run(tmp_path / "static" / f"seed{seed}", [0.80, 0.90])
        fake_run(tmp_path / "pcgrad" / f"seed{seed}", [0.81, 0.91])
    fake_run(tmp_path / "mgda" / "seed0", [0.7, 0.7])  # one seed of two: not finished
    datasets = {t: [ALONE[0][t], ALONE[1][t]] for t in TASKS}
    json.dump({"arms": {"alone": {"datasets": datasets}}}, open(tmp_path / "alone.json", "w"))
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "bench", "bench_weighting_faces.py"), "--seeds", "0",
                           "1", "--out", str(tmp_path), "--strategies", "static", "pcgrad", "mgda", "--finished-only"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| pcgrad" in proc.stdout and "| mgda" not in proc.stdout
    assert "not measured: mgda" in proc.stdout
