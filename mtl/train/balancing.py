"""The weighting step: everything about task weights in one step's backward (``weighting:`` in the job;
:mod:`mtl.weighting` holds the strategies). The parallel strategy is asked only to all-reduce.

Exact under data + model parallelism:

* Loss-based strategies see the global task losses (equal on every rank), so every rank computes the same weights;
  the backward is the usual one with each task's loss multiplied by its weight (heads and backbone alike).
* Gradient-based strategies act on g_t, the gradient of task t's weighted loss w.r.t. the shared parameters
  (``JointModel.shared_parameters``: the backbone's trainable ones). Each rank holds only its rows' share, so every
  g_t is summed over ranks first (one fused ``T x |theta|`` all-reduce); every rank then combines the same numbers
  and applies the same update ``sum_t alpha_t g_t``. Heads keep their task gradient, scaled only where the strategy
  scales the task's loss. The Gram matrix ``G_ij = g_i . g_j`` is formed in float64 (rows cast one pair at a time).
* The representation variant (``uses_representation``: MGDA-UB, IMTL-G's own) takes the Gram matrix of ``dL_t/dz``
  instead: every task scores its own rows, so it is diagonal, ``G_tt = sum over rows and ranks of ||dL_t/dz||^2``
  (float64, one all-reduce of T x T numbers), and the backbone backward runs once with the feature gradients scaled
  by ``alpha``. When every task reads the same samples (``schedule.same_rows``; a task whose reader alters its
  inputs keeps rows of its own and pairs with no other) row r of every task is the same input, z is the
  backbone's output (one pass, before the architecture's task layers), and the Gram matrix is Sener and Koltun's,
  ``G_ij = sum over rows and ranks of dL_i/dz_r . dL_j/dz_r`` (their Eq. 10: the gradients of the one shared
  representation of each input).
* Strategies that need the per-task gradients themselves (``needs_gradient_matrix``: GradDrop, DB-MTL) get the same
  summed ``[T, P]`` matrix as float32 numpy and return the shared gradient ``[P]``, written as it is.

Gradient accumulation (``schedule.accumulate`` K, :class:`AccumulatedStep`): a step's losses are the means of its K
micro-batches' (equal-sized) losses, and each micro-batch is differentiated with its losses divided by K, so the
gradients summed over the micro-batches are the step's. Weights that do not depend on the step's losses (static,
RLW: ``Weighting.uses_losses``) are applied in every micro-batch's backward, with one gradient sync at the end.
Every other strategy needs the step's losses (or its per-task gradients) before anything is combined: each task's
backbone gradient is summed apart over the micro-batches into the ``[T, P]`` matrix (one backbone backward per task
and micro-batch, one all-reduce at the end), and the step's weights or alpha combine it after the last micro-batch:
loss-based strategies ``sum_t (w_t / loss_weight_t) g_t``, Gram-based ones from its Gram matrix, matrix-based ones
from the matrix, the representation variants from the representation Gram summed over the micro-batches (rows of
different micro-batches never meet, so it is the step's). A head whose output layer is the backbone's input
embeddings (masked LM) gives them a gradient of its own in the heads' backward; the per-task paths keep it apart
(``JointModel.backward_heads(apart=True)``) and hand it to its task's share.

The strategy's state goes into the checkpoint's ``state.json``; arrays of more than ``INLINE_ELEMENTS`` numbers
(DB-MTL's T x P moving average) as base64 of their float64 bytes, which restores them bit for bit at a third of
the size of a JSON list.
"""
import base64
import math
from typing import Dict

import numpy as np
import paddle

from mtl.core.arrays import tensor_from

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


