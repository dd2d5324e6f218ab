"""Collectives with autograd for model-parallel heads: gather rows, softmax cross-entropy and top-k across shards.

A model-parallel head works on the rows of every rank (``all_gather_rows``) against the classes of its own shard
(logits ``[N, C_k]``). The softmax over all ``C = sum_k C_k`` classes is assembled from per-rank pieces:
all-reduce MAX of row maxima, all-reduce SUM of exp-sums and of the target logit (non-zero on the owner rank only).
Every function here is the identity (or a purely local computation) at world size 1, and every rank must call them
in the same order: each one issues a fixed sequence of collectives that does not depend on the data.
"""
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from mtl.parallel import distributed


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


ID_BASE = 4096  # ids travel in float columns as (hi, lo) = (floor(id / 4096), id mod 4096): both exact in float32
ID_LIMIT = 1 << 35  # |id| below this keeps hi exact in float32 (2**24)


def pack_ids(ids: paddle.Tensor, dtype) -> paddle.Tensor:
    """Integer ids ``[n]`` as two exact float columns ``[n, 2]`` of ``dtype`` (see :func:`unpack_ids`). An id out of
    range becomes NaN instead of raising here: a rank that raised before a collective would leave the others waiting,
    while every rank unpacks the same gathered columns and raises alike."""
    ids = ids.astype("int64").reshape([-1])
    hi = paddle.floor_divide(ids, paddle.full_like(ids, ID_BASE))
    columns = paddle.stack([hi, ids - hi * ID_BASE], axis=1).astype(dtype)
    valid = (paddle.abs(ids) < ID_LIMIT).unsqueeze(1)
    return paddle.where(valid, columns, paddle.full_like(columns, float("nan")))


def unpack_ids(columns: paddle.Tensor) -> paddle.Tensor:
    """int64 ids ``[n]`` from the ``[n, 2]`` float columns of :func:`pack_ids`; ValueError for an id out of range."""
    if bool(paddle.isnan(columns).any()):
        raise ValueError(f"a class id of {ID_LIMIT} or more in absolute value cannot travel with the features (the "
                         f"labels of a head are class ids in [0, num_classes))")
    columns = columns.astype("int64")
    return columns[:, 0] * ID_BASE + columns[:, 1]


class _AllGatherRows(PyLayer):
    """Forward: rows of every rank concatenated in rank order (and the labels, travelling in the same all-gather as
    two extra float columns). Backward: all-reduce SUM, keep this rank's rows.

    Each rank's gradient of the gathered rows holds only its own shard's contribution to the (global) loss, so
    the sum over ranks is the full gradient of the gathered rows; this rank then keeps the slice of its own rows.
    """

    @staticmethod
    def forward(ctx, x, counts, rank, labels=None, check_rows=False):
        ctx.begin = sum(counts[:rank])
        ctx.end = ctx.begin + counts[rank]
        if labels is None:
            return _gather_padded(x, counts)
        parts = [x, pack_ids(labels, x.dtype)]
        if check_rows:  # every row also carries its rank's row count, which must be the one assumed
            parts.append(paddle.full([x.shape[0], 1], x.shape[0], dtype=x.dtype))
        both = _gather_padded(paddle.concat(parts, axis=1), counts)
        dim = x.shape[1]
        if check_rows and not bool((both[:, dim + 2] == counts[rank]).all()):
            raise RuntimeError(f"rank {rank} passed {counts[rank]} rows to a head told that every rank passes as "
                               f"many (equal_rows), but another rank passed a different count; the gathered batch "
                               f"would be garbage (gloo does not check shapes reliably)")
        gathered_labels = unpack_ids(both[:, dim:dim + 2])
        ctx.mark_non_differentiable(gathered_labels)
        return both[:, :dim], gathered_labels

    @staticmethod
    def backward(ctx, grad, labels_grad=None):
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        own = total[ctx.begin:ctx.end]
        return own if labels_grad is None else (own, None)


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


