"""Softmax cross-entropy over classes split across ranks (the softmax head's loss): exact, with its own gradient.

The softmax over all ``C = sum_k C_k`` classes is assembled from per-rank pieces: all-reduce MAX of the row maxima,
all-reduce SUM of the exp-sums and of the target logit (non-zero on the owner rank only). The margin heads score
their cosine logits with the same math over class chunks (:mod:`mtl.headkit.chunked_softmax`).
"""
import paddle
from paddle.autograd import PyLayer

from mtl.parallel import distributed


def local_targets(labels: paddle.Tensor, shard_start: int, shard_size: int) -> paddle.Tensor:
    """Column of each label in the shard ``[shard_start, shard_start + shard_size)``, or -1 for another rank's."""
    local = labels.astype("int64") - int(shard_start)
    owned = paddle.logical_and(local >= 0, local < int(shard_size))
    return paddle.where(owned, local, paddle.full_like(local, -1))


class _ShardedSoftmaxCrossEntropy(PyLayer):
    """Mean softmax cross-entropy over classes split across ranks; exact gradient on the local shard.

    With the global row maximum ``m`` (all-reduce MAX of the shards' row maxima):
    ``loss = mean_n [ log sum_k sum_j exp(z_nj - m_n) - (z_n,target - m_n) ]`` (the exp-sums and the target term,
    non-zero on the owner rank only, in one all-reduce SUM). Backward: ``dL/dz = (softmax(z) - onehot) / N``.
    One ``[N, C_k]`` buffer holds z, then exp(z - m), then the softmax, then the gradient (in place: large
    allocations cost more than the arithmetic on CPU), so the graph cannot be run backward twice.
    """

    @staticmethod
    def forward(ctx, logits, target):
        n, c = logits.shape
        owned = (target >= 0).astype(logits.dtype)
        ctx.used = False
        if c == 0:  # this rank holds no class: it takes part in the same collectives with empty contributions
            ctx.save_for_backward(logits)
            distributed.all_reduce_max(paddle.full([n], float("-inf"), dtype=logits.dtype))
            both = distributed.all_reduce_sum(paddle.zeros([2, n], dtype=logits.dtype))
            return (paddle.log(both[0]) - both[1]).mean()
        column = paddle.clip(target, 0, c - 1).unsqueeze(1)
        value = paddle.take_along_axis(logits, column, axis=1).squeeze(1)  # z_target on the owner rank
        buf = logits.clone()
        row_max = distributed.all_reduce_max(buf.max(axis=1))  # m_n over every shard
        buf.subtract_(row_max.unsqueeze(1))
        buf.exp_()
        target_shifted = (value - row_max) * owned  # z_target - m on the owner rank, else 0
        both = distributed.all_reduce_sum(paddle.stack([buf.sum(axis=1), target_shifted]))  # one SUM for both
        exp_sum, target_shifted = both[0], both[1]
        buf.divide_(exp_sum.unsqueeze(1))  # softmax over all shards, this shard's columns
        ctx.save_for_backward(buf, column, owned)
        return (paddle.log(exp_sum) - target_shifted).mean()

    @staticmethod
    def backward(ctx, grad):
        if ctx.used:
            raise RuntimeError("the sharded cross-entropy reuses its buffer: its graph can be run backward once")
        ctx.used = True
        saved = ctx.saved_tensor()
        if len(saved) == 1:  # no class on this rank
            return paddle.zeros_like(saved[0]), None
        prob, column, owned = saved
        at_target = paddle.take_along_axis(prob, column, axis=1).squeeze(1)
        at_target = paddle.where(owned > 0, at_target - 1.0, at_target)
        prob.put_along_axis_(column, at_target.unsqueeze(1), axis=1)  # softmax - onehot
        prob.multiply_(grad * (1.0 / prob.shape[0]))
        return prob, None


def sharded_softmax_cross_entropy(logits: paddle.Tensor, labels: paddle.Tensor, shard_start: int) -> paddle.Tensor:
    """Mean cross-entropy over all classes of the gathered batch (equal on every rank); this rank holds the logits
    ``[N, C_k]`` of classes ``[shard_start, shard_start + C_k)``; ``labels [N]`` are global class ids."""
    target = local_targets(labels, shard_start, logits.shape[1])
    return _ShardedSoftmaxCrossEntropy.apply(logits, target.astype("int64"))
