"""The report scripts' progress lines (mtl/core/progress.py, issue 30 item 7 and "a progress line for every step of the
reports"): which run of how many, times so far and left, a running run's step; one seed is said, not '± 0.0000'."""
import io
import json
import os
import time

import numpy as np

from mtl.core import progress as progress_module
from mtl.core.progress import Progress, duration, run_step, spread


def test_duration_reads_as_minutes_and_hours():
    assert [duration(s) for s in (12.4, 185, 3725)] == ["12s", "3m05s", "1h02m"]


def test_spread_says_one_seed_and_is_numpys_std_for_several():
    assert spread([0.86281]) == "0.8628 (one seed)"
    values = [0.81, 0.84, 0.9]
    assert spread(values) == f"{np.mean(values):.4f} ± {np.std(values):.4f}"
    assert spread([97.1, None, 96.4], digits=2) == f"{np.mean([97.1, 96.4]):.2f} ± {np.std([97.1, 96.4]):.2f}"
    assert spread([]) == "" and spread([None]) == ""


def write_run(folder, steps, step):
    folder.mkdir(exist_ok=True)
    (folder / "job.json").write_text(json.dumps({"schedule": {"steps": steps}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                                                  for s in range(1, step + 1)) + '{"step": ')  # caught mid-write


def test_run_step_reads_the_last_step_and_ignores_an_earlier_runs_files(tmp_path):
    write_run(tmp_path / "run", 600, 120)
    assert run_step(str(tmp_path / "run")) == (120, 600)
    old = time.time() - 100
    os.utime(tmp_path / "run" / "metrics.jsonl", (old, old))  # a previous run's, before this one started
    assert run_step(str(tmp_path / "run"), since=time.time() - 10) is None
    assert run_step(str(tmp_path / "missing")) is None


def watched(monkeypatch, total, every, start):
    """``(progress, out, now)``: a Progress of ``total`` items printing into ``out`` every ``every`` s of the clock
    ``now[0]`` (from ``start``), whose watch threads poll every 10 ms."""
    monkeypatch.setattr(progress_module, "POLL_SECONDS", 0.01)
    now, out = [start], io.StringIO()
    return Progress("train", total, stream=out, every=every, clock=lambda: now[0]), out, now


def test_a_watched_run_prints_its_step_and_time_left_while_it_trains(tmp_path, monkeypatch):
    progress, out, now = watched(monkeypatch, 3, 30.0, 1000.0)
    run = tmp_path / "run"
    with progress.watch("seed 0 joint", str(run)):
        write_run(run, 600, 150)
        time.sleep(0.1)  # polled, but less than 30 s since the run began: no line yet
        assert out.getvalue() == ""
        now[0] = 1060.0  # a quarter of the steps in one minute: three minutes left
        deadline = time.time() + 10
        while not out.getvalue() and time.time() < deadline:
            time.sleep(0.01)
    assert out.getvalue().splitlines() == ["[train 1/3] seed 0 joint: step 150 of 600, 1m00s, about 3m00s left"]
    with progress.watch("seed 1 joint", str(tmp_path / "other")):  # the second run started: 2 of 3
        now[0] = 1200.0
        write_run(tmp_path / "other", 10, 5)
        while out.getvalue().count("\n") < 2 and time.time() < deadline:
            time.sleep(0.01)
    assert out.getvalue().splitlines()[1] == "[train 2/3] seed 1 joint: step 5 of 10, 2m20s, about 2m20s left"


def test_a_watched_run_that_stops_logging_says_so_and_when_every_step_is_done(tmp_path, monkeypatch):
    """No estimate while the step does not move (an evaluation, a checkpoint), nor after the last step."""
    progress, out, now = watched(monkeypatch, 1, 30.0, 0.0)
    run = tmp_path / "run"
    deadline = time.time() + 10

    def line_at(when, count):
        now[0] = when
        while out.getvalue().count("\n") < count and time.time() < deadline:
            time.sleep(0.01)
        return out.getvalue().splitlines()[count - 1]

    with progress.watch("seed 0 joint", str(run)):
        write_run(run, 600, 580)
        time.sleep(0.05)  # read at t = 0
        assert line_at(60.0, 1) == "[train 1/1] seed 0 joint: step 580 of 600, 1m00s, about 2s left"
        assert line_at(95.0, 2) == "[train 1/1] seed 0 joint: step 580 of 600 (logged 1m35s ago), 1m35s"
        write_run(run, 600, 600)
        time.sleep(0.05)
        assert line_at(130.0, 3) == "[train 1/1] seed 0 joint: all 600 steps done, 2m10s; evaluating and saving"


def test_a_finished_line_says_which_run_of_how_many_and_the_time_left():
    clock = iter([100.0, 130.0, 190.0])
    out = io.StringIO()
    progress = Progress("score", 4, stream=out, clock=lambda: next(clock))
    progress.finished("seed 0 naive", 100.0)
    progress.finished("seed 0 oracle", 130.0)
    assert out.getvalue().splitlines() == ["[score 1/4] seed 0 naive (30s); elapsed 30s, about 1m30s left",
                                           "[score 2/4] seed 0 oracle (1m00s); elapsed 1m30s, about 1m30s left"]


def test_a_watched_run_after_runs_read_from_disk_takes_the_next_number(tmp_path, monkeypatch):
    """Items read from an earlier report's folder (``read=True``) take numbers too. Several runs at once (as with
    several jobs): b and a watched, c read, a finished, then d starts while b still runs: d is 4 of 4 (counting the
    finished ones would give 3; the multimnist report numbered 3, 2, 3 after two read runs)."""
    progress, out, now = watched(monkeypatch, 4, 0.0, 1000.0)
    run = tmp_path / "d"
    deadline = time.time() + 10
    with progress.watch("b", str(tmp_path / "b")):
        with progress.watch("a", str(tmp_path / "a")):
            progress.finished("c (finished before, read)", now[0], read=True)
        progress.finished("a", now[0])
        with progress.watch("d", str(run)):
            now[0] = 1060.0
            write_run(run, 600, 150)
            while "] d: step" not in out.getvalue() and time.time() < deadline:
                time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[train 1/4] c (finished before, read) (0s); elapsed 0s, about 0s left",
                         "[train 2/4] a (0s); elapsed 0s, about 0s left"]
    assert [line for line in lines if "] d: step" in line][0].startswith("[train 4/4] d: step 150 of 600"), lines
