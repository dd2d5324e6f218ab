"""The margin softmax cross-entropy across shards, over blocks of class rows: the loss of a margin head's step.

The same function as ``cos = x_hat W^T / ||W_row||`` followed by the softmax cross-entropy across shards of
:mod:`mtl.headkit.sharded_loss` with a margin on the target logit, computed over blocks of class rows (``CHUNK_ROWS``
on the CPU, larger on a GPU: :func:`mtl.headkit.class_rows.chunk_rows`) so that the per-class work (row norms,
scaling, max, exp, softmax, gradient) runs on a block that stays in cache (a few blocks on a GPU: few kernel
launches) instead of on whole ``[N, C_k]`` tensors, and so that Partial FC allocates nothing of size ``[K, D]`` but
the rows' gradient. Logits are kept transposed (``[K, N]``: a chunk is a contiguous row block). Per chunk c with
rows ``W_c`` and ``inv_j = 1 / max(||w_j||, 1e-12)``:

    z_c = scale * (W_c x_hat^T) * inv_c             (the target entries are masked to -inf here; the target logit
                                                      ``scale * psi(cos_t)`` is computed once per row, see below)
    m, S: online softmax statistics (running max m_n, S_n = sum_j exp(z_jn - m_n), rescaled when m_n grows),
          then all-reduce MAX of m and SUM of (S, target term) over the shards (Milakov & Gimelshein 2018,
          "Online normalizer calculation for softmax").
    loss = mean_n [ log S_n - (z_target,n - m_n) ]

The rows are :class:`mtl.headkit.class_rows.ScoredRows`: the head's own rows first, then (cross-head negatives)
other heads' rows on this rank, which enter S like any negative and are pushed away from x, without a gradient of
their own unless they learn (``update: both``: their rows' gradient, by the same formula as the own rows', goes to
their source's sink, :class:`mtl.headkit.class_rows.RowSource`). Backward,
``G_jn = dL/dcos_jn = (scale / N) softmax_jn`` (zero at the target, whose ``(p_t - 1) psi'(cos_t)`` term is added
per row) and ``G'_jn = G_jn inv_j``:

    dx_hat = G'^T W  (every chunk);    dW_j = M_j - inv_j^2 (w_j . M_j) w_j   with M = G' x_hat (chunks that learn),
    since d cos_jn / d w_j = inv_j x_hat_n - inv_j^2 cos_jn w_j and sum_n G_jn cos_jn = w_j . M_j.

One buffer of ``K * max(N, D)`` floats serves both passes: the forward stores each chunk's ``exp(z - m_chunk)``
(``m_chunk`` = the running maximum after that chunk, so the backward needs no second exp:
``exp(z - m) = exp(z - m_chunk) exp(m_chunk - m)``), and the backward overwrites it chunk by chunk with the own
rows' gradient ``[K_own, D]``, in the order of :func:`mtl.headkit.class_rows.chunk_order`. Nothing else of size
``[K, N]`` or ``[K, D]`` is allocated: the whole shard returns that gradient as ``weight.grad``, Partial FC leaves it
in its :class:`mtl.headkit.row_gradients.RowGradient` for the optimizer's row-sparse update.

This is the loss only. What the passes see anyway comes out as a :class:`Statistics` value (no extra work): each
row's best own logit and its column (the head settles the training top-1 across shards itself,
:func:`mtl.parallel.topk.top1_across_shards`), and each row's target cosine, summed into the softmax's all-reduce
(the online same-person rule of :mod:`mtl.headkit.cross_negatives` is calibrated on them).

The passes exist twice, with the same math, buffer layout and chunk order: in Paddle ops (``_online_pass``,
``_gradient_pass``: GPU, and CPU when ``mtl.core.arrays.HOST_PATHS`` is off) and in numpy on the CPU tensors' memory
(:mod:`mtl.headkit.host_chunks`, the CPU default). The tests run both against the numpy reference.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle
from paddle.autograd import PyLayer

from mtl.core.arrays import NORM_FLOOR_SQUARED, on_host, tensor_from
from mtl.headkit import host_chunks
from mtl.headkit.class_rows import ScoredRows, chunk_order
from mtl.parallel import distributed

_LOW = -1e30  # a finite "minus infinity" for running maxima (exp(_LOW - x) = 0, and _LOW - _LOW = 0, not nan)


@dataclass
class Statistics:
    """What one loss evaluation saw, besides the loss: per gathered row, the best logit among this rank's own rows
    (the target's plain, margin-free logit included) and its column (-1: none), and the target cosine (every rank
    holds it: the owner's value, summed across shards); ``gradient``: where the own rows' gradient goes when they
    are a sample (a :class:`mtl.headkit.row_gradients.RowGradient`, filled by the backward)."""

    best: Optional[paddle.Tensor] = None
    best_column: Optional[paddle.Tensor] = None
    target_cosine: Optional[paddle.Tensor] = None
    gradient: object = None


def inverse_norm(rows):
    """``1 / max(||w_j||, 1e-12)`` of every row."""
    return paddle.rsqrt(paddle.clip((rows * rows).sum(axis=1), min=NORM_FLOOR_SQUARED))


def _chunk_logits(rows, x_hat, scale, in_chunk, position, z=None):
    """``(z [c, N] = scale * cos with target entries at -inf, inv [c], largest masked logit, its row)``.

    ``z``: the products ``rows x_hat^T`` already computed (a view of the kept logits), scaled in place."""
    inv = inverse_norm(rows)
    if z is None:
        z = paddle.matmul(rows, x_hat, transpose_y=True)
    z.multiply_((inv * scale).unsqueeze(1))
    current = paddle.take_along_axis(z, position, axis=0)
    z.put_along_axis_(position, paddle.where(in_chunk, paddle.full_like(current, float("-inf")), current), axis=0)
    return z, inv, z.max(axis=0), z.argmax(axis=0)


def _target_terms(rows: ScoredRows, x_hat, target, scale, transform):
    """Per row: owner flag, column, ``z_t = scale * psi(cos_t)`` (``_LOW`` off the owner), ``psi'``, target row,
    its inverse norm and cosine; ``cos_t = inv_t w_t . x_hat_n`` on the rank owning the label."""
    n = x_hat.shape[0]
    owned = target >= 0
    if rows.own_count == 0:
        return owned, target, paddle.full([n], _LOW, x_hat.dtype), paddle.ones([n], x_hat.dtype), None, None, None
    column = paddle.clip(target, 0, rows.own_count - 1)
    w_t = rows.rows(column)
    inv_t = inverse_norm(w_t)
    cos_t = (w_t * x_hat).sum(axis=1) * inv_t
    value, slope = (cos_t, paddle.ones_like(cos_t)) if transform is None else transform(cos_t)
    z_t = paddle.where(owned, value * scale, paddle.full_like(value, _LOW))
    return owned, column, z_t, slope, w_t, inv_t, cos_t


class _ChunkedMarginSoftmax(PyLayer):
    """Mean margin softmax cross-entropy of ``x_hat [N, D]`` over class rows split across ranks (module docstring).

    ``weight`` is the own rows' weight when it gets a dense gradient (the whole shard), else None (the rows'
    gradient goes to ``stats.gradient``)."""

    @staticmethod
    def forward(ctx, x_hat, weight, rows, target, scale, transform, host, mask, stats):
        n, dim = x_hat.shape
        owned, column, z_t, slope, w_t, inv_t, cos_t = _target_terms(rows, x_hat, target, scale, transform)
        work = rows.buffer(rows.count * max(n, dim), x_hat.dtype)  # exp(z - m_chunk), then dW
        inverse = paddle.empty([rows.count], dtype=x_hat.dtype)
        ctx.host = host_chunks.HostRows(rows) if host else None
        passes = host_chunks.online_pass if host else _online_pass
        running, total, best, best_column, maxima = passes(ctx.host if host else rows, x_hat, scale, owned, column,
                                                           work, inverse, mask)
        if rows.own_count:  # the target's own (margin-free) cosine competes for the top-1 prediction
            plain = paddle.where(owned, cos_t * scale, paddle.full_like(cos_t, float("-inf")))
            best_column = paddle.where(plain > best, column, best_column)
            best = paddle.maximum(plain, best)
        # one MAX for the row maxima, one SUM for the exp-sums, the target terms and the target cosines
        row_max = distributed.all_reduce_max(paddle.maximum(running, z_t))
        total = total * paddle.exp(running - row_max)
        target_shifted = paddle.where(owned, z_t - row_max, paddle.zeros_like(z_t))
        cosine = paddle.where(owned, cos_t, paddle.zeros_like(z_t)) if rows.own_count else paddle.zeros_like(z_t)
        both = distributed.all_reduce_sum(paddle.stack([total + paddle.exp(z_t - row_max), target_shifted, cosine]))
        exp_sum, target_shifted = both[0], both[1]
        stats.best, stats.best_column, stats.target_cosine = best, best_column, both[2]
        ctx.rows, ctx.scale, ctx.dense, ctx.work, ctx.maxima = rows, scale, weight is not None, work, maxima
        ctx.target, ctx.stats = (owned, column, slope, w_t, inv_t, cos_t), stats
        ctx.save_for_backward(x_hat, row_max, exp_sum, z_t, inverse)
        return (paddle.log(exp_sum) - target_shifted).mean()

    @staticmethod
    def backward(ctx, grad):
        if ctx.work is None:
            raise RuntimeError("the chunked margin softmax reuses its buffer: its graph can be run backward once")
        x_hat, row_max, exp_sum, z_t, inverse = ctx.saved_tensor()
        rows, scale, work, stats, (n, dim) = ctx.rows, ctx.scale, ctx.work, ctx.stats, x_hat.shape
        rows.check_buffer()
        owned, column, slope, w_t, inv_t, cos_t = ctx.target
        # the graph (and this ctx) outlives the step while the caller holds the loss: drop what points at the
        # buffer, so that the next step's buffer does not coexist with this one (the rows' gradient goes to the
        # optimizer through the head's output, which drops it when the step is applied)
        ctx.work = ctx.rows = ctx.target = ctx.stats = None
        coefficient = (grad * (scale / n)) / exp_sum  # dL/dcos_jn = coefficient_n * exp(z_jn - m_n)
        # the target terms: g_t = dL/dcos_t = (coefficient exp(z_t - m) - scale / N) psi'(cos_t), on the owner
        g_t = paddle.where(owned, coefficient * paddle.exp(z_t - row_max) - grad * (scale / n),
                           paddle.zeros_like(z_t)) * slope
        dx = paddle.zeros_like(x_hat)
        if ctx.host is not None:
            target_rows = None
            if rows.own_count:
                dx.add_((g_t * inv_t).unsqueeze(1) * w_t)
                target_rows = (g_t * inv_t).unsqueeze(1) * (x_hat - (cos_t * inv_t).unsqueeze(1) * w_t)
            targets = (owned, column, target_rows)
            host_chunks.gradient_pass(ctx.host, x_hat, work, inverse, ctx.maxima, coefficient, row_max, targets, dx)
            ctx.host = None
        else:  # the target terms enter G' itself (see _gradient_pass)
            targets = (owned, column, g_t * inv_t if rows.own_count else None)
            _gradient_pass(rows, x_hat, work, inverse, ctx.maxima, coefficient, row_max, targets, dx)
        for source, offset in rows.learning_others():  # other heads' rows that learn: a copy to their sink
            source.sink(source, work[offset * dim:(offset + source.count) * dim].reshape([source.count, dim]).clone())
        own = rows.own_count
        dw = work[:own * dim].reshape([own, dim]) if own else paddle.zeros([0, dim], x_hat.dtype)
        ctx.maxima = None
        if ctx.dense:
            return dx, dw, None  # None: the integer target
        if stats.gradient is not None:
            stats.gradient.grad = dw
        return dx, None


def _filter_chunk(z, begin: int, end: int, mask, chunk_max):
    """Paddle-op version of ``host_chunks._filter_chunk``: ``(z, softmax chunk maximum, filtered entries or
    None)``."""
    if mask is None:
        return z, chunk_max, None
    limit, mode = mask.setting(begin)
    columns, rows = mask.entries(begin, end)
    if limit is None and not len(columns):
        return z, chunk_max, None
    listed = np.zeros(z.shape, bool)
    listed[columns, rows] = True
    dirty = tensor_from(listed)
    if limit is not None:
        dirty = paddle.logical_or(dirty, z > limit)
    if mask.recording(begin):
        found = np.nonzero(dirty.numpy())
        mask.record(begin, found[0], found[1])
    fill = paddle.full_like(z, 0.0 if mode == "zero" else float("-inf"))
    z = paddle.where(dirty, fill, z)
    return z, z.max(axis=0), dirty


def _online_pass(rows: ScoredRows, x_hat, scale, owned, column, work, inverse, mask=None):
    """The forward over the chunks: each chunk's ``exp(z - m_chunk)`` into ``work``, its inverse norms into
    ``inverse``; returns the running maximum m and exp-sum S (online softmax), the best masked own logit and its
    column (top-1), and ``m_chunk`` of every chunk."""
    n = x_hat.shape[0]
    running = paddle.full([n], _LOW, x_hat.dtype)
    total = paddle.zeros([n], x_hat.dtype)
    best = paddle.full([n], float("-inf"), x_hat.dtype)
    best_column = paddle.full([n], -1, "int64")
    maxima = []
    for begin, end in rows.chunks(max(n, x_hat.shape[1])):
        in_chunk, position = _chunk_targets(owned, column, begin, end)
        z, inv, chunk_max, chunk_arg = _chunk_logits(rows.block(begin, end), x_hat, scale, in_chunk, position)
        if rows.is_own(begin):  # the top-1 is among the head's own classes
            better = chunk_max > best
            best = paddle.where(better, chunk_max, best)
            best_column = paddle.where(better, chunk_arg + begin, best_column)
        z, chunk_max, dirty = _filter_chunk(z, begin, end, mask, chunk_max)
        grown = paddle.maximum(running, chunk_max)
        z.subtract_(grown.unsqueeze(0)).exp_()
        total = total * paddle.exp(running - grown) + z.sum(axis=0)  # S rescaled to the new maximum
        if dirty is not None and mask.setting(begin)[1] == "zero":  # counted in S, but a constant logit: no gradient
            z = paddle.where(dirty, paddle.zeros_like(z), z)
        running = grown
        work[begin * n:end * n] = z.reshape([-1])
        inverse[begin:end] = inv
        maxima.append(grown)
    return running, total, best, best_column, maxima


def _gradient_pass(rows: ScoredRows, x_hat, work, inverse, maxima, coefficient, row_max, targets, dx):
    """The backward over the chunks: ``G'`` from the stored exp values, ``dx += G'^T W`` (in place) and each own
    chunk's gradient rows written over ``work``.

    The target terms go into ``G'`` itself: the entry of row n's target class is 0 there (its logit was masked to
    -inf) and becomes ``g_t inv_t``, so that ``G'^T W`` adds ``g_t inv_t w_t`` to dx and ``M = G' x_hat`` with the
    correction gives ``g_t inv_t (x_hat - cos_t inv_t w_t)``, the target row's term. Each (class, row) entry is
    written once (a deterministic scatter), where adding rows sharing a class into the gradient (``index_add``) is
    an atomic add on a GPU, whose order, and so rounding, changes from run to run."""
    (n, dim), (owned, column, target_coefficient) = x_hat.shape, targets
    for index, (begin, end) in chunk_order(rows.chunks(max(n, dim)), n, dim):
        g = work[begin * n:end * n].reshape([end - begin, n])
        g.multiply_((coefficient * paddle.exp(maxima[index] - row_max)).unsqueeze(0))
        g.multiply_(inverse[begin:end].unsqueeze(1))  # G'_jn = G_jn inv_j
        block = rows.block(begin, end)
        if rows.is_own(begin):
            in_chunk, position = _chunk_targets(owned, column, begin, end)
            current = paddle.take_along_axis(g, position, axis=0)
            g.put_along_axis_(position, paddle.where(in_chunk, target_coefficient.unsqueeze(0), current), axis=0)
        dx.add_(paddle.matmul(g, block, transpose_x=True))
        if rows.trainable(begin):
            part = paddle.matmul(g, x_hat)
            _correct_(part, block, inverse[begin:end])
            work[begin * dim:end * dim] = part.reshape([-1])


def _chunk_targets(owned, column, begin: int, end: int):
    """``(in_chunk [1, N], position [1, N])``: whether row n's target column is in ``[begin, end)``, and where."""
    in_chunk = paddle.logical_and(owned, paddle.logical_and(column >= begin, column < end)).unsqueeze(0)
    return in_chunk, paddle.clip(column - begin, 0, end - begin - 1).unsqueeze(0)


