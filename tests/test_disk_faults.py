"""Disk faults (issue 55): a checkpoint that cannot be written (ENOSPC, EROFS, EACCES, EIO) on any rank leaves the
previous checkpoint complete and the one ``--resume`` picks; the job says which file and why in one sentence and
stops (exit status 74), or trains on and tries again at the next interval (``on_save_error: retry``); records and log
lines that cannot be written stop the job the same way, the records before them intact. The real-disk tests mount a
small tmpfs (the tests run as root), fill it during a checkpoint, and make it read-only during a run."""
import errno
import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

from mtl.core.errors import DiskError
from mtl.store import checkpoint, integrity, layout
from mtl.train import reporting
from tests.dist_util import ROOT, run_distributed
from tests.shared_runs import train_here, two_process_run

TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
PLUGIN = os.path.join(ROOT, "tests", "dist_scripts", "stuck_readers")
PAGE = 4096
NOT_MOUNTABLE = "mounting a tmpfs needs root and a kernel that allows it"


def job(out, steps=12, every=5, reader=None, **over):
    cfg = {"seed": 0, "device": "cpu", "output_dir": str(out), "plugins": [PLUGIN] if reader else [],
           "tasks": [{"name": "faces", "reader": reader or {"type": "synthetic", "num_samples": 64, "num_classes": 5},
                      "head": {"type": "arcface", "scale": 8.0}, "eval": None}],
           "backbone": {"type": "mlp", "hidden": [256], "embedding_size": 128}, "schedule": {"batch_size": 8,
                                                                                          "steps": steps},
           "optimizer": {"type": "momentum", "lr": 0.05},
           "log": {"every": 1, "progress": False, "plot": False}, "checkpoint": {"every": every, "keep": 5},
           "data": {"num_workers": 0}, "watchdog": {"timeout": 0}}
    cfg.update(over)
    return cfg


def write(folder, name, out=None, **kw):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job(out or folder / name, **kw)))
    return str(path)


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{k: v for k, v in r.items() if k != "samples_per_s"} for r in map(json.loads, f) if "lr" in r]


def steps_saved(out):
    return sorted(os.listdir(os.path.join(out, "checkpoints")))


# ---- a failing file, whatever the error -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full")
    train_here(write(folder, "run"))
    return folder / "run"


def fail_once(monkeypatch, when, code):
    """``paddle.save`` of checkpoint files raises OSError ``code`` for the first file whose path holds ``when``."""
    real, failed = checkpoint.paddle.save, []

    def save(obj, path, *args, **kw):
        if when in str(path) and not failed:
            failed.append(str(path))
            with open(path, "wb") as f:
                f.write(b"half a file")  # as a write cut short leaves it
            raise OSError(code, os.strerror(code))
        return real(obj, path, *args, **kw)
    monkeypatch.setattr(checkpoint.paddle, "save", save)
    return failed


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO])
def test_a_checkpoint_that_cannot_be_written_leaves_the_previous_one_selected(tmp_path, monkeypatch, code):
    failed = fail_once(monkeypatch, os.path.join(".step_10.tmp", "optimizer.rank0.pdopt"), code)
    with pytest.raises(DiskError) as info:
        train_here(write(tmp_path, "run"))
    out = tmp_path / "run"
    previous = out / "checkpoints" / "step_5"
    assert str(info.value) == (f"the checkpoint of step 10 was not written: could not write '{failed[0]}': "
                               f"{os.strerror(code)} ({errno.errorcode[code]}); nothing of it was kept; '{previous}' "
                               "stays the checkpoint --resume continues from; the job stops (on_save_error: stop)")
    assert info.value.exit_status == 74
    assert steps_saved(out) == ["step_5"]  # the unfinished folder is gone: no half checkpoint
    assert integrity.verify(str(previous)) == "" and layout.latest_checkpoint(str(out)) == str(previous)


def test_a_checkpoint_whose_state_json_cannot_be_written_is_not_published(tmp_path, monkeypatch):
    real = integrity.write_state

    def write_state(folder, state):
        if state["step"] == 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(folder, state)
    monkeypatch.setattr(integrity, "write_state", write_state)
    with pytest.raises(DiskError, match=r"could not write '.*\.step_10\.tmp/state\.json': No space left on device"):
        train_here(write(tmp_path, "run"))
    assert steps_saved(tmp_path / "run") == ["step_5"]


