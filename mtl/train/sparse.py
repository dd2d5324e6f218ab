"""Row-sparse optimizer update for heads that score only some rows of a parameter (Partial FC).

Paddle's optimizers update every row of a parameter that has a gradient, so a Partial FC head that let the optimizer
own its weight would (a) hold a dense [C_k, D] gradient and (b) keep moving rows that were not sampled, through their
momentum. Instead the head scores a detached copy of the sampled rows (its gradient is [K, D]) and declares them as
:class:`RowGradient` (PLSC's shape: the head says which rows it used, the optimizer owns the update). On those rows
only, :class:`RowSparseOptimizer` applies the update Paddle's ``Momentum`` (L2 ``weight_decay``) / ``SGD`` would:

    g' = g + weight_decay * w;   v = momentum * v + g';   w = w - lr * v        (SGD: momentum 0, no v kept)
"""
from dataclasses import dataclass

import numpy as np
import paddle

from mtl.arrays import host_view, on_host
from mtl.errors import ConfigError

SPARSE_OPTIMIZERS = ("sgd", "momentum")


@dataclass
class RowGradient:
    """Rows of ``parameter`` that a head scored this step: ``rows`` (a detached copy, whose ``.grad`` is the rows'
    gradient ``[K, D]``) at local row ids ``index [K]``. Only these rows (and their momentum) change."""

    parameter: paddle.Tensor
    index: paddle.Tensor
    rows: paddle.Tensor


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


def check_sparse_optimizer(cfg, what, source=None):
    """Row-sparse heads support the optimizers whose row-wise update is written above; say so at start-up."""
    if cfg["type"] not in SPARSE_OPTIMIZERS:
        raise ConfigError(f"{what} uses Partial FC (sample_ratio < 1), which updates only the sampled class centres "
                          f"and supports optimizer.type sgd or momentum, not {cfg['type']!r}", source,
                          "optimizer.type")


class RowSparseOptimizer:
    """Momentum / SGD on the rows heads declare, with the job's optimizer hyper-parameters; owns the velocities."""

    def __init__(self, cfg):
        self.momentum = cfg["momentum"] if cfg["type"] == "momentum" else 0.0
        self.weight_decay = cfg["weight_decay"]
        self.velocities = {}  # parameter name -> velocity [C_k, D] (created on the parameter's first update)

    def velocity(self, parameter):
        """The velocity of ``parameter`` (None before its first update or without momentum)."""
        return self.velocities.get(parameter.name)

    def step(self, row_gradients, lr: float):
        """Apply the update to every declared row gradient."""
        for row in row_gradients:
            if row.rows.grad is None:
                continue
            velocity = None
            if self.momentum:
                if row.parameter.name not in self.velocities:
                    self.velocities[row.parameter.name] = paddle.zeros_like(row.parameter)
                velocity = self.velocities[row.parameter.name]
            scaled = lr * row.parameter.optimize_attr.get("learning_rate", 1.0)  # optimizer.lr_mult
            row_sparse_momentum_(row.parameter, velocity, row.index, row.rows.grad, scaled, self.momentum,
                                 self.weight_decay)
