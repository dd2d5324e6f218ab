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
