"""The training loop: a short template with ``should_log`` / ``should_eval`` / ``should_save`` hooks.

For every step batch: agree with the other ranks (data errors, stop requests), run one optimizer step
(:class:`mtl.train.step.OptimizerStep`: joint forward, weighted backward, gradient sync, norm, clip, update,
averager) and keep its :class:`mtl.train.step.StepResult`, then the hooks: bad-step handling, the log, evaluation,
checkpoints (:class:`mtl.train.state.TrainingState` saves and restores everything a resume needs). Everything that
involves other processes goes through :class:`mtl.parallel.strategy.ParallelStrategy`; the loop itself never
communicates.
"""
import json
import logging
import os
import time

import paddle

from mtl.config.overrides import key_source
from mtl.core import activity, registry
from mtl.core.contracts import check_batch
from mtl.core.errors import ConfigError, DiskError
from mtl.data.steps import StepDataset, error_text, make_loader, raise_error_text
from mtl.optimizer.joint import JointOptimizer
from mtl.parallel.strategy import ParallelStrategy
from mtl.store import layout, rundir
from mtl.store.run_lock import RunLock
from mtl.train.averaging import build_averager
from mtl.train.balancing import TaskBalancer
from mtl.train.eval_check import check_eval_samples, small_set_warnings
from mtl.train.guard import NonFiniteGuard
from mtl.train.loop import Loop, StepRecord, log_stop, read_records, timed_steps
from mtl.train.precision import build_precision
from mtl.train.preemption import Preempted, StopRequest
from mtl.train.reporting import MetricsLog, setup_logging
from mtl.train.run_evaluation import RunEvaluation
from mtl.train.state import TrainingState
from mtl.train.step import OptimizerStep, StepResult, as_tensors
from mtl.train.watchdog import for_run
from mtl.train.write_faults import next_save, save_failed, write_job_file, write_problem_text

log = logging.getLogger("mtl")


