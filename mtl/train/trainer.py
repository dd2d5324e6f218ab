"""The training loop: a short template with ``should_log`` / ``should_eval`` / ``should_save`` hooks.

One step = one joint forward over every task present, total loss = sum_t loss_weight_t * loss_t, one backward, a
SUM all-reduce of the replicated parameters' gradients (backbone and unsharded heads; every head's loss is already
the loss of the global sub-batch, so the sum over ranks is the full gradient), optional global-norm clipping, one
optimizer step, one averager update. Head shards are never all-reduced.
"""
import contextlib
import json
import logging
import os
import time

import numpy as np
import paddle
import paddle.distributed as dist

from mtl.contracts import check_batch
from mtl.data.steps import StepDataset, check_divisible, error_text, make_loader, raise_error_text, task_seed
from mtl.errors import ConfigError
from mtl.evaluation.evaluator import Evaluator
from mtl.parallel import distributed
from mtl.train import checkpoint, rundir
from mtl.train.optim import build_optimizer, clip_grad_global_norm
from mtl.train.reporting import MetricsLog, metrics_table, plot_losses, setup_logging

log = logging.getLogger("mtl")


class Trainer:
    """Runs a built :class:`mtl.job.Job`: training, logging, evaluation, checkpoints, summary."""

    def __init__(self, job, resume=False, console=print, overwrite=False):
        self.job = job
        self.cfg = job.cfg
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.is_main = self.rank == 0
        self.console = console if self.is_main else (lambda *a, **k: None)
        self.output_dir = self.cfg["output_dir"]
        os.makedirs(self.output_dir, exist_ok=True)
        self.steps = self.cfg["schedule"]["steps"]
        check_divisible(job.schedule, self.world, self.cfg["source"])
        model = job.model
        self.sharded = [p for t in job.tasks if getattr(t.head, "sharded", False) for p in t.head.parameters()]
        ids = {id(p) for p in self.sharded}
        self.replicated = [p for p in model.parameters() if id(p) not in ids]
        # BatchNorm running statistics of the backbone (``_mean``/``_variance``): per rank unless synchronised
        self.statistics = [t for name, t in list(model.backbone.named_parameters()) +
                           list(model.backbone.named_buffers())
                           if name.rsplit(".", 1)[-1] in ("_mean", "_variance") and int(t.numel()) > 0]
        self.optimizer, self.lr = build_optimizer(self.cfg["optimizer"], model.parameters(), self.steps)
        # every rank draws its own random numbers (dropout masks), from (seed, rank); a checkpoint restores them
        paddle.seed(task_seed(self.cfg["seed"], f"rank{self.rank}"))
        self.averager = self._build_averager()
        self.last_grad_norm = None
        self.start_step = 0
        self.resumed_from = None
        rundir.refuse_or_clear(self.output_dir, resume, overwrite, self.cfg["source"])
        setup_logging(self.output_dir, self.rank)
        if resume:
            path = checkpoint.latest_checkpoint(self.output_dir)
            if path is None:
                self.console(f"--resume: no checkpoint under {checkpoint.checkpoint_root(self.output_dir)}; "
                             "starting from step 0")
            else:
                state = checkpoint.load(path, model, self.optimizer, job.schedule, self.averager)
                if state["step"] > self.steps:
                    raise ConfigError(f"the latest checkpoint '{path}' is at step {state['step']}, beyond this job's "
                                      f"schedule.steps {self.steps}", self.cfg["source"], "schedule.steps")
                self.start_step = state["step"]
                self.resumed_from = path
        kept = []
        if self.is_main:
            if self.resumed_from:
                kept = rundir.keep_until(self.output_dir, self.start_step)
            else:
                rundir.start_fresh(self.output_dir)
        self.metrics = MetricsLog(os.path.join(self.output_dir, "metrics.jsonl"), self.is_main, kept)
        self.evaluator = Evaluator(job, self.output_dir)
        if self.is_main:
            with open(os.path.join(self.output_dir, "job.json"), "w") as f:
                json.dump(self.cfg, f, indent=1, default=str)

    def _build_averager(self):
        cfg = dict(self.cfg["averaging"])
        if cfg.get("type", "none") == "none":
            return None
        from mtl.train.averaging import build_averager

        return build_averager(cfg, self.job.model, source=self.cfg["source"])

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
    def sync_gradients(self):
        """SUM all-reduce of every replicated parameter's gradient, fused into one flat buffer."""
        if self.world <= 1:
            return
        grads = [p.grad for p in self.replicated if p.grad is not None]
        if not grads:
            return
        flat = paddle.concat([g.reshape([-1]).astype("float32") for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            n = int(np.prod(g.shape))
            g.set_value(flat[offset:offset + n].reshape(g.shape).astype(g.dtype))
            offset += n

    @paddle.no_grad()
    def sync_statistics(self):
        """Average the backbone's running statistics over ranks (before evaluating or saving).

        Without synchronised BatchNorm each rank's running mean and variance follow its own rows; evaluation (every
        rank embeds the eval split for the model-parallel heads), checkpoints (rank 0 saves the backbone) and export
        must all see one set, the same on every rank: their mean over ranks.
        """
        if self.world <= 1 or not self.statistics:
            return
        flat = paddle.concat([t.reshape([-1]).astype("float32") for t in self.statistics])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat / self.world
        offset = 0
        for t in self.statistics:
            n = int(t.numel())
            t.set_value(flat[offset:offset + n].reshape(t.shape).astype(t.dtype))
            offset += n

    def train_step(self, batch, step=None):
        """Forward, backward, gradient sync, clip, optimizer step; returns ``{task: HeadOutput}`` and the total."""
        if step is not None:
            for task in batch:
                self.job.model.heads[task].set_step(step)
        total, outputs = self.job.model(batch)
        self.job.model.backward()
        self.sync_gradients()
        clip = self.cfg["optimizer"]["clip_norm"]
        heads = [self.job.model.heads[t] for t in batch]
        own = [g for h in heads for g in h.own_gradients()]
        self.last_grad_norm = clip_grad_global_norm(self.replicated, self.sharded + own, clip) if clip else None
        lr = self.optimizer.get_lr()
        self.optimizer.step()
        for head in heads:
            head.apply_own_updates(lr, self.cfg["optimizer"])
        self.optimizer.clear_grad(set_to_zero=False)
        self.lr.step()
        if self.averager is not None:
            self.averager.step()
        return total, outputs

    def _to_tensors(self, batch):
        return {t: {k: paddle.to_tensor(v) for k, v in sub.items()} for t, sub in batch.items()}

    def _check_first(self, batch, seen):
        if not self.cfg["data"]["check_batches"]:
            return
        for task in batch:
            if task in seen:
                continue
            seen.add(task)
            t = self.job.task(task)
            fields = self.job.backbone.input_fields() + t.head.fields()
            reader = t.cfg["reader"]["type"] if isinstance(t.cfg["reader"], dict) else t.cfg["reader"]
            check_batch(task, f"reader '{reader}'", fields, batch[task])

    # ---- the loop ----------------------------------------------------------------------------------------------
    def run(self, until=None):
        """Train from ``start_step`` to ``steps`` (or stop after step ``until``, as a pre-empted job would);
        evaluate, save and summarise; return the summary dict."""
        job = self.job
        readers = {t.name: t.reader for t in job.tasks}
        end = self.steps if until is None else min(self.steps, int(until))
        ranges = {t.name: (t.head.label_field, int(t.head.num_classes)) for t in job.tasks
                  if getattr(t.head, "num_classes", None) and t.head.fields()[0].dtype == "int64"}
        dataset = StepDataset(job.schedule, readers, self.cfg["seed"], self.start_step, end, self.world, self.rank,
                              ranges)
        loader = make_loader(dataset, self.cfg["data"]["num_workers"])
        job.model.train()
        progress = self._progress()
        pending, seen = [], set()
        window_start, window_samples = time.time(), 0
        started = time.time()
        step = self.start_step
        for batch in loader:
            self._stop_on_data_error(batch)
            self._check_first(batch, seen)
            lr = self.optimizer.get_lr()
            total, outputs = self.train_step(self._to_tensors(batch), step)
            step += 1
            pending.append((step, lr, self.last_grad_norm, {t: o.global_loss.detach() for t, o in outputs.items()},
                            {t: {k: v for k, v in o.metrics.items()} for t, o in outputs.items()}))
            window_samples += self.cfg["schedule"]["batch_size"]
            # a checkpoint or an evaluation first writes out every pending record, so a resumed run misses none
            if self.should_log(step) or (pending and (self.should_save(step) or self.should_eval(step))):
                elapsed = max(time.time() - window_start, 1e-9)
                self._flush(pending, window_samples / elapsed, progress)
                pending, window_start, window_samples = [], time.time(), 0
            if progress is not None:
                progress.update(1)
            if self.should_eval(step):
                self._evaluate(step)
            if self.should_save(step):
                self._save(step)
        if pending:  # a run stopped early (--until) between two log steps
            self._flush(pending, window_samples / max(time.time() - window_start, 1e-9), progress)
        if progress is not None:
            progress.close()
        if step == self.start_step and self.start_step == self.steps and self.is_main:
            self.console(f"nothing to train: the checkpoint is already at step {self.steps}")
        return self.finish(time.time() - started, step)

    def _stop_on_data_error(self, batch):
        """Raise the user error a batch carries, on every rank at once (one tiny all-reduce per step at world > 1)."""
        text = error_text(batch)
        if text and self.world > 1:
            kind, message = text.split("\n", 1)
            text = f"{kind}\nrank {self.rank} met: {message}"
        text = distributed.first_error(text) if self.world > 1 else text
        if text:
            raise_error_text(text)

    def _progress(self):
        if not (self.is_main and self.cfg["log"]["progress"]):
            return None
        from tqdm import tqdm

        return tqdm(total=self.steps, initial=self.start_step, desc="train", dynamic_ncols=True)

    def _flush(self, pending, samples_per_s, progress):
        last = None
        for step, lr, grad_norm, losses, metrics in pending:
            record = {"step": step, "lr": float(lr)}
            if grad_norm is not None:
                record["grad_norm"] = grad_norm  # global norm before clipping
            record["loss"] = float(sum(self.job.model.loss_weights[t] * float(v) for t, v in losses.items()))
            for t, v in losses.items():
                record[f"loss/{t}"] = float(v)
            for t, ms in metrics.items():
                for k, v in ms.items():
                    record[f"{k}/{t}"] = float(v)
            record["samples_per_s"] = round(samples_per_s, 2)
            self.metrics.write(record)
            log.info(json.dumps(record))
            last = record
        if progress is not None and last is not None:
            progress.set_postfix({k.split("/", 1)[1]: f"{v:.3f}" for k, v in last.items()
                                  if k.startswith("loss/")}, refresh=False)

    def _evaluate(self, step):
        self.sync_statistics()
        ctx = self.averager.apply() if self.averager is not None else contextlib.nullcontext()
        with ctx:
            self.sync_statistics()  # averaged statistics (average_batchnorm: true) are per rank too
            results = self.evaluator.evaluate()
        record = {"step": step, "eval": results, "averaged": self.averager is not None}
        self.metrics.write(_eval_record(step, results, "eval_averaged" if self.averager is not None else "eval"))
        if self.is_main:
            with open(os.path.join(self.output_dir, "eval.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
        log.info("eval %s", json.dumps(record))
        return results

    def _save(self, step):
        self.sync_statistics()
        checkpoint.save(self.output_dir, step, self.job.model, self.optimizer, self.job.schedule, self.averager,
                        keep=self.cfg["checkpoint"]["keep"], sync=self.sync_statistics)

    def finish(self, seconds, step=None):
        """Final evaluation (live and averaged weights), ``summary.json``, the table and the loss plot."""
        step = self.steps if step is None else step
        self.sync_statistics()
        live = self.evaluator.evaluate()
        averaged = None
        if self.averager is not None:
            with self.averager.apply():
                self.sync_statistics()
                averaged = self.evaluator.evaluate()
        final = _eval_record(step, live, "eval")
        final["final"] = True  # a run continued later drops this record (mtl.train.rundir.keep_until)
        final.update(_eval_record(step, averaged or {}, "eval_averaged"))
        self.metrics.write(final)
        records = [r for r in self.metrics.records if "loss" in r]
        tasks = {}
        for t in self.job.tasks:
            losses = [r[f"loss/{t.name}"] for r in records if f"loss/{t.name}" in r]
            head_type = t.cfg["head"]["type"] if isinstance(t.cfg["head"], dict) else t.cfg["head"]
            tasks[t.name] = {
                "head": head_type,
                "loss_start": _mean(losses[:max(1, len(losses) // 10)]) if losses else None,
                "loss_end": _mean(losses[-max(1, len(losses) // 10):]) if losses else None,
                "eval": live.get(t.name),
                "eval_averaged": (averaged or {}).get(t.name),
                "primary_metric": t.head.primary_metric,
            }
            if hasattr(t.reader, "bad_samples"):  # readers with on_bad_sample: skip count what they skipped
                tasks[t.name]["bad_samples"] = int(t.reader.bad_samples)
        summary = {"steps": step, "world_size": self.world, "seconds": round(seconds, 2),
                   "resumed_from": self.resumed_from, "tasks": tasks}
        if self.is_main:
            with open(os.path.join(self.output_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            if self.cfg["log"]["plot"] and records:
                plot_losses(records, [t.name for t in self.job.tasks], os.path.join(self.output_dir,
                                                                                    "loss_curves.png"))
            self.console("\n" + metrics_table(tasks))
            self.console("(loss start / end: mean over the first / last tenth of the logged steps; * primary metric)")
            self.console(f"\nresults in {self.output_dir} (metrics.jsonl, summary.json, loss_curves.png)")
        return summary


def _eval_record(step, results, prefix):
    """A metrics.jsonl record of evaluation results: ``{"step", "<prefix>/<task>/<metric>": value}``."""
    record = {"step": step}
    for task, metrics in results.items():
        for name, value in metrics.items():
            record[f"{prefix}/{task}/{name}"] = value
    return record


def _mean(values):
    return float(np.mean(values)) if values else None
