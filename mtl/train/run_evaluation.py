"""A run's evaluation: during training (``eval.every``: the averaged weights when the run averages) and at its end
(live and averaged weights, the final record, ``summary.json``, the table and the loss plot). Every rank calls it
alike; rank 0 writes the files. A failing evaluation raises the error that names the task, the stage and the
checkpoint to resume from (:func:`mtl.train.eval_check.evaluation_error`)."""
import json
import logging
import os

from mtl.core import activity
from mtl.core.errors import DiskError, MtlError
from mtl.evaluation.evaluator import Evaluator
from mtl.train.eval_check import evaluation_error
from mtl.train.loop import AveragedWeights
from mtl.train.reporting import eval_record, write_summary
from mtl.train.write_faults import write_problem_text

log = logging.getLogger("mtl")


class RunEvaluation:
    """Evaluation of one run (module docstring): ``metrics`` is the run's :class:`mtl.train.reporting.MetricsLog`,
    ``plot`` whether the end draws the loss plot."""

    def __init__(self, job, strategy, averager, metrics, output_dir: str, console, plot: bool):
        self.job, self.strategy, self.averager, self.metrics = job, strategy, averager, metrics
        self.output_dir, self.console, self.plot = output_dir, console, plot
        self.evaluator = Evaluator(job, output_dir)

    def averaged(self):
        """Context: the averaged weights when the run averages, else the live ones; either way with BatchNorm
        statistics agreed by every rank (averaged once)."""
        return AveragedWeights(self.averager, self.strategy)

    def during(self, step: int, saved):
        """The evaluation after ``step`` (``saved``: the checkpoint a failure names), written to the metrics log
        and ``eval.jsonl``; its results."""
        try:
            with activity.long_wait(f"evaluating after step {step}"), self.averaged():
                results = self.evaluator.evaluate()
        except MtlError as exc:
            raise evaluation_error(exc, self.job, f"the evaluation after step {step}", saved, self.output_dir,
                                   self.strategy.rank) from exc
        record = {"step": step, "eval": results, "averaged": self.averager is not None}
        self.metrics.write(eval_record(step, results, "eval_averaged" if self.averager is not None else "eval"))
        if self.strategy.is_main:
            self.metrics.append(os.path.join(self.output_dir, "eval.jsonl"), record)
        log.info("eval %s", json.dumps(record))
        return results

    def final(self, run: dict, step: int, saved) -> dict:
        """The final evaluation (live and averaged weights) of a run that trained ``step`` steps, its record,
        ``summary.json`` (``run``: what the summary says of the training), the table and the loss plot; the summary
        dict. When the evaluation fails, ``summary.json`` still holds the training (``evaluation_failed`` says
        why)."""
        try:
            live, averaged = self._final_results()
        except MtlError as exc:
            self._summarise(dict(run, evaluation_failed=exc.bare_message), {}, None)
            raise evaluation_error(exc, self.job, "the final evaluation, after training,", saved, self.output_dir,
                                   self.strategy.rank) from exc
        record = eval_record(step, live, "eval")
        record["final"] = True  # a run continued later drops this record (mtl.store.rundir.keep_until)
        record.update(eval_record(step, averaged or {}, "eval_averaged"))
        self.metrics.write(record)
        if problem := write_problem_text(self.metrics):  # (records kept whole: summary.json is not written)
            raise DiskError(problem.split("\n", 1)[1])
        return self._summarise(run, live, averaged)

    def _final_results(self):
        """(live results, averaged results or None) of the final evaluation."""
        with self.strategy.agreed_statistics():
            live = self.evaluator.evaluate()
        if self.averager is None:
            return live, None
        with self.averaged():
            return live, self.evaluator.evaluate()

    def _summarise(self, run, live, averaged):
        """``summary.json``, the table and the loss plot (rank 0 writes them); the summary dict."""
        return write_summary(self.job, self.metrics.records, live, averaged, run, self.output_dir,
                             self.console if self.strategy.is_main else None, self.plot)
