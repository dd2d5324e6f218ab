"""The progress watchdog: a process whose step makes no progress within a timeout stops the job, with one sentence
naming the process that stopped answering (its rank, host, process), the step and what it was doing.

Each rank's training thread records its step and phase (:mod:`mtl.core.activity`); a thread of the rank (this module)
looks twice a second. The step's timeout (``watchdog.timeout``) is by default measured from the job's own steps:
``multiple`` x the slowest step seen so far, at least ``floor`` seconds (``watchdog.multiple``, ``watchdog.floor``)
and at most ``long_timeout``; the long legitimate waits (start-up and the first step, saving a checkpoint,
evaluating) do not count as a step and have their own limit, ``watchdog.long_timeout``. When a rank's step goes past
its timeout, the rank finds which process stopped answering from every rank's progress record
(:mod:`mtl.train.blame`), writes the sentence to its console and log (and to the log of the process it names),
gives the output folder's hold back and exits with status :data:`STUCK_EXIT_STATUS`; the launcher then stops every
other process (a stopped one with SIGKILL). Every rank that can still act does the same, and they name the same
process. Nothing is saved: the last complete checkpoint stays the one ``--resume`` continues from.

The collectives' own timeouts are set above it where Paddle exposes them: NCCL's (``PADDLE_PG_TIMEOUT``, read when
the process group starts) to ``long_timeout`` + :data:`COLLECTIVE_MARGIN`, unless the environment sets it. Gloo's
wait is fixed at 30 s in Paddle 3.3 (no setting); a collective that waits longer fails there first, and the
error it raises is answered with the same sentence (:func:`lost_contact_sentence`).

Time in which the process could not run is nobody's step, so the clocks move on by it (:meth:`Watchdog._thaw`): a
whole process frozen (SIGSTOP, a paused machine: the thread finds it oversleeping) and, on Linux, a training thread
that was ready to run but given no CPU (a job at low priority on a busy machine: the time it waited on a run queue,
the second field of its ``/proc/self/task/<tid>/schedstat``), at most ``long_timeout`` of the latter in one step. A
step that sleeps (a collective, a blocked read) or computes counts as before. Only the training thread's wait is
read: that of its OpenMP threads, of evaluation's thread pools and of the data-loading processes is not, so a step
starved only through them still counts.
"""
import logging
import os
import socket
import sys
import threading
import time

from mtl.core import activity as activity_module
from mtl.train import blame

log = logging.getLogger("mtl")
FROZEN_AFTER = 5.0  # seconds this thread may oversleep before the process counts as having been frozen
STUCK_EXIT_STATUS = 124  # as timeout(1): the job stopped because a process made no progress in time
COLLECTIVE_MARGIN = 60.0  # seconds NCCL's timeout lies above the watchdog's longest limit
GLOO_WAIT = 30.0  # seconds gloo's collectives wait in Paddle 3.3 (fixed: no setting)
DETAIL_AFTER = 5.0  # seconds in one step after which a record carries the phase's detail (which sample, which file)
PG_TIMEOUT_ENV = "PADDLE_PG_TIMEOUT"
_LAST = None  # the watchdog of this process's last run (what a collective's error is answered with)


def set_collective_timeouts(settings, environ=None):
    """Before the process group starts: NCCL's timeout (``PADDLE_PG_TIMEOUT``, milliseconds) above the watchdog's
    longest limit, unless the environment already sets it, the watchdog is off or the job has one process (no process
    group: nothing to set, and a run in a caller's process leaves its environment as it was); the value set, or
    None."""
    environ = os.environ if environ is None else environ
    single = int(environ.get("PADDLE_TRAINERS_NUM", "1") or 1) <= 1
    if PG_TIMEOUT_ENV in environ or settings["timeout"] == 0 or single:
        return None
    longest = max(settings["long_timeout"], settings["timeout"] or 0.0) + COLLECTIVE_MARGIN
    environ[PG_TIMEOUT_ENV] = str(int(longest * 1000))
    return environ[PG_TIMEOUT_ENV]


def step_timeout(settings, slowest: float) -> float:
    """The seconds a step may take now: ``watchdog.timeout``, or ``multiple`` x the ``slowest`` step seen, at least
    ``floor``, at most ``long_timeout``."""
    if settings["timeout"]:
        return float(settings["timeout"])
    return min(max(settings["floor"], settings["multiple"] * slowest), settings["long_timeout"])


