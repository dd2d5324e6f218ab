"""One step's backward under a task-weighting strategy (``weighting:`` in the job; :mod:`mtl.weighting`).

Exact under data + model parallelism (docs/architecture.md, "Task weighting across processes"):

* Loss-based strategies see the global task losses (equal on every rank), so every rank computes the same weights;
  the backward is the usual one with each task's loss multiplied by its weight (heads and backbone alike).
* Gradient-based strategies act on g_t, the gradient of task t's weighted loss w.r.t. the backbone (the replicated,
  shared parameters). Each rank holds only its rows' share, so every g_t is summed over ranks first (one fused
  ``T x |theta|`` all-reduce); every rank then combines the same numbers and applies the same update
  ``sum_t alpha_t g_t``. Heads keep their task gradient, scaled only where the strategy scales the task's loss.
* The representation variant (``uses_representation``, MGDA-UB) takes the Gram matrix of ``dL_t/dz`` instead (one
  all-reduce of T numbers) and runs the backbone backward once with the feature gradients scaled by ``alpha``.
* Strategies that need the per-task gradients themselves (``needs_gradient_matrix``: GradDrop, DB-MTL) get the same
  summed ``[T, P]`` matrix as float32 numpy and return the shared gradient ``[P]``, written as it is.

Gradient accumulation (``schedule.accumulate`` K, :class:`AccumulatedStep`): a step's losses are the means of its K
micro-batches' (equal-sized) losses, and each micro-batch is differentiated with its losses divided by K, so the
gradients summed over the micro-batches are the step's. Weights that do not depend on the step's losses (static,
RLW: ``Weighting.uses_losses``) are applied in every micro-batch's backward, with one gradient sync at the end.
Every other strategy needs the step's losses (or its per-task gradients) before anything is combined: each task's
backbone gradient is then summed apart over the micro-batches into the ``[T, P]`` buffer of the gradient-based path
(one backbone backward per task and micro-batch, one all-reduce at the end), and the step's weights or alpha combine
it after the last micro-batch: loss-based strategies ``sum_t (w_t / loss_weight_t) g_t``, Gram-based ones from its
Gram matrix, matrix-based ones from the matrix, MGDA-UB from the representation Gram summed over the micro-batches
(rows of different micro-batches never meet, so it is the step's).

The strategy's state goes into the checkpoint's ``state.json``; arrays of more than ``INLINE_ELEMENTS`` numbers
(DB-MTL's T x P moving average) as base64 of their float64 bytes, which restores them bit for bit at a third of
the size of a JSON list.
"""
import base64
from typing import Dict

import numpy as np
import paddle

INLINE_ELEMENTS = 4096  # arrays up to this size are JSON lists in state.json, larger ones base64


def _to_json(value):
    """A state value as JSON: small arrays as lists, large ones as ``{"base64", "dtype", "shape"}``."""
    if not isinstance(value, np.ndarray):
        return value
    if value.size <= INLINE_ELEMENTS:
        return value.tolist()
    data = np.ascontiguousarray(value)
    return {"base64": base64.b64encode(data.tobytes()).decode("ascii"), "dtype": str(data.dtype),
            "shape": list(data.shape)}


def _from_json(value):
    """Inverse of :func:`_to_json` (lists stay lists: the strategy converts them to its own dtype)."""
    if isinstance(value, dict) and "base64" in value:
        raw = base64.b64decode(value["base64"].encode("ascii"))
        return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
    return value


