"""Step loading that never hangs: every fault of a reader or of a worker process becomes an *error item*.

The trainer turns an error item into one user error on every rank at once (``ParallelStrategy.agree_on_error``),
so a fault ends the job with one line instead of a hang or a traceback from Paddle's data queue:

* ``num_workers: 0`` reads steps in the training thread itself (Paddle's single-process loader runs the reader in
  a helper thread: a reader that raised there left the training thread waiting forever on its queue);
* with workers, a worker process that dies (killed by the OOM killer, a segfault in a decoder) is noticed by
  Paddle's reader thread within its 5 s status check; the exception that then ends the iteration becomes an error
  item naming the worker, its pid and the signal;
* every worker dies with its trainer (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, Linux; a watchdog thread that polls
  ``os.getppid()`` elsewhere), so a ``kill -9`` of a trainer leaves no orphan holding memory.

The original traceback of a reader fault travels in the error item and is written to the rank's log file
(``logs/rank<k>.log``) by :func:`error_text`.
"""
import logging
import os
import signal
import traceback

import numpy as np
import paddle

from mtl.core.arrays import to_numpy

ERROR_KEY = "__mtl_error__"
log = logging.getLogger("mtl")


def error_item(exc, details=None):
    """A DataLoader item that carries a user error (and optionally a traceback) from a worker to the trainer."""
    text = f"{type(exc).__name__}\n{exc}".encode()
    item = {"message": np.frombuffer(text, dtype=np.uint8).copy()}
    if details:
        item["details"] = np.frombuffer(details.encode(), dtype=np.uint8).copy()
    return {ERROR_KEY: item}


def _bytes_of(value) -> str:
    raw = to_numpy(value)
    return bytes(raw.astype(np.uint8)).decode(errors="replace")


def _log_file() -> str:
    """The path of this rank's log file (``mtl.train.reporting.setup_logging``), or a generic phrase."""
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return "the rank's log file"


def error_text(batch):
    """The ``"Kind\\nmessage"`` an item from :func:`error_item` carries, or None for a normal batch.

    A carried traceback is written to this rank's log, and the message says where to find it.
    """
    if ERROR_KEY not in batch:
        return None
    item = batch[ERROR_KEY]
    text = _bytes_of(item["message"])
    if "details" in item:
        log.error("%s\n%s", text.replace("\n", ": ", 1), _bytes_of(item["details"]))
        text += f" (traceback in {_log_file()})"
    return text


def raise_error_text(text):
    """Raise the user error described by :func:`error_text` (the same class: DataError, ConfigError, ...)."""
    kind, message = text.split("\n", 1)
    from mtl.core import errors

    cls = vars(errors).get(kind, errors.DataError)
    raise (cls if isinstance(cls, type) and issubclass(cls, errors.MtlError) else errors.DataError)(message)


def format_fault(exc) -> str:
    """The original traceback of ``exc`` as text (for the rank's log)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# ---- worker processes die with their trainer -------------------------------------------------------------------
def die_with_parent(parent_pid, worker_id=None):
    """DataLoader worker init: make this worker exit when its trainer process (``parent_pid``) dies, even by SIGKILL
    (:func:`mtl.core.runtime.die_with_parent` with SIGKILL: ``prctl(PR_SET_PDEATHSIG)`` on Linux, a thread that polls
    ``os.getppid()`` once a second elsewhere)."""
    from mtl.core.runtime import die_with_parent as ask

    ask(parent_pid, signal.SIGKILL)


class _WorkerInit:
    """Picklable ``worker_init_fn``: :func:`die_with_parent` for the process that created the loader."""

    def __init__(self):
        self.parent_pid = os.getpid()

    def __call__(self, worker_id):
        die_with_parent(self.parent_pid, worker_id)


# ---- loaders -----------------------------------------------------------------------------------------------------
class InProcessLoader:
    """``num_workers: 0``: the dataset's items in order, read in the calling thread (no queue to wait on)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __iter__(self):
        for i in range(len(self.dataset)):
            yield self.dataset[i]


WORKER_CHECK_INTERVAL = 0.5  # seconds


class WorkerLoader:
    """Paddle's multi-process DataLoader, with workers that die with the trainer and faults turned into error items."""

    def __init__(self, dataset, num_workers: int):
        self.dataset = dataset
        # ``timeout`` is how often Paddle's reader thread, while it waits for a batch, looks for a dead worker
        # (its default, 5 s, kept a job whose worker the OOM killer took waiting that long before it said so)
        self.loader = paddle.io.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=int(num_workers),
                                           use_shared_memory=False, worker_init_fn=_WorkerInit(),
                                           timeout=WORKER_CHECK_INTERVAL)

    def __len__(self):
        return len(self.dataset)

    def __iter__(self):
        iterator = iter(self.loader)
        # Paddle's SIGCHLD handler raises a SystemError at whatever line the training thread is running when a
        # worker dies (possibly inside a collective, leaving the other ranks waiting); its reader thread notices the
        # dead worker anyway and ends the iteration, which is the one place where the fault is handled here.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as exc:  # the queue was killed: a worker died, or the reader thread failed
                yield error_item(_worker_fault(iterator, exc), format_fault(exc))
                return
            yield batch


def _worker_fault(iterator, exc):
    """The user error for a loader that stopped with ``exc``: which worker died and how, when that is known."""
    from mtl.core.errors import DataError

    dead = [w for w in getattr(iterator, "_workers", []) if w.exitcode is not None and w.exitcode != 0]
    if not dead:
        return DataError(f"the DataLoader stopped unexpectedly ({type(exc).__name__}: {str(exc).strip()[:200]})")
    w = dead[0]
    how = f"exited with status {w.exitcode}"
    if w.exitcode < 0:
        name = signal.Signals(-w.exitcode).name
        how = f"was killed by {name}" + (" (the system's out-of-memory killer sends it: check the memory of the "
                                          "machine, lower data.num_workers or the batch size)"
                                          if -w.exitcode == signal.SIGKILL else "")
    return DataError(f"DataLoader worker process {w.pid} {how}; the training cannot get its data")


def make_loader(dataset, num_workers: int):
    """One step per item, in order: in the training thread (``num_workers`` 0) or in ``num_workers`` processes."""
    if int(num_workers) <= 0:
        return InProcessLoader(dataset)
    return WorkerLoader(dataset, num_workers)
