"""Cosine logits, angular margin and softmax cross-entropy across shards in one pass over class chunks.

The same function as ``cos = x_hat W^T / ||W_row||`` followed by the softmax cross-entropy across shards of
:mod:`mtl.heads.sharded_loss` with a margin on the target logit, computed over blocks of class rows (``CHUNK_ROWS``
on the CPU, larger on a GPU: :func:`chunk_rows`) so that the per-class work (row norms, scaling, max, exp, softmax,
gradient) runs on a block that stays in cache (a few blocks on a GPU: few kernel launches) instead of on whole
``[N, C_k]`` tensors (issue 14.1), and so that Partial FC allocates nothing of size
``[K, D]`` but the rows' gradient (issue 14.2). Logits are kept transposed (``[K, N]``: a chunk is a contiguous row
block). Per chunk c with rows ``W_c`` and ``inv_j = 1 / max(||w_j||, 1e-12)``:

    z_c = scale * (W_c x_hat^T) * inv_c             (the target entries are masked to -inf here; the target logit
                                                      ``scale * psi(cos_t)`` is computed once per row, see below)
    m, S: online softmax statistics (running max m_n, S_n = sum_j exp(z_jn - m_n), rescaled when m_n grows),
          then all-reduce MAX of m and SUM of (S, target term) over the shards (Milakov & Gimelshein 2018,
          "Online normalizer calculation for softmax").
    loss = mean_n [ log S_n - (z_target,n - m_n) ]

Backward, ``G_jn = dL/dcos_jn = (scale / N) softmax_jn`` (zero at the target, whose ``(p_t - 1) psi'(cos_t)`` term is
added per row) and ``G'_jn = G_jn inv_j``:

    dx_hat = G'^T W;    dW_j = M_j - inv_j^2 (w_j . M_j) w_j   with M = G' x_hat,
    since d cos_jn / d w_j = inv_j x_hat_n - inv_j^2 cos_jn w_j and sum_n G_jn cos_jn = w_j . M_j.

One buffer of ``K * max(N, D)`` floats serves both passes: the forward stores each chunk's ``exp(z - m_chunk)``
(``m_chunk`` = the running maximum after that chunk, so the backward needs no second exp:
``exp(z - m) = exp(z - m_chunk) exp(m_chunk - m)``), and the backward overwrites it chunk by chunk with the rows'
gradient ``[K, D]``, in an order that never overwrites values not yet read. Nothing else of size ``[K, N]`` or
``[K, D]`` is allocated: the full softmax returns that gradient as ``weight.grad``, Partial FC leaves it in
``rows.grad`` for the optimizer's row-sparse update.

The passes exist twice, with the same math, buffer layout and chunk order: in Paddle ops (``_online_pass``,
``_gradient_pass``: GPU, and CPU when ``mtl.arrays.HOST_PATHS`` is off) and in numpy on the CPU tensors' memory
(:mod:`mtl.heads.host_chunks`, the CPU default). The tests run both against the numpy reference.
"""
import numpy as np
import paddle
from paddle.autograd import PyLayer

from mtl.arrays import NORM_FLOOR_SQUARED, on_host
from mtl.heads import host_chunks
from mtl.parallel import distributed, topk

CHUNK_ROWS = 8192  # class rows per block on the CPU: [8192, 128] float32 = 4 MiB, a block that stays in cache
# on a GPU a block holds up to this many elements ([rows, max(N, D)], 128 MiB in float32): each chunk costs ~30
# kernel launches, and at 1M classes per rank CPU-sized chunks would be ~120 chunks, ~3,700 launches per step
DEVICE_CHUNK_ELEMENTS = 1 << 25