class Trainer:
    """Runs a built :class:`mtl.train.job.Job`: training, logging, evaluation, checkpoints, summary."""

    def __init__(self, job, resume=False, console=print, overwrite=False, resume_from=None):
        self.job, self.cfg = job, job.cfg
        check_eval_samples(job)  # a bad image of the held-out people fails now, before anything is written
        self.resume_from = resume_from  # a named checkpoint to resume from (--resume STEP_OR_PATH), else the latest
        self.strategy = ParallelStrategy(job.model)
        self.is_main = self.strategy.is_main
        self.console = console if self.is_main else (lambda *a, **k: None)
        self.output_dir = self.cfg["output_dir"]
        created = rundir.open_output_dir(self.output_dir, resume, resume_from)  # the folders this start made
        self.lock = self._hold()  # one run per output folder, before anything is written there
        try:
            self._build(job, resume, overwrite)
        except BaseException:
            self.release()
            rundir.remove_created(created, self.output_dir, self.strategy.rank)  # no empty run folder is left
            raise

    def _hold(self):
        """Rank 0 takes the output folder's hold (:mod:`mtl.store.run_lock`); every rank learns if it was refused."""
        lock, refusal = RunLock(self.output_dir), None
        if self.is_main:
            try:
                lock.acquire(self.cfg["source"])
            except ConfigError as exc:
                refusal, lock = exc.bare_message, None
        refusal = self.strategy.from_main(refusal)
        if refusal:
            raise ConfigError(refusal, key_source(self.cfg, "output_dir"), "output_dir")
        return lock if self.is_main else None

    def release(self):
        """Give the output folder's hold back (the run is over, or never started)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _build(self, job, resume, overwrite):
        """Everything of the run (the hold is taken): optimizer, averager, weighting, precision, the step, the
        resumable state, the run folder, the restored checkpoint, the log and the evaluator."""
        self.steps = self.cfg["schedule"]["steps"]
        accumulate = self.cfg["schedule"]["accumulate"]  # micro-batches per optimizer step
        self.strategy.check_batch_split(job.schedule, self.cfg["source"], accumulate)
        self.optimizer = JointOptimizer(self.cfg["optimizer"], job.model, self.steps)
        self.strategy.seed_random(self.cfg["seed"])  # dropout masks per rank; a checkpoint restores them
        self.averager = build_averager(self.cfg["averaging"], job.model, source=self.cfg["source"])
        self.balancer = self._build_balancer()
        self.guard = NonFiniteGuard(self.cfg["on_nonfinite"], self.cfg["max_consecutive_nonfinite"])
        self.autocast, self.scaler = build_precision(self.cfg, paddle.get_device(), self.console)
        job.model.autocast = self.autocast
        self.autocast.prepare([job.model.backbone, *job.model.architecture.backbone_copies()], self.optimizer.dense)
        self.optimizer_step = OptimizerStep(job.model, self.balancer, self.strategy, self.optimizer, self.averager,
                                            self.scaler, self.cfg["optimizer"]["clip_norm"], accumulate)
        self.state = TrainingState(job.model, self.optimizer, job.schedule, self.strategy, self.balancer, self.guard,
                                   self.averager, self.scaler, keep=self.cfg["checkpoint"]["keep"],
                                   total_steps=self.steps)
        rundir.refuse_or_clear(self.output_dir, resume, overwrite, key_source(self.cfg, "output_dir"),
                               self.strategy)
        setup_logging(self.output_dir, self.strategy.rank)
        self._announce_hooks()
        self._announce_small_sets()
        self.start_step, self.resumed_from = self._restore() if resume else (0, None)
        self.saved = self.resumed_from  # the newest checkpoint of this run (what --resume continues from)
        kept = []
        if self.is_main:
            kept = rundir.keep_until(self.output_dir, self.start_step) if self.resumed_from else []
            if not self.resumed_from:
                rundir.start_fresh(self.output_dir)
        self.metrics = MetricsLog(os.path.join(self.output_dir, "metrics.jsonl"), self.is_main, kept,
                                  visualdl=self.cfg["log"]["visualdl"])
        self.evaluation = RunEvaluation(job, self.strategy, self.averager, self.metrics, self.output_dir, self.console,
                                        self.cfg["log"]["plot"])
        write_job_file(self.output_dir, self.cfg, self.strategy)  # a full or read-only disk: every rank stops alike
        if self.is_main:
            job.backbone.save_assets(self.output_dir)  # a text encoder's tokenizer.json: the run tokenises as it did

    def _announce_hooks(self):
        """What the step hooks say at the start (cross-head negatives: the same-person pairs they mask), on the
        console and in every rank's log."""
        for hook in self.job.model.step_hooks:
            if line := hook.describe():
                self.console(line)
                log.info(line)

    def _announce_small_sets(self):
        """The verification sets (``eval.sets``) too small for their folds, once, on the console and in every rank's
        log (:func:`mtl.train.eval_check.small_set_warnings`)."""
        for line in small_set_warnings(self.job):
            self.console(line)
            log.warning(line)

    def _restore(self):
        """(start step, checkpoint path) of the latest checkpoint, loaded; (0, None) when there is none; a
        ConfigError, before anything is touched, when there are checkpoints and every one is damaged."""
        named = rundir.named_checkpoint(self.output_dir, self.resume_from)
        path = named or layout.latest_checkpoint(self.output_dir, strategy=self.strategy)
        if path is None:
            refusal = self.strategy.from_main(rundir.all_damaged(self.output_dir) if self.is_main else None)
            if refusal:  # every checkpoint damaged: start nothing and touch nothing (they may be repaired)
                raise ConfigError(refusal, key_source(self.cfg, "output_dir"), "output_dir")
            self.console(f"--resume: no checkpoint under {layout.checkpoint_root(self.output_dir)}; "
                         "starting from step 0")
            return 0, None
        step, before, written_by = self.state.restore(path, self.steps, self.cfg["source"])
        self.console(rundir.resumed_line(path, step, self.steps, written_by, self.strategy.world))
        if before is not None and before != self.steps and self.is_main:
            self.console(rundir.horizon_moved(before, self.steps, self.cfg["schedule"].get("epochs")))
        if named and self.is_main:
            rundir.drop_after(self.output_dir, step, self.console)
        return step, path

    def _build_balancer(self):
        """The job's task-weighting strategy (``weighting:``) over its tasks, applied by a :class:`TaskBalancer`."""
        model = self.job.model
        tasks = list(model.heads.keys())
        weighting = registry.build("weighting", self.cfg["weighting"], self.cfg["source"], "weighting", tasks=tasks,
                                   loss_weights=[model.loss_weights[t] for t in tasks], seed=self.cfg["seed"])
        return TaskBalancer(weighting, self.strategy, model, self.job.schedule.row_sharing(), self.optimizer.rows)

    # ---- hooks -------------------------------------------------------------------------------------------------
    def should_log(self, step):
        """Log after ``step`` (1-based count of finished steps)."""
        return step % self.cfg["log"]["every"] == 0 or step == self.steps

    def should_eval(self, step):
        """Evaluate during training after ``step`` (the final evaluation is separate)."""
        every = self.cfg["eval"]["every"]
        return every > 0 and step % every == 0 and step != self.steps

    def should_save(self, step):
        """Checkpoint after ``step``; the final step is always saved."""
        every = self.cfg["checkpoint"]["every"]
        return step == self.steps or (every > 0 and step % every == 0)

    # ---- one step ----------------------------------------------------------------------------------------------
    def train_step(self, batch, step=None) -> StepResult:
        """One optimizer step on ``batch`` (tensors or numpy arrays: this rank's rows of the 0-based ``step``,
        default the run's first); see :class:`mtl.train.step.OptimizerStep`."""
        return self.optimizer_step(self.as_tensors(batch), self.start_step if step is None else step)

    def as_tensors(self, batch):
        """The step batch as the tensors the model reads (a subclass may widen them, e.g. to float64)."""
        return as_tensors(batch)

    def _check_first(self, batch, seen):
        """Check the first batch of every task against the fields its backbone and head declared."""
        if not self.cfg["data"]["check_batches"]:
            return
        for task in batch:
            if task not in seen:
                seen.add(task)
                t = self.job.task(task)
                inputs = self.job.backbone.input_fields()
                check_batch(task, f"reader '{t.cfg['reader']['type']}'", inputs + t.head.fields(), batch[task],
                            groups={f.name for f in inputs})

    # ---- the loop ----------------------------------------------------------------------------------------------
    def run(self, until=None):
        """Train from ``start_step`` to ``steps``; evaluate, save and summarise; return the summary dict.

        ``until``: stop after that step as a pre-empted job would (:meth:`stop_early`: a checkpoint of the step, no
        final evaluation, no ``summary.json``). A pre-emption signal saves the current step and raises
        :class:`Preempted`. On any error the progress bar is closed first, so the error starts on its own line. The
        output folder's hold is given back however the run ends. A stuck step ends it: :mod:`mtl.train.watchdog`.
        """
        watchdog = for_run(self.cfg["watchdog"], self.output_dir, self.strategy, self.lock, lambda: self.saved,
                           self.release).start()
        try:
            return self._run(until)
        finally:
            watchdog.stop()
            self.release()

    def _run(self, until):
        end = self.steps if until is None else max(self.start_step, min(self.steps, int(until)))
        dataset = self._dataset(end)
        loader = make_loader(dataset, self.cfg["data"]["num_workers"])
        self.job.model.train()
        loop = Loop(self._progress())
        started, step = time.time(), self.start_step
        try:
            with StopRequest() as stop:
                for batch in timed_steps(loader, step, dataset.board):
                    self._agree(batch, step, loop, stop)
                    step = self._step(batch, step, loop)
        except BaseException as exc:
            loop.close()  # before anything prints: the error line must not share the progress bar's line
            log_stop(exc, step)
            raise
        self._flush(loop)
        loop.close()
        if step < self.steps:
            return self.stop_early(step)
        if step == self.start_step == self.steps:
            self.console(f"nothing to train: the checkpoint is already at step {self.steps}")
        with activity.long_wait("the final evaluation and summary"):
            return self.finish(time.time() - started, step)

    def _step(self, batch, step, loop):
        """Train on ``batch`` (the batch of step ``step + 1``), record it and run the hooks; the new step count."""
        self._check_first(batch, loop.seen)
        lr = self.optimizer.get_lr()
        result = self.train_step(batch, step)
        step += 1
        loop.pending.append(StepRecord(step, lr, result))
        self._after_step(step, result, loop)
        return step

    def stop_early(self, step):
        """End a run stopped by ``until`` before the end of its schedule, as a pre-emption at ``step`` would: save a
        checkpoint of ``step`` (unless the hooks just did, or nothing was trained), no final evaluation and no
        ``summary.json`` (the run is not finished). Returns ``{"steps", "stopped_early": True, "checkpoint"}``, the
        checkpoint ``--resume`` continues from (None before any)."""
        if step > self.start_step and not self.should_save(step):
            self._save(step)
        return {"steps": step, "stopped_early": True, "checkpoint": self.saved}

    def _after_step(self, step, result: StepResult, loop):
        """Bad-step handling, then the hooks: log, evaluate, save."""
        loop.window.add(self.cfg["schedule"]["batch_size"])
        if result.nonfinite:
            self._on_bad_step(step, result, loop)
        elif result.applied:
            self.guard.good_step()
        # a checkpoint or an evaluation first writes out every pending record, so a resumed run misses none
        if self.should_log(step) or self.should_save(step) or self.should_eval(step):
            self._flush(loop)
        if loop.progress is not None:
            loop.progress.update(1)
        if self.should_eval(step):
            self._evaluate(step)
        if self.should_save(step):
            self._save(step, periodic=True)

    def _agree(self, batch, step, loop, stop):
        """Before a step: every rank learns any rank's data error (raised on all) or stop request (the last step
        is saved, then :class:`Preempted`) — one tiny all-reduce per step at world > 1."""
        text, stopping = self.strategy.agree(error_text(batch) or write_problem_text(self.metrics), stop.requested,
                                             batch)
        if text:
            raise_error_text(text)
        if stopping:
            self._flush(loop)
            loop.close()
            if step > self.start_step and not self.should_save(step):
                self._save(step)  # hashed once, as it is written: the path is known, nothing is read again
            raise Preempted(f"stopped after step {step} on request ({stop.signal_name or 'another rank'}); "
                            f"checkpoint {self.saved}")  # the command line adds the command that continues

    def _on_bad_step(self, step, result: StepResult, loop):
        """A non-finite step: write its record (strict JSON), then stop or count it as ``on_nonfinite`` says."""
        self._flush(loop)
        self.guard.bad_step(step, result.nonfinite, self.saved)
        log.warning("step %d skipped: %s not finite", step, ", ".join(result.nonfinite))

    def _dataset(self, end):
        """The step dataset of this rank from ``start_step`` to ``end``, with the class-label range checks."""
        job = self.job
        readers = {t.name: t.reader for t in job.tasks}
        ranges = {t.name: (t.head.label_field, t.head.class_count()) for t in job.tasks
                  if t.head.class_count() is not None}
        return StepDataset(job.schedule, readers, self.cfg["seed"], self.start_step, end, self.strategy.world,
                           self.strategy.rank, ranges, self.optimizer_step.accumulate,
                           self.cfg["data"]["bucket_batches"])

    def _progress(self):
        if not (self.is_main and self.cfg["log"]["progress"]):
            return None
        from tqdm import tqdm

        return tqdm(total=self.steps, initial=self.start_step, desc="train", dynamic_ncols=True)

    def _flush(self, loop):
        """Write the pending step records to ``metrics.jsonl`` and the rank's log."""
        if not loop.pending:
            return
        samples_per_s = loop.window.rate()
        record = None
        read_records(loop.pending)
        for item in loop.pending:
            record = item.as_json(self.job.model.loss_weights, samples_per_s)
            self.metrics.write(record)
            log.info(json.dumps(record))
        loop.pending = []
        if loop.progress is not None:
            loop.progress.set_postfix({k.split("/", 1)[1]: f"{v:.3f}" for k, v in record.items()
                                       if k.startswith("loss/")}, refresh=False)

    def _evaluate(self, step):
        """The evaluation after ``step`` (:meth:`mtl.train.run_evaluation.RunEvaluation.during`)."""
        return self.evaluation.during(step, self.saved)

    def _save(self, step, periodic=False):
        """Checkpoint ``step`` (every rank): the one ``--resume`` continues from (a failure: :mod:`.write_faults`)."""
        with activity.long_wait(f"saving checkpoint step_{step}"):
            try:
                self.saved = self.state.save(self.output_dir, step)
            except DiskError as exc:
                retry = periodic and step < self.steps and self.cfg["on_save_error"] == "retry"  # never a stop's
                at = next_save(step, self.cfg["checkpoint"]["every"], self.steps) if retry else None
                save_failed(exc, self.saved, at, self.is_main)

    def _finish_hooks(self):
        """The step hooks' end of training (every rank; cross-head negatives' online rule writes the same-person
        pairs it estimated), their lines on the console."""
        for hook in self.job.model.step_hooks:
            if line := hook.finish(self.output_dir, self.strategy.gather_texts, self.is_main):
                self.console(line)

    def finish(self, seconds, step=None):
        """The step hooks' end, then the final evaluation (live and averaged weights), ``summary.json``, the table
        and the loss plot (:meth:`mtl.train.run_evaluation.RunEvaluation.final`); the summary dict."""
        step = self.steps if step is None else step
        self._finish_hooks()
        run = {"steps": step, "world_size": self.strategy.world, "seconds": round(seconds, 2),
               "resumed_from": self.resumed_from, "nonfinite_steps_skipped": self.guard.skipped}
        return self.evaluation.final(run, step, self.saved)
