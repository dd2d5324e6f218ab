"""The progress watchdog (issue 55): a process that stops answering without dying (SIGSTOP, a reader blocked on a dead
filesystem) stops the job within its timeout, with one sentence naming that process, its host, the step and what it
was doing; the last complete checkpoint stays the one ``--resume`` continues from, and the resumed run equals an
uninterrupted one; the ranks of a launch do not outlive a killed ``mtl launch``. Every job here sets a watchdog
timeout of a few seconds (the default is measured from the job's steps, at least a minute)."""
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from mtl.core import activity as activity_module
from mtl.data.reading import ReadingBoard
from mtl.data.scheduler import JointSchedule
from mtl.data.steps import StepDataset
from mtl.readers.synthetic import SyntheticReader
from mtl.train import blame, watchdog
from tests import warm_python
from tests.dist_scripts.stuck_readers.stuck_readers import BlockingReader
from tests.dist_util import ROOT, _descendants, launcher_env, run_distributed
from tests.references.steps import step_samples
from tests.shared_runs import two_process_run

TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
PLUGIN = os.path.join(ROOT, "tests", "dist_scripts", "stuck_readers")
TIMEOUT = 3.0  # the watchdog's timeout in these jobs (seconds)
STEPS = 40
SETTINGS = {"timeout": None, "multiple": 10.0, "floor": 60.0, "long_timeout": 1800.0}


# ---- the pieces -------------------------------------------------------------------------------------------------
def record(rank, step=7, phase="the per-step agreement of the ranks (an all-reduce)", waiting=True, beat=10):
    return {"run": "r", "rank": rank, "host": "node7", "pid": 4000 + rank, "beat": beat, "step": step,
            "phase": phase, "waiting": waiting, "long": None, "seconds": 4.0, "limit": 3.0}


def test_blame_names_the_process_that_does_not_run_or_is_stuck_in_its_own_work():
    waiting = {k: record(k) for k in range(3)}
    moved = {k: record(k, beat=12) for k in range(3)}
    assert blame.blame(waiting, {**moved, 2: record(2, beat=10)}, own_rank=0) == (2, "frozen")  # beat did not move
    assert blame.blame(waiting, {**moved, 1: None}, own_rank=0) == (1, "absent")  # no record of this run
    reading = record(1, phase="reading data", waiting=False, beat=12)
    assert blame.blame(waiting, {**moved, 1: reading}, own_rank=0) == (1, "stuck")  # alive, not waiting: the one
    assert blame.blame(waiting, {**moved, 2: record(2, waiting=False, beat=12)}, own_rank=2) == (2, "stuck")
    assert blame.blame(waiting, moved, own_rank=0) == (None, None)  # every process waits: nobody to name
    text = blame.sentence(1, "stuck", {**moved, 1: reading}, 3, blame.resume_words("runs/x/checkpoints/step_5"))
    assert text == ("rank 1 (host node7, process 4001) stopped answering in step 7 while reading data: its step made "
                    "no progress within 3 s (watchdog.timeout); every process of the job stops; the last checkpoint "
                    "is 'runs/x/checkpoints/step_5' (continue with --resume)")
    # gloo's own 30 s ran out first (a collective's error): the words do not claim the watchdog's timeout passed
    outwaited = blame.sentence(1, "outwaited", {**moved, 1: reading}, 3, "")
    assert "reading data: the collective the others waited in gave up first (gloo waits 30 s at most" in outwaited


def test_a_frozen_process_is_placed_in_the_step_of_the_ranks_that_wait_for_it():
    """Its own last record may be half a second old: the ranks waiting for it say which step it has not finished."""
    records = {0: record(0, step=21, beat=12), 1: record(1, step=17, phase="reading data", waiting=False, beat=10)}
    text = blame.sentence(1, "frozen", records, 2, blame.resume_words(None))
    assert text.startswith("rank 1 (host node7, process 4001) stopped answering in step 21: the other ranks wait for "
                           "it in the per-step agreement of the ranks (an all-reduce), and its process "), text
    assert text.endswith("every process of the job stops; no checkpoint was written yet")


