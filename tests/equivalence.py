"""The 1-vs-2-process equivalence job (tests/dist_scripts/equivalence_job.yaml) and the runs of it that several test
files read: joint mode with gradient clipping (the global norm must include every rank's shard exactly once) and
checkpoints every 5 steps, trained once per session at 1 process (tests/test_distributed_training.py,
tests/test_reshard.py) and at 2 processes (tests/test_distributed_training.py, tests/test_reliability_multinode.py)."""
import os

from tests.dist_util import ROOT
from tests.shared_runs import one_process_run, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "equivalence_job.yaml")
TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
STEPS = 20  # schedule.steps of the job
JOINT = ["schedule.mode=joint", "optimizer.clip_norm=2.0", "checkpoint.every=5", "checkpoint.keep=5"]
SAMPLE = ["schedule.mode=sample", "schedule.batch_size=8"]


def argv(out, overrides, *extra):
    """``examples/train_joint.py`` arguments of the job with ``overrides``, written to ``out``."""
    return [JOB, *extra, "--set", f"output_dir={out}", *overrides]


@one_process_run("equivalence_joint")
def _one_joint(folder):
    return argv(folder, JOINT), str(folder)


@two_process_run("equivalence_joint")
def _two_joint(folder):
    return {"train": argv(folder, JOINT)}, str(folder)


@two_process_run("equivalence_sample")
def _two_sample(folder):
    return {"train": argv(folder, SAMPLE)}, str(folder)
