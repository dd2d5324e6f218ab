"""Row-sparse optimizer update for heads that score only some rows of a parameter (Partial FC).

Paddle's optimizers update every row of a parameter that has a gradient, so a Partial FC head that let the optimizer
own its weight would (a) hold a dense [C_k, D] gradient and (b) keep moving rows that were not sampled, through their
momentum. Instead the head scores a detached copy of the sampled rows (its gradient is [K, D]) and declares them as
:class:`RowGradient` (PLSC's shape: the head says which rows it used, the optimizer owns the update). On those rows
only, :class:`RowSparseOptimizer` applies the update Paddle's ``Momentum`` (L2 ``weight_decay``) / ``SGD`` would:

    g' = g + weight_decay * w;   v = momentum * v + g';   w = w - lr * v        (SGD: momentum 0, no v kept)

or the one Paddle's ``AdamW`` would (decoupled ``weight_decay``), with every row counting its own steps c:

    c = c + 1;   w = w - lr * weight_decay * w;   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
    w = w - lr sqrt(1 - b2^c) / (1 - b1^c) * m / (sqrt(v) + eps sqrt(1 - b2^c))

Semantics of a row not sampled for n steps (both optimizers): nothing of it moves — no momentum or moment decay, no
weight decay, no update from its old momentum — and its Adam bias correction counts only the steps it was sampled
in. A row's trajectory is then exactly what the dense optimizer would do on the sub-sequence of steps that sampled
it (with those steps' learning rates), which is what the tests check. Why the row's own count: Adam's correction
1 / (1 - b^c) undoes the zero start of m and v, which for a row starts at its first sample, not at step 1; with the
global count (PLSC's plsc/optimizer/adamw.py: one ``state['step']`` per parameter; it also freezes unsampled
rows) a row first sampled at step t >> 1 / (1 - b2) moves by lr (1 - b1) / sqrt(1 - b2) = 3.2 lr per coordinate
(betas 0.9, 0.999) instead of Adam's first step of lr. arcface_torch
(PartialFC_V2 + torch.optim.AdamW) takes the dense road: ``weight[index]`` gives every row a gradient (zero when not
sampled), so every row's moments decay, every row keeps moving on its old moments and is weight-decayed each step.
"""
import numpy as np
import paddle

from mtl.core.arrays import host_view, on_host, tensor_from
from mtl.core.errors import ConfigError
from mtl.headkit.row_gradients import merge_rows

SPARSE_OPTIMIZERS = ("sgd", "momentum", "adamw")
ADAM_EPSILON = 1e-8  # Paddle's AdamW default (the dense optimizer of the job uses it too)


class StepRows:
    """The row declarations of one optimizer step (:class:`mtl.headkit.row_gradients.RowGradient`), as the optimizer
    takes them: ``add`` each micro-batch's (a step read as K > 1 micro-batches: ``summed``, each added in place into
    the earlier declaration of the same parameter, task and rows, which Partial FC's one sample per step gives every
    micro-batch; other rows are kept apart and merged as a union), then the step hooks' (``add`` after the
    weighting), ``scale`` a task's, and ``merged()`` once: one declaration per parameter
    (:func:`mtl.headkit.row_gradients.merge_rows`), what clipping, the norm and the update read. ``clear()`` drops the
    gradients it took: a declaration's gradient can be a view of a head's reused buffer, which nothing may hold
    after the step (the step's result keeps the heads' outputs)."""

    def __init__(self):
        self._rows, self._merged = [], None

    def add(self, rows, summed: bool = False):
        """Take ``rows``; ``summed``: a micro-batch's of an accumulated step, after its backward (its gradient is
        copied: the head reuses its buffer in the next micro-batch)."""
        for row in rows:
            first = self._same_rows(row) if summed else None
            if row.grad is None or first is None:
                if summed and row.grad is not None:
                    row.grad = row.grad.clone()
                self._rows.append(row)
            elif first.grad is None:
                first.grad = row.grad.clone()
            else:
                first.grad.add_(row.grad)
        self._merged = None

    def _same_rows(self, row):
        """The earlier declaration of ``row``'s parameter, task and rows (known on the host), or None."""
        if row.host_index is None:
            return None
        return next((r for r in self._rows if r.parameter is row.parameter and r.source == row.source
                     and r.host_index is not None and np.array_equal(r.host_index, row.host_index)), None)

    @paddle.no_grad()
    def scale(self, task: str, factor: float):
        """Multiply the gradient of every declaration of ``task``'s loss by ``factor`` (a weighting strategy)."""
        for row in self._rows:
            if row.source == task and row.grad is not None:
                row.grad.scale_(factor)
        self._merged = None

    def merged(self) -> list:
        """One declaration per parameter (computed once a step)."""
        if self._merged is None:
            self._merged = merge_rows(self._rows)
        return self._merged

    def clear(self):
        """The step is applied or dropped: the gradients taken are let go (module docstring of the class)."""
        for row in self._rows + (self._merged or []):
            row.grad = None
        self._rows, self._merged = [], None


