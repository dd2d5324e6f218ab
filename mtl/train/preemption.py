"""Pre-emption: SIGTERM (what cluster schedulers send before they pre-empt a job) or a first Ctrl-C asks the job to
stop after the current step; a second Ctrl-C stops at once.

Every rank finishes its step, the ranks agree on the stop (one flag in the per-step all-reduce that already carries
data errors), a checkpoint of that step is saved, and the process exits with status ``PREEMPTED_EXIT_STATUS`` (75,
``EX_TEMPFAIL`` of sysexits.h: a temporary failure, run it again). Under ``paddle.distributed.launch`` signalling the
launcher is enough: it forwards SIGTERM to every worker and waits up to 30 s for them; rank 0 then writes its
sentence to the launcher's console (the launcher stops copying the worker logs when signalled), but the launcher
itself exits with the signal's number (2, 15): ``mtl launch`` (:mod:`mtl.commands.launch`) runs it and exits with 75.
``--resume`` then continues bit-identically.
"""
import logging
import signal
import threading

from mtl.core.console import launch_signal

PREEMPTED_EXIT_STATUS = 75
log = logging.getLogger("mtl")


class Preempted(Exception):
    """The job stopped on request after saving a checkpoint; the CLI exits with ``PREEMPTED_EXIT_STATUS``."""


class StopRequest:
    """Catches SIGTERM and SIGINT while installed; ``requested`` says whether this process was asked to stop."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.signal_name = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signal handlers: main thread only
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        return False

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:  # a second Ctrl-C: at once
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = "Ctrl-C, SIGINT" if signum == signal.SIGINT else signal.Signals(signum).name
        passed_on = launch_signal() if signum == signal.SIGTERM else None
        if passed_on and passed_on != "SIGTERM":  # mtl launch got it; its launcher passes SIGTERM on
            self.signal_name = f"{'Ctrl-C, ' if passed_on == 'SIGINT' else ''}{passed_on} to mtl launch"
        log.warning("%s received: stopping after the current step", self.signal_name)
