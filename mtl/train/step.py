"""One optimizer step of the joint model, and the typed value it returns.

:class:`OptimizerStep` runs what a step is: the joint forward (``schedule.accumulate`` K micro-batches), the
weighted backward (:mod:`mtl.train.balancing`), the loss-scale, the global gradient norm (non-finite: nothing is
applied and the weighting's state is put back), clipping, the optimizer update and the averager. Everything it
decides travels in one :class:`StepResult`: what the loop logs, whether the update was applied, and why not.
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import paddle

from mtl.core.arrays import host_floats, tensor_from
from mtl.train.guard import NonFiniteGuard
from mtl.train.loop import StepMeans
from mtl.train.model import micro_batches


@dataclass
class StepResult:
    """What one training step produced.

    ``outputs``: ``{task: HeadOutput}`` (for an accumulated step, the means over its micro-batches); ``losses``: the
    global task losses as floats (equal on every rank); ``weights``: ``{"weight": {task: w_t}}`` as applied (plus
    ``"alpha"`` for gradient-based strategies; empty when the step stopped at a non-finite loss); ``grad_norm``: the
    global norm before clipping (None when no backward ran); ``nonfinite``: what was not finite (task names or
    ``"gradient"``; empty when applied); ``overflow``: fp16 only, the step was skipped and the scale lowered;
    ``loss_scale``: the fp16 scale after the step (None without loss scaling).
    """

    outputs: Dict[str, object]
    losses: Dict[str, float]
    weights: Dict[str, Dict[str, float]] = field(default_factory=lambda: {"weight": {}})
    grad_norm: Optional[float] = None
    nonfinite: List[str] = field(default_factory=list)
    overflow: bool = False
    loss_scale: Optional[float] = None

    @property
    def applied(self) -> bool:
        """True when the update was applied (every loss and the gradient norm finite, no fp16 overflow)."""
        return not self.nonfinite and not self.overflow

    def total(self, loss_weights: Dict[str, float]) -> float:
        """sum_t w_t L_t with the weights applied (the static ``loss_weights`` for tasks without one)."""
        weights = self.weights.get("weight", {})
        return float(sum(weights.get(t, loss_weights[t]) * v for t, v in self.losses.items()))


class OptimizerStep:
    """One optimizer step: ``step(batch, step)`` -> :class:`StepResult` (module docstring)."""

    def __init__(self, model, balancer, strategy, optimizer, averager=None, scaler=None, clip_norm=None,
                 accumulate: int = 1):
        self.model, self.balancer, self.strategy, self.optimizer = model, balancer, strategy, optimizer
        self.averager, self.scaler, self.clip_norm, self.accumulate = averager, scaler, clip_norm, int(accumulate)

    @property
    def scale(self) -> float:
        """The fp16 loss scale (1 without loss scaling)."""
        return self.scaler.scale if self.scaler is not None else 1.0

    def __call__(self, batch, step: int) -> StepResult:
        """Train on ``batch`` (this rank's rows of step ``step``, 0-based) and return what happened."""
        self.optimizer.rows.clear()  # nothing of a step that ended in an error reaches this one
        self.model.prepare_step(batch, step, self.accumulate)
        if self.accumulate > 1:
            return self._accumulated(batch, step)
        forward = self.model(batch, step=step)
        outputs = forward.outputs
        self.optimizer.add_rows(forward.rows())  # their gradients: filled by the backward
        losses = _losses(outputs)  # global: equal on every rank; one host read for every task
        bad = NonFiniteGuard.bad_losses(losses)
        if bad:  # global losses: every rank skips the backward (and its collectives) alike
            self.optimizer.discard()
            return StepResult(outputs, losses, nonfinite=bad, loss_scale=self._scale_after())
        snapshot = self.balancer.snapshot()
        weights = self.balancer.backward(forward, losses, step, self.scale)
        return self._apply(StepResult(outputs, losses, weights), snapshot)

    def _accumulated(self, batch, step: int) -> StepResult:
        """One optimizer step read as ``accumulate`` micro-batches (``mtl.train.balancing.AccumulatedStep``): each
        micro-batch's forward and backward (gradients add up; heads that sample prepare for the whole step), then
        the step's weighting, the loss-scale, non-finite and clipping decisions and the update, once. The result's
        outputs and losses are the means over the micro-batches (a step stopped at a non-finite loss: over those
        run)."""
        snapshot = self.balancer.snapshot()
        plan = self.balancer.accumulated(list(batch), step, self.scale, self.accumulate)
        sums = StepMeans()
        for part in micro_batches(batch, self.accumulate):
            forward = self.model(part, step=step)
            outputs = forward.outputs
            losses = _losses(outputs)
            sums.add(outputs, losses)
            bad = NonFiniteGuard.bad_losses(losses)
            if bad:  # every rank alike: the rest of the step is not run, nothing is applied
                self.optimizer.discard()
                return StepResult(sums.outputs(), sums.mean_losses(), nonfinite=bad, loss_scale=self._scale_after())
            plan.backward(forward)
            self.optimizer.add_rows(forward.rows(), summed=True)  # the step's sum (the buffer is reused)
            del forward  # its features and leaves: not alive during the next micro-batch's forward
        losses = sums.mean_losses()  # the floats the means hold: no host read
        return self._apply(StepResult(sums.outputs(), losses, plan.finish(losses)), snapshot)

    def _apply(self, result: StepResult, snapshot) -> StepResult:
        """After the backward: unscale, the global norm (non-finite: the guard or an fp16 overflow, the weighting's
        state put back), clip, the optimizer step and the averager. The step hooks settle first: their rows join
        the heads' in the optimizer's one merge."""
        for hook in self.model.step_hooks:
            self.optimizer.add_rows(hook.settle())
        rows = self.optimizer.rows.merged()
        if self.scale != 1.0:
            self.strategy.unscale_gradients(1.0 / self.scale, rows)
        result.grad_norm = self.strategy.grad_norm(rows)  # global: every rank decides alike
        if not math.isfinite(result.grad_norm):
            self.balancer.restore(snapshot)
            self.optimizer.discard()
            result.overflow = self.scaler is not None and self.scaler.overflow()
            result.nonfinite = [] if result.overflow else ["gradient"]
            result.loss_scale = self._scale_after()
            return result
        if self.scaler is not None:
            self.scaler.good_step()
        self.strategy.clip_gradients(self.clip_norm, result.grad_norm, rows)
        self.optimizer.step()
        if self.averager is not None:
            self.averager.step()
        result.loss_scale = self._scale_after()
        return result

    def _scale_after(self):
        return self.scaler.scale if self.scaler is not None else None


def _losses(outputs) -> Dict[str, float]:
    """The global losses of ``{task: HeadOutput}`` as floats, in one host read."""
    return dict(zip(outputs, host_floats(o.global_loss for o in outputs.values())))


def as_tensors(batch):
    """A step batch as tensors (the DataLoader already yields tensors; numpy arrays, e.g. from tests and benchmarks,
    are wrapped)."""
    return {t: {k: v if isinstance(v, paddle.Tensor) else tensor_from(v) for k, v in sub.items()}
            for t, sub in batch.items()}