UPDATE_CHUNK_ROWS = 1 << 13  # rows updated at a time: the update's temporaries stay [chunk, D], never [K, D]


@paddle.no_grad()
def row_sparse_momentum_(weight, velocity, index, grad, lr, momentum=0.9, weight_decay=0.0):
    """Update rows ``index`` of ``weight`` (and of ``velocity``, if given) in place from their gradient ``grad``.

    Works through ``UPDATE_CHUNK_ROWS`` rows at a time (gather, update, scatter back), so that at 20M classes with
    Partial FC the update allocates a bounded buffer instead of several copies of the sampled rows. CPU tensors are
    updated by the same float operations in numpy on their memory (Paddle's CPU gather/scatter are slower).
    """
    if on_host(weight):
        _row_sparse_momentum_host(weight, velocity, index, grad, lr, momentum, weight_decay)
        return
    for begin in range(0, index.shape[0], UPDATE_CHUNK_ROWS):
        ids = index[begin:begin + UPDATE_CHUNK_ROWS]
        rows = paddle.gather(weight, ids)
        step = grad[begin:begin + UPDATE_CHUNK_ROWS].astype(rows.dtype)
        if weight_decay:
            step = step + weight_decay * rows
        if velocity is not None and momentum:
            step = paddle.gather(velocity, ids).scale_(momentum).add_(step)
            paddle.scatter_(velocity, ids, step, overwrite=True)
        paddle.scatter_(weight, ids, rows.subtract_(step.scale(lr)), overwrite=True)


def _row_sparse_momentum_host(weight, velocity, index, grad, lr, momentum, weight_decay):
    """:func:`row_sparse_momentum_` in numpy on the tensors' memory, chunk by chunk, with the same float steps."""
    w, ids_all, g = host_view(weight), host_view(index), host_view(grad)
    v = host_view(velocity) if velocity is not None and momentum else None
    lr, momentum, weight_decay = (w.dtype.type(a) for a in (lr, momentum, weight_decay))
    for begin in range(0, ids_all.shape[0], UPDATE_CHUNK_ROWS):
        ids = ids_all[begin:begin + UPDATE_CHUNK_ROWS]
        rows = np.take(w, ids, axis=0)
        grad_rows = np.asarray(g[begin:begin + UPDATE_CHUNK_ROWS], dtype=w.dtype)  # a copy only to convert
        step = grad_rows  # read, never written
        if weight_decay:
            step = rows * weight_decay
            step += grad_rows  # = grad + weight_decay * rows (IEEE addition commutes)
        if v is not None:
            velocity_rows = np.take(v, ids, axis=0)
            velocity_rows *= momentum
            velocity_rows += step
            v[ids] = velocity_rows
            velocity_rows *= lr  # the taken copy, already stored
            rows -= velocity_rows
        else:
            rows -= step * lr
        w[ids] = rows


def _adam_factors(steps, lr, betas, epsilon):
    """Per row with step count ``c`` (float64): ``(lr sqrt(1 - b2^c) / (1 - b1^c), eps sqrt(1 - b2^c))``."""
    b1, b2 = betas
    root = np.sqrt(1.0 - np.power(b2, steps))
    return lr * root / (1.0 - np.power(b1, steps)), epsilon * root


@paddle.no_grad()
def row_sparse_adamw_(weight, moments, index, grad, lr, betas=(0.9, 0.999), epsilon=ADAM_EPSILON, weight_decay=0.0):
    """AdamW on rows ``index`` of ``weight`` from their gradient ``grad`` (module docstring), in place.

    ``moments`` = ``(m [C_k, D], v [C_k, D], steps [C_k] int32)``: the rows' moments and own step counts, updated
    in place. ``UPDATE_CHUNK_ROWS`` rows at a time; CPU tensors in numpy on their memory, with the same float steps.
    """
    if on_host(weight):
        _row_sparse_adamw_host(weight, moments, index, grad, lr, betas, epsilon, weight_decay)
        return
    m_all, v_all, steps_all = moments
    b1, b2 = (float(b) for b in betas)
    for begin in range(0, index.shape[0], UPDATE_CHUNK_ROWS):
        ids = index[begin:begin + UPDATE_CHUNK_ROWS]
        rows, g = paddle.gather(weight, ids), grad[begin:begin + UPDATE_CHUNK_ROWS].astype(weight.dtype)
        steps = paddle.gather(steps_all, ids) + 1
        paddle.scatter_(steps_all, ids, steps, overwrite=True)
        size, eps = _adam_factors(steps.astype("float64").numpy(), lr, (b1, b2), epsilon)
        m = paddle.gather(m_all, ids).scale_(b1).add_(g.scale(1.0 - b1))
        v = paddle.gather(v_all, ids).scale_(b2).add_((g * g).scale_(1.0 - b2))
        paddle.scatter_(m_all, ids, m, overwrite=True)
        paddle.scatter_(v_all, ids, v, overwrite=True)
        if weight_decay:
            rows = rows.subtract_(rows.scale(lr * weight_decay))
        size, eps = (tensor_from(a).astype(rows.dtype).unsqueeze(1) for a in (size, eps))
        rows = rows.subtract_(m.divide(v.sqrt().add_(eps)).multiply_(size))
        paddle.scatter_(weight, ids, rows, overwrite=True)