def test_retry_trains_on_and_equals_an_uninterrupted_run(tmp_path, monkeypatch, capfd, uninterrupted):
    fail_once(monkeypatch, os.path.join(".step_5.tmp", "backbone.pdparams"), errno.ENOSPC)
    summary = train_here(write(tmp_path, "run", on_save_error="retry"))
    warning = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning")]
    assert len(warning) == 1 and warning[0].endswith(
        "nothing of it was kept; no checkpoint was written yet; training goes on and tries again at step 10 "
        "(on_save_error: retry)"), warning
    assert summary["steps"] == 12 and steps_saved(tmp_path / "run") == ["step_10", "step_12"]
    assert records(tmp_path / "run") == records(uninterrupted)  # a failed save changed nothing of the training


@pytest.mark.parametrize("what", ["metrics.jsonl", "rank0.log"])
def test_a_record_or_log_line_that_cannot_be_written_stops_the_job_at_the_next_step(tmp_path, monkeypatch, what,
                                                                                       uninterrupted):
    """Step 7's record (or its log line) meets a full disk: the job stops in step 8 with one sentence naming the
    file, before training on (no checkpoint of step 10); the records before it are intact."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real_append, real_emit = reporting.append_line, reporting.RankLogHandler.emit

    def append_line(path, text):
        if path.endswith("metrics.jsonl") and '"step": 7,' in text and "lr" in text:
            return reporting.write_problem(path, full)
        return real_append(path, text)

    def emit(handler, record):
        if '"step": 7,' in record.getMessage():
            try:  # as logging.StreamHandler.emit meets a failed write
                raise full
            except OSError:
                handler.handleError(record)
            return
        real_emit(handler, record)
    if what == "metrics.jsonl":
        monkeypatch.setattr(reporting, "append_line", append_line)
    else:
        monkeypatch.setattr(reporting.RankLogHandler, "emit", emit)
    with pytest.raises(DiskError) as info:
        train_here(write(tmp_path, "run"))
    out = tmp_path / "run"
    path = out / "metrics.jsonl" if what == "metrics.jsonl" else out / "logs" / "rank0.log"
    record = "the record of step 7 was not written: " if what == "metrics.jsonl" else ""
    assert str(info.value) == f"{record}could not write '{path}': No space left on device (ENOSPC); the job stops"
    assert steps_saved(out) == ["step_5"]  # stopped in step 8, not at the end of the run
    kept = 6 if what == "metrics.jsonl" else 7
    assert records(out) == records(uninterrupted)[:kept] and not (out / "summary.json").exists()


# ---- a real small filesystem ------------------------------------------------------------------------------------
@pytest.fixture
def disk(tmp_path):
    """``mount(size, at=FOLDER)`` mounts a tmpfs of ``size`` bytes at ``FOLDER`` (default ``tmp_path/disk``);
    ``mount(size)`` or ``mount(options="ro")`` again remounts it; unmounted after the test."""
    mounted = []

    def mount(size=None, options=None, at=None):
        opts = options or f"size={size}"
        if mounted:
            cmd = ["mount", "-o", f"remount,{opts}", str(mounted[0])]
        else:
            mounted.append(at or tmp_path / "disk")
            mounted[0].mkdir(parents=True, exist_ok=True)
            cmd = ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mounted[0])]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"{NOT_MOUNTABLE} ({' '.join(cmd)}: {done.stderr.strip()})")
        return mounted[0]
    yield mount
    if mounted:
        subprocess.run(["umount", "-l", str(mounted[0])], capture_output=True)


def pages(folder):
    """Bytes a tmpfs needs for every file under ``folder`` (whole pages)."""
    return sum(-(-os.path.getsize(os.path.join(d, f)) // PAGE) * PAGE for d, _, names in os.walk(folder)
               for f in names)


def room_for_one_and_a_half(checkpoint_folder, allowance=32 * PAGE):
    """A disk size where the run's small files and one checkpoint fit, and the next checkpoint fails half-way."""
    size = pages(checkpoint_folder)
    assert size >= 40 * PAGE, size  # large enough that half of one is far more than the small files need
    return allowance + size + size // 2


def test_a_full_disk_during_a_checkpoint_at_one_process(tmp_path, disk, uninterrupted):
    where = disk(room_for_one_and_a_half(uninterrupted / "checkpoints" / "step_5"))
    config = write(tmp_path, "run", out=where / "run")
    with pytest.raises(DiskError) as info:
        train_here(config)
    assert re.fullmatch(r"the checkpoint of step 10 was not written: could not write '.*/\.step_10\.tmp/[^']+': No "
                        r"space left on device \(ENOSPC\); nothing of it was kept; '.*/step_5' stays the checkpoint "
                        r"--resume continues from; the job stops \(on_save_error: stop\)", str(info.value)), info.value
    assert steps_saved(where / "run") == ["step_5"]
    assert records(where / "run") == records(uninterrupted)[:10]  # the records before the fault are intact
    disk(16 << 20)  # room again
    train_here(config, "--resume")
    assert records(where / "run") == records(uninterrupted)  # --resume chose step_5 and continued exactly


