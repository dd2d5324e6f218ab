"""Collectives with autograd for model-parallel heads: gather rows, softmax cross-entropy and top-k across shards.

A model-parallel head works on the rows of every rank (``all_gather_rows``) against the classes of its own shard
(logits ``[N, C_k]``). The softmax over all ``C = sum_k C_k`` classes is assembled from per-rank pieces:
all-reduce MAX of row maxima, all-reduce SUM of exp-sums and of the target logit (non-zero on the owner rank only).
Every function here is the identity (or a purely local computation) at world size 1, and every rank must call them
in the same order: each one issues a fixed sequence of collectives that does not depend on the data.
"""
import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from . import distributed


def row_counts(num_rows: int):
    """Row count of every rank, in rank order (one all-gather of a ``[1]`` tensor; ``[num_rows]`` at world 1)."""
    if not distributed.is_distributed():
        return [int(num_rows)]
    parts = []
    dist.all_gather(parts, paddle.to_tensor([int(num_rows)], dtype="int64"))
    return [int(p.numpy()[0]) for p in parts]


def _gather_padded(x: paddle.Tensor, counts):
    """All-gather rows of unequal count: pad to the largest count (at least 1: gloo fails on empty tensors)."""
    rows = max(max(counts), 1)
    if x.shape[0] < rows:
        pad = paddle.zeros([rows - x.shape[0]] + list(x.shape[1:]), dtype=x.dtype)
        x = paddle.concat([x, pad], axis=0)
    parts = []
    dist.all_gather(parts, x)
    return paddle.concat([p[:c] for p, c in zip(parts, counts)], axis=0)


class _AllGatherRows(PyLayer):
    """Forward: rows of every rank concatenated in rank order. Backward: all-reduce SUM, keep this rank's rows.

    Each rank's gradient of the gathered rows holds only its own shard's contribution to the (global) loss, so
    the sum over ranks is the full gradient of the gathered rows; this rank then keeps the slice of its own rows.
    """

    @staticmethod
    def forward(ctx, x, counts, rank):
        ctx.begin = sum(counts[:rank])
        ctx.end = ctx.begin + counts[rank]
        return _gather_padded(x, counts)

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[ctx.begin:ctx.end]


def all_gather_rows(x: paddle.Tensor, counts=None) -> paddle.Tensor:
    """Rows of every rank concatenated in rank order, differentiable (identity at world 1).

    ``counts`` (from :func:`row_counts`) saves one collective when several tensors of the same batch are gathered.
    Tensors with ``stop_gradient`` (labels) are gathered without autograd.
    """
    if not distributed.is_distributed():
        return x
    counts = row_counts(x.shape[0]) if counts is None else list(counts)
    if x.stop_gradient:
        return _gather_padded(x, counts)
    return _AllGatherRows.apply(x, counts, distributed.rank())


def local_targets(labels: paddle.Tensor, shard_start: int, shard_size: int) -> paddle.Tensor:
    """Column of each label in the shard ``[shard_start, shard_start + shard_size)``, or -1 for another rank's."""
    local = labels.astype("int64") - int(shard_start)
    owned = paddle.logical_and(local >= 0, local < int(shard_size))
    return paddle.where(owned, local, paddle.full_like(local, -1))