def chunk_rows(width: int, on_gpu: bool) -> int:
    """Class rows per block for blocks ``[rows, width]`` (``width = max(N, D)``): ``CHUNK_ROWS`` on the CPU (cache
    sized); on a GPU as many as ``DEVICE_CHUNK_ELEMENTS`` allow, never fewer than ``CHUNK_ROWS`` (the memory plan
    counts the same figure)."""
    if not on_gpu:
        return CHUNK_ROWS
    return max(CHUNK_ROWS, DEVICE_CHUNK_ELEMENTS // max(int(width), 1))
_LOW = -1e30  # a finite "minus infinity" for running maxima (exp(_LOW - x) = 0, and _LOW - _LOW = 0, not nan)


class Workspace:
    """A flat buffer one head reuses at every step (Partial FC): the step's exp values and then the sampled rows'
    gradient live in it. A new ``[K, max(N, D)]`` buffer per step is not always put back where the last one was
    freed (at 5M classes, resident memory grew by a second buffer after a few steps); reused, the plan's one buffer
    holds. It grows (with 2 % headroom: K varies a little per rank and step) and never shrinks. The rows' gradient
    of a step is valid until the head's next forward, which is when the optimizer has used it."""

    HEADROOM = 1.02

    def __init__(self):
        self.flat = None
        self.generation = 0  # counts the steps that took the buffer: a backward checks its step still owns it

    @classmethod
    def capacity(cls, size: int) -> int:
        """Elements allocated when a step needs ``size`` (the memory plan uses the same figure)."""
        return int(size * cls.HEADROOM) + 1

    def take(self, size: int, dtype):
        """A view of the first ``size`` elements (reallocated when too small or of another dtype)."""
        if self.flat is None or self.flat.shape[0] < size or self.flat.dtype != dtype:
            self.flat = None  # the old buffer goes before the new one is made
            self.flat = paddle.empty([self.capacity(size)], dtype=dtype)
        self.generation += 1
        return self.flat[:size]


class ClassRows:
    """The class rows one step scores: the whole ``weight [C_k, D]`` (``index`` None) or the local ids ``index``;
    the global id of weight row r is ``first_id + r``.

    After the forward, ``predicted`` holds each row's global top-1 class over every shard (the largest cosine logit,
    for the accuracy) and ``grad`` the rows' gradient ``[K, D]`` (sampled rows only).
    """

    def __init__(self, weight, index=None, workspace=None, first_id: int = 0):
        self.weight, self.index, self.workspace, self.first_id = weight, index, workspace, int(first_id)
        self.count = weight.shape[0] if index is None else index.shape[0]
        self.predicted = self.grad = None
        self.generation = 0

    def buffer(self, size: int, dtype):
        """The step's flat work buffer of ``size`` elements: from the head's :class:`Workspace`, or new."""
        if self.workspace is None:
            return paddle.empty([size], dtype=dtype)
        flat = self.workspace.take(size, dtype)
        self.generation = self.workspace.generation
        return flat

    def check_buffer(self):
        """Raise if a later forward of the same head has taken the shared buffer (its values are gone)."""
        if self.workspace is not None and self.workspace.generation != self.generation:
            raise RuntimeError("the head ran forward again before this step's backward: Partial FC reuses one "
                               "work buffer per head, so run backward (and the update) before the next forward")

    def block(self, begin, end):
        """Rows ``[begin, end)`` of the scored set: a view of the weight, or gathered (a copy)."""
        if self.index is None:
            return self.weight[begin:end]
        return paddle.gather(self.weight, self.index[begin:end])

    def rows(self, columns):
        """The rows at ``columns`` of the scored set (gathered)."""
        ids = columns if self.index is None else paddle.gather(self.index, columns)
        return paddle.gather(self.weight, ids)

    def global_ids(self, columns):
        """Global class ids of ``columns`` of the scored set (-1 stays -1)."""
        if self.count == 0:
            return paddle.full_like(columns, -1)
        local = paddle.clip(columns, min=0)
        local = local if self.index is None else paddle.gather(self.index, local)
        return paddle.where(columns >= 0, local + self.first_id, paddle.full_like(columns, -1))

    def chunks(self, width: int = 0):
        """``(begin, end)`` of every block of :func:`chunk_rows` rows (``width``: the blocks' columns, max(N, D))."""
        size = chunk_rows(width, self.weight.place.is_gpu_place())
        return [(b, min(b + size, self.count)) for b in range(0, self.count, size)]


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


def _target_terms(rows: ClassRows, x_hat, target, scale, transform):
    """Per row: owner flag, column, ``z_t = scale * psi(cos_t)`` (``_LOW`` off the owner), ``psi'``, target row,
    its inverse norm and cosine; ``cos_t = inv_t w_t . x_hat_n`` on the rank owning the label."""
    n = x_hat.shape[0]
    owned = target >= 0
    if rows.count == 0:
        return owned, target, paddle.full([n], _LOW, x_hat.dtype), paddle.ones([n], x_hat.dtype), None, None, None
    column = paddle.clip(target, 0, rows.count - 1)
    w_t = rows.rows(column)
    inv_t = inverse_norm(w_t)
    cos_t = (w_t * x_hat).sum(axis=1) * inv_t
    value, slope = (cos_t, paddle.ones_like(cos_t)) if transform is None else transform(cos_t)
    z_t = paddle.where(owned, value * scale, paddle.full_like(value, _LOW))
    return owned, column, z_t, slope, w_t, inv_t, cos_t


class _ChunkedMarginSoftmax(PyLayer):
    """Mean margin softmax cross-entropy of ``x_hat [N, D]`` over class rows split across ranks (module docstring).

    ``weight`` is the dense weight when it gets a dense gradient (full softmax), else None (the row gradient goes
    to ``rows.grad``)."""

    @staticmethod
    def forward(ctx, x_hat, weight, rows, target, scale, transform, host, mask):
        n, dim = x_hat.shape
        owned, column, z_t, slope, w_t, inv_t, cos_t = _target_terms(rows, x_hat, target, scale, transform)
        work = rows.buffer(rows.count * max(n, dim), x_hat.dtype)  # exp(z - m_chunk), then dW
        inverse = paddle.empty([rows.count], dtype=x_hat.dtype)
        ctx.host = host_chunks.HostRows(rows, CHUNK_ROWS) if host else None
        if host:
            running, total, best, best_column, maxima = host_chunks.online_pass(
                ctx.host, x_hat, scale, owned, column, work, inverse, mask)
        else:
            running, total, best, best_column, maxima = _online_pass(rows, x_hat, scale, owned, column, work, inverse,
                                                                     mask)
        if rows.count:  # the target's own (margin-free) cosine competes for the top-1 prediction
            plain = paddle.where(owned, cos_t * scale, paddle.full_like(cos_t, float("-inf")))
            best_column = paddle.where(plain > best, column, best_column)
            best = paddle.maximum(plain, best)
        # one MAX for the row maxima and the best scores, one SUM for the exp-sums, the target terms and the top-1;
        # float32 scores go into the MAX as rank keys (float64): ties then go to the lowest rank without a host read
        keyed = distributed.is_distributed() and best.dtype == paddle.float32
        score = topk.rank_key(best, distributed.rank()) if keyed else best
        peaks = distributed.all_reduce_max(paddle.stack([paddle.maximum(running, z_t).astype(score.dtype), score]))
        row_max, ids = peaks[0].astype(x_hat.dtype), rows.global_ids(best_column)
        total = total * paddle.exp(running - row_max)
        target_shifted = paddle.where(owned, z_t - row_max, paddle.zeros_like(z_t))
        sums = [paddle.stack([total + paddle.exp(z_t - row_max), target_shifted])]
        if distributed.is_distributed():
            sums.append(topk.top1_votes(score, peaks[1], ids).astype(x_hat.dtype))
        both = distributed.all_reduce_sum(paddle.concat(sums, axis=0))
        exp_sum, target_shifted = both[0], both[1]
        rows.predicted = topk.top1_from_votes(both[2:], best, ids, keyed) if len(sums) > 1 else ids
        ctx.rows, ctx.scale, ctx.dense, ctx.work, ctx.maxima = rows, scale, weight is not None, work, maxima
        ctx.target = (owned, column, slope, w_t, inv_t, cos_t)
        ctx.save_for_backward(x_hat, row_max, exp_sum, z_t, inverse)
        return (paddle.log(exp_sum) - target_shifted).mean()

    @staticmethod
    def backward(ctx, grad):
        if ctx.work is None:
            raise RuntimeError("the chunked margin softmax reuses its buffer: its graph can be run backward once")
        x_hat, row_max, exp_sum, z_t, inverse = ctx.saved_tensor()
        rows, scale, work, (n, dim) = ctx.rows, ctx.scale, ctx.work, x_hat.shape
        rows.check_buffer()
        owned, column, slope, w_t, inv_t, cos_t = ctx.target
        # the graph (and this ctx) outlives the step while the caller holds the loss: drop what points at the
        # buffer, so that the next step's buffer does not coexist with this one (rows.grad is owned by the head)
        ctx.work = ctx.rows = ctx.target = None
        coefficient = (grad * (scale / n)) / exp_sum  # dL/dcos_jn = coefficient_n * exp(z_jn - m_n)
        # the target terms: g_t = dL/dcos_t = (coefficient exp(z_t - m) - scale / N) psi'(cos_t), on the owner
        g_t = paddle.where(owned, coefficient * paddle.exp(z_t - row_max) - grad * (scale / n),
                           paddle.zeros_like(z_t)) * slope
        dx = paddle.zeros_like(x_hat)
        if ctx.host is not None:
            target_rows = None
            if rows.count:
                dx.add_((g_t * inv_t).unsqueeze(1) * w_t)
                target_rows = (g_t * inv_t).unsqueeze(1) * (x_hat - (cos_t * inv_t).unsqueeze(1) * w_t)
            targets = (owned, column, target_rows)
            host_chunks.gradient_pass(ctx.host, x_hat, work, inverse, ctx.maxima, coefficient, row_max, targets, dx)
            ctx.host = None
        else:  # the target terms enter G' itself (see _gradient_pass)
            targets = (owned, column, g_t * inv_t if rows.count else None)
            _gradient_pass(rows, x_hat, work, inverse, ctx.maxima, coefficient, row_max, targets, dx)
        dw = work[:rows.count * dim].reshape([rows.count, dim]) if rows.count else paddle.zeros([0, dim], x_hat.dtype)
        ctx.maxima = None
        if ctx.dense:
            return dx, dw, None  # None: the integer target
        rows.grad = dw
        return dx, None


def _filter_chunk(z, begin: int, end: int, mask, chunk_max):
    """Paddle-op version of ``host_chunks._filter_chunk``: ``(z, softmax chunk maximum, filtered entries or
    None)``."""
    if mask is None:
        return z, chunk_max, None
    listed = np.zeros(z.shape, bool)
    columns, rows = mask.entries(begin, end)
    listed[columns, rows] = True
    dirty = paddle.to_tensor(listed, place=z.place)
    if mask.limit is not None:
        dirty = paddle.logical_or(dirty, z > mask.limit)
    fill = paddle.full_like(z, 0.0 if mask.mode == "zero" else float("-inf"))
    z = paddle.where(dirty, fill, z)
    return z, z.max(axis=0), dirty


def _online_pass(rows: ClassRows, x_hat, scale, owned, column, work, inverse, mask=None):
    """The forward over the chunks: each chunk's ``exp(z - m_chunk)`` into ``work``, its inverse norms into
    ``inverse``; returns the running maximum m and exp-sum S (online softmax), the best masked logit and its column
    (top-1), and ``m_chunk`` of every chunk."""
    n = x_hat.shape[0]
    running = paddle.full([n], _LOW, x_hat.dtype)
    total = paddle.zeros([n], x_hat.dtype)
    best = paddle.full([n], float("-inf"), x_hat.dtype)
    best_column = paddle.full([n], -1, "int64")
    maxima = []
    for begin, end in rows.chunks(max(n, x_hat.shape[1])):
        in_chunk, position = _chunk_targets(owned, column, begin, end)
        z, inv, chunk_max, chunk_arg = _chunk_logits(rows.block(begin, end), x_hat, scale, in_chunk, position)
        better = chunk_max > best
        best = paddle.where(better, chunk_max, best)
        best_column = paddle.where(better, chunk_arg + begin, best_column)
        z, chunk_max, dirty = _filter_chunk(z, begin, end, mask, chunk_max)
        grown = paddle.maximum(running, chunk_max)
        z.subtract_(grown.unsqueeze(0)).exp_()
        total = total * paddle.exp(running - grown) + z.sum(axis=0)  # S rescaled to the new maximum
        if dirty is not None and mask.mode == "zero":  # counted in S, but a constant logit: no gradient
            z = paddle.where(dirty, paddle.zeros_like(z), z)
        running = grown
        work[begin * n:end * n] = z.reshape([-1])
        inverse[begin:end] = inv
        maxima.append(grown)
    return running, total, best, best_column, maxima


def _gradient_pass(rows: ClassRows, x_hat, work, inverse, maxima, coefficient, row_max, targets, dx):
    """The backward over the chunks: ``G'`` from the stored exp values, ``dx += G'^T W`` (in place) and each
    chunk's gradient rows written over ``work``.

    The target terms go into ``G'`` itself: the entry of row n's target class is 0 there (its logit was masked to
    -inf) and becomes ``g_t inv_t``, so that ``G'^T W`` adds ``g_t inv_t w_t`` to dx and ``M = G' x_hat`` with the
    correction gives ``g_t inv_t (x_hat - cos_t inv_t w_t)``, the target row's term. Each (class, row) entry is
    written once (a deterministic scatter), where adding rows sharing a class into the gradient (``index_add``) is
    an atomic add on a GPU, whose order, and so rounding, changes from run to run."""
    (n, dim), (owned, column, target_coefficient) = x_hat.shape, targets
    chunks = list(enumerate(rows.chunks(max(n, dim))))
    # chunk c's gradient rows go to work[b D, e D), where its exp values were (work[b N, e N)): in reverse
    # order when D > N, forward when D <= N, nothing is overwritten before it is read
    for index, (begin, end) in reversed(chunks) if dim > n else chunks:
        g = work[begin * n:end * n].reshape([end - begin, n])
        g.multiply_((coefficient * paddle.exp(maxima[index] - row_max)).unsqueeze(0))
        g.multiply_(inverse[begin:end].unsqueeze(1))  # G'_jn = G_jn inv_j
        in_chunk, position = _chunk_targets(owned, column, begin, end)
        current = paddle.take_along_axis(g, position, axis=0)
        g.put_along_axis_(position, paddle.where(in_chunk, target_coefficient.unsqueeze(0), current), axis=0)
        block = rows.block(begin, end)
        dx.add_(paddle.matmul(g, block, transpose_x=True))
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


def chunked_margin_softmax(x_hat, rows: ClassRows, target, scale: float, transform=None, dense: bool = True,
                           host=None, mask=None):
    """Mean cross-entropy (equal on every rank) of ``x_hat`` (normalised features of the gathered batch) over the
    class ``rows`` of every shard; ``target [N]`` = column of the label in ``rows`` or -1 (another rank's).

    ``dense``: the weight gets its gradient through autograd (``weight.grad``); otherwise the rows' gradient
    ``[K, D]`` is left in ``rows.grad`` by the backward. ``transform(cos_t) -> (value, slope)`` is the margin.
    ``host``: run the chunk passes in numpy on the tensors' memory (:mod:`mtl.heads.host_chunks`) or in Paddle ops;
    None chooses numpy for CPU tensors (float32/float64) and Paddle ops on a device. ``mask``
    (:class:`mtl.heads.filtering.ChunkMask`): negatives taken out of the softmax (inter-class filtering).
    """
    weight = rows.weight if dense else None
    if host is None:
        host = on_host(x_hat) and on_host(rows.weight) and rows.count > 0
    return _ChunkedMarginSoftmax.apply(x_hat, weight, rows, target.astype("int64"), float(scale), transform,
                                       bool(host), mask)
