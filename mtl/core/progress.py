"""Progress lines of the report scripts (``examples/*_report.py``): which run of how many, the time so far and the
time left (estimated), and, while a run trains in its own process, its step every ``every`` seconds (read from the
``metrics.jsonl`` and ``job.json`` the run writes), so that a report of long runs is never silent for minutes.

    progress = Progress("train", len(runs))
    for name, out_dir in runs:
        began = time.time()
        with progress.watch(name, out_dir):
            subprocess.run([...])  # trains into out_dir
        progress.finished(name, began)

Lines are printed (flushed) from any thread; several runs at a time (``--jobs``) each get their own.
"""
import json
import os
import sys
import threading
import time
from contextlib import contextmanager

POLL_SECONDS = 2.0  # how often a watched run's files are read
WATCH_EVERY = 30.0  # seconds between two lines of one running run


def duration(seconds) -> str:
    """``1h02m``, ``3m05s`` or ``12s``."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def spread(values, digits=4, unit="") -> str:
    """``mean ± std`` over seeds, ``value (one seed)`` for a single one (a spread of one seed is no spread),
    empty for none; ``None`` entries are left out."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return ""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}{unit} (one seed)"
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5  # numpy's np.std (ddof 0)
    return f"{mean:.{digits}f}{unit} ± {std:.{digits}f}{unit}"


def run_step(out_dir, since=0.0):
    """``(last step written, steps of the run)`` of a run training into ``out_dir`` (its ``metrics.jsonl`` and
    ``job.json`` written at or after ``since``: an earlier run's files are not read), or None before it logs."""
    metrics, job = os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "job.json")
    try:
        if os.path.getmtime(metrics) < since or os.path.getmtime(job) < since:
            return None
        with open(job) as f:
            steps = int(json.load(f)["schedule"]["steps"])
        with open(metrics, "rb") as f:
            f.seek(max(0, os.path.getsize(metrics) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except (OSError, ValueError, KeyError, TypeError):  # not written yet, or caught mid-write
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return record["step"], steps
    return None


def _state(progress, elapsed, since_step, unchanged) -> str:
    """``step 120 of 600, 1m05s, about 4m20s left`` (from the pace so far); once every step is logged, or when the
    step did not move since the last line (an evaluation, a checkpoint), no estimate but what is known."""
    step, steps = progress
    if step >= steps:
        return f"all {steps} steps done, {duration(elapsed)}; evaluating and saving"
    if unchanged:
        return f"step {step} of {steps} (logged {duration(since_step)} ago), {duration(elapsed)}"
    left = f", about {duration(elapsed / step * (steps - step))} left" if step > 0 else ""
    return f"step {step} of {steps}, {duration(elapsed)}{left}"


class Progress:
    """One line per finished item: which of how many, its time, the time so far and the time left (estimated from
    the mean so far); with :meth:`watch`, lines of a running one. Safe to call from several threads."""

    def __init__(self, what, total, stream=None, every=WATCH_EVERY, clock=None):
        self.what, self.total, self.done, self.started = what, total, 0, 0
        self.clock = clock or time.time
        self.start = self.clock()
        self.every = every
        self.stream = stream
        self.lock = threading.Lock()

    def _print(self, line):
        print(line, file=self.stream or sys.stdout, flush=True)

    def finished(self, text, began, read=False):
        """Print the line of an item that started at ``began``; ``read``: an item that was not watched (its result
        read from an earlier run), which takes a number of its own."""
        with self.lock:
            self.done += 1
            if read:
                self.started += 1
            now = self.clock()
            elapsed = now - self.start
            left = elapsed / self.done * (self.total - self.done)
            self._print(f"[{self.what} {self.done}/{self.total}] {text} ({duration(now - began)}); elapsed "
                        f"{duration(elapsed)}, about {duration(left)} left")

    @contextmanager
    def watch(self, text, out_dir):
        """While the body trains a run into ``out_dir``: a line every ``every`` seconds with the run's step, its
        time so far and the time it has left (from its pace), e.g. ``[train 2/6] seed 0 joint: step 120 of 600,
        1m05s, about 4m20s left``."""
        with self.lock:
            self.started += 1
            label = f"[{self.what} {self.started}/{self.total}] {text}"
        began, stop = self.clock(), threading.Event()

        since = time.time() - 1.0  # files written from now on (file times are the wall clock's)

        def report():
            last, seen, shown = began, None, None  # seen: (step, when first read); shown: the step last printed
            while not stop.wait(POLL_SECONDS):
                now = self.clock()
                progress = run_step(out_dir, since)
                if progress is not None and (seen is None or seen[0] != progress[0]):
                    seen = (progress[0], now)
                if progress is None or now - last < self.every:
                    continue
                self._print(f"{label}: {_state(progress, now - began, now - seen[1], progress[0] == shown)}")
                last, shown = now, progress[0]

        thread = threading.Thread(target=report, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