# ---- per-task gradients of the shared parameters ---------------------------------------------------------------
def task_gradient_matrix(model, heads, tasks, buffer=None):
    """``[T, P]`` float32: row t += the gradient of task t's weighted loss w.r.t. ``model.shared_parameters()``
    (this rank's rows only; sum over ranks afterwards) from the heads' backward ``heads``
    (:class:`mtl.train.model.HeadGradients`). Runs the backbone backward once per task present
    (``JointModel.backward_backbone_per_task``) and clears the shared gradients after each; rows of absent tasks
    stay as they were. Memory: T copies of the shared gradient (``bench/bench_weighting.py``)."""
    params = model.shared_parameters()
    sizes = [math.prod(p.shape) for p in params]
    if buffer is None:
        buffer = paddle.zeros([len(tasks), sum(sizes)], dtype="float32")
    for task in model.backward_backbone_per_task(heads):
        grads = [p.grad.reshape([-1]).astype("float32") if p.grad is not None else paddle.zeros([n])
                 for p, n in zip(params, sizes)]
        row = tasks.index(task)
        buffer[row] = buffer[row] + paddle.concat(grads)
        for p in params:
            p.clear_gradient(set_to_zero=False)
    return buffer


@paddle.no_grad()
def write_shared_gradient(model, vector):
    """Write the flat shared gradient ``vector`` [P] (a tensor or a numpy array, in the parameter order of
    :func:`task_gradient_matrix`) into the shared parameters' gradients."""
    if not isinstance(vector, paddle.Tensor):
        vector = tensor_from(vector, dtype=np.float32)
    offset = 0
    for p in model.shared_parameters():
        n = math.prod(p.shape)
        p.grad = vector[offset:offset + n].reshape(p.shape).astype(p.dtype)
        offset += n


@paddle.no_grad()
def gram_float64(matrix) -> np.ndarray:
    """``G_ij = g_i . g_j`` of the rows of ``matrix`` [T, P] in float64: each pair of rows cast to float64 on its
    device (at most two rows of P float64 at a time, not the whole matrix), read to the host once."""
    rows = int(matrix.shape[0])
    dots = []
    for i in range(rows):
        left = matrix[i].astype("float64")
        dots += [paddle.dot(left, left if j == i else matrix[j].astype("float64")) for j in range(i + 1)]
    values = paddle.stack(dots).numpy() if dots else np.zeros(0)
    gram = np.zeros((rows, rows), dtype=np.float64)
    gram[np.tril_indices(rows)] = values
    return gram + np.tril(gram, -1).T


@paddle.no_grad()
def representation_gram(feature_grads, tasks, paired=None) -> paddle.Tensor:
    """``[T, T]`` float64, this rank's rows: the diagonal ``sum over rows ||dL_t/dz||^2`` of every task (0 for absent
    tasks), and between two tasks of ``paired`` (``{task: the backbone output its head reads}`` of the tasks whose
    row r is the same input: ``schedule.same_rows``) that read the same output every ``sum over rows dL_i/dz_r .
    dL_j/dz_r``. Two that read different outputs (a tagger the word vectors, a classifier the pooled one) meet at 0:
    z is the backbone's whole output, and each one's gradient is zero on the other's part. A task outside ``paired``
    (rows of its own) pairs with no other.
    """
    paired = paired or {}
    gram = paddle.zeros([len(tasks), len(tasks)], dtype="float64")
    flat = {t: g.astype("float64").reshape([g.shape[0], -1]) for t, g in feature_grads.items()}
    for task, grad in flat.items():
        i = tasks.index(task)
        partners = [t for t in flat if t in paired and paired[t] == paired[task]] if task in paired else [task]
        for other in partners:
            if list(flat[other].shape) != list(grad.shape):
                raise ValueError(f"the features of tasks '{task}' and '{other}' differ in shape ({grad.shape}, "
                                 f"{flat[other].shape}): their rows cannot be paired")
            gram[i, tasks.index(other)] = paddle.sum(grad * flat[other])
    return gram


