"""The class rows a margin head scores in one step, and the buffer and chunk order its passes share.

A step scores :class:`ScoredRows`: the head's own class rows (its whole shard, or the Partial FC sample of it) and,
with cross-head negatives (:mod:`mtl.headkit.cross_negatives`), other heads' rows on this rank after them. Columns are
numbered across the sources in that order; the targets' columns are always among the head's own rows, which come
first. The own rows get a gradient (in ``weight.grad`` for the whole shard, in a
:class:`mtl.headkit.row_gradients.RowGradient` for a sample); other heads' rows are negatives without gradient (a
sample is pushed away from them; they move with their own data only), unless their source ``learns`` (cross-head
negatives' ``update: both``): then their gradient rows are handed to the source's ``sink`` (as a merged head's rows
would get them).

Chunks (blocks of class rows, :func:`chunk_rows`) never span two sources. :func:`chunk_order` is the one rule both
implementations of the backward pass (Paddle ops and numpy) follow, so that a chunk's gradient rows never overwrite
exp values not yet read (see :mod:`mtl.headkit.chunked_softmax`).
"""
from typing import List, Optional

import paddle

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


def chunk_order(chunks, n: int, dim: int):
    """The order in which the backward visits ``chunks`` (``[(index, (begin, end))]``): chunk c's gradient rows go
    to ``work[b D, e D)``, where its exp values were (``work[b N, e N)``); last chunk first when ``D >= N`` (and the
    block the forward gathered last is used again first), first chunk first when ``D < N``: either way nothing is
    overwritten before it is read. Other heads' chunks (after the own ones) write nothing."""
    indexed = list(enumerate(chunks))
    return list(reversed(indexed)) if dim >= n else indexed


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


class RowSource:
    """One set of class rows: ``weight [C_k, D]`` whole (``index`` None) or at the sorted local ids ``index``; the
    global class id of weight row r is ``first_id + r``. ``task``: the head the rows belong to. ``sink``: for
    another head's rows that learn from this head's samples, ``sink(source, grad [count, D])`` takes their gradient
    (a copy: the buffer it lives in is reused); None: negatives without a gradient of their own. ``host_index``: the
    same ids as a numpy array, when the rows were drawn on the host (a sample), so that who declares them need not read
    the device to name them."""

    def __init__(self, weight, index=None, first_id: int = 0, task: str = "", sink=None, host_index=None):
        self.weight, self.index, self.first_id, self.task = weight, index, int(first_id), task
        self.sink, self.host_index = sink, host_index
        self.count = int(weight.shape[0] if index is None else index.shape[0])

    def local_rows(self):
        """The local weight rows of this source, ``[count]`` int64."""
        return paddle.arange(self.count, dtype="int64") if self.index is None else self.index

    def block(self, begin: int, end: int):
        """Rows ``[begin, end)`` of this source: a view of the weight, or gathered (a copy)."""
        if self.index is None:
            return self.weight[begin:end]
        return paddle.gather(self.weight, self.index[begin:end])

    def local_ids(self, columns):
        """Local weight rows of ``columns`` of this source (non-negative columns)."""
        return columns if self.index is None else paddle.gather(self.index, columns)


class ScoredRows:
    """The class rows of one step (module docstring): ``sources[0]`` the head's own, others after it."""

    def __init__(self, sources: List[RowSource], workspace: Optional[Workspace] = None):
        self.sources = list(sources)
        self.own = self.sources[0]
        self.workspace = workspace
        self.offsets = [0]
        for source in self.sources:
            self.offsets.append(self.offsets[-1] + source.count)
        self.count = self.offsets[-1]
        self.generation = 0

    @property
    def weight(self):
        """The own rows' weight."""
        return self.own.weight

    @property
    def index(self):
        """The own rows' local ids (None: the whole shard)."""
        return self.own.index

    @property
    def own_count(self) -> int:
        """Columns of the own rows (the first ones)."""
        return self.own.count

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

    def chunks(self, width: int = 0):
        """``(begin, end)`` of every block of :func:`chunk_rows` rows (``width``: the blocks' columns, max(N, D)),
        source by source, in column order."""
        size = chunk_rows(width, self.own.weight.place.is_gpu_place())
        return [(offset + b, offset + min(b + size, source.count))
                for source, offset in zip(self.sources, self.offsets) for b in range(0, source.count, size)]

    def source_of(self, begin: int):
        """``(source, its first column)`` of the chunk starting at column ``begin``."""
        for source, offset, end in zip(self.sources, self.offsets, self.offsets[1:]):
            if begin < end:
                return source, offset
        raise IndexError(begin)

    def block(self, begin: int, end: int):
        """Rows of columns ``[begin, end)`` (one source's)."""
        source, offset = self.source_of(begin)
        return source.block(begin - offset, end - offset)

    def is_own(self, begin: int) -> bool:
        """Whether the chunk starting at ``begin`` holds the head's own rows (the top-1 is searched among them)."""
        return begin < self.own_count

    def trainable(self, begin: int) -> bool:
        """Whether the chunk starting at ``begin`` gets gradient rows: the own rows, and other heads' rows that
        learn (a ``sink``)."""
        return begin < self.own_count or self.source_of(begin)[0].sink is not None

    def learning_others(self):
        """``(source, first column)`` of every other head's source that learns."""
        return [(s, o) for s, o in zip(self.sources[1:], self.offsets[1:]) if s.sink is not None]

    def rows(self, columns):
        """The own rows at ``columns`` (the targets), gathered."""
        return paddle.gather(self.own.weight, self.own.local_ids(columns))

    def global_ids(self, columns):
        """Global class ids of own ``columns`` (-1 stays -1)."""
        if self.own_count == 0:
            return paddle.full_like(columns, -1)
        local = self.own.local_ids(paddle.clip(columns, min=0))
        return paddle.where(columns >= 0, local + self.own.first_id, paddle.full_like(columns, -1))
