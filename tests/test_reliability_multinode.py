"""Multi-node: two launchers on one host (``--nnodes 2 --master 127.0.0.1:PORT``, one process each) train exactly like
one launcher with two processes: the same per-step losses and gradient norms, the same final weights. The
one-launcher run is the session's joint-mode equivalence run (tests/equivalence.py), also read by
tests/test_distributed_training.py."""
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from mtl.core.safe_pickle import load_paddle_file
from tests import equivalence
from tests.dist_util import _read_logs, _stop, free_port, start_launcher

pytestmark = [pytest.mark.distributed, pytest.mark.two_process_runs("equivalence_joint")]

STEPS = equivalence.STEPS


def two_nodes(out, timeout=240):
    """Two launchers of one process each, joined through a master on 127.0.0.1; (exit codes, output)."""
    args = equivalence.argv(out, equivalence.JOINT)  # the overrides of the one-launcher run
    master = ["--nnodes", "2", "--master", f"127.0.0.1:{free_port()}"]
    logs = [tempfile.mkdtemp(prefix="mtl_node_") for _ in range(2)]
    procs = [start_launcher(equivalence.TRAIN, 1, args, log, launch_args=master) for log in logs]
    codes, output = [], []
    for proc in procs:
        try:
            out_text, _ = proc.communicate(timeout=timeout)
            codes.append(proc.returncode)
        except subprocess.TimeoutExpired:
            out_text = f"timed out after {timeout} s\n{_stop(proc)}"
            codes.append(-9)
        output.append(out_text)
    output += [_read_logs(log) for log in logs]
    for log in logs:
        shutil.rmtree(log, ignore_errors=True)
    return codes, "\n".join(output)


def records(out):
    from mtl.store.rundir import read_jsonl

    return [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if "loss" in r]


def test_two_launchers_equal_one_launcher_with_two_processes(two_process, tmp_path):
    nodes = str(tmp_path / "nodes")
    codes, output = two_nodes(nodes)
    assert codes == [0, 0], output
    local = two_process["equivalence_joint"]
    a, b = records(nodes), records(local)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        keys = sorted(k for k in rb if k.startswith(("loss", "grad_norm")))
        assert len(keys) >= 6  # total loss, grad_norm and every task's loss
        assert {k: ra[k] for k in keys} == {k: rb[k] for k in keys}, ra["step"]  # the same floats, bit for bit
    for name in ("backbone.pdparams", os.path.join("heads", "arc7.shard1of2.pdparams")):
        wa = load_paddle_file(os.path.join(nodes, "checkpoints", f"step_{STEPS}", name))
        wb = load_paddle_file(os.path.join(local, "checkpoints", f"step_{STEPS}", name))
        for key in wb:
            np.testing.assert_array_equal(wa[key], wb[key], err_msg=f"{name} {key}")
