"""Gathering rows with autograd for model-parallel heads: every rank's rows (and labels) in rank order.

A model-parallel head works on the rows of every rank (``all_gather_rows``, ``gather_batch``) against the classes of
its own shard; the backward sums the gathered rows' gradient over ranks and keeps this rank's rows. Class ids travel
as two exact float columns of the features (``pack_ids``). Every function here is the identity at world size 1, and
every rank must call them in the same order: each issues a fixed sequence of collectives that does not depend on the
data. The softmax across shards is :mod:`mtl.headkit.sharded_loss`'s; top-k across shards is :mod:`mtl.parallel.topk`'s.
"""
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from mtl.core import activity
from mtl.core.arrays import tensor_from
from mtl.parallel import distributed


def row_counts(num_rows: int):
    """Row count of every rank, in rank order (one all-gather of a ``[1]`` tensor; ``[num_rows]`` at world 1)."""
    if not distributed.is_distributed():
        return [int(num_rows)]
    parts = []
    with activity.collective("the all-gather of the row counts of a head"):
        dist.all_gather(parts, tensor_from([int(num_rows)], dtype="int64"))
    return [int(v) for v in paddle.concat(parts).numpy()]  # one host read


def _gather_padded(x: paddle.Tensor, counts):
    """All-gather rows of unequal count: pad to the largest count (at least 1: gloo fails on empty tensors)."""
    rows = max(max(counts), 1)
    if x.shape[0] < rows:
        pad = paddle.zeros([rows - x.shape[0]] + list(x.shape[1:]), dtype=x.dtype)
        x = paddle.concat([x, pad], axis=0)
    parts = []
    with activity.collective("the all-gather of a head's features and labels"):
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


def unpack_ids(columns: paddle.Tensor, check: bool = True) -> paddle.Tensor:
    """int64 ids ``[n]`` from the ``[n, 2]`` float columns of :func:`pack_ids`; ValueError for an id out of range
    (``check=False``: no check, so no host read, for columns that cannot hold one)."""
    if check and bool(paddle.isnan(columns).any()):
        _refuse_ids()
    columns = columns.astype("int64")
    return columns[:, 0] * ID_BASE + columns[:, 1]


def _refuse_ids():
    raise ValueError(f"a class id of {ID_LIMIT} or more in absolute value cannot travel with the features (the "
                     f"labels of a head are class ids in [0, num_classes))")


def _check_gathered(both, dim: int, own_count, rank: int):
    """Raise, alike on every rank, when a gathered id column is NaN (an id out of range, :func:`pack_ids`) or, with
    ``own_count``, when a row carries another rank's row count than the one assumed: one host read for both checks
    (a second one only to word the error)."""
    bad = paddle.isnan(both[:, dim:dim + 2]).any()
    if own_count is not None:
        wrong = (both[:, dim + 2] != own_count).any()
        bad = paddle.logical_or(bad, wrong)
    if not bool(bad):
        return
    if own_count is not None and bool(wrong):
        raise RuntimeError(f"rank {rank} passed {own_count} rows to a head told that every rank passes as many "
                           f"(equal_rows), but another rank passed a different count; the gathered batch would be "
                           f"garbage (gloo does not check shapes reliably)")
    _refuse_ids()


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
        _check_gathered(both, dim, counts[rank] if check_rows else None, rank)
        gathered_labels = unpack_ids(both[:, dim:dim + 2], check=False)
        ctx.mark_non_differentiable(gathered_labels)
        return both[:, :dim], gathered_labels

    @staticmethod
    def backward(ctx, grad, labels_grad=None):
        total = grad.clone()
        with activity.collective("the all-reduce of a head's feature gradients"):
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
    # the count column catches unequal rows after a gloo gather; NCCL would hang or write past its buffer first, so
    # there the runner checks the rows before the step instead (ParallelStrategy.agree) and the column is left out
    check = equal_rows and distributed.backend() != "nccl"
    return _AllGatherRows.apply(features, counts, distributed.rank(), labels, check)