def gather_batch(features: paddle.Tensor, labels: paddle.Tensor, equal_rows: bool = False):
    """Features (differentiable) and int64 labels of every rank in rank order, in one all-gather: the labels travel
    as two exact float columns of the features (:func:`pack_ids`). ``equal_rows``: the caller guarantees every rank
    passes as many rows (the runner's batches do, :func:`mtl.data.steps.check_divisible`), which saves the
    all-gather of the row counts; each row then carries its rank's count in one more column, and a rank that finds
    another count raises (for unequal shapes gloo hands back garbage or aborts a rank). The identity at world 1.
    """
    labels = labels.reshape([-1]).astype("int64")
    if not distributed.is_distributed():
        return features, labels
    if features.dtype not in (paddle.float32, paddle.float64):  # ids are exact in float32/float64 columns only
        counts = row_counts(features.shape[0])
        return all_gather_rows(features, counts), all_gather_rows(labels, counts)
    counts = [features.shape[0]] * distributed.world_size() if equal_rows else row_counts(features.shape[0])
    return _AllGatherRows.apply(features, counts, distributed.rank(), labels, equal_rows)


def local_targets(labels: paddle.Tensor, shard_start: int, shard_size: int) -> paddle.Tensor:
    """Column of each label in the shard ``[shard_start, shard_start + shard_size)``, or -1 for another rank's."""
    local = labels.astype("int64") - int(shard_start)
    owned = paddle.logical_and(local >= 0, local < int(shard_size))
    return paddle.where(owned, local, paddle.full_like(local, -1))


class _ShardedSoftmaxCrossEntropy(PyLayer):
    """Mean softmax cross-entropy over classes split across ranks; exact gradient on the local shard.

    Logits ``z = scale * x`` except the target column, ``z_t = scale * f(x_t)`` on the owner rank (``f`` = the
    optional target transform, e.g. an angular margin, returning value and slope). With the global row maximum
    ``m``: ``loss = mean_n [ log sum_k sum_j exp(z_nj - m_n) - (z_n,target - m_n) ]``.
    Backward: ``dL/dx = scale * (softmax(z) - onehot) / N``, times ``f'(x_t)`` in the target column.
    One ``[N, C_k]`` buffer holds z, then exp(z - m), then the softmax, then the gradient (in place: large
    allocations cost more than the arithmetic on CPU), so the graph cannot be run backward twice.
    """

    @staticmethod
    def forward(ctx, logits, target, scale, target_transform):
        n, c = logits.shape
        owned = (target >= 0).astype(logits.dtype)
        ctx.scale, ctx.used = scale, False
        if c == 0:  # this rank holds no class: it takes part in the same collectives with empty contributions
            ctx.save_for_backward(logits)
            distributed.all_reduce_max(paddle.full([n], float("-inf"), dtype=logits.dtype))
            both = distributed.all_reduce_sum(paddle.zeros([2, n], dtype=logits.dtype))
            return (paddle.log(both[0]) - both[1]).mean()
        column = paddle.clip(target, 0, c - 1).unsqueeze(1)
        x_target = paddle.take_along_axis(logits, column, axis=1).squeeze(1)
        value, slope = (x_target, None) if target_transform is None else target_transform(x_target)
        value = paddle.where(owned > 0, value, x_target) * scale  # z_target on the owner, unchanged elsewhere
        buf = paddle.scale(logits, scale)
        buf.put_along_axis_(column, value.unsqueeze(1), axis=1)
        row_max = distributed.all_reduce_max(buf.max(axis=1))  # m_n over every shard
        buf.subtract_(row_max.unsqueeze(1))
        buf.exp_()
        target_shifted = (value - row_max) * owned  # z_target - m on the owner rank, else 0
        both = distributed.all_reduce_sum(paddle.stack([buf.sum(axis=1), target_shifted]))  # one SUM for both
        exp_sum, target_shifted = both[0], both[1]
        buf.divide_(exp_sum.unsqueeze(1))  # softmax over all shards, this shard's columns
        ctx.save_for_backward(buf, column, owned, paddle.ones([n], logits.dtype) if slope is None else slope)
        return (paddle.log(exp_sum) - target_shifted).mean()

    @staticmethod
    def backward(ctx, grad):
        if ctx.used:
            raise RuntimeError("the sharded cross-entropy reuses its buffer: its graph can be run backward once")
        ctx.used = True
        saved = ctx.saved_tensor()
        if len(saved) == 1:  # no class on this rank
            return paddle.zeros_like(saved[0]), None
        prob, column, owned, slope = saved
        at_target = paddle.take_along_axis(prob, column, axis=1).squeeze(1)
        at_target = paddle.where(owned > 0, (at_target - 1.0) * slope, at_target)
        prob.put_along_axis_(column, at_target.unsqueeze(1), axis=1)  # softmax - onehot, times f'
        prob.multiply_(grad * (ctx.scale / prob.shape[0]))
        return prob, None