def test_the_step_timeout_is_a_multiple_of_the_slowest_step_with_a_floor_and_a_ceiling():
    assert watchdog.step_timeout(SETTINGS, 0.5) == 60.0  # 10 x 0.5 s is below the floor
    assert watchdog.step_timeout(SETTINGS, 9.0) == 90.0
    assert watchdog.step_timeout(SETTINGS, 500.0) == 1800.0  # never above long_timeout
    assert watchdog.step_timeout(dict(SETTINGS, timeout=3.0), 500.0) == 3.0


def test_nccl_waits_longer_than_the_watchdog(monkeypatch):
    """``PADDLE_PG_TIMEOUT`` (what Paddle's process group reads, in ms) is set 60 s above the longest limit."""
    from paddle.distributed.parallel import ParallelEnv

    monkeypatch.setenv("PADDLE_PG_TIMEOUT", "")  # recorded first, so that the test leaves the variable as it was
    monkeypatch.delenv("PADDLE_PG_TIMEOUT")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    assert watchdog.set_collective_timeouts(SETTINGS) == "1860000"
    assert ParallelEnv().pg_timeout == (1800 + 60) * 1000
    monkeypatch.setenv("PADDLE_PG_TIMEOUT", "5000")  # the user's own value stays
    assert watchdog.set_collective_timeouts(SETTINGS) is None and os.environ["PADDLE_PG_TIMEOUT"] == "5000"
    assert watchdog.set_collective_timeouts(dict(SETTINGS, timeout=0), {"PADDLE_TRAINERS_NUM": "2"}) is None  # off
    assert watchdog.set_collective_timeouts(SETTINGS, {}) is None  # one process: no process group