class TaskBalancer:
    """The job's weighting strategy applied to every step's backward; its state goes into checkpoints."""

    def __init__(self, weighting, strategy, model, same_rows=(), rows=None):
        self.weighting = weighting
        self.strategy = strategy
        self.model = model
        self.rows = rows  # the step's row declarations (mtl.optimizer.sparse.StepRows, the optimizer's), rescaled alike
        self.same_rows = list(same_rows)  # the tasks whose row r is the same input (schedule.same_rows)
        self.pairing = {t: model.reads_output(t) for t in self.same_rows}  # representation Gram: who meets where
        self.tasks = list(model.heads.keys())
        self.static = np.array([model.loss_weights[t] for t in self.tasks], dtype=np.float64)

    def representation(self, heads):
        """The representation variants' per-task gradients from the heads' backward ``heads``: of each task's
        features (its own rows), or under ``same_rows`` of the backbone's output that every task shares (before any
        task layers: the rows pair there)."""
        return self.model.shared_gradients(heads) if self.same_rows else heads.grads

    def present(self, tasks) -> np.ndarray:
        """[T] bool: which of the job's tasks are in ``tasks``."""
        return np.array([t in tasks for t in self.tasks])

    def loss_vector(self, losses: Dict[str, float], present) -> np.ndarray:
        """[T] float64 of the present tasks' losses (NaN for absent ones)."""
        return np.array([losses[t] if p else np.nan for t, p in zip(self.tasks, present)])

    def logged(self, weights, present, alpha=None) -> Dict[str, Dict[str, float]]:
        """``{"weight": {task: w_t}, "alpha": {task: alpha_t}}`` of the present tasks, for the log."""
        out = {"weight": {t: float(w) for t, w, p in zip(self.tasks, weights, present) if p}}
        if alpha is not None:
            out["alpha"] = {t: float(a) for t, a, p in zip(self.tasks, alpha, present) if p}
        return out

    def scaled(self, weights, factor: float) -> Dict[str, float]:
        """``{task: w_t * factor}``: the multipliers of the heads' backward."""
        return {t: float(w) * factor for t, w in zip(self.tasks, weights)}

    def backward(self, forward, losses: Dict[str, float], step: int, scale: float = 1.0) -> Dict[str, Dict[str, float]]:
        """Backward of ``forward`` (a :class:`mtl.train.model.ForwardPass`) with this step's weights; gradients summed
        over ranks where replicated.

        ``losses``: the global loss of every task present (host floats). ``scale`` (fp16 loss scaling) multiplies
        every loss; the caller divides the gradients by it afterwards. Returns :meth:`logged`.
        """
        present = self.present(forward.outputs)
        values = self.loss_vector(losses, present)
        weights = self.weighting.weights(values, present, step)
        if not self.weighting.needs_gradients:
            self.model.backward(forward, self.scaled(weights, scale))
            self.strategy.reduce_gradients()
            return self.logged(weights, present)
        heads = self.model.backward_heads(forward, self.scaled(self.static, scale), apart=True)
        if self.weighting.uses_representation:
            gram = self.strategy.sum_over_ranks(representation_gram(self.representation(heads), self.tasks,
                                                                    self.pairing))
            alpha = self.combine(gram.numpy() / scale ** 2, values, present, step)
            self.model.backward_backbone(heads, {t: float(a) for t, a in zip(self.tasks, alpha)})
            self.rescale_heads(weights, present)
            self.strategy.reduce_gradients()
            return self.logged(weights, present, alpha)
        matrix = task_gradient_matrix(self.model, heads, self.tasks)
        self.rescale_heads(weights, present)  # after the backbone passes: the architecture's task layers too
        self.strategy.sum_over_ranks_(matrix)
        return self.logged(weights, present, self.apply(matrix, values, present, step, scale))

    def apply(self, matrix, losses, present, step, scale, weights=None):
        """The shared gradient from the summed per-task matrix [T, P] (gradient-based strategies: their alpha or
        their own combination; a loss-based one: ``weights / loss_weight``), written into the shared parameters,
        then the other replicated gradients summed over ranks. Returns the alpha to log (None: none)."""
        if self.weighting.needs_gradient_matrix:
            combined = self.weighting.combine_matrix(matrix.numpy() / np.float32(scale) if scale != 1.0 else
                                                     matrix.numpy(), losses, present, step)
            write_shared_gradient(self.model, np.asarray(combined, dtype=np.float64) * scale)
            alpha, logged = None, None
        else:
            if weights is not None:  # a loss-based strategy on an accumulated step
                alpha = np.where(self.static > 0, weights / np.where(self.static > 0, self.static, 1.0), 0.0)
                logged = None
            else:
                alpha = logged = self.combine(gram_float64(matrix) / scale ** 2, losses, present, step)
            write_shared_gradient(self.model, paddle.matmul(
                tensor_from(alpha, dtype="float32").unsqueeze(0), matrix).reshape([-1]))
        self.strategy.reduce_gradients_except(self.model.shared_parameters())
        return logged

    def combine(self, gram, losses, present, step):
        """The strategy's alpha; NaN (the strategy untouched) when the Gram matrix is not finite, so that the
        non-finite gradient reaches the trainer's guard (skip or stop, fp16: lower the loss scale)."""
        if not np.all(np.isfinite(gram)):
            return np.full(len(self.tasks), np.nan)
        return self.weighting.combine(gram, losses, present, step)

    @paddle.no_grad()
    def rescale_heads(self, weights, present):
        """Scale each task's own gradients (its head's, its architecture layers': ``JointModel.task_parameters``) by
        ``w_t / loss_weight_t`` where the strategy changes a task's weight, the rows its loss declared and what the
        step hooks hold of it alike."""
        for task, w, static, here in zip(self.tasks, weights, self.static, present):
            if not here or w == static:
                continue
            factor = float(w / static) if static else 0.0
            for grad in [p.grad for p in self.model.task_parameters(task) if p.grad is not None]:
                grad.scale_(factor)
            if self.rows is not None:
                self.rows.scale(task, factor)
            for hook in self.model.step_hooks:
                hook.rescale(task, factor)

    @paddle.no_grad()
    def scale_task_layers(self, alpha, present):
        """Scale each task's own architecture layers' gradients (towers, gates, adapters: below the point the
        representation Gram is taken at) by ``alpha_t``."""
        model = self.model
        for task, a, here in zip(self.tasks, alpha, present):
            if here:
                for grad in [p.grad for p in model.architecture.task_parameters(task, model.backbone)
                             if p.grad is not None]:
                    grad.scale_(float(a))

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
        self.present = balancer.present(present)
        self.weights = None  # weights applied per micro-batch (the strategy does not use the step's losses)
        weighting = balancer.weighting
        if not weighting.needs_gradients and not weighting.uses_losses:
            self.weights = weighting.weights(np.zeros(len(balancer.tasks)), self.present, self.step)
        self.matrix, self.gram = None, None

    def backward(self, forward):
        """The backward of a micro-batch's ``forward`` (a :class:`mtl.train.model.ForwardPass`), its losses divided
        by the micro-batch count."""
        balancer, model = self.balancer, self.balancer.model
        per = self.scale / self.accumulate
        if self.weights is not None:
            model.backward(forward, balancer.scaled(self.weights, per))
            return
        heads = model.backward_heads(forward, balancer.scaled(balancer.static, per), apart=True)
        if balancer.weighting.uses_representation:
            gram = representation_gram(balancer.representation(heads), balancer.tasks, balancer.pairing)
            self.gram = gram if self.gram is None else self.gram + gram
        self.matrix = task_gradient_matrix(model, heads, balancer.tasks, self.matrix)

    def finish(self, losses: Dict[str, float]) -> Dict[str, Dict[str, float]]:
        """After the last micro-batch: the step's weights from its losses (the means over the micro-batches), the
        shared gradient they combine, the gradient sync. Returns what :meth:`TaskBalancer.backward` returns."""
        balancer = self.balancer
        if self.weights is not None:
            balancer.strategy.reduce_gradients()
            return balancer.logged(self.weights, self.present)
        values = balancer.loss_vector(losses, self.present)
        weights = balancer.weighting.weights(values, self.present, self.step)
        balancer.rescale_heads(weights, self.present)
        balancer.strategy.sum_over_ranks_(self.matrix)
        if balancer.weighting.uses_representation:
            gram = balancer.strategy.sum_over_ranks(self.gram)
            alpha = balancer.combine(gram.numpy() / self.scale ** 2, values, self.present, self.step)
            write_shared_gradient(balancer.model, paddle.matmul(
                tensor_from(alpha, dtype="float32").unsqueeze(0), self.matrix).reshape([-1]))
            balancer.scale_task_layers(alpha, self.present)  # as the one backward with alpha scales them at K = 1
            balancer.strategy.reduce_gradients_except(balancer.model.shared_parameters())
            return balancer.logged(weights, self.present, alpha)
        loss_based = None if balancer.weighting.needs_gradients else weights
        alpha = balancer.apply(self.matrix, values, self.present, self.step, self.scale, loss_based)
        return balancer.logged(weights, self.present, alpha)
