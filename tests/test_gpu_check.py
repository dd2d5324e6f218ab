"""tools/gpu_check.py runs on the CPU with tiny sizes, so that the one command meant for a GPU machine cannot rot:
every check runs, passes (the fused path is skipped: no CPU kernel) and lands in the JSON file. On the CPU the
heads check compares the device passes (Paddle ops, the GPU's code) with the host passes, the precisions all run
in float32 and so equal fp32, and the resume is bit for bit."""
import json

import pytest

from tools import gpu_check


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_gpu_check_runs_every_check_on_the_cpu(tmp_path):
    out = tmp_path / "check.json"
    code = gpu_check.main(["--device", "cpu", "--tiny", "--json", str(out), "--work", str(tmp_path / "work")])
    result = json.loads(out.read_text())
    assert code == 0 and result["failed"] == [], result
    checks = result["checks"]
    assert list(checks) == list(gpu_check.CHECKS)
    assert {name: check["status"] for name, check in checks.items()} == dict.fromkeys(gpu_check.CHECKS, "pass")
    assert checks["heads"]["fused"]["status"] == "skip"
    assert checks["heads"]["full"]["relative_difference"]["loss"] <= gpu_check.HEAD_TOLERANCE
    assert all(checks["precision"][f"{p}_{level}"]["relative_to_fp32"] == 0.0 for p, level in gpu_check.PRECISIONS)
    assert checks["resume"]["losses_bit_identical"] and checks["resume"]["weights_differing"] == []
    assert checks["throughput"]["samples_per_s"] > 0 and result["environment"]["device"] == "cpu"
