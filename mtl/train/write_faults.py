"""What the trainer does when the run's files cannot be written (a full disk, a read-only filesystem, no permission,
an I/O error): one sentence naming the file and why, agreed by every rank, and exit status 74 (``DiskError``).

* A checkpoint that fails on any rank leaves nothing of itself (:func:`mtl.store.checkpoint.save`); the previous one
  stays the one ``--resume`` continues from. ``on_save_error: stop`` (default) ends the job there; ``retry`` trains
  on and tries again at the next ``checkpoint.every`` (:func:`save_failed`); the last step's checkpoint and the one of
  a stop (a pre-emption, ``--until``) are never skipped.
* A metrics or evaluation record, or a line of a rank's log, that cannot be written stops every rank at the next
  step (:func:`write_problem_text`, carried by the per-step agreement); the records before it stay intact.
"""
import json
import logging
import os
import sys

from mtl.core.errors import DiskError
from mtl.train.reporting import log_problem, write_whole

log = logging.getLogger("mtl")


def next_save(step: int, every: int, steps: int) -> int:
    """The step of the checkpoint after ``step``: the next multiple of ``every`` (> 0), or the last step ``steps``
    (always saved) when that comes first."""
    return min(steps, (step // every + 1) * every)


def save_failed(exc: DiskError, previous, retry_at, is_main: bool):
    """A checkpoint was not written (``exc``; nothing of it kept): raise the DiskError that stops the job, or, with
    ``retry_at`` (the step of the next try), say on rank 0's console and every rank's log that training goes on."""
    kept = (f"'{previous}' stays the checkpoint --resume continues from" if previous else
            "no checkpoint was written yet")
    if retry_at is None:
        raise DiskError(f"{exc.bare_message}; {kept}; the job stops (on_save_error: stop)") from exc
    line = f"{exc.bare_message}; {kept}; training goes on and tries again at step {retry_at} (on_save_error: retry)"
    log.warning(line)
    if is_main:
        print(f"warning: {line}", file=sys.stderr, flush=True)


def write_problem_text(metrics):
    """``"DiskError\\n<why>"`` when this rank could not write a record (``metrics``, rank 0's) or a line of its log,
    for the per-step agreement (every rank then raises it); None when every write went through."""
    problem = metrics.problem or log_problem()
    return f"DiskError\n{problem}; the job stops" if problem else None


def write_job_file(output_dir, cfg, strategy):
    """Rank 0 writes the run's ``job.json`` whole; a failure (agreed by every rank, one small collective) raises
    DiskError on every rank."""
    problem = None
    if strategy.is_main:
        try:
            write_whole(os.path.join(output_dir, "job.json"), json.dumps(cfg, indent=1, default=str))
        except DiskError as exc:
            problem = exc.bare_message
    problem = strategy.agree_on_error(problem)
    if problem:
        raise DiskError(f"{problem}; the job stops before training")