class Watchdog:
    """The watchdog of one rank of a run (module docstring): :meth:`start` when training starts, :meth:`stop` when
    it ends. ``last_checkpoint``: a callable giving the checkpoint ``--resume`` continues from; ``on_expire``:
    callables run before the process exits (giving the output folder's hold back)."""

    def __init__(self, settings, output_dir, rank, world, run, last_checkpoint, on_expire=(), activity=None):
        self.settings, self.output_dir, self.rank, self.world, self.run = settings, output_dir, rank, world, run
        self.last_checkpoint, self.on_expire = last_checkpoint, list(on_expire)
        self.activity = activity or activity_module.CURRENT
        self.file = blame.ProgressFile(blame.record_path(output_dir, rank)) if world > 1 else None
        self.host, self.beat = socket.gethostname(), 0
        self._stop, self._thread = threading.Event(), None
        self.looked = time.monotonic()  # when the thread last looked
        self.thawed = None  # (when, seconds) of the last freeze the thread found
        self.queued = None  # (training thread's schedstat path, its run-queue seconds when last read)
        self.starved = (None, 0.0)  # ((step, long wait), the run-queue seconds taken off it so far)

    @property
    def enabled(self) -> bool:
        """False with ``watchdog.timeout: 0``."""
        return self.settings["timeout"] != 0

    def start(self):
        """Start looking (a daemon thread); this becomes the process's watchdog for collective errors."""
        global _LAST
        _LAST = self
        if self.enabled:
            path = f"/proc/self/task/{threading.get_native_id()}/schedstat"  # this thread trains
            seconds = run_queue_seconds(path)
            self.queued = None if seconds is None else (path, seconds)
            self._beat()  # the first record before the first step: the others can tell this rank reached training
            self._thread = threading.Thread(target=self._watch, name="mtl-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        """Stop looking (the run ended, however). A freeze the thread had no time to find (the run ended because a
        collective failed as the process woke) is found now, for :func:`lost_contact_sentence`."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._thread is not None:
            self.looked = self._thaw(self.looked)
        self._thread = None

    def record(self, snapshot=None, detail=False) -> dict:
        """This rank's progress record now (the phase's detail when ``detail`` or when the step is slow)."""
        now = snapshot or self.activity.snapshot()
        limit = self.settings["long_timeout"] if now["long"] else step_timeout(self.settings, now["slowest"])
        slow = now["seconds"] > min(DETAIL_AFTER, limit / 2)
        phase = self.activity.describe() if detail or slow else now["phase"]
        return {"run": self.run, "rank": self.rank, "host": self.host, "pid": os.getpid(), "beat": self.beat,
                "step": now["step"], "phase": phase, "waiting": now["waiting"], "long": now["long"],
                "seconds": round(now["seconds"], 1), "waited": round(now["waited"], 1), "slowest": now["slowest"],
                "limit": limit}

    def _watch(self):
        checked = 0.0  # the time waited in the current collective when the peers were last looked at
        self.looked = time.monotonic()
        while not self._stop.wait(blame.BEAT):
            self.looked = self._thaw(self.looked, self._queued())
            record = self._beat()
            if self._stop.is_set():
                return
            if record["seconds"] > record["limit"]:
                self.expire()
            # a long wait (saving, evaluating) spent waiting for the others: is one of them still there?
            step_limit = step_timeout(self.settings, record["slowest"])
            if record["long"] and record["waiting"] and record["waited"] > checked + step_limit:
                checked = record["waited"]
                self._expire_if_a_peer_is_gone()
            elif not record["waiting"]:
                checked = 0.0

    def _thaw(self, looked: float, queued: float = 0.0) -> float:
        """Time in which the process could not run since this thread last looked (at ``looked``) is not the step's:
        the activity's clocks started before the middle of that time move on by it. Two kinds, never both for the
        same seconds:

        * ``queued``: the seconds the training thread waited for a CPU, ready to run (:meth:`_queued`), at most
          ``long_timeout`` in one step or long wait, so that a thread that spins forever on a busy machine is still
          stopped;
        * the rest of this thread's oversleep (it looks every :data:`blame.BEAT` seconds) when over
          :data:`FROZEN_AFTER`: the whole process was frozen (a job suspended with SIGSTOP and continued with SIGCONT,
          a paused virtual machine; a rank stopped alone is named by the others before it is continued).

        An oversleep over :data:`FROZEN_AFTER` of either kind is kept for :meth:`frozen_lately`. The time now."""
        now = time.monotonic()
        gap = now - looked - blame.BEAT
        starved = self._within_ceiling(queued)
        if starved > 0:
            self.activity.discount(starved, (looked + now) / 2)
        frozen = gap - queued  # the part of the oversleep the training thread did not spend waiting for a CPU
        if frozen > FROZEN_AFTER:  # a clock started before the middle of the gap was started before the freeze
            self.activity.discount(frozen, looked + blame.BEAT + frozen / 2)
        if gap > FROZEN_AFTER:
            self.thawed = (now, gap)
        return now

    def _queued(self) -> float:
        """The seconds the training thread waited on a run queue since the last call, from the kernel's count; 0
        where it cannot be read."""
        if self.queued is None:
            return 0.0
        path, before = self.queued
        now = run_queue_seconds(path)
        if now is None:  # the thread ended
            self.queued = None
            return 0.0
        self.queued = (path, now)
        return max(0.0, now - before)

    def _within_ceiling(self, queued: float) -> float:
        """The part of ``queued`` that may still be taken off the current step (or long wait): at most
        ``long_timeout`` in all."""
        now = self.activity.snapshot()
        key, total = (now["step"], now["long"]), 0.0
        if self.starved[0] == key:
            total = self.starved[1]
        take = min(queued, max(0.0, self.settings["long_timeout"] - total))
        self.starved = (key, total + take)
        return take

    def frozen_lately(self, within: float):
        """The seconds this process was frozen, when it was and the freeze ended less than ``within`` seconds ago (as
        the thread found it, or :meth:`stop` when the thread had no time to); else None. Without a thread
        (``watchdog.timeout: 0``) nothing is known."""
        if self.thawed is not None and time.monotonic() - self.thawed[0] < within:
            return self.thawed[1]
        return None

    def _beat(self) -> dict:
        """Write this rank's record once more (a new beat); the record."""
        self.beat += 1
        record = self.record()
        if self.file is not None:
            self.file.write(record)
        return record

    def _expire_if_a_peer_is_gone(self):
        """While this rank waits in a long wait: expire when another process does not run (or never got here); a
        peer that runs may be writing a large file, which takes what it takes."""
        own = self.record(detail=True)
        first, second = blame.read_records(self.output_dir, self.run, self.world, self.rank, own, beat=self._beat)
        culprit, how = blame.blame(first, second, self.rank)
        if how in ("frozen", "absent"):
            self.expire(self._named(culprit, how, second))

    def expire(self, text=None):
        """This rank's step made no progress in time: name the process that stopped answering, say it, exit."""
        text = text or self.diagnose()
        log.error("watchdog: %s", text)
        prefix = f"error (rank {self.rank}): " if self.world > 1 else "error: "
        print(prefix + text, file=sys.stderr, flush=True)
        for hook in self.on_expire:
            try:
                hook()
            except Exception:  # noqa: BLE001 - the process ends anyway
                log.exception("watchdog: a clean-up before the exit failed")
        for handler in log.handlers:
            handler.flush()
        os._exit(STUCK_EXIT_STATUS)

    def diagnose(self, own_waiting=None):
        """The sentence naming the process that stopped answering (this one at world 1), from every rank's record;
        ``own_waiting``: override whether this rank waits (a collective that failed waited for another)."""
        own = self.record(detail=True)
        if own_waiting is not None:
            own["waiting"] = own_waiting
            own["phase"] = self.activity.failed or own["phase"]
        if self.world == 1 or not own["waiting"]:  # its own work made no progress: it is the one
            return blame.sentence(self.rank, "stuck", {self.rank: own}, self.world,
                                  blame.resume_words(self.last_checkpoint()))
        first, second = blame.read_records(self.output_dir, self.run, self.world, self.rank, own, beat=self._beat)
        culprit, how = blame.blame(first, second, self.rank)
        if own_waiting and how == "stuck":  # it runs, but the collective stopped waiting for it first
            how = "outwaited"
        return self._named(culprit, how, second)

    def _named(self, culprit, how, records):
        """The sentence naming ``culprit`` (written to its log too when it is a process that does not run)."""
        text = blame.sentence(culprit, how, records, self.world, blame.resume_words(self.last_checkpoint()))
        if culprit is not None and culprit != self.rank and how == "frozen":
            self._tell_its_log(culprit, text)
        return text

    def _tell_its_log(self, culprit, text):
        """The sentence in the log of the process named too: a stopped process writes nothing of its own."""
        path = os.path.join(self.output_dir, "logs", f"rank{culprit}.log")
        try:
            with open(path, "a") as f:
                f.write(f"(written by rank {self.rank}'s watchdog) error: {text}\n")
        except OSError:
            pass


def run_queue_seconds(path: str):
    """The seconds the thread of ``path`` (its ``/proc/.../schedstat``) has waited on a run queue, ready to run but
    given no CPU (the file's second field, in nanoseconds); None where it cannot be read (not Linux, no schedstats)."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def for_run(settings, output_dir, strategy, lock, last_checkpoint, release):
    """The watchdog of this rank for a run starting now: the activity reset, the run's id from rank 0's hold (the
    progress records of this run, not of an earlier one in the same folder), ``release`` run before an exit."""
    activity_module.CURRENT.reset()
    run = strategy.from_main(lock.record["run"] if lock is not None else None)
    return Watchdog(settings, output_dir, strategy.rank, strategy.world, run, last_checkpoint, on_expire=[release])


def lost_contact_sentence():
    """After a collective failed (gloo's fixed 30 s wait, or a peer's broken connection): the sentence naming the
    process that stopped answering, or None when this process ran no watchdog or the process named has ended (the
    launcher then says how it ended)."""
    watchdog = _LAST
    if watchdog is None or watchdog.world == 1:
        return None
    # the others gave up waiting for this process while it did not run (not after a short freeze: they wait 30 s)
    frozen = watchdog.frozen_lately(GLOO_WAIT + FROZEN_AFTER)
    if frozen is not None and frozen >= GLOO_WAIT / 2:
        return (f"this process did not run for {frozen:.0f} s (stopped with SIGSTOP or Ctrl-Z, its machine paused, "
                f"or given no CPU) while it was in a collective, and the other processes, which wait there at most "
                f"{GLOO_WAIT:.0f} s (gloo), gave up on it; "
                f"{blame.resume_words(watchdog.last_checkpoint())}")
    text = watchdog.diagnose(own_waiting=True)
    return None if "(the launcher says how)" in text or "a bug (the logs say more)" in text else text
