"""The default demo job (what `make demo` runs): ArcFace verification >= 0.95 on held-out digits, every loss falls."""
import json
import os
import sys

import pytest

from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.subprocess
def test_demo_learns_three_tasks(tmp_path):
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # the demo picks its own thread count, as `make demo` would
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), "--set",
                           f"output_dir={tmp_path}", "log.progress=false"],
                          capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.load(open(tmp_path / "summary.json"))
    tasks = summary["tasks"]
    assert set(tasks) == {"digits_low", "digits_high", "digits_classify"}
    for name, info in tasks.items():
        assert info["loss_end"] < info["loss_start"], name
        if info["head"] == "arcface":
            assert info["eval"]["verification_accuracy"] >= 0.95, (name, info["eval"])
            assert info["eval_averaged"]["verification_accuracy"] >= 0.95, (name, info["eval_averaged"])
        else:
            assert info["eval"]["accuracy"] >= 0.95, (name, info["eval"])
    assert "verification_accuracy *" in proc.stdout  # the end-of-run table
    assert (tmp_path / "loss_curves.png").stat().st_size > 1000
