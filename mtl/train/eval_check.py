"""A run's evaluation data read before training, and the error of an evaluation that fails after it.

A face task's held-out people are decoded only when they are evaluated: at the end of training, or every
``eval.every`` steps. A bad image among them failed the run after all its training, with a bare decode error.
:func:`check_eval_samples` reads every sample an evaluation will read before the first step (the reader's own
:meth:`mtl.readers.base.Reader.check_samples`: nothing for in-memory readers), once, when a
:class:`mtl.train.trainer.Trainer` is made: ``mtl train``, ``mtl compare``'s runs and the Python API alike, before
the run's folder is touched; :func:`evaluation_error` is the
sentence when an evaluation fails anyway (a file changed during training, a verification set): the task and stage,
that the checkpoint is saved and the command that scores it. :func:`small_set_warnings` says at start-up which
verification sets (``eval.sets``) are too small for their folds.
"""
import logging
import os
from typing import List

from mtl.core.errors import DataError, MtlError
from mtl.data.steps import eval_count

log = logging.getLogger("mtl")


def evaluated_splits(job):
    """``[(task, eval reader, samples an evaluation reads)]`` of the tasks whose evaluation reads their split."""
    found = []
    for task in job.tasks:
        if task.cfg["eval"]["enabled"] and task.cfg["eval"]["split"]:
            reader = job.eval_reader(task)
            found.append((task, reader, eval_count(reader, task.cfg["eval"]["max_samples"])))
    return found


def check_eval_samples(job):
    """Read every sample each task's evaluation will read, before training: a DataError naming the task, its file
    and key and the sample that cannot be read (with ``on_bad_sample: skip`` bad samples are counted instead)."""
    for task, reader, count in evaluated_splits(job):
        try:
            reader.check_samples(count)
        except DataError as exc:
            raise DataError(f"task '{task.name}': its evaluation split (checked before training, so that it cannot "
                            f"fail the run at its end) holds a sample that cannot be read: {exc.bare_message}",
                            task.source, task.key("reader")) from exc


def small_set_warnings(job) -> List[str]:
    """One line per verification set of a task's ``eval.sets`` with fewer than 20 pairs of either kind
    (:func:`mtl.evaluation.metrics.small_folds_warning`: its fold accuracies move in large steps), naming the task and
    the set; its pairs read without decoding an image (:func:`mtl.data.verification_sets.pair_kinds`)."""
    from mtl.data.verification_sets import pair_kinds
    from mtl.evaluation.metrics import small_folds_warning

    lines = []
    for task in job.tasks:
        for entry in task.cfg["eval"]["sets"] if task.cfg["eval"]["enabled"] else []:
            issame = pair_kinds(entry["path"])
            warning = small_folds_warning(issame, folds=min(10, len(issame)))  # the folds evaluate_sets cuts
            if warning:
                lines.append(f"task '{task.name}': verification set '{entry['path']}': {warning}")
    return lines


def failing_task(job, exc):
    """The task whose evaluation raised ``exc``: the first whose evaluation split fails to read now, else one whose
    verification set (``eval.sets``) the message names; None when neither tells."""
    for task, reader, count in evaluated_splits(job):
        try:
            reader.check_samples(count)
        except DataError:
            return task.name
    for task in job.tasks:
        if task.cfg["eval"]["enabled"] and any(s["path"] in str(exc) for s in task.cfg["eval"]["sets"]):
            return task.name
    return None


def evaluation_error(exc: MtlError, job, stage: str, checkpoint, output_dir, rank=0) -> DataError:
    """The error of an evaluation that failed at ``stage`` ("the final evaluation, after training," or "the
    evaluation after step N"), its traceback written to the rank's log: the task, the stage, the cause, and the
    checkpoint that holds the training with the command that scores it (``mtl eval RUN``)."""
    log.error("%s failed", stage, exc_info=exc)
    log_file = os.path.join(output_dir, "logs", f"rank{rank}.log")
    task = failing_task(job, exc)
    who = f"task '{task}': " if task else ""
    if checkpoint is None:
        saved = "no checkpoint was saved yet"
    else:
        saved = (f"the checkpoint {checkpoint} holds the training: once the data is fixed, score it with: "
                 f"mtl eval {output_dir}")
    return DataError(f"{who}{stage} failed: {exc.bare_message}; {saved} (traceback in {log_file})")