def test_checkpoints_on_a_filesystem_made_read_only_during_a_run(tmp_path, disk):
    """The run's checkpoints folder is a filesystem of its own, remounted read-only between two checkpoints (Linux
    refuses it while a file there is open for writing, so not under the run's own log)."""
    out = tmp_path / "run"
    disk(16 << 20, at=out / "checkpoints")
    slow = {"type": "slow_synthetic", "num_samples": 64, "num_classes": 5, "delay": 0.02}  # 0.16 s a step
    config = write(tmp_path, "run", out=out, steps=40, reader=slow)
    proc = subprocess.Popen([sys.executable, TRAIN, config], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    end = time.monotonic() + 120
    while not (out / "checkpoints" / "step_5").is_dir() and time.monotonic() < end:
        time.sleep(0.01)
    disk(options="ro")
    stderr = proc.communicate(timeout=120)[1]
    errors = [line for line in stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 74 and len(errors) == 1, stderr
    previous = out / "checkpoints" / "step_5"
    assert errors[0] == (f"error: the checkpoint of step 10 was not written: could not write '{out / 'checkpoints'}"
                         f"/.step_10.tmp': Read-only file system (EROFS); nothing of it was kept; '{previous}' stays "
                         f"the checkpoint --resume continues from; the job stops (on_save_error: stop)"), stderr
    assert steps_saved(out) == ["step_5"] and layout.latest_checkpoint(str(out)) == str(previous)
    assert len(records(out)) == 10  # every record up to the failed checkpoint


def test_an_output_dir_on_a_read_only_filesystem_is_refused_before_anything(tmp_path, disk):
    where = disk(1 << 20)
    disk(options="ro")
    proc = subprocess.run([sys.executable, TRAIN, write(tmp_path, "run", out=where / "run")], cwd=ROOT, text=True,
                          capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        f"output_dir: the folder '{where}' is not writable (it is on a read-only filesystem), so "
        f"'{where / 'run'}' cannot be created there"), proc.stderr


def test_a_record_cut_short_by_a_full_disk_is_taken_back(tmp_path, disk):
    where = disk(2 * PAGE)
    path = where / "metrics.jsonl"
    path.write_text("x" * (PAGE + 100))  # the second page is begun: a long append fills it, then fails
    problem = reporting.append_line(str(path), "y" * (2 * PAGE))
    assert problem == f"could not write '{path}': No space left on device (ENOSPC)"
    assert path.read_text() == "x" * (PAGE + 100)  # no half line
    handler = reporting.RankLogHandler(str(where / "rank0.log"))
    logger = logging.getLogger("test_disk_faults")
    logger.addHandler(handler)
    try:
        logger.error("%s", "z" * (2 * PAGE))  # logging's own handling would print a traceback on the console
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert handler.problem == f"could not write '{where / 'rank0.log'}': No space left on device (ENOSPC)"


# ---- two processes ----------------------------------------------------------------------------------------------
@two_process_run("disk_full_reference")
def _reference(folder):
    config = write(folder, "full")
    return {"train": [config]}, folder / "full"


@pytest.mark.distributed
@pytest.mark.two_process_runs("disk_full_reference")
def test_a_full_disk_during_a_checkpoint_at_two_processes(two_process, tmp_path, disk):
    reference = two_process["disk_full_reference"]
    where = disk(room_for_one_and_a_half(reference / "checkpoints" / "step_5", allowance=48 * PAGE))
    config = write(tmp_path, "run", out=where / "run")
    code, output = run_distributed(TRAIN, 2, [config], timeout=180)  # the launcher's logs are not on that disk
    errors = [line for line in output.splitlines() if line.startswith("error")]  # both ranks' and the console's
    assert code == 74 and len({line.split(": ", 1)[1] for line in errors}) == 1, output  # one sentence on every rank
    assert any(line.startswith("error (rank 1)") for line in errors), output
    assert re.fullmatch(r"error \(rank [01]\): the checkpoint of step 10 was not written: rank [01] could not write "
                        r"'.*/\.step_10\.tmp/[^']+': No space left on device \(ENOSPC\); nothing of it was kept; "
                        r"'.*/step_5' stays the checkpoint --resume continues from; the job stops "
                        r"\(on_save_error: stop\)", errors[0]), errors[0]
    assert steps_saved(where / "run") == ["step_5"]
    assert records(where / "run") == records(reference)[:10]
    disk(16 << 20)
    code, output = run_distributed(TRAIN, 2, [config, "--resume"], timeout=180)
    assert code == 0 and "--resume: from checkpoint " + str(where / "run" / "checkpoints" / "step_5") in output, output
    assert records(where / "run") == records(reference)

