"""Reader faults never hang: with and without DataLoader workers, at 1 and 2 processes, a reader that raises, a
sample that lacks a declared field, or a worker killed like the OOM killer does, ends the job with exit status 2 and
one line naming the task, the reader, the sample index and what was wrong; the original traceback is in the rank's
log file. A hang would show as the subprocess timeout (exit code -9), never as a slow pass."""
import logging
import os
import sys

import pytest
import yaml

from mtl.data.scheduler import JointSchedule
from mtl.data.steps import StepDataset, error_text
from tests import warm_python
from tests.dist_scripts.faulty_readers.faulty_readers import FieldlessReader, RaisingReader
from tests.dist_util import ROOT, run_distributed
from tests.references.steps import step_samples

TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
PLUGIN = os.path.join(ROOT, "tests", "dist_scripts", "faulty_readers")
WHAT = {"raising_synthetic": "the reader raised ValueError: cannot decode record 5: deliberate failure",
        "fieldless_synthetic": "the sample lacks the declared field(s) ['label'] (it has ['image'])",
        "self_killing_synthetic": "was killed by SIGKILL (the system's out-of-memory killer sends it"}


def write_job(tmp_path, reader, workers):
    """A one-task job whose reader fails on sample 5, read at step 2 (batch 8 of a 32-sample epoch)."""
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"), "plugins": [PLUGIN],
           "tasks": [{"name": "faces", "reader": {"type": reader, "num_samples": 32, "num_classes": 5, "bad_index": 5},
                      "head": {"type": "arcface", "scale": 8.0}, "eval": None}],
           "backbone": {"type": "mlp"}, "schedule": {"batch_size": 8, "steps": 12},
           "log": {"every": 1, "progress": False, "plot": False}, "checkpoint": {"every": 0},
           "data": {"num_workers": workers}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def expected_line(reader):
    if reader == "self_killing_synthetic":
        return WHAT[reader]
    return f"task 'faces': reader '{reader}', sample 5 (step "


def test_a_fault_becomes_an_error_item_naming_task_reader_and_sample():
    readers = {"faces": RaisingReader(num_samples=32, num_classes=5, bad_index=5)}
    schedule = JointSchedule(["faces"], [1.0], 8, seed=0)
    dataset = StepDataset(schedule, readers, seed=0, start_step=0, end_step=4)
    bad = [s for s in range(4) if 5 in step_samples(dataset, s)["faces"]]
    assert len(bad) == 1  # sample 5 is read once in the first epoch
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("mtl").addHandler(handler)
    try:
        text = error_text(dataset[bad[0]])
    finally:
        logging.getLogger("mtl").removeHandler(handler)
    assert text.startswith(f"ReaderFault\ntask 'faces': reader 'raising_synthetic', sample 5 (step {bad[0] + 1}): "
                           f"{WHAT['raising_synthetic']} (traceback in ")
    assert "Traceback" in records[0].getMessage() and "deliberate failure" in records[0].getMessage()
    assert all(error_text(dataset[s]) is None for s in range(4) if s != bad[0])
    fieldless = StepDataset(schedule, {"faces": FieldlessReader(num_samples=32, num_classes=5, bad_index=5)}, 0, 0, 4)
    assert WHAT["fieldless_synthetic"] in error_text(fieldless[bad[0]])


@pytest.mark.parametrize("reader,workers", [("raising_synthetic", 0), ("raising_synthetic", 2),
                                            ("fieldless_synthetic", 0), ("self_killing_synthetic", 1)])
@pytest.mark.subprocess
def test_one_process_stops_with_one_line(tmp_path, reader, workers):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = warm_python.run([sys.executable, TRAIN, write_job(tmp_path, reader, workers)], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and expected_line(reader) in errors[0] and WHAT[reader] in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if reader == "raising_synthetic":
        log = (tmp_path / "run" / "logs" / "rank0.log").read_text()
        assert errors[0].endswith(f"(traceback in {tmp_path / 'run' / 'logs' / 'rank0.log'})")
        assert "Traceback (most recent call last)" in log and "deliberate failure" in log


@pytest.mark.distributed
@pytest.mark.parametrize("reader,workers", [("raising_synthetic", 0), ("raising_synthetic", 1),
                                            ("fieldless_synthetic", 1), ("self_killing_synthetic", 1)])
def test_two_processes_stop_together_with_one_line_each(tmp_path, reader, workers):
    code, output = run_distributed(TRAIN, 2, [write_job(tmp_path, reader, workers)], timeout=120)
    assert code not in (0, -9), output
    logs = output.split("\n===== ")[1:]
    workerlogs = [part for part in logs if part.startswith("workerlog.")]
    assert len(workerlogs) == 2, output
    for rank, text in enumerate(workerlogs):  # every rank says it, in one line, without a traceback
        lines = [line for line in text.splitlines() if line.startswith(f"error (rank {rank}):")]
        assert len(lines) == 1 and expected_line(reader) in lines[0] and WHAT[reader] in lines[0], text
        # no Python traceback; rank that exits last may show Paddle's C++ dump of the launcher's SIGTERM
        assert " met: " in lines[0] and "\nTraceback (most recent call last)" not in text, text
    # no rank was left waiting in a collective until gloo gave up
    assert "TIMEOUT" not in output.split("\n===== ")[0], output
