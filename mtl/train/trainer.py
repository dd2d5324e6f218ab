"""The training loop: a short template with ``should_log`` / ``should_eval`` / ``should_save`` hooks.

One step = one joint forward over every task present, total loss = sum_t w_t * loss_t with the weights of the job's
weighting strategy (default: the static loss_weight_t), one backward, the parallel strategy's gradient sync
(replicated parameters summed over ranks; head shards never; per-task gradients combined for gradient-based
strategies, :mod:`mtl.train.balancing`), optional global-norm clipping, one optimizer step (dense and row-sparse),
one averager update. With ``schedule.accumulate`` K the step's batch is read as K micro-batches whose gradients add
up before that one update (:meth:`Trainer._accumulated_step`). Everything that involves other processes
goes through :class:`mtl.parallel.strategy.ParallelStrategy`; the loop itself never communicates.
"""
import json
import logging
import math
import os
import time

import paddle

from mtl import registry
from mtl.arrays import host_floats
from mtl.contracts import check_batch
from mtl.data.steps import StepDataset, error_text, make_loader, raise_error_text
from mtl.errors import ConfigError, MtlError
from mtl.evaluation.evaluator import Evaluator
from mtl.parallel.strategy import ParallelStrategy
from mtl.train import checkpoint, rundir
from mtl.train.averaging import build_averager
from mtl.train.balancing import TaskBalancer
from mtl.train.guard import NonFiniteGuard
from mtl.train.loop import AveragedWeights, Loop, StepMeans, StepRecord
from mtl.train.model import micro_batches
from mtl.train.optim import JointOptimizer
from mtl.train.precision import build_precision
from mtl.train.preemption import Preempted, StopRequest
from mtl.train.reporting import MetricsLog, eval_record, setup_logging, write_summary

log = logging.getLogger("mtl")


def _log_stop(exc, step):
    """Write why training stopped after ``step`` to this rank's log: a user error's line (a reader's traceback was
    logged where it happened), the full traceback of anything else."""
    if isinstance(exc, Preempted):
        return
    if isinstance(exc, MtlError):
        log.error("stopped after step %d: %s", step, exc)
    elif isinstance(exc, KeyboardInterrupt):
        log.warning("stopped after step %d: interrupted (a second Ctrl-C)", step)
    else:
        log.exception("stopped after step %d by an unexpected error", step)


def _read_records(pending):
    """The loss and metric tensors of every pending step record replaced by their floats, in one host read."""
    slots = [(item.losses, t) for item in pending for t in item.losses]
    slots += [(metrics, k) for item in pending for metrics in item.metrics.values() for k in metrics]
    for (table, key), value in zip(slots, host_floats(table[key] for table, key in slots)):
        table[key] = value


