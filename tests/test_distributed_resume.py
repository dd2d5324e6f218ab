"""Exact resume at 2 processes: stopped by --until after step 5 (periodic checkpoint at 3, --until's at 5) and
resumed, the run ends bit for bit where an uninterrupted one does (BatchNorm statistics included: saving and
evaluating average them over ranks only while they write or score); mid-run evaluation and checkpoints with an empty
head shard and averaging.

The uninterrupted run and the run stopped after step 5 are in the session's one launch of 2-process runs
(tests/shared_runs.py); the resume is a launch of its own, so it starts in processes that never trained the job."""
import json
import os

import numpy as np
import pytest

from mtl.core.safe_pickle import load_paddle_file
from tests.dist_util import ROOT, run_distributed
from tests.shared_runs import two_process_run

pytestmark = [pytest.mark.distributed, pytest.mark.two_process_runs("resume_full", "resume_cut")]

JOB = os.path.join(ROOT, "tests", "dist_scripts", "resume_job.yaml")
TRAIN = os.path.join(ROOT, "examples", "train_joint.py")


def launch(out, *extra):
    code, output = run_distributed(TRAIN, 2, [JOB, "--set", f"output_dir={out}", *extra], timeout=300)
    assert code == 0, output


def checkpoint_files(out, step):
    root = os.path.join(out, "checkpoints", f"step_{step}")
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
                  if f.endswith(".pdparams") and not f.startswith(("averager", "rng")))


@two_process_run("resume_full")
def _full(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}"]}, str(folder)


@two_process_run("resume_cut")
def _cut(folder):
    return {"train": [JOB, "--until", "5", "--set", f"output_dir={folder}"]}, str(folder)


def test_resume_at_two_processes_is_exact(two_process):
    full, cut = two_process["resume_full"], two_process["resume_cut"]
    assert os.path.isdir(os.path.join(cut, "checkpoints", "step_3")) and os.path.isdir(os.path.join(cut, "checkpoints",
                                                                                                     "step_5"))
    assert not os.path.isdir(os.path.join(cut, "checkpoints", "step_8"))
    launch(cut, "--resume")
    files = checkpoint_files(full, 8)
    assert files == checkpoint_files(cut, 8)
    assert "heads/one.shard1of2.pdparams" in files and "backbone.averaged.pdparams" in files
    for name in files:
        a = load_paddle_file(os.path.join(full, "checkpoints", "step_8", name))
        b = load_paddle_file(os.path.join(cut, "checkpoints", "step_8", name))
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=f"{name} {key}")
    ra = [json.loads(x) for x in open(os.path.join(full, "metrics.jsonl"))]
    rb = [json.loads(x) for x in open(os.path.join(cut, "metrics.jsonl"))]
    assert [r["step"] for r in ra if "loss" in r] == list(range(1, 9))
    assert ra == [dict(r, samples_per_s=x.get("samples_per_s")) if "samples_per_s" in r else r
                  for r, x in zip(rb, ra)]
    summary = json.load(open(os.path.join(cut, "summary.json")))
    assert summary["resumed_from"].endswith("step_5") and summary["tasks"]["pfc"]["eval_averaged"]