def test_long_waits_never_count_as_a_step(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(activity_module.time, "monotonic", lambda: now[0])
    act = activity_module.Activity()
    act.begin_step(1, "reading data", first=True)
    now[0] += 500  # the first step: start-up, first reads
    assert act.snapshot()["long"] == "the first step" and act.snapshot()["seconds"] == 500
    act.begin_step(2, "reading data")
    now[0] += 1
    with act.long_wait("saving checkpoint step_2"):
        now[0] += 900
        assert act.snapshot()["long"] == "saving checkpoint step_2"
    now[0] += 2
    snap = act.snapshot()
    assert (snap["long"], snap["seconds"], snap["phase"]) == (None, 2.0, "reading data")  # the clock restarted
    act.begin_step(3, "reading data")
    assert act.snapshot()["slowest"] == 2.0  # step 2 without its save; step 1 (a long wait) is not counted
    with act.collective("an all-reduce (sum)"), act.collective("a nested one"):
        now[0] += 4
        assert (act.snapshot()["phase"], act.snapshot()["waited"]) == ("an all-reduce (sum)", 4.0)
    assert act.snapshot()["waiting"] is False and act.snapshot()["phase"] == "reading data"


def test_a_frozen_process_does_not_count_its_frozen_time(monkeypatch):
    """A watchdog thread that wakes long after it last looked was frozen with its process: the clocks started before
    move on by the frozen time, a clock started later is left alone, and a short oversleep changes nothing."""
    now = [100.0]
    monkeypatch.setattr(activity_module.time, "monotonic", lambda: now[0])
    act = activity_module.Activity()
    act.begin_step(3, "the forward and backward pass")
    dog = watchdog.Watchdog(dict(SETTINGS, timeout=TIMEOUT), "/nonexistent", 0, 1, "run", lambda: None, activity=act)
    now[0] += 2.0
    looked = dog._thaw(now[0] - blame.BEAT - 1.0)  # one second late: a busy machine, not a frozen process
    assert act.snapshot()["seconds"] == 2.0 and looked == now[0]
    now[0] += 0.2
    act.set("the forward and backward pass")  # a phase begun after the last look, before the freeze
    with act.collective("an all-reduce (sum)"):
        now[0] += 600.0  # stopped with SIGSTOP, continued with SIGCONT
        dog._thaw(looked)
        snap = act.snapshot()  # the time outside the freeze (2.2 s and 0.2 s), within one beat of the watchdog
        assert 2.2 - blame.BEAT <= snap["seconds"] <= 2.2 + blame.BEAT
        assert 0.2 - blame.BEAT <= snap["waited"] <= 0.2 + blame.BEAT
    with act.collective("an all-reduce (sum)"):
        act.discount(50.0, before=now[0] - 1.0)  # a collective entered after the freeze keeps its clock
        assert act.snapshot()["waited"] == 0.0


def test_time_the_training_thread_waited_for_a_cpu_is_not_the_steps(monkeypatch, tmp_path):
    """A training thread that is ready to run but given no CPU (a low-priority job on a busy machine) makes no
    progress through no fault of its own: the seconds the kernel counts it waiting on a run queue (schedstat's second
    field) since the watchdog last looked move its clocks on, the seconds it ran or slept do not; an oversleep of the
    watchdog's thread that those seconds explain is not also taken as a freeze; and at most ``long_timeout`` is taken
    off one step, so that a thread spinning forever on a busy machine is still stopped."""
    now = [100.0]
    monkeypatch.setattr(activity_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: now[0])
    stat = tmp_path / "schedstat"
    queued = [2.0]

    def count(seconds):
        queued[0] += seconds
        stat.write_text(f"5000000000 {int(queued[0] * 1e9)} 40\n")

    count(0.0)
    act = activity_module.Activity()
    act.begin_step(7, "the forward and backward pass")
    dog = watchdog.Watchdog(dict(SETTINGS, timeout=TIMEOUT, long_timeout=40.0), "/nonexistent", 0, 1, "run",
                            lambda: None, activity=act)
    dog.queued = (str(stat), watchdog.run_queue_seconds(str(stat)))
    assert dog.queued[1] == 2.0
    looked = now[0]
    now[0] += blame.BEAT + 0.1  # one beat, 0.5 s of it waiting for a CPU
    count(0.5)
    looked = dog._thaw(looked, dog._queued())
    assert act.snapshot()["seconds"] == pytest.approx(0.1)
    now[0] += 30.0  # this thread starved too: 29.5 s late, 27 s of which the training thread waited for a CPU
    count(27.0)
    looked = dog._thaw(looked, dog._queued())
    assert act.snapshot()["seconds"] == pytest.approx(3.1)  # not also 29.5 s of freeze
    assert dog.frozen_lately(10.0) == pytest.approx(30.0 - blame.BEAT)  # the process did not run: said so
    now[0] += 20.0  # 20 s more waiting, but the step may have only 40 s taken off in all: 12.5 s are left
    count(20.0)
    looked = dog._thaw(looked, dog._queued())
    assert act.snapshot()["seconds"] == pytest.approx(3.1 + 20.0 - 12.5)
    act.begin_step(8, "the forward and backward pass")  # a new step: a new allowance
    now[0] += 20.0
    count(20.0)
    looked = dog._thaw(looked, dog._queued())
    assert act.snapshot()["seconds"] == pytest.approx(0.0)
    stat.unlink()  # the thread ended (or no schedstats): nothing is read any more, nothing fails
    assert dog._queued() == 0.0 and dog.queued is None
    assert watchdog.run_queue_seconds("/nonexistent/schedstat") is None


def test_a_process_that_did_not_run_says_so_when_its_collective_failed(monkeypatch):
    """A rank that did not run for minutes (stopped alone, its machine paused, given no CPU) while the others waited
    for it in a collective: they gave up (gloo's 30 s), and its own collective fails when it runs again, before its
    watchdog thread looked; the run ends (the watchdog is stopped), and the sentence says that this process did not
    run, not that another one ended. A freeze over a minute old, or one shorter than half of gloo's wait, is not
    blamed."""
    import types

    now = [100.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: now[0])
    dog = watchdog.Watchdog(dict(SETTINGS, timeout=TIMEOUT), "/nonexistent", 0, 2, "run", lambda: "ckpt/step_40",
                            activity=activity_module.Activity())
    monkeypatch.setattr(watchdog, "_LAST", dog)
    monkeypatch.setattr(dog, "diagnose", lambda own_waiting: "the sentence naming another process")
    thread = types.SimpleNamespace(join=lambda timeout=None: None)  # a thread that looks (not started: the clock
    dog._thread, dog.looked = thread, now[0]  # is ours)
    now[0] += blame.BEAT + 1.0  # a busy machine: not a freeze
    dog.stop()
    assert dog.frozen_lately(40.0) is None
    assert watchdog.lost_contact_sentence() == "the sentence naming another process"
    dog._thread = thread
    now[0] += 300.0  # stopped for five minutes; its collective fails on waking, before the thread looks
    dog.stop()  # the run ends: the trainer stops its watchdog before the error reaches the command
    text = watchdog.lost_contact_sentence()
    assert text.startswith("this process did not run for 300 s")
    assert "wait there at most 30 s (gloo), gave up on it" in text
    assert text.endswith("the last checkpoint is 'ckpt/step_40' (continue with --resume)")
    now[0] += 60.0
    assert dog.frozen_lately(40.0) is None  # long ago: a later failure is not the freeze's
    dog._thread, dog.looked = thread, now[0]  # the thread looked again
    now[0] += 8.0  # frozen for 8 s only: gloo waits 30 s, so that is not why the others gave up
    dog.stop()
    assert dog.frozen_lately(40.0) == pytest.approx(7.5)
    assert watchdog.lost_contact_sentence() == "the sentence naming another process"


@pytest.mark.subprocess
def test_a_job_stopped_and_continued_as_a_whole_goes_on(tmp_path):
    """Job control (Ctrl-Z then fg, a scheduler suspending a job): the process is stopped for longer than the
    watchdog's timeout in the middle of a step (its reader takes half a second a step), then continued; the run goes
    on to its end."""
    steps = 10
    config, out = write(tmp_path, "run", steps=steps, workers=0,
                        reader={"type": "slow_synthetic", "delay": 0.06, "num_samples": 64, "num_classes": 5})
    proc = subprocess.Popen([sys.executable, TRAIN, config], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    wait_for_records(proc, out, 3)
    os.killpg(proc.pid, signal.SIGSTOP)
    time.sleep(TIMEOUT + watchdog.FROZEN_AFTER + 1)
    os.killpg(proc.pid, signal.SIGCONT)
    output = finish(proc, 120)
    assert proc.returncode == 0, output
    assert [r["step"] for r in records(out)] == list(range(1, steps + 1))


@pytest.mark.subprocess
def test_a_low_priority_job_given_no_cpu_by_a_busier_process_goes_on(tmp_path):
    """A job at low priority (nice 19) on a busy machine: from its third step on it shares its one CPU with a process
    at normal priority that never sleeps, which the kernel serves first, so a step that computes for about 0.15 s
    (its reader's work) takes longer than the watchdog's timeout in wall time. The time its training thread waited
    for the CPU is not the step's: the run goes on to its end."""
    cpu, steps = min(os.sched_getaffinity(0)), 4  # the starved step is step 3
    config, out = write(tmp_path, "run", steps=steps, workers=0,
                        reader={"type": "slow_synthetic", "delay": 0.015, "busy": True, "num_samples": 64,
                                "num_classes": 5})

    # the same session as the busy process below, so that nice orders the two (autogroups); set as soon as it
    # started, before it has any thread but its first (the others inherit both)
    proc = subprocess.Popen([sys.executable, TRAIN, config], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    os.sched_setaffinity(proc.pid, {cpu})
    os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
    busy = None
    try:
        wait_for_records(proc, out, 2)
        spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
        busy = subprocess.Popen([sys.executable, "-c", spin])
        began = time.monotonic()
        wait_for_records(proc, out, 3, limit=90)  # a whole step given (almost) no CPU
        took = time.monotonic() - began
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    try:
        output = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert took > TIMEOUT + 1, (f"the busy process took only {took:.1f} s from the step: nothing was tested (are the "
                                f"tests at a lower priority, nice {os.nice(0)}, than the training's 19?)")
    assert proc.returncode == 0, output
    assert [r["step"] for r in records(out)] == list(range(1, steps + 1))


def test_the_board_names_the_sample_and_file_another_process_reads():
    reader = BlockingReader(num_samples=32, num_classes=5)
    board = ReadingBoard(["digits", "faces"], {"digits": reader, "faces": reader})
    worker = multiprocessing.get_context("fork").Process(target=board.mark, args=(4, "faces", 17))
    worker.start()
    worker.join()
    assert board.describe(4) == "task 'faces', reader 'blocking_synthetic', sample 17, file /data/faces/0017.png"
    assert board.describe(3) is None


# ---- jobs -------------------------------------------------------------------------------------------------------
def job(out, reader=None, workers=1, steps=STEPS):
    return {"seed": 0, "device": "cpu", "output_dir": str(out), "plugins": [PLUGIN],
            "tasks": [{"name": "faces", "reader": reader or {"type": "synthetic", "num_samples": 64, "num_classes": 5},
                       "head": {"type": "arcface", "scale": 8.0}, "eval": None}],
            "backbone": {"type": "mlp"}, "schedule": {"batch_size": 8, "steps": steps},
            "optimizer": {"type": "momentum", "lr": 0.05},
            "log": {"every": 1, "progress": False, "plot": False}, "checkpoint": {"every": 5, "keep": 2},
            "data": {"num_workers": workers}, "watchdog": {"timeout": TIMEOUT}}


def write(tmp_path, name, **kw):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job(tmp_path / name, **kw)))
    return str(path), tmp_path / name


def blocked_sample(world, rank, after_step=7):
    """A sample of ``rank``'s slice read first in step ``after_step`` or later (1-based), and that step: rank r of W
    takes the r-th contiguous slice of the global batch (docs/distributed.md)."""
    dataset = StepDataset(JointSchedule(["faces"], [1.0], 8, seed=0),
                          {"faces": SyntheticReader(num_samples=64, num_classes=5)}, 0, 0, 8)
    seen, per = set(), 8 // world
    for step in range(8):
        mine = [int(i) for i in step_samples(dataset, step)["faces"][rank * per:(rank + 1) * per]]
        new = [i for i in mine if i not in seen]
        if step + 1 >= after_step and new:
            return new[0], step + 1
        seen.update(mine)
    raise AssertionError("no sample found")


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def equal_records(full, cut):
    """Every step's record of the cut run, the same bit for bit as the uninterrupted run's (but the speed)."""
    assert [r["step"] for r in cut] == list(range(1, STEPS + 1))
    for a, b in zip(full, cut):
        assert {k: v for k, v in a.items() if k != "samples_per_s"} == \
               {k: v for k, v in b.items() if k != "samples_per_s"}, a["step"]
    return True


def errors(text):
    return [line for line in text.splitlines() if line.startswith("error")]


@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [0, 1])
def test_a_reader_that_blocks_forever_stops_one_process_naming_its_file(tmp_path, workers):
    block = tmp_path / "block"
    block.write_text("")
    index, step = blocked_sample(1, 0)
    reader = {"type": "blocking_synthetic", "num_samples": 64, "num_classes": 5, "bad_index": index,
              "block_while": str(block)}
    config, out = write(tmp_path, "run", reader=reader, workers=workers)
    started = time.monotonic()
    proc = warm_python.run([sys.executable, TRAIN, config], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    assert time.monotonic() - started < TIMEOUT + 30
    assert proc.returncode == watchdog.STUCK_EXIT_STATUS, proc.stderr
    lines = errors(proc.stderr)
    saved = sorted(int(name.split("_")[1]) for name in os.listdir(out / "checkpoints"))[-1]
    assert len(lines) == 1 and re.fullmatch(
        rf"error: the training process \(host \S+, process \d+\) stopped in step {step} while reading data \(task "
        rf"'faces', reader 'blocking_synthetic', sample {index}, file /data/faces/{index:04d}.png\): its step made "
        rf"no progress within 3 s \(watchdog.timeout\); it stops; the last checkpoint is "
        rf"'{re.escape(str(out / 'checkpoints' / f'step_{saved}'))}' \(continue with --resume\)", lines[0]), proc.stderr
    assert saved == (step - 1) // 5 * 5 and not (out / ".run.lock").exists()  # the hold is given back


# ---- two processes ----------------------------------------------------------------------------------------------
def launch(config, log_dir, *extra):
    return subprocess.Popen([sys.executable, "-m", "mtl.cli", "launch", "--log_dir", str(log_dir),
                             "--nproc_per_node", "2", TRAIN, config, *extra], cwd=ROOT, env=launcher_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_records(proc, out, count, limit=120):
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never wrote {count} records:\n{proc.communicate()[0] if proc.poll() else ''}")


def rank_pid(launcher, rank):
    """The process of ``rank``: a child of the launcher that ``mtl launch`` runs (its DataLoader workers are the
    rank's own children)."""
    for pid in _descendants(launcher.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if _parent(_parent(pid)) == launcher.pid and f"PADDLE_TRAINER_ID={rank}".encode() in env:
            return pid
    raise AssertionError(f"rank {rank} not found")


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, TypeError):
        return None


def alive(pids):
    """The processes of ``pids`` still running (a zombie, dead but not yet reaped, counts as gone)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except OSError:
            pass
    return running


def finish(proc, limit):
    try:
        return proc.communicate(timeout=limit)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return "timed out: " + proc.communicate()[0]


@two_process_run("watchdog_full")
def _uninterrupted(folder):
    config, out = write(folder, "full")
    return {"train": [config]}, out


@pytest.mark.distributed
@pytest.mark.two_process_runs("watchdog_full")
def test_a_stopped_rank_is_named_and_resume_equals_an_uninterrupted_run(two_process, tmp_path):
    config, out = write(tmp_path, "cut")
    proc = launch(config, tmp_path / "logs")
    wait_for_records(proc, out, 12)
    everything = _descendants(proc.pid)
    stopped = rank_pid(proc, 1)
    os.kill(stopped, signal.SIGSTOP)
    began = time.monotonic()
    try:
        console = finish(proc, TIMEOUT + 60)
        took = time.monotonic() - began
        gone = not alive(everything)
    finally:
        for pid in alive(everything):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == watchdog.STUCK_EXIT_STATUS and gone and took < TIMEOUT + 30, (took, console)
    lines = errors(console)
    assert len(lines) == 1 and re.fullmatch(
        rf"error \(rank 0\): rank 1 \(host \S+, process {stopped}\) stopped answering in step \d+( \(last seen .*\))?: "
        r"the other ranks wait for it in .*, and its process is stopped \(by SIGSTOP, a debugger or job control\); "
        r"every process of the job stops; the last checkpoint is '.*step_\d+' \(continue with --resume\)",
        lines[0]), console
    assert f"process {stopped}) stopped answering" in (out / "logs" / "rank1.log").read_text()  # in its own log too
    resumed = launch(config, tmp_path / "logs_resume", "--resume")
    assert resumed.wait(timeout=240) == 0, resumed.communicate()[0]
    assert equal_records(records(two_process["watchdog_full"]), records(out))


@pytest.mark.distributed
def test_two_processes_suspended_as_a_whole_for_longer_than_gloos_wait_go_on(tmp_path):
    """The whole job (launcher and both ranks) stopped for longer than gloo's 30 s wait while rank 0 waits for rank
    1's slow reads in a collective, then continued: the collective completes on waking (also after 70 s, tried once
    by hand), the watchdog does not count the frozen time, and the run goes on to its end."""
    steps = 20
    config, out = write(tmp_path, "suspended", steps=steps, workers=0,
                        reader={"type": "slow_synthetic", "delay": 0.2, "slow_rank": 1, "num_samples": 64,
                                "num_classes": 5})
    raw = yaml.safe_load(open(config))
    raw["watchdog"]["timeout"] = 20.0  # rank 1's steps take 0.8 s
    open(config, "w").write(yaml.safe_dump(raw))
    proc = launch(config, tmp_path / "logs")
    wait_for_records(proc, out, 3)
    time.sleep(0.3)  # inside a step: rank 0 waits for rank 1 in its collectives
    everything = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGSTOP)
    time.sleep(watchdog.GLOO_WAIT + 4)
    os.killpg(proc.pid, signal.SIGCONT)
    try:
        console = finish(proc, 120)
    finally:
        for pid in alive(everything):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0 and not errors(console), console
    assert [r["step"] for r in records(out)] == list(range(1, steps + 1))


@pytest.mark.distributed
@pytest.mark.two_process_runs("watchdog_full")
def test_a_reader_that_blocks_forever_on_one_rank_stops_every_rank(two_process, tmp_path):
    block = tmp_path / "block"
    block.write_text("")
    index, step = blocked_sample(2, 1)
    reader = {"type": "blocking_synthetic", "num_samples": 64, "num_classes": 5, "bad_index": index,
              "block_while": str(block)}
    config, out = write(tmp_path, "run", reader=reader)
    began = time.monotonic()
    proc = launch(config, tmp_path / "logs")
    console = finish(proc, 120)
    assert proc.returncode == watchdog.STUCK_EXIT_STATUS and not _descendants(proc.pid), console
    assert time.monotonic() - began < TIMEOUT + 60  # start-up included
    expected = (rf"rank 1 \(host \S+, process \d+\) stopped answering in step {step} while reading data \(task "
                rf"'faces', reader 'blocking_synthetic', sample {index}, file /data/faces/{index:04d}.png\): its step "
                rf"made no progress within 3 s \(watchdog.timeout\); every process of the job stops; the last "
                rf"checkpoint is '.*step_{(step - 1) // 5 * 5}' \(continue with --resume\)")
    lines = errors(console)
    assert len(lines) == 1 and re.fullmatch(r"error \(rank [01]\): " + expected, lines[0]), console
    for rank in (0, 1):  # a rank that said anything before the launcher stopped it said the same
        log = (tmp_path / "logs" / f"workerlog.{rank}").read_text()
        assert all(re.fullmatch(rf"error \(rank {rank}\): " + expected, line) for line in errors(log)), log
    assert errors((tmp_path / "logs" / "workerlog.1").read_text())  # the stuck rank's own watchdog said it
    block.unlink()  # the filesystem is back: --resume reads on, and equals an uninterrupted run
    resumed = launch(config, tmp_path / "logs_resume", "--resume")
    assert resumed.wait(timeout=240) == 0, resumed.communicate()[0]
    assert equal_records(records(two_process["watchdog_full"]), records(out))


@pytest.mark.distributed
def test_a_rank_that_evaluates_longer_than_the_timeout_is_waited_for(tmp_path):
    """Rank 0 evaluates 8 s longer than rank 1 (as it does with the verification sets it alone evaluates): rank 1
    waits for it in its next step, past its own 3 s, but rank 0 runs within its own limit (an evaluation's): the job
    finishes. (Rank 1 used to stop the job, saying that rank 0's step made no progress within 1800 s.)"""
    config, out = tmp_path / "run.yaml", tmp_path / "run"
    cfg = job(out, steps=6)
    cfg["plugins"] = [os.path.join(ROOT, "tests", "dist_scripts", "slow_ranks")]
    cfg["tasks"][0].update(head={"type": "slow_eval_softmax", "delay": 8.0}, eval={"enabled": True})
    cfg["eval"] = {"every": 2}
    config.write_text(yaml.safe_dump(cfg))
    proc = launch(str(config), tmp_path / "logs")
    console = finish(proc, 120)
    assert proc.returncode == 0 and not errors(console), console
    assert [r["step"] for r in records(out)] == list(range(1, 7))


@pytest.mark.distributed
def test_a_rank_done_with_its_checkpoint_files_waits_for_the_others_outside_any_collective(tmp_path):
    """Rank 1 writes its checkpoint files 5 s after rank 0: rank 0 waits for it in the job's key-value store, not in a
    gloo collective, which gives up after 30 s whatever the watchdog allows (a CPU job stopped when one rank's part
    of a checkpoint took 30 s longer). Where rank 0 waits is read from its threads' stacks (faulthandler)."""
    cfg = job(tmp_path / "run", steps=6)
    cfg["plugins"] = [os.path.join(ROOT, "tests", "dist_scripts", "slow_ranks")]
    cfg["tasks"][0]["head"] = {"type": "slow_save_arcface", "delay": 5.0}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = launch(str(config), tmp_path / "logs")
    progress, end = tmp_path / "run" / "logs" / "progress.rank0.json", time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < end:
        now = blame.read_record(str(progress), json.loads(progress.read_text())["run"]) if progress.exists() else None
        if now and now["long"] == "saving checkpoint step_5" and now["waiting"]:
            break
        time.sleep(0.1)
    os.kill(rank_pid(proc, 0), signal.SIGUSR1)
    console = finish(proc, 120)
    assert proc.returncode == 0, console
    stacks = (tmp_path / "logs" / "workerlog.0").read_text()
    assert "in wait_for_all" in stacks and "in lowest_rank_text" not in stacks, stacks


@pytest.mark.distributed
@pytest.mark.parametrize("killed", ["mtl launch", "its launcher"])
def test_the_ranks_do_not_outlive_a_killed_launcher(tmp_path, killed):
    """SIGKILL of ``mtl launch`` (its launcher gets SIGTERM and passes it on) or of the launcher itself (each rank
    gets SIGTERM when its parent ends): the ranks stop as pre-empted ones, none trains on re-parented."""
    config, out = write(tmp_path, "run", steps=100000)
    proc = launch(config, tmp_path / "logs")
    wait_for_records(proc, out, 5)
    everything = _descendants(proc.pid)
    if killed == "mtl launch":
        proc.kill()  # SIGKILL: mtl launch can pass nothing on
    else:
        os.kill(next(p for p in everything if _parent(p) == proc.pid), signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 30
    while alive(everything) and time.monotonic() < end:
        time.sleep(0.2)
    left = alive(everything)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} processes outlived mtl launch"
    assert not (out / ".run.lock").exists()  # a rerun is not refused: the folder is not held
    steps = [int(name.split("_")[1]) for name in os.listdir(out / "checkpoints")]
    assert steps and max(steps) >= 5  # they stopped as pre-empted ranks do: a checkpoint of their step


@pytest.mark.distributed
def test_a_rank_that_ends_right_after_a_wait_for_all_leaves_the_others_out_of_it_too():
    """Rank 0 ends its process the moment its wait returns (the end of a job's last evaluation): rank 1, waiting
    first, still comes out (it read the count from rank 0's store, which was gone: 'Connection reset by peer')."""
    code, output = run_distributed(os.path.join(ROOT, "tests", "dist_scripts", "wait_for_all_exit.py"), 2,
                                   timeout=120)
    assert code == 0 and "rank 1 went on" in output, output[-5000:]
