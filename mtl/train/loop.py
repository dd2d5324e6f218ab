"""Small state objects of the training loop: a step's record, the loop's pending records and throughput; the step
batches with the activity the watchdog reads; how a stopped loop is logged."""
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Dict

import numpy as np
import paddle

from mtl.core import activity
from mtl.core.arrays import host_floats, tensor_from
from mtl.core.errors import MtlError
from mtl.train.preemption import Preempted

log = logging.getLogger("mtl")


@dataclass
class StepRecord:
    """What one training step leaves for the log: its number (1-based), learning rate and result; ``metrics``: the
    heads' metric tensors, read to the host for many steps at once when the log is written."""

    step: int
    lr: float
    result: object  # mtl.train.step.StepResult
    metrics: Dict[str, Dict[str, object]] = field(default_factory=dict)

    def __post_init__(self):
        if not self.metrics:
            self.metrics = {t: dict(o.metrics) for t, o in self.result.outputs.items()}

    def as_json(self, loss_weights, samples_per_s: float) -> dict:
        """The ``metrics.jsonl`` record of the step (its metrics read to floats: :func:`read_records`)."""
        result = self.result
        record = {"step": self.step, "lr": float(self.lr)}
        if result.grad_norm is not None:
            record["grad_norm"] = result.grad_norm  # global norm before clipping
        record["loss"] = result.total(loss_weights)  # a skipped step: the static weights
        record.update({f"loss/{t}": v for t, v in result.losses.items()})
        record.update({f"{kind}/{t}": v for kind, values in result.weights.items() for t, v in values.items()})
        record.update({f"{k}/{t}": float(v) for t, ms in self.metrics.items() for k, v in ms.items()})
        record["samples_per_s"] = round(samples_per_s, 2)
        if result.loss_scale is not None:
            record["loss_scale"] = result.loss_scale
        if result.overflow:
            record["overflow"] = True  # fp16 overflow: not applied, scale lowered
        if result.nonfinite:
            record["nonfinite"] = True  # not applied (on_nonfinite); non-finite values are written as null
        return record


class StepMeans:
    """The losses and metrics of an accumulated step: sums over its micro-batches, then their means (the micro-batches
    of a task are equal-sized, so the mean of their means is the mean over the step's batch)."""

    def __init__(self):
        self.count, self.losses, self.metrics = 0, {}, {}

    def add(self, outputs, losses):
        """One micro-batch's ``{task: HeadOutput}`` and global losses."""
        self.count += 1
        for task, out in outputs.items():
            self.losses[task] = self.losses.get(task, 0.0) + losses[task]
            sums = self.metrics.setdefault(task, {})
            for name, value in out.metrics.items():  # summed where they are (float64): no host read per micro-batch
                value = value.detach().astype("float64") if isinstance(value, paddle.Tensor) else \
                    tensor_from(float(value), dtype="float64")
                sums[name] = value if name not in sums else sums[name] + value

    def mean_losses(self) -> Dict[str, float]:
        """``{task: mean loss}`` as the float32 values :meth:`outputs` holds (no host read)."""
        return {task: float(np.float32(loss / self.count)) for task, loss in self.losses.items()}

    def outputs(self):
        """``{task: HeadOutput}`` of the means (float32 tensors, as a head's outputs are)."""
        from mtl.headkit.base import HeadOutput

        def mean(value):
            if isinstance(value, paddle.Tensor):  # a true division, as of the floats before (not x * (1 / K))
                return paddle.divide(value, paddle.full([], self.count, dtype="float64")).astype("float32")
            return tensor_from(value / self.count, dtype="float32")
        return {task: HeadOutput(loss=mean(loss), metrics={k: mean(v) for k, v in self.metrics[task].items()})
                for task, loss in self.losses.items()}


class AveragedWeights:
    """Swap in the averaged weights (when there is an averager) with BatchNorm statistics agreed by every rank;
    on exit the live weights and each rank's own statistics come back."""

    def __init__(self, averager, strategy):
        self.stack = contextlib.ExitStack()
        self.averager, self.strategy = averager, strategy

    def __enter__(self):
        if self.averager is not None:
            self.stack.enter_context(self.averager.apply())
        self.stack.enter_context(self.strategy.agreed_statistics())
        return self

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


class Loop:
    """State of one run of the loop: pending step records, tasks whose first batch was checked, throughput."""

    def __init__(self, progress):
        self.pending, self.seen, self.window, self.progress = [], set(), Window(), progress

    def close(self):
        """Close the progress bar (once)."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None


class Window:
    """Samples seen since the last flush, for the ``samples_per_s`` of the log records."""

    def __init__(self):
        self.start, self.samples = time.time(), 0

    def add(self, samples: int):
        self.samples += samples

    def rate(self) -> float:
        """Samples per second since the last call, and restart the window."""
        rate = self.samples / max(time.time() - self.start, 1e-9)
        self.start, self.samples = time.time(), 0
        return rate


def log_stop(exc, step):
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


def read_records(pending):
    """The metric tensors of every pending step record replaced by their floats, in one host read (the losses are
    floats already: the step reads them to decide whether it is finite)."""
    slots = [(metrics, k) for item in pending for metrics in item.metrics.values() for k in metrics]
    for (table, key), value in zip(slots, host_floats(table[key] for table, key in slots)):
        table[key] = value


TRAINING = "training (forward, backward and update)"


def timed_steps(loader, start_step: int, board=None, current=None):
    """The loader's step batches, the training thread's activity (:mod:`mtl.core.activity`) told where it is: reading
    the data of a step (which sample and file: ``board``, :class:`mtl.data.reading.ReadingBoard`), then training
    on it. The run's first step is a long wait (start-up, first reads and compilations)."""
    current = current or activity.CURRENT
    iterator, step = iter(loader), start_step
    while True:
        detail = functools.partial(board.describe, step) if board is not None else None
        current.begin_step(step + 1, "reading data", detail, first=step == start_step)
        try:
            batch = next(iterator)
        except StopIteration:
            return
        current.set(TRAINING)
        yield batch
        step += 1
