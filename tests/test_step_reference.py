"""Issue 56's typed step changed nothing in what the code computes: the jobs of tests/step_reference.py (the demo,
accumulation with Partial FC under momentum and AdamW, cross-head negatives with ``update: both`` at K = 1 and 2, a
stopped and resumed online run) give, at 1 and at 2 processes, the same step records, final evaluation and final
checkpoint arrays, bit for bit, as commit 842ea44 (main's code before the change) on the same machine.

The reference is that commit's code run from ``git archive`` in a fresh process (a launch at 2 processes); a checkout
without the commit compares with the committed digests of the arrays that code wrote on the machine that made them
(tests/fixtures/step_reference.json, by :func:`digests`), which binds the comparison to that CPU.
"""
import hashlib
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests import step_reference
from tests.dist_util import ROOT, assert_success, run_distributed
from tests.shared_runs import two_process_run

BEFORE = "842ea44"  # main's last commit before issue 56's change
SCRIPT = os.path.join(ROOT, "tests", "step_reference.py")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "step_reference.json")


def digests(arrays) -> dict:
    """``{key: sha256 of the array's dtype, shape and bytes}``."""
    out = {}
    for key in sorted(arrays):
        value = np.ascontiguousarray(arrays[key])
        out[key] = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode() + value.tobytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def before(tmp_path_factory):
    """The folder of commit 842ea44's code (``git archive``), or None in a checkout without that commit."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", BEFORE], capture_output=True)
    if archive.returncode != 0:
        return None
    folder = tmp_path_factory.mktemp("before")
    (folder / "code.tar").write_bytes(archive.stdout)
    with tarfile.open(folder / "code.tar") as tar:
        tar.extractall(folder / "code", filter="data")
    assert not (folder / "code" / "tests" / "step_reference.py").exists()  # the code before this test existed
    return folder / "code"


def reference(before, which, tmp_path) -> dict:
    """Digests of the jobs ``which`` (one, two) trained by commit 842ea44's code, or the committed ones."""
    if before is None:
        with open(FIXTURE) as f:
            return json.load(f)[which]
    out = tmp_path / f"before_{which}.npz"
    env = {"PYTHONPATH": str(before), "OMP_NUM_THREADS": "1"}
    if which == "one":
        done = subprocess.run([sys.executable, SCRIPT, "one", str(out)], env=dict(os.environ, **env),
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
        output = done.stdout
    else:
        runs = tmp_path / "before_runs"
        runs.mkdir()
        code, output = run_distributed(SCRIPT, 2, ["two", str(out), str(runs)], env=env, timeout=300)
        assert_success(code, output)
    assert f"mtl from {before / 'mtl'}" in output  # the old code trained, not this checkout
    return digests(np.load(out))


def assert_same(got: dict, expected: dict):
    """Every key in both, every digest equal (the differing keys named)."""
    assert sorted(got) == sorted(expected), (set(got) ^ set(expected))
    differ = [key for key in expected if got[key] != expected[key]]
    assert not differ, f"{len(differ)} of {len(expected)} arrays differ from {BEFORE}'s: {differ[:12]}"


@pytest.mark.slow
def test_one_process_is_bit_identical_to_the_code_before(before, tmp_path):
    from mtl.core.runtime import select_device

    select_device("cpu")
    got = digests(step_reference.train_all(str(tmp_path / "now"), step_reference.ONE))
    assert_same(got, reference(before, "one", tmp_path))


@two_process_run("step_reference")
def _two_processes(folder):
    out = folder / "arrays.npz"
    return {"call": [SCRIPT, "main", "two", str(out), str(folder / "runs")]}, out


@pytest.mark.distributed
@pytest.mark.two_process_runs("step_reference")
def test_two_processes_are_bit_identical_to_the_code_before(before, two_process, tmp_path):
    assert_same(digests(np.load(two_process["step_reference"])), reference(before, "two", tmp_path))


if __name__ == "__main__":  # write the fixture: python tests/test_step_reference.py ONE.npz TWO.npz (842ea44's)
    with open(FIXTURE, "w") as f:
        json.dump({"one": digests(np.load(sys.argv[1])), "two": digests(np.load(sys.argv[2]))}, f, indent=0)