def sharded_softmax_cross_entropy_local(logits, target, scale: float = 1.0, target_transform=None):
    """Mean cross-entropy of this shard's ``logits [N, C_k]``; ``target [N]`` = local column or -1 (not here).

    ``scale`` multiplies every logit; ``target_transform(x_target) -> (value, slope)`` replaces the target logit
    on its owner rank (see :func:`mtl.heads.margin.margin_transform`). All N rows must be the same on every rank (the
    gathered batch); the result is equal on every rank.
    """
    return _ShardedSoftmaxCrossEntropy.apply(logits, target.astype("int64"), float(scale), target_transform)


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
            if local_k == 1:  # max + argmax: several times faster than topk on a wide row
                top_values, top_columns = logits.max(axis=1, keepdim=True), logits.argmax(axis=1, keepdim=True)
            else:
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


def sharded_top1(scores: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
    """Global class id ``[N]`` of the best score over every shard, from each rank's best ``scores [N]`` and their
    global ``ids [N]`` (one all-gather of (score, id) pairs in float64; ties go to the lower rank)."""
    if not distributed.is_distributed():
        return ids
    parts = []
    dist.all_gather(parts, paddle.stack([scores.astype("float64"), ids.astype("float64")]))
    stacked = paddle.stack(parts)  # [W, 2, N]
    best = paddle.argmax(stacked[:, 0], axis=0, keepdim=True)
    return paddle.take_along_axis(stacked[:, 1], best, axis=0)[0].astype("int64")


def top1_votes(best: paddle.Tensor, global_best: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
    """This rank's rows of the SUM all-reduce that settles the global top-1 without an all-gather of its own:
    ``[3, N]`` = (hi, lo, 1) of its best id (:func:`pack_ids`) where its best score equals ``global_best`` (the
    scores' all-reduce MAX, folded into the softmax's), else zeros. Summed over ranks, a row with one voter holds
    that rank's id exactly; see :func:`top1_from_votes`."""
    mine = (best == global_best).astype(best.dtype)
    return paddle.concat([pack_ids(ids, best.dtype).T * mine, mine.unsqueeze(0)], axis=0)


def top1_from_votes(votes: paddle.Tensor, best: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
    """Global top-1 ids ``[N]`` from the summed :func:`top1_votes`: the one voter's id. Where ranks tie on the best
    score, the lowest rank's, as :func:`sharded_top1` decides (one all-gather, taken by every rank alike since the
    sums are equal everywhere; exact ties across shards are rare); -1 where no rank voted (a NaN score)."""
    count = votes[2]
    tied = distributed.is_distributed() and bool((count > 1).any())
    predicted = sharded_top1(best, ids) if tied else unpack_ids(votes[:2].T)
    return paddle.where(count > 0, predicted, paddle.full_like(ids, -1))