class Trainer:
    """Runs a built :class:`mtl.job.Job`: training, logging, evaluation, checkpoints, summary."""

    def __init__(self, job, resume=False, console=print, overwrite=False):
        self.job, self.cfg = job, job.cfg
        self.strategy = ParallelStrategy(job.model)
        self.is_main = self.strategy.is_main
        self.console = console if self.is_main else (lambda *a, **k: None)
        self.output_dir = self.cfg["output_dir"]
        os.makedirs(self.output_dir, exist_ok=True)
        self.steps = self.cfg["schedule"]["steps"]
        self.accumulate = self.cfg["schedule"]["accumulate"]  # micro-batches per optimizer step
        self.strategy.check_batch_split(job.schedule, self.cfg["source"], self.accumulate)
        self.optimizer = JointOptimizer(self.cfg["optimizer"], job.model, self.steps)
        self.strategy.seed_random(self.cfg["seed"])  # dropout masks per rank; a checkpoint restores them
        self.averager = build_averager(self.cfg["averaging"], job.model, source=self.cfg["source"])
        self.balancer = self._build_balancer()
        self.guard = NonFiniteGuard(self.cfg["on_nonfinite"], self.cfg["max_consecutive_nonfinite"])
        self.autocast, self.scaler = build_precision(self.cfg, paddle.get_device(), self.console)
        job.model.autocast = self.autocast
        self.autocast.prepare(job.model.backbone, self.optimizer.dense)
        self.last_grad_norm, self.last_weights, self.last_bad, self.last_overflow = None, {}, [], False
        rundir.refuse_or_clear(self.output_dir, resume, overwrite, self.cfg["source"], self.strategy)
        setup_logging(self.output_dir, self.strategy.rank)
        self.start_step, self.resumed_from = self._restore() if resume else (0, None)
        kept = []
        if self.is_main:
            kept = rundir.keep_until(self.output_dir, self.start_step) if self.resumed_from else []
            if not self.resumed_from:
                rundir.start_fresh(self.output_dir)
        self.metrics = MetricsLog(os.path.join(self.output_dir, "metrics.jsonl"), self.is_main, kept,
                                  visualdl=self.cfg["log"]["visualdl"])
        self.evaluator = Evaluator(job, self.output_dir)
        if self.is_main:
            with open(os.path.join(self.output_dir, "job.json"), "w") as f:
                json.dump(self.cfg, f, indent=1, default=str)
            job.backbone.save_assets(self.output_dir)  # a text encoder's tokenizer.json: the run tokenises as it did

    def _restore(self):
        """(start step, checkpoint path) of the latest checkpoint, loaded; (0, None) when there is none."""
        path = checkpoint.latest_checkpoint(self.output_dir, strategy=self.strategy)
        if path is None:
            self.console(f"--resume: no checkpoint under {checkpoint.checkpoint_root(self.output_dir)}; "
                         "starting from step 0")
            return 0, None
        state = checkpoint.load(path, self.job.model, self.optimizer, self.job.schedule, self.averager,
                                    self.strategy.rank, self.strategy.world)
        if "weighting" in state:
            self.balancer.set_state_dict(state["weighting"])
        if "nonfinite" in state:
            self.guard.set_state_dict(state["nonfinite"])
        if "loss_scale" in state and self.scaler is not None:
            self.scaler.set_state_dict(state["loss_scale"])
        if state["step"] > self.steps:
            raise ConfigError(f"the latest checkpoint '{path}' is at step {state['step']}, beyond this job's "
                              f"schedule.steps {self.steps}", self.cfg["source"], "schedule.steps")
        return state["step"], path

    def _build_balancer(self):
        """The job's task-weighting strategy (``weighting:``) over its tasks, applied by a :class:`TaskBalancer`."""
        model = self.job.model
        tasks = list(model.heads.keys())
        weighting = registry.build("weighting", self.cfg["weighting"], self.cfg["source"], "weighting", tasks=tasks,
                                   loss_weights=[model.loss_weights[t] for t in tasks], seed=self.cfg["seed"])
        return TaskBalancer(weighting, self.strategy, model)

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
    def train_step(self, batch, step=None):
        """Forward, backward, gradient sync, clip, optimizer step; returns the total loss and ``{task: HeadOutput}``.

        A non-finite task loss or gradient norm leaves everything untouched and sets ``last_bad`` (what was not
        finite); :meth:`run` then stops or skips as ``on_nonfinite`` says. Under fp16 loss scaling a non-finite
        gradient is an overflow first: the step is skipped and the scale lowered (``last_overflow``).
        """
        step = self.start_step if step is None else step
        if self.accumulate > 1:
            return self._accumulated_step(batch, step)
        total, outputs = self.job.model(batch, step=step)
        # global: equal on every rank; one host read for every task
        losses = dict(zip(outputs, host_floats(o.global_loss for o in outputs.values())))
        self.last_bad = NonFiniteGuard.bad_losses(losses)
        self.last_overflow = False
        if self.last_bad:  # global losses: every rank skips the backward (and its collectives) alike
            self.last_grad_norm, self.last_weights = None, {"weight": {}}
        else:
            self._backward_and_update(outputs, losses, step)
        return total, outputs

    def _backward_and_update(self, outputs, losses, step):
        """The weighted backward, loss-scale and clip the gradients, and apply them (or skip a bad step)."""
        scale = self.scaler.scale if self.scaler is not None else 1.0
        weighting = self.balancer.snapshot()
        self.last_weights = self.balancer.backward(outputs, losses, step, scale)
        self._apply(weighting, scale)

    def _accumulated_step(self, batch, step):
        """One optimizer step read as ``accumulate`` micro-batches (``mtl.train.balancing.AccumulatedStep``): each
        micro-batch's forward and backward (gradients add up; heads that sample prepare for the whole step), then
        the step's weighting, the loss-scale, non-finite and clipping decisions and the update, once. Returns the
        static-weighted total and ``{task: HeadOutput}`` of the means over the micro-batches (a step stopped at a
        non-finite loss: over those run)."""
        model = self.job.model
        scale = self.scaler.scale if self.scaler is not None else 1.0
        model.prepare_step(batch, step, self.accumulate)
        weighting = self.balancer.snapshot()
        plan = self.balancer.accumulated(list(batch), step, scale, self.accumulate)
        sums, self.last_bad, self.last_overflow = StepMeans(), [], False
        for part in micro_batches(batch, self.accumulate):
            _, outputs = model(part, step=step)
            losses = {t: float(o.global_loss) for t, o in outputs.items()}  # global: equal on every rank
            sums.add(outputs, losses)
            self.last_bad = NonFiniteGuard.bad_losses(losses)
            if self.last_bad:  # every rank alike: the rest of the step is not run, nothing is applied
                break
            plan.backward()
        outputs = sums.outputs()
        if self.last_bad:
            self.optimizer.discard()
            self.last_grad_norm, self.last_weights = None, {"weight": {}}
        else:
            self.last_weights = plan.finish({t: float(o.global_loss) for t, o in outputs.items()})
            self._apply(weighting, scale)
        return sum(o.loss * model.loss_weights[t] for t, o in outputs.items()), outputs

    def _apply(self, weighting, scale):
        """After the backward of a step: unscale, the global norm (non-finite: the guard or an fp16 overflow, the
        weighting's state put back), clip, the optimizer step and the averager."""
        rows = self.job.model.row_gradients()
        if scale != 1.0:
            self.strategy.unscale_gradients(1.0 / scale, rows)
        self.last_grad_norm = self.strategy.grad_norm(rows)  # global: every rank decides alike
        if not math.isfinite(self.last_grad_norm):
            self.balancer.restore(weighting)
            self.optimizer.discard()
            self.last_overflow = self.scaler is not None and self.scaler.overflow()
            self.last_bad = [] if self.last_overflow else ["gradient"]
            return
        if self.scaler is not None:
            self.scaler.good_step()
        self.strategy.clip_gradients(self.cfg["optimizer"]["clip_norm"], self.last_grad_norm, rows)
        self.optimizer.step(rows)
        if self.averager is not None:
            self.averager.step()

    def _to_tensors(self, batch):
        """The step batch as tensors (the DataLoader already yields tensors; numpy arrays from tests are wrapped)."""
        return {t: {k: v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v) for k, v in sub.items()}
                for t, sub in batch.items()}

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
        :class:`Preempted`. On any error the progress bar is closed first, so the error starts on its own line.
        """
        end = self.steps if until is None else max(self.start_step, min(self.steps, int(until)))
        loader = make_loader(self._dataset(end), self.cfg["data"]["num_workers"])
        self.job.model.train()
        loop = Loop(self._progress())
        started, step = time.time(), self.start_step
        try:
            with StopRequest() as stop:
                for batch in loader:
                    self._agree(batch, step, loop, stop)
                    step = self._step(batch, step, loop)
        except BaseException as exc:
            loop.close()  # before anything prints: the error line must not share the progress bar's line
            _log_stop(exc, step)
            raise
        self._flush(loop)
        loop.close()
        if step < self.steps:
            return self.stop_early(step)
        if step == self.start_step == self.steps:
            self.console(f"nothing to train: the checkpoint is already at step {self.steps}")
        return self.finish(time.time() - started, step)

    def _step(self, batch, step, loop):
        """Train on ``batch`` (the batch of step ``step + 1``), record it and run the hooks; the new step count."""
        self._check_first(batch, loop.seen)
        lr = self.optimizer.get_lr()
        _, outputs = self.train_step(self._to_tensors(batch), step)
        step += 1
        loop.pending.append(StepRecord(step, lr, self.last_grad_norm,
                                       {t: o.global_loss.detach() for t, o in outputs.items()},
                                       {t: dict(o.metrics) for t, o in outputs.items()}, self.last_weights,
                                       bool(self.last_bad), self.last_overflow, self._scale()))
        self._after_step(step, loop)
        return step

    def stop_early(self, step):
        """End a run stopped by ``until`` before the end of its schedule, as a pre-emption at ``step`` would: save a
        checkpoint of ``step`` (unless the hooks just did, or nothing was trained), no final evaluation and no
        ``summary.json`` (the run is not finished). Returns ``{"steps", "stopped_early": True, "checkpoint"}``, the
        checkpoint ``--resume`` continues from (None before any)."""
        if step > self.start_step and not self.should_save(step):
            self._save(step)
        saved = checkpoint.latest_checkpoint(self.output_dir, strategy=self.strategy)
        return {"steps": step, "stopped_early": True, "checkpoint": saved}

    def _after_step(self, step, loop):
        """Bad-step handling, then the hooks: log, evaluate, save."""
        loop.window.add(self.cfg["schedule"]["batch_size"])
        if self.last_bad:
            self._on_bad_step(step, loop)
        else:
            self.guard.good_step()
        # a checkpoint or an evaluation first writes out every pending record, so a resumed run misses none
        if self.should_log(step) or self.should_save(step) or self.should_eval(step):
            self._flush(loop)
        if loop.progress is not None:
            loop.progress.update(1)
        if self.should_eval(step):
            self._evaluate(step)
        if self.should_save(step):
            self._save(step)

    def _agree(self, batch, step, loop, stop):
        """Before a step: every rank learns any rank's data error (raised on all) or stop request (the last step
        is saved, then :class:`Preempted`) — one tiny all-reduce per step at world > 1."""
        text, stopping = self.strategy.agree(error_text(batch), stop.requested, batch)
        if text:
            raise_error_text(text)
        if stopping:
            self._flush(loop)
            loop.close()
            if step > self.start_step and not self.should_save(step):
                self._save(step)
            saved = checkpoint.latest_checkpoint(self.output_dir, strategy=self.strategy)
            raise Preempted(f"stopped after step {step} on request ({stop.signal_name or 'another rank'}); "
                            f"checkpoint {saved}; continue with --resume")

    def _on_bad_step(self, step, loop):
        """A non-finite step: write its record (strict JSON), then stop or count it as ``on_nonfinite`` says."""
        self._flush(loop)
        self.guard.bad_step(step, self.last_bad, checkpoint.latest_checkpoint(self.output_dir, strategy=self.strategy))
        log.warning("step %d skipped: %s not finite", step, ", ".join(self.last_bad))

    def _dataset(self, end):
        """The step dataset of this rank from ``start_step`` to ``end``, with the class-label range checks."""
        job = self.job
        readers = {t.name: t.reader for t in job.tasks}
        ranges = {t.name: (t.head.label_field, t.head.class_count()) for t in job.tasks
                  if t.head.class_count() is not None}
        return StepDataset(job.schedule, readers, self.cfg["seed"], self.start_step, end, self.strategy.world,
                           self.strategy.rank, ranges, self.accumulate, self.cfg["data"]["bucket_batches"])

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
        _read_records(loop.pending)
        for item in loop.pending:
            record = self._record(item, samples_per_s)
            self.metrics.write(record)
            log.info(json.dumps(record))
        loop.pending = []
        if loop.progress is not None:
            loop.progress.set_postfix({k.split("/", 1)[1]: f"{v:.3f}" for k, v in record.items()
                                       if k.startswith("loss/")}, refresh=False)

    def _record(self, item: StepRecord, samples_per_s: float) -> dict:
        """The ``metrics.jsonl`` record of one step."""
        record = {"step": item.step, "lr": float(item.lr)}
        if item.grad_norm is not None:
            record["grad_norm"] = item.grad_norm  # global norm before clipping
        weights = item.weights["weight"]  # a skipped step has none: its total is the static one
        statics = self.job.model.loss_weights
        record["loss"] = float(sum(weights.get(t, statics[t]) * float(v) for t, v in item.losses.items()))
        record.update({f"loss/{t}": float(v) for t, v in item.losses.items()})
        record.update({f"{kind}/{t}": v for kind, values in item.weights.items() for t, v in values.items()})
        record.update({f"{k}/{t}": float(v) for t, ms in item.metrics.items() for k, v in ms.items()})
        record["samples_per_s"] = round(samples_per_s, 2)
        if item.loss_scale is not None:
            record["loss_scale"] = item.loss_scale
        if item.overflow:
            record["overflow"] = True  # fp16 overflow: not applied, scale lowered
        if item.nonfinite:
            record["nonfinite"] = True  # not applied (on_nonfinite); non-finite values are written as null
        return record

    def _scale(self):
        return self.scaler.scale if self.scaler is not None else None

    def _extra_state(self):
        """State equal on every rank, kept in the checkpoint's state.json."""
        extra = {"weighting": self.balancer.state_dict(), "nonfinite": self.guard.state_dict()}
        if self.scaler is not None:
            extra["loss_scale"] = self.scaler.state_dict()
        return extra

    def _averaged(self):
        """Context: the averaged weights when the run averages, else the live ones; either way with BatchNorm
        statistics agreed by every rank (averaged once)."""
        return AveragedWeights(self.averager, self.strategy)

    def _evaluate(self, step):
        with self._averaged():
            results = self.evaluator.evaluate()
        record = {"step": step, "eval": results, "averaged": self.averager is not None}
        self.metrics.write(eval_record(step, results, "eval_averaged" if self.averager is not None else "eval"))
        if self.is_main:
            with open(os.path.join(self.output_dir, "eval.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
        log.info("eval %s", json.dumps(record))
        return results

    def _save(self, step):
        checkpoint.save(self.output_dir, step, self.job.model, self.optimizer, self.job.schedule, self.strategy,
                        self.averager, keep=self.cfg["checkpoint"]["keep"], extra=self._extra_state())

    def finish(self, seconds, step=None):
        """Final evaluation (live and averaged weights), ``summary.json``, the table and the loss plot."""
        step = self.steps if step is None else step
        with self.strategy.agreed_statistics():
            live = self.evaluator.evaluate()
        averaged = None
        if self.averager is not None:
            with self._averaged():
                averaged = self.evaluator.evaluate()
        final = eval_record(step, live, "eval")
        final["final"] = True  # a run continued later drops this record (mtl.train.rundir.keep_until)
        final.update(eval_record(step, averaged or {}, "eval_averaged"))
        self.metrics.write(final)
        run = {"steps": step, "world_size": self.strategy.world, "seconds": round(seconds, 2),
               "resumed_from": self.resumed_from, "nonfinite_steps_skipped": self.guard.skipped}
        return write_summary(self.job, self.metrics.records, live, averaged, run, self.output_dir,
                             self.console if self.is_main else None, self.cfg["log"]["plot"])
