"""The two passes of :mod:`mtl.headkit.chunked_softmax` on the host (CPU tensors), in numpy on the tensors' own memory.

Paddle's CPU build runs broadcast element-wise products and reductions over the class axis 5-15 times slower than
numpy on the same ``[8192, 128]`` block (``docs/paddle-notes.md``, ``bench/bench_host_passes.py``), and every op
allocates its result. Here each chunk is computed in place on numpy views of the Paddle buffers (``np.from_dlpack``
shares the memory, no copy): the products are written straight into the work buffer (``matmul(..., out=)``), the row
norms are one ``einsum``, the broadcast scalings are in place, and the top-1 column is searched only where a chunk
improves the best logit. The exponential is numpy's too (on this machine its float32 ``exp`` now runs faster than
Paddle's, and a zero-copy Paddle tensor of the block, built each chunk, kept 80 bytes for good each time: Paddle 3.3's
Tensor construction leaks, bench/bench_soak.py). The math, the buffer layout and the chunk order are those of the device
passes (the module docstring of :mod:`mtl.headkit.chunked_softmax`); tests run both on CPU against the numpy reference
and against each other (tests/test_margin_speed.py).
"""
import numpy as np

from mtl.core.arrays import NORM_FLOOR_SQUARED, host_view, tensor_from
from mtl.headkit.class_rows import chunk_order

_LOW = np.float32(-1e30)
TRANSPOSED_BLOCK = 128  # rows per product of dx += G'^T W: single-threaded OpenBLAS runs [128, K] x [K, 128] with
# K = 8192 at a third of its speed for K = 128 (bench: 25 ms vs 64 x 0.14 ms), and two threads are not slower


_blas_prepared = False


def prepare_blas():
    """Run one small transposed product, once per process.

    Measured with numpy's OpenBLAS 0.3.31 single-threaded on this machine: a process's ``[8192, 128] x [128, 128]``
    products run at half speed (17.7 ms instead of 8.4 ms, for as long as the process lives) until it has run one
    product of another kind, such as this ``[64, 256] x [256, 32]``; the state then persists. Costs microseconds.
    """
    global _blas_prepared
    if not _blas_prepared:
        probe = np.ones((256, 64), np.float32)
        probe.T @ probe[:, :32]
        _blas_prepared = True


class HostRows:
    """numpy access to a :class:`mtl.headkit.class_rows.ScoredRows` for one forward and its backward: blocks of each
    source's weight, views or gathered into one reused ``[CHUNK_ROWS, D]`` buffer (a sample; the block gathered
    last is kept for the backward, which with one chunk, or D >= N, starts with it), and two scratch blocks."""

    def __init__(self, rows):
        prepare_blas()
        self.rows = rows
        self.chunks = rows.chunks()
        self.held = None  # (begin, end) of the rows in ``gathered``
        self.weights = [host_view(source.weight) for source in rows.sources]
        self.indexes = [None if source.index is None else host_view(source.index) for source in rows.sources]
        width = max(end - begin for begin, end in self.chunks)
        dim = self.weights[0].shape[1]
        dtype = self.weights[0].dtype
        self.gathered = None if all(i is None for i in self.indexes) else np.empty((width, dim), dtype)
        self.scratch = np.empty((2, width, dim), dtype)

    def block(self, begin: int, end: int) -> np.ndarray:
        """Rows of columns ``[begin, end)`` (valid until the next call)."""
        which = next(i for i, stop in enumerate(self.rows.offsets[1:]) if begin < stop)
        offset, weight, index = self.rows.offsets[which], self.weights[which], self.indexes[which]
        if index is None:
            return weight[begin - offset:end - offset]
        out = self.gathered[:end - begin]
        if self.held != (begin, end):
            np.take(weight, index[begin - offset:end - offset], axis=0, out=out, mode="clip")  # "raise" buffers out
            self.held = (begin, end)
        return out


def inverse_norm(block: np.ndarray) -> np.ndarray:
    """``1 / max(||w_j||, 1e-12)`` of every row."""
    return 1.0 / np.sqrt(np.maximum(np.einsum("ij,ij->i", block, block), np.float32(NORM_FLOOR_SQUARED)))


def _in_chunk(owned, column, begin: int, end: int):
    """Batch rows whose target column lies in ``[begin, end)`` and that column relative to ``begin``."""
    hits = np.flatnonzero(owned & (column >= begin) & (column < end))
    return hits, column[hits] - begin