class TaskBalancer:
    """Applies the job's weighting strategy to every step's backward; its state goes into checkpoints."""

    def __init__(self, weighting, strategy, model):
        self.weighting = weighting
        self.strategy = strategy
        self.model = model
        self.tasks = list(model.heads.keys())
        self.static = np.array([model.loss_weights[t] for t in self.tasks], dtype=np.float64)

    def backward(self, outputs, losses: Dict[str, float], step: int, scale: float = 1.0) -> Dict[str, Dict[str, float]]:
        """Backward of the last forward with this step's weights; gradients summed over ranks where replicated.

        ``losses``: the global loss of every task present (host floats). ``scale`` (fp16 loss scaling) multiplies
        every loss; the caller divides the gradients by it afterwards.
        Returns ``{"weight": {task: w_t}, "alpha": {task: alpha_t}}`` (alpha only for gradient-based strategies)
        for the log.
        """
        present = np.array([t in outputs for t in self.tasks])
        losses = np.array([losses[t] if t in outputs else np.nan for t in self.tasks])
        weights = self.weighting.weights(losses, present, step)
        logged = {"weight": {t: float(w) for t, w, p in zip(self.tasks, weights, present) if p}}
        if not self.weighting.needs_gradients:
            self.model.backward({t: float(w) * scale for t, w in zip(self.tasks, weights)})
            self.strategy.reduce_gradients()
            return logged
        alpha = self._gradient_step(losses, present, weights, step, scale)
        if alpha is not None:
            logged["alpha"] = {t: float(a) for t, a, p in zip(self.tasks, alpha, present) if p}
        return logged

    def _gradient_step(self, losses, present, weights, step, scale):
        """Heads with the static weights (g_t = gradient of loss_weight_t L_t), rescaled to ``weights``; backbone
        with the strategy's combination of the global per-task gradients."""
        self.model.backward_heads({t: float(w) * scale for t, w in zip(self.tasks, self.static)})
        if self.weighting.uses_representation:
            gram = self.strategy.representation_gram(self.model.feature_gradients(), self.tasks) / scale ** 2
            alpha = self._combine(gram, losses, present, step)
            self.model.backward_backbone({t: float(a) for t, a in zip(self.tasks, alpha)})
            self._rescale_heads(weights, present)
            self.strategy.reduce_gradients()
            return alpha
        task_grads = self.strategy.task_gradients(self.model, self.tasks)
        self._rescale_heads(weights, present)  # after the backbone passes: the architecture's task layers too
        if self.weighting.needs_gradient_matrix:
            return self._matrix_step(task_grads, losses, present, step, scale)
        gram = paddle.matmul(task_grads, task_grads, transpose_y=True).numpy().astype(np.float64) / scale ** 2
        alpha = self._combine(gram, losses, present, step)
        self.strategy.set_shared_gradient(self.model, task_grads, alpha)
        self.strategy.reduce_gradients_except(self.strategy.shared_parameters(self.model))
        return alpha

    def _combine(self, gram, losses, present, step):
        """The strategy's alpha; NaN (the strategy untouched) when the Gram matrix is not finite, so that the
        non-finite gradient reaches the trainer's guard (skip or stop, fp16: lower the loss scale)."""
        if not np.all(np.isfinite(gram)):
            return np.full(len(self.tasks), np.nan)
        return self.weighting.combine(gram, losses, present, step)

    def _matrix_step(self, task_grads, losses, present, step, scale):
        """The strategy combines the per-task gradient matrix itself (unscaled float32 numpy, equal on every rank);
        its shared gradient is written back at the loss scale the caller divides out. No alpha to log: None."""
        matrix = task_grads.numpy()
        if scale != 1.0:
            matrix = matrix / np.float32(scale)
        combined = self.weighting.combine_matrix(matrix, losses, present, step)
        self.strategy.set_shared_vector(self.model, np.asarray(combined, dtype=np.float64) * scale)
        self.strategy.reduce_gradients_except(self.strategy.shared_parameters(self.model))
        return None

    @paddle.no_grad()
    def _rescale_heads(self, weights, present):
        """Scale each task's own gradients (its head's, its architecture layers': ``JointModel.task_parameters``) by
        ``w_t / loss_weight_t`` where the strategy changes a task's weight."""
        for task, w, static, here in zip(self.tasks, weights, self.static, present):
            if not here or w == static:
                continue
            factor = float(w / static) if static else 0.0
            head = self.model.heads[task]
            tensors = [p.grad for p in self.model.task_parameters(task) if p.grad is not None]
            tensors += [row.rows.grad for row in head.row_gradients() if row.rows.grad is not None]
            for grad in tensors:
                grad.scale_(factor)

    def accumulated(self, present, step: int, scale: float, accumulate: int) -> "AccumulatedStep":
        """The backward of a step read as ``accumulate`` micro-batches of the tasks ``present``."""
        return AccumulatedStep(self, present, step, scale, accumulate)

    def state_dict(self) -> dict:
        """The strategy's state as JSON-able values (equal on every rank; stored in the checkpoint's state.json)."""
        return {k: _to_json(v) for k, v in self.weighting.state_dict().items()}

    def set_state_dict(self, state: dict):
        """Restore :meth:`state_dict` output."""
        self.weighting.set_state_dict({k: _from_json(v) for k, v in state.items()})

    def snapshot(self) -> dict:
        """A copy of the strategy's state (numpy, not JSON) to :meth:`restore` if this step is not applied."""
        return self.weighting.state_dict()

    def restore(self, snapshot: dict):
        """Put back a :meth:`snapshot` (a step whose gradient was not finite must not move the strategy)."""
        self.weighting.set_state_dict(snapshot)


