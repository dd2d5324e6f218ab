"""Which process stopped answering, and the one sentence that says so (:mod:`mtl.train.watchdog`).

Every rank's watchdog writes a small progress record, ``output_dir/logs/progress.rank<k>.json``, twice a second
(:class:`ProgressFile`: rewritten in place, no new file, so a full disk does not stop it once it exists): the run, the
rank, its host and process, a beat counter, the step, the phase (with which sample and file while it reads data),
whether it waits for the others in a collective, and its timeout. A rank whose own step made no progress reads
every rank's record twice, :data:`FROZEN_WINDOW` seconds apart (:func:`read_records`), and :func:`blame` picks the
process that stopped answering, the same one on every rank that asks:

0. this process itself, when it does not wait for the others: its own work made no progress;
1. a process whose beat did not move (its whole process is stopped: SIGSTOP, swapped out, a lost machine; or it
   ended), or that has no record of this run (it never reached the training loop);
2. else a process that is not waiting for the others (reading data, computing, saving), the one furthest behind;
3. else nobody can be named: every process waits in a collective (the ranks issued different collectives).

The records are on the run's own folder, which every machine of a job shares (docs/distributed.md): no connection to
another process is needed, so a stopped rank 0 (which serves Paddle's key-value store) is named like any other.
"""
import json
import os
import socket
import time

RECORD_BYTES = 4096  # the fixed size of a record file (rewritten in place)
BEAT = 0.5  # seconds between two records of a rank
FROZEN_WINDOW = 2.5  # seconds without a new beat after which a process is judged not to run


def record_path(output_dir, rank) -> str:
    """The progress record of ``rank`` in the run folder ``output_dir``."""
    return os.path.join(output_dir, "logs", f"progress.rank{rank}.json")