def _first_peak_rows(z: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """``z.argmax(axis=0)`` given ``peak = z.max(axis=0)`` (no NaN): the first row holding each column's peak.
    numpy's argmax along axis 0 of a ``[8192, 128]`` block takes 3.3 ms, finding the equal entries 0.9 ms."""
    rows, columns = np.divmod(np.flatnonzero(z == peak), z.shape[1])  # row-major: a column's first hit comes first
    found, first = np.unique(columns, return_index=True)
    out = np.full(z.shape[1], -1, np.int64)
    out[found] = rows[first]
    return out


def _add_transposed_product(out, g, block, scratch):
    """``out += g^T block`` over blocks of ``TRANSPOSED_BLOCK`` rows (``scratch``: an ``out``-shaped buffer)."""
    for begin in range(0, g.shape[0], TRANSPOSED_BLOCK):
        np.matmul(g[begin:begin + TRANSPOSED_BLOCK].T, block[begin:begin + TRANSPOSED_BLOCK], out=scratch)
        out += scratch


def _filter_chunk(z: np.ndarray, begin: int, end: int, mask, chunk_max):
    """Filtering of one chunk (``mtl.headkit.filtering``: inter-class filtering, same-person classes), after the
    top-1 search: the filtered logits become 0 (``zero``) or -inf (``remove``); returns the softmax's chunk maximum
    and the filtered entries (None)."""
    if mask is None:
        return chunk_max, None
    limit, mode = mask.setting(begin)
    columns, rows = mask.entries(begin, end)
    if limit is None and not len(columns):
        return chunk_max, None
    dirty = z > z.dtype.type(limit) if limit is not None else np.zeros(z.shape, bool)
    dirty[columns, rows] = True
    if mask.recording(begin):
        found = np.nonzero(dirty)
        mask.record(begin, found[0], found[1])
    if not dirty.any():
        return chunk_max, None
    z[dirty] = 0.0 if mode == "zero" else -np.inf
    return z.max(axis=0), dirty


def online_pass(host: HostRows, x_hat, scale, owned, column, work, inverse, mask=None):
    """Host version of ``_online_pass`` (the rows as :class:`HostRows`; the chunk maxima as numpy arrays)."""
    x, n = host_view(x_hat), x_hat.shape[0]
    buffer, inverses = host_view(work), host_view(inverse)
    owned, column = owned.numpy(), column.numpy()
    running = np.full(n, _LOW, x.dtype)
    total = np.zeros(n, x.dtype)
    best = np.full(n, -np.inf, x.dtype)
    best_column = np.full(n, -1, np.int64)
    maxima = []
    for begin, end in host.chunks:
        block = host.block(begin, end)
        inv = inverse_norm(block)
        inverses[begin:end] = inv
        z = buffer[begin * n:end * n].reshape(end - begin, n)
        np.matmul(block, x.T, out=z)
        z *= (inv * x.dtype.type(scale))[:, None]
        hits, position = _in_chunk(owned, column, begin, end)
        z[position, hits] = -np.inf  # the target logit enters once, with its margin (z_t)
        chunk_max = z.max(axis=0)
        if host.rows.is_own(begin):  # top-1 among the own classes: the first largest masked logit, searched
            better = np.flatnonzero(chunk_max > best)  # only where this chunk beats the best
            if better.size == n:
                best_column[:] = _first_peak_rows(z, chunk_max) + begin
            elif better.size:
                best_column[better] = z[:, better].argmax(axis=0) + begin
            best[better] = chunk_max[better]
        chunk_max, dirty = _filter_chunk(z, begin, end, mask, chunk_max)
        grown = np.maximum(running, chunk_max)
        z -= grown
        np.exp(z, out=z)  # in place (numpy's float32 exp: 0.55 ms for [8192, 128] here, Paddle's 0.94 ms)
        total = total * np.exp(running - grown) + z.sum(axis=0)  # S rescaled to the new maximum
        if dirty is not None and mask.setting(begin)[1] == "zero":
            z[dirty] = 0.0  # counted in S, but a constant logit: no gradient
        running = grown
        maxima.append(grown)
    return tensor_from(running), tensor_from(total), tensor_from(best), tensor_from(best_column), maxima  # (CPU)


def gradient_pass(host: HostRows, x_hat, work, inverse, maxima, coefficient, row_max, targets, dx):
    """Host version of ``_gradient_pass``: ``dx`` is accumulated in place, the rows' gradient written over ``work``."""
    (n, dim), (owned, column, target_rows) = x_hat.shape, targets
    x, buffer, inverses = host_view(x_hat), host_view(work), host_view(inverse)
    owned, column = owned.numpy(), column.numpy()
    target_rows = None if target_rows is None else target_rows.numpy()
    coefficient, row_max = coefficient.numpy(), row_max.numpy()
    dx_host, dx_part = np.zeros((n, dim), x.dtype), np.empty((n, dim), x.dtype)
    for index, (begin, end) in chunk_order(host.chunks, n, dim):
        count = end - begin
        g = buffer[begin * n:end * n].reshape(count, n)
        g *= (coefficient * np.exp(maxima[index] - row_max))[None, :]
        inv = inverses[begin:end]
        g *= inv[:, None]  # G'_jn = G_jn inv_j
        block = host.block(begin, end)
        _add_transposed_product(dx_host, g, block, dx_part)
        if not host.rows.trainable(begin):  # another head's rows that do not learn: negatives without a gradient
            continue
        products, correction = host.scratch[0, :count], host.scratch[1, :count]
        np.matmul(g, x, out=products)  # M = G' x_hat
        np.multiply(block, (np.einsum("ij,ij->i", products, block) * inv * inv)[:, None], out=correction)
        part = buffer[begin * dim:end * dim].reshape(count, dim)  # g's memory (read above) or already-used memory
        np.subtract(products, correction, out=part)  # dW_j = M_j - inv_j^2 (w_j . M_j) w_j
        hits, position = _in_chunk(owned, column, begin, end)
        if hits.size:
            np.add.at(part, position, target_rows[hits])
    dx.add_(tensor_from(dx_host))