class AccumulatedStep:
    """The backward of one optimizer step read as ``accumulate`` micro-batches (module docstring)."""

    def __init__(self, balancer: TaskBalancer, present, step: int, scale: float, accumulate: int):
        self.balancer, self.step, self.scale, self.accumulate = balancer, int(step), float(scale), int(accumulate)
        self.present = np.array([t in present for t in balancer.tasks])
        self.weights = None  # weights applied per micro-batch (the strategy does not use the step's losses)
        weighting = balancer.weighting
        if not weighting.needs_gradients and not weighting.uses_losses:
            self.weights = weighting.weights(np.zeros(len(balancer.tasks)), self.present, self.step)
        self.buffer, self.gram = None, None

    def backward(self):
        """The backward of the last micro-batch's forward, its losses divided by the micro-batch count."""
        balancer, model = self.balancer, self.balancer.model
        per = self.scale / self.accumulate
        if self.weights is not None:
            model.backward({t: float(w) * per for t, w in zip(balancer.tasks, self.weights)})
            return
        model.backward_heads({t: float(w) * per for t, w in zip(balancer.tasks, balancer.static)})
        if balancer.weighting.uses_representation:
            gram = balancer.strategy.representation_gram(model.feature_gradients(), balancer.tasks)
            self.gram = gram if self.gram is None else self.gram + gram
        self.buffer = balancer.strategy.task_gradients(model, balancer.tasks, self.buffer, reduce=False)

    def finish(self, losses: Dict[str, float]) -> Dict[str, Dict[str, float]]:
        """After the last micro-batch: the step's weights from its losses (the means over the micro-batches), the
        shared gradient they combine, the gradient sync. Returns what :meth:`TaskBalancer.backward` returns."""
        balancer = self.balancer
        if self.weights is not None:
            balancer.strategy.reduce_gradients()
            return {"weight": {t: float(w) for t, w, p in zip(balancer.tasks, self.weights, self.present) if p}}
        values = np.array([losses[t] if p else np.nan for t, p in zip(balancer.tasks, self.present)])
        weights = balancer.weighting.weights(values, self.present, self.step)
        logged = {"weight": {t: float(w) for t, w, p in zip(balancer.tasks, weights, self.present) if p}}
        balancer._rescale_heads(weights, self.present)
        strategy, model = balancer.strategy, balancer.model
        strategy.reduce_task_gradients(self.buffer)
        alpha = self._alpha(values, weights)
        if alpha is not None:
            if balancer.weighting.needs_gradients:
                logged["alpha"] = {t: float(a) for t, a, p in zip(balancer.tasks, alpha, self.present) if p}
            strategy.set_shared_gradient(model, self.buffer, alpha)
            strategy.reduce_gradients_except(strategy.shared_parameters(model))
        return logged

    def _alpha(self, losses, weights):
        """The combination of the summed per-task gradients: ``w_t / loss_weight_t`` for a loss-based strategy, the
        strategy's alpha for a gradient-based one; None when a matrix-based strategy has written it already."""
        balancer, weighting = self.balancer, self.balancer.weighting
        if not weighting.needs_gradients:
            static = balancer.static
            return np.where(static > 0, weights / np.where(static > 0, static, 1.0), 0.0)
        if weighting.uses_representation:
            return balancer._combine(self.gram / self.scale ** 2, losses, self.present, self.step)
        if weighting.needs_gradient_matrix:
            return balancer._matrix_step(self.buffer, losses, self.present, self.step, self.scale)
        gram = paddle.matmul(self.buffer, self.buffer, transpose_y=True).numpy().astype(np.float64)
        return balancer._combine(gram / self.scale ** 2, losses, self.present, self.step)