def _row_sparse_adamw_host(weight, moments, index, grad, lr, betas, epsilon, weight_decay):
    """:func:`row_sparse_adamw_` in numpy on the tensors' memory, chunk by chunk, with the same float steps."""
    w, ids_all, g_all = host_view(weight), host_view(index), host_view(grad)
    m_all, v_all, steps_all = (host_view(t) for t in moments)
    b1, b2, c1, c2 = (w.dtype.type(b) for b in (betas[0], betas[1], 1.0 - betas[0], 1.0 - betas[1]))
    for begin in range(0, ids_all.shape[0], UPDATE_CHUNK_ROWS):
        ids = ids_all[begin:begin + UPDATE_CHUNK_ROWS]
        rows = np.take(w, ids, axis=0)
        g = np.asarray(g_all[begin:begin + UPDATE_CHUNK_ROWS], dtype=w.dtype)
        steps = np.take(steps_all, ids) + 1
        steps_all[ids] = steps
        size, eps = (a.astype(w.dtype)[:, None] for a in _adam_factors(steps.astype(np.float64), lr, betas, epsilon))
        m = np.take(m_all, ids, axis=0) * b1 + g * c1
        v = np.take(v_all, ids, axis=0) * b2 + (g * g) * c2
        m_all[ids], v_all[ids] = m, v
        if weight_decay:
            rows -= rows * w.dtype.type(lr * weight_decay)
        rows -= m / (np.sqrt(v) + eps) * size
        w[ids] = rows


def check_sparse_optimizer(cfg, what, source=None):
    """Row-sparse heads support the optimizers whose row-wise update is written above; say so at start-up."""
    if cfg["type"] not in SPARSE_OPTIMIZERS:
        raise ConfigError(f"{what} uses Partial FC (sample_ratio < 1), which updates only the sampled class centres "
                          f"and supports optimizer.type {', '.join(SPARSE_OPTIMIZERS)}, not {cfg['type']!r}", source,
                          "optimizer.type")


SLOTS = {"sgd": (), "momentum": ("velocity",), "adamw": ("moment1", "moment2", "steps")}


class RowSparseOptimizer:
    """Momentum / SGD / AdamW on the rows heads declare, with the job's optimizer hyper-parameters; owns the rows'
    optimizer state (``slots``: parameter name -> {slot: tensor}; velocity, or moments and step counts)."""

    def __init__(self, cfg):
        self.kind = cfg["type"]
        self.momentum = cfg["momentum"] if self.kind == "momentum" else 0.0
        self.weight_decay = cfg["weight_decay"]
        self.betas = tuple(float(b) for b in cfg.get("betas", (0.9, 0.999)))
        self.slots = {}  # parameter name -> {slot: tensor [C_k, D] (steps: [C_k] int32)}, made at its first update

    def velocity(self, parameter):
        """The velocity of ``parameter`` (None before its first update or without momentum)."""
        return self.slots.get(parameter.name, {}).get("velocity")

    def state(self, parameter) -> dict:
        """``{slot: tensor}`` of ``parameter`` (empty before its first update)."""
        return self.slots.get(parameter.name, {})

    def _slots_of(self, parameter):
        if parameter.name not in self.slots:
            made = {name: paddle.zeros_like(parameter) for name in SLOTS[self.kind] if name != "steps"}
            if "steps" in SLOTS[self.kind]:
                made["steps"] = paddle.zeros([parameter.shape[0]], dtype="int32")
            self.slots[parameter.name] = made
        return self.slots[parameter.name]

    def step(self, row_gradients, lr: float):
        """Apply the update to every declared row gradient."""
        for row in row_gradients:
            if row.grad is None:
                continue
            slots = self._slots_of(row.parameter)
            scaled = lr * row.parameter.optimize_attr.get("learning_rate", 1.0)  # optimizer.lr_mult
            if self.kind == "adamw":
                moments = (slots["moment1"], slots["moment2"], slots["steps"])
                row_sparse_adamw_(row.parameter, moments, row.index, row.grad, scaled, self.betas, ADAM_EPSILON,
                                  self.weight_decay)
            else:
                row_sparse_momentum_(row.parameter, slots.get("velocity"), row.index, row.grad, scaled,
                                     self.momentum, self.weight_decay)
