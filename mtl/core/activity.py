"""What this process is doing now: the step it is in, since when, and the phase of the step (reading data, the forward
and backward pass, a named collective, saving), for the progress watchdog (:mod:`mtl.train.watchdog`).

The training thread writes it (a few attribute writes per phase; nothing at all for a collective at world 1), the
watchdog's thread reads it. Long legitimate waits (the first step, saving a checkpoint, evaluating) are marked with
:meth:`Activity.long_wait`: the step's clock stops while they last and restarts when they end, so that they never
count as a step that made no progress; they have a limit of their own. A collective names itself with
:meth:`Activity.collective` (the outermost name wins: ``the per-step agreement of the ranks``, not the generic
all-reduce inside it); while it lasts the process is *waiting* for the others, which is how the watchdog tells the
rank that stopped from the ranks that wait for it.
"""
import contextlib
import time


class Activity:
    """The step, the phase and their clocks of the training thread (module docstring)."""

    def __init__(self):
        self.reset()

    def reset(self):
        """Before a run: no step yet, starting up (a long wait: building and restoring take what they take)."""
        self.step = 0  # the 1-based step being worked on; 0 before the first
        self.phase = "starting"
        self.detail = None  # a callable returning more words on the phase (which sample, which file), or None
        self.waiting = False  # inside a collective: waiting for the other processes
        self.wait_since = 0.0  # when the collective began
        self.failed = None  # the collective that last raised (a peer lost), for the words of the error
        self.long = ["starting"]  # the long waits in progress, outermost first
        self.step_since = self.long_since = time.monotonic()
        self.slowest = 0.0  # seconds of the slowest step seen, long waits left out
        self.changes = 0  # phase changes so far: a number that moves while the thread makes progress

    def begin_step(self, step: int, phase: str, detail=None, first: bool = False):
        """The training thread starts step ``step`` (1-based) with ``phase``; ``first``: the run's first step, a long
        wait (start-up, the first reads and compilations)."""
        now = time.monotonic()
        if self.step and not self.long:
            self.slowest = max(self.slowest, now - self.step_since)
        if self.long and self.long[-1] in ("starting", "the first step"):
            self.long = []
        self.step, self.step_since = int(step), now
        if first:
            self.long, self.long_since = ["the first step"], now
        self.set(phase, detail)

    def set(self, phase: str, detail=None):
        """The step goes on with ``phase`` (``detail``: a callable giving more words when the watchdog asks)."""
        self.phase, self.detail = phase, detail
        self.changes += 1

    @contextlib.contextmanager
    def collective(self, name: str):
        """Inside: waiting for the other processes in the collective ``name`` (a nested one keeps the outer name)."""
        if self.waiting:
            yield
            return
        phase, detail = self.phase, self.detail
        self.phase, self.detail, self.waiting, self.wait_since = name, None, True, time.monotonic()
        self.changes += 1
        try:
            yield
        except BaseException:
            self.failed = name
            raise
        finally:
            self.phase, self.detail, self.waiting = phase, detail, False
            self.changes += 1

    @contextlib.contextmanager
    def long_wait(self, name: str):
        """Inside: a long legitimate wait ``name`` (saving a checkpoint, evaluating); the step's clock restarts after
        it."""
        phase, detail = self.phase, self.detail
        if not self.long:
            self.long_since = time.monotonic()
        self.long.append(name)
        self.set(name)
        try:
            yield
        finally:
            self.long.pop()
            if not self.long:
                self.step_since = time.monotonic()
            self.set(phase, detail)

    def discount(self, seconds: float, before: float):
        """The clocks started before ``before`` move on by ``seconds`` (at most to now): time in which this whole
        process was frozen (stopped by SIGSTOP or job control and continued, a virtual machine paused), or its
        training thread waited for a CPU, is nobody's step (:mod:`mtl.train.watchdog`); a clock started at or after
        ``before`` (after the process was continued) is left as it is."""
        now = time.monotonic()
        for name in ("step_since", "long_since", "wait_since"):
            value = getattr(self, name)
            if value < before:
                setattr(self, name, min(value + seconds, now))

    def snapshot(self) -> dict:
        """What the thread is doing now, read from another thread: step, phase, waiting (and for how many seconds),
        the long wait (or None), the seconds in the step (or in the long wait) and the slowest step."""
        now = time.monotonic()
        long = self.long[0] if self.long else None
        since = self.long_since if long else self.step_since
        return {"step": self.step, "phase": self.phase, "waiting": self.waiting, "long": long,
                "waited": max(0.0, now - self.wait_since) if self.waiting else 0.0,
                "seconds": max(0.0, now - since), "slowest": self.slowest, "changes": self.changes}

    def describe(self) -> str:
        """The phase with its detail (``reading data (task 'faces', ..., sample 17, file ...)``); the detail is asked
        for now (it may read a reader's file list)."""
        detail = None
        if self.detail is not None:
            try:
                detail = self.detail()
            except Exception:  # noqa: BLE001 - a report must not fail on the words it adds
                detail = None
        return f"{self.phase} ({detail})" if detail else self.phase


CURRENT = Activity()  # the training thread's (one training run per process at a time)


def collective(name: str):
    """:meth:`Activity.collective` of this process's activity."""
    return CURRENT.collective(name)


def long_wait(name: str):
    """:meth:`Activity.long_wait` of this process's activity."""
    return CURRENT.long_wait(name)