def _correct_(dw, rows, inv):
    """``dW_j = M_j - inv_j^2 (w_j . M_j) w_j`` in place on ``dw`` (= M) for the block ``rows``."""
    dw.subtract_(((dw * rows).sum(axis=1) * inv * inv).unsqueeze(1) * rows)


def chunked_margin_softmax(x_hat, rows: ScoredRows, target, scale: float, transform=None, host=None, mask=None,
                           stats: Optional[Statistics] = None):
    """Mean cross-entropy (equal on every rank) of ``x_hat`` (normalised features of the gathered batch) over the
    class ``rows`` of every shard; ``target [N]`` = column of the label in the own rows or -1 (another rank's).

    The own rows get their gradient through autograd (``weight.grad``) when they are the whole shard
    (``rows.index`` None); a sample's gradient ``[K, D]`` goes to ``stats.gradient`` (a RowGradient). Other heads'
    rows get none, or (a source with a ``sink``) hand theirs to the sink. ``transform(cos_t) -> (value, slope)`` is
    the margin. ``host``: run the chunk passes in numpy on the tensors' memory (:mod:`mtl.headkit.host_chunks`) or in
    Paddle ops; None chooses numpy for CPU tensors (float32/float64) and Paddle ops on a device. ``mask``
    (:class:`mtl.headkit.filtering.ChunkMask`): negatives taken out of the softmax (inter-class filtering, same-person
    classes). ``stats`` (:class:`Statistics`): filled with what the passes saw.
    """
    stats = Statistics() if stats is None else stats
    weight = rows.weight if rows.index is None else None
    if host is None:
        host = on_host(x_hat) and on_host(rows.weight) and rows.count > 0
    return _ChunkedMarginSoftmax.apply(x_hat, weight, rows, target.astype("int64"), float(scale), transform,
                                       bool(host), mask, stats)