class ProgressFile:
    """This rank's progress record, rewritten in place (module docstring); a failed write is skipped (a full or
    read-only disk stops the job through its own error, not through the watchdog's records)."""

    def __init__(self, path):
        self.path, self._fd = path, None

    def write(self, record: dict):
        """Replace the record with ``record`` (JSON, at most :data:`RECORD_BYTES`)."""
        text = json.dumps(record)
        if len(text) >= RECORD_BYTES:
            record = dict(record, phase=record["phase"][:RECORD_BYTES // 2])
            text = json.dumps(record)[:RECORD_BYTES - 1]
        try:
            if self._fd is None:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(self._fd, text.encode().ljust(RECORD_BYTES - 1) + b"\n", 0)
        except OSError:
            pass

    def close(self):
        """Close the file (the record stays: it says what the rank did last)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_record(path, run):
    """The record at ``path`` when it belongs to the run ``run``, else None (missing, another run's, unreadable)."""
    for _ in range(3):  # a read may meet a write half done
        try:
            with open(path, encoding="utf-8") as f:
                record = json.loads(f.read().strip() or "null")
            return record if isinstance(record, dict) and record.get("run") == run else None
        except OSError:
            return None
        except ValueError:
            time.sleep(0.02)
    return None


def read_records(output_dir, run, world, own_rank, own_record, window=FROZEN_WINDOW, beat=None):
    """``(first, second)``: every rank's record, read twice ``window`` seconds apart (this rank's own is
    ``own_record``); ``beat``: called every :data:`BEAT` seconds meanwhile (this rank's own record goes on, so that
    a rank that asks at the same time does not find it frozen)."""
    def read_all():
        return {k: own_record if k == own_rank else read_record(record_path(output_dir, k), run) for k in range(world)}
    first = read_all()
    end = time.monotonic() + window
    while time.monotonic() < end:
        time.sleep(min(BEAT, max(0.0, end - time.monotonic())))
        if beat is not None:
            beat()
    return first, read_all()


def blame(first, second, own_rank):
    """``(rank, how)`` of the process that stopped answering, from two readings of every rank's record (module
    docstring): how is ``"frozen"`` (its process did not run), ``"absent"`` (no record of this run) or ``"stuck"``
    (it runs but its step made no progress; ``"outwaited"`` when a collective gave up on it first, a name the caller
    gives); ``(None, None)`` when every process waits for the others."""
    ranks = sorted(second)
    if not second[own_rank]["waiting"]:  # this process's own work (reading, computing, saving) made no progress
        return own_rank, "stuck"
    absent = [k for k in ranks if second[k] is None]
    if absent:
        return absent[0], "absent"
    frozen = [k for k in ranks if k != own_rank and (first.get(k) is None or first[k]["beat"] == second[k]["beat"])]
    if frozen:
        return frozen[0], "frozen"
    working = [k for k in ranks if not second[k]["waiting"]]
    if working:
        return min(working, key=lambda k: (second[k]["step"], k)), "stuck"
    return None, None


def process_state(record) -> str:
    """What is known of the process of ``record`` from this machine: ``stopped`` (SIGSTOP or a debugger),
    ``ended``, ``running``, or ``unknown`` (another machine, or no /proc)."""
    if record.get("host") != socket.gethostname():
        return "unknown"
    try:
        with open(f"/proc/{int(record['pid'])}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return "ended" if os.path.isdir("/proc") else "unknown"
    return {"T": "stopped", "t": "stopped", "Z": "ended", "X": "ended"}.get(state, "running")


def _why(record, how) -> str:
    if how == "absent":
        return "it has no progress record of this run (it never reached the training loop)"
    if how == "outwaited":
        return ("the collective the others waited in gave up first (gloo waits 30 s at most: Paddle 3.3 has no "
                "setting for it)")
    if how == "stuck":
        limit = record["limit"]
        key = "watchdog.long_timeout" if record.get("long") else "watchdog.timeout"
        return f"its step made no progress within {limit:g} s ({key})"
    state = process_state(record)
    if state == "stopped":
        return "its process is stopped (by SIGSTOP, a debugger or job control)"
    if state == "ended":
        return "its process has ended (the launcher says how)"
    return (f"its process has not run for {FROZEN_WINDOW:g} s (stopped by a signal, swapped out or throttled, "
            f"or its machine is lost)")


def where(record) -> str:
    """``in step 57 while reading data: ...`` of a record (``before its first step while ...``)."""
    step = f"in step {record['step']}" if record.get("step") else "before its first step"
    return f"{step} while {record['phase']}"


def sentence(culprit, how, records, world, resume) -> str:
    """The one sentence naming the process that stopped answering (its rank, host, process, step and what it was
    doing), why it is judged so and what happens now; ``resume``: the last checkpoint's words."""
    if culprit is None:
        waits = "; ".join(f"rank {k} {where(r)}" for k, r in sorted(records.items()) if r)
        return (f"no process of the job made progress and every one waits for the others ({waits}): they issued "
                f"different collectives, a bug (the logs say more); every process stops; {resume}")
    record = records[culprit]
    if how == "absent":
        return f"rank {culprit} stopped answering: {_why(record, how)}; every process of the job stops; {resume}"
    if how == "frozen":
        return _frozen_sentence(culprit, records, resume)
    if world == 1:
        return (f"the training process (host {record['host']}, process {record['pid']}) stopped {where(record)}: "
                f"{_why(record, how)}; it stops; {resume}")
    return (f"rank {culprit} (host {record['host']}, process {record['pid']}) stopped answering {where(record)}: "
            f"{_why(record, how)}; every process of the job stops; {resume}")


def _frozen_sentence(culprit, records, resume) -> str:
    """A process that does not run cannot say where it is (its last record may be half a second old): its step is
    the one the ranks waiting for it are in (it has not reached their collective, and it finished every earlier
    one), and what it was doing is what they wait for."""
    record = records[culprit]
    waiting = [r for k, r in sorted(records.items()) if k != culprit and r and r["waiting"]]
    step = max([r["step"] for r in waiting] + [record["step"]])
    seen = f" (last seen {record['phase']})" if record["step"] == step else ""
    waits = f"the other ranks wait for it in {waiting[0]['phase']}, and " if waiting else ""
    return (f"rank {culprit} (host {record['host']}, process {record['pid']}) stopped answering in step {step}{seen}: "
            f"{waits}{_why(record, 'frozen')}; every process of the job stops; {resume}")


def resume_words(checkpoint) -> str:
    """The end of the sentence (after a semicolon: the error stays one sentence): the checkpoint ``--resume``
    continues from, or that there is none yet."""
    if checkpoint:
        return f"the last checkpoint is '{checkpoint}' (continue with --resume)"
    return "no checkpoint was written yet"