class _ShardedSoftmaxCrossEntropy(PyLayer):
    """Mean softmax cross-entropy over classes split across ranks; exact gradient on the local shard.

    loss = mean_n [ log sum_k sum_j exp(z_nj) - z_n,target ], computed with the global row maximum ``m_n``:
    ``log sum exp(z - m) - (z_target - m)``. Backward: ``dL/dz = (softmax(z) - onehot) / N`` on this shard.
    """

    @staticmethod
    def forward(ctx, logits, target):
        n, c = logits.shape
        if c > 0:
            row_max = logits.max(axis=1)
        else:
            row_max = paddle.full([n], float("-inf"), dtype=logits.dtype)
        row_max = distributed.all_reduce_max(row_max)  # m_n = max over every shard
        shifted = logits - row_max.unsqueeze(1)
        exp = paddle.exp(shifted)
        owned = target >= 0
        if c > 0:
            column = paddle.clip(target, 0, c - 1).unsqueeze(1)
            target_shifted = paddle.take_along_axis(shifted, column, axis=1).squeeze(1)
            target_shifted = target_shifted * owned.astype(logits.dtype)  # z_target - m on the owner rank, else 0
            exp_sum = exp.sum(axis=1)
        else:
            target_shifted = paddle.zeros([n], dtype=logits.dtype)
            exp_sum = paddle.zeros([n], dtype=logits.dtype)
        both = distributed.all_reduce_sum(paddle.stack([exp_sum, target_shifted]))  # one SUM for both vectors
        exp_sum, target_shifted = both[0], both[1]
        row_loss = paddle.log(exp_sum) - target_shifted
        ctx.save_for_backward(exp / exp_sum.unsqueeze(1), target)
        return row_loss.mean()

    @staticmethod
    def backward(ctx, grad):
        prob, target = ctx.saved_tensor()
        n, c = prob.shape
        if c == 0:
            return paddle.zeros_like(prob), None
        column = paddle.clip(target, 0, c - 1).unsqueeze(1)
        owned = (target >= 0).astype(prob.dtype).unsqueeze(1)
        at_target = paddle.take_along_axis(prob, column, axis=1) - owned
        grad_logits = paddle.put_along_axis(prob, column, at_target, axis=1)  # softmax - onehot
        return grad_logits * (grad / n), None


def sharded_softmax_cross_entropy_local(logits: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    """Mean cross-entropy of this shard's ``logits [N, C_k]``; ``target [N]`` = local column or -1 (not here).

    All N rows must be the same on every rank (the gathered batch); the result is equal on every rank.
    """
    return _ShardedSoftmaxCrossEntropy.apply(logits, target.astype("int64"))


def sharded_softmax_cross_entropy(logits: paddle.Tensor, labels: paddle.Tensor, shard_start: int) -> paddle.Tensor:
    """Mean cross-entropy over all classes; this rank holds the logits of classes ``[shard_start, +C_k)``."""
    return sharded_softmax_cross_entropy_local(logits, local_targets(labels, shard_start, logits.shape[1]))


def sharded_topk(logits: paddle.Tensor, class_ids: paddle.Tensor, k: int) -> paddle.Tensor:
    """Global class ids ``[N, k]`` of the k largest logits over every shard (no gradient).

    ``class_ids [C_k]`` are the global ids of this shard's columns; ``k`` must not exceed the total class count.
    Each rank takes its local top-k, pads with -inf to k, and one all-gather of (value, id) pairs in float64
    (ids exact up to 2**53) lets every rank merge the candidates of all ranks.
    """
    with paddle.no_grad():
        n, c = logits.shape
        local_k = min(int(k), c)
        values = paddle.full([n, k], float("-inf"), dtype="float64")
        ids = paddle.full([n, k], -1.0, dtype="float64")
        if local_k > 0:
            top_values, top_columns = paddle.topk(logits, local_k, axis=1)
            top_ids = paddle.gather(class_ids.astype("int64"), top_columns.reshape([-1])).reshape([n, local_k])
            values[:, :local_k] = top_values.astype("float64")
            ids[:, :local_k] = top_ids.astype("float64")
        if distributed.is_distributed():
            parts = []
            dist.all_gather(parts, paddle.concat([values, ids], axis=1))
            values = paddle.concat([p[:, :k] for p in parts], axis=1)
            ids = paddle.concat([p[:, k:] for p in parts], axis=1)
        _, best = paddle.topk(values, k, axis=1)
        return paddle.take_along_axis(ids, best, axis=1).astype("int64")


def to_numpy(x) -> np.ndarray:
    """A numpy array from a paddle tensor or anything array-like."""
    return x.numpy() if isinstance(x, paddle.Tensor) else np.asarray(x)
