"""A job in which rank 1 raises exits non-zero promptly, with rank 1's error visible; no hang."""
import os
import time

import pytest

from tests.dist_util import ROOT, run_distributed

pytestmark = pytest.mark.distributed


def test_rank_failure_stops_the_job(tmp_path):
    job = os.path.join(ROOT, "tests", "dist_scripts", "failing_job.yaml")
    start = time.time()
    code, output = run_distributed(os.path.join(ROOT, "examples", "train_joint.py"), 2,
                                   [job, "--set", f"output_dir={tmp_path}"], timeout=120)
    elapsed = time.time() - start
    assert code not in (0, -9), output
    assert elapsed < 60, f"took {elapsed:.0f} s"
    console = output.split("\n===== ")[0]  # the launcher's own console, before the appended per-rank logs
    assert "deliberate failure on rank 1" in console, output


def test_a_bad_record_in_one_ranks_slice_stops_every_rank_with_its_message(tmp_path):
    """The label check runs where the record is read (one rank's DataLoader worker); every rank must stop with it."""
    import numpy as np
    import yaml

    labels = np.arange(48) % 3
    labels[21] = 7  # outside [0, 3)
    np.savez(tmp_path / "data.npz", image=np.random.RandomState(0).randn(48, 1, 8, 8).astype("float32"),
             label=labels)
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"),
           "tasks": [{"name": "digitsish", "reader": {"type": "numpy", "path": str(tmp_path / "data.npz"),
                                                      "num_classes": 3},
                      "head": {"type": "softmax", "num_classes": 3}, "eval": None}],
           "backbone": {"type": "mlp"}, "schedule": {"batch_size": 8, "steps": 20},
           "log": {"progress": False, "plot": False}, "data": {"num_workers": 1}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    start = time.time()
    code, output = run_distributed(os.path.join(ROOT, "examples", "train_joint.py"), 2, [str(tmp_path / "job.yaml")],
                                   timeout=120)
    assert code not in (0, -9), output
    assert time.time() - start < 60
    console = output.split("\n===== ")[0]
    assert "sample 21 of the training split" in console and "label 7, outside [0, 3)" in console, output
    assert "TIMEOUT" not in console, output  # no rank was left waiting in a collective until gloo gave up
