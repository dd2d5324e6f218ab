"""From schedule to batches: the global batch of a step depends only on (seed, step); each rank takes its slice.

A task's samples are read in epochs; epoch ``e`` of task ``t`` visits the training set in the order
``RandomState(seed_t + e).permutation(N)``, so global position ``p`` maps to sample ``perm_{p // N}[p % N]``.
The step's sub-batch of task ``t`` covers positions ``[consumed_t(step), consumed_t(step) + n_t)``; rank ``r`` of
``W`` takes rows ``[r * n_t / W, (r + 1) * n_t / W)`` of it, so that the global batch never depends on ``W``. With
gradient accumulation (``schedule.accumulate`` K) the sub-batch is read as K micro-batches of ``m = n_t / K`` rows
(micro-batch k: rows ``[k m, (k + 1) m)``) and rank r takes rows ``[k m + r m / W, k m + (r + 1) m / W)`` of each,
concatenated in micro-batch order: the union over micro-batches and ranks is still the whole sub-batch.
One ``StepDataset`` item is a whole step, collated per task; ``paddle.io.DataLoader(batch_size=None)`` runs it in
worker processes and keeps the steps in order.
"""
import zlib

import numpy as np
import paddle

from mtl.core.errors import ConfigError, DataError, MtlError
from mtl.data.buckets import BucketedOrder
from mtl.data.loader import ERROR_KEY, error_item, error_text, format_fault, make_loader, raise_error_text
from mtl.data.padding import collate_padded
from mtl.data.reading import ReadingBoard

__all__ = ["ERROR_KEY", "StepDataset", "SampleOrder", "check_divisible", "check_labels", "collate", "error_item",
           "error_text", "make_loader", "raise_error_text", "rank_rows", "rank_slice", "task_seed"]


def task_seed(seed: int, task_name: str) -> int:
    """Per-task seed: the job seed mixed with a stable hash of the task name."""
    return (int(seed) * 1_000_003 + zlib.crc32(task_name.encode())) % (2**31 - 1)


class SampleOrder:
    """Maps a task's global read position to a sample index, epoch by epoch (pure function of seed and position)."""

    def __init__(self, size: int, seed: int):
        if size <= 0:
            raise ValueError("a task's training split is empty")
        self.size = int(size)
        self.seed = int(seed)
        self._epoch = None
        self._perm = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.RandomState((self.seed + epoch) % (2**32 - 1)).permutation(self.size)
            self._epoch = epoch
        return self._perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices of positions ``start .. start + count - 1``."""
        out = np.empty(count, dtype=np.int64)
        for j, p in enumerate(range(start, start + count)):
            out[j] = self._permutation(p // self.size)[p % self.size]
        return out

    def epochs(self, start: int, count: int) -> np.ndarray:
        """Epoch of positions ``start .. start + count - 1`` (for readers whose augmentation depends on it)."""
        return np.arange(start, start + count, dtype=np.int64) // self.size


def rank_slice(n: int, world: int, rank: int):
    """Rows of a sub-batch of ``n`` that rank ``rank`` of ``world`` takes (contiguous, equal sizes)."""
    per = n // world
    return slice(rank * per, (rank + 1) * per)


def rank_rows(n: int, world: int, rank: int, accumulate: int = 1):
    """Rows of a sub-batch of ``n`` that rank ``rank`` takes when it is read as ``accumulate`` micro-batches: its
    slice of every micro-batch, in micro-batch order (a slice for one micro-batch, else an index array)."""
    if accumulate == 1:
        return rank_slice(n, world, rank)
    micro = n // accumulate
    part = rank_slice(micro, world, rank)
    return np.concatenate([np.arange(k * micro + part.start, k * micro + part.stop) for k in range(accumulate)])


def _splits_evenly(schedule, world, accumulate=1):
    return all(n % (world * accumulate) == 0 for task in schedule.tasks for n in schedule.possible_sizes(task))


def check_divisible(schedule, world: int, source=None, accumulate: int = 1):
    """Start-up check: every sub-batch size must split evenly into ``accumulate`` micro-batches and each of those
    over ``world`` processes.

    The error names the task and its size, the micro-batch rows every task would get per process, and suggests
    global batch sizes near the current one for which every task's sub-batch (with the same ratios) splits evenly.
    """
    if _splits_evenly(schedule, world, accumulate):
        return
    parts = world * accumulate
    task, n = next((t, n) for t in schedule.tasks for n in schedule.possible_sizes(t) if n % parts)
    total = schedule.batch_size
    candidates = sorted((b for b in range(max(len(schedule.tasks), 1), total + 64 * parts + 1)
                         if _fits(schedule, b, world, accumulate)), key=lambda b: (abs(b - total), b))[:6]
    hint = f"e.g. schedule.batch_size one of {sorted(candidates)}" if candidates else "adjust the task ratios"
    if accumulate == 1:
        raise ConfigError(
            f"task '{task}' gets a sub-batch of {n} samples per step, which does not split evenly over {world} "
            f"processes; every task's sub-batch must be a multiple of {world} ({hint})", source, "schedule.batch_size")
    sizes = ", ".join(f"'{t}' {m} / {accumulate} / {world} = {m / parts:g}" for t in schedule.tasks
                      for m in schedule.possible_sizes(t)[:1])
    raise ConfigError(
        f"task '{task}' gets a sub-batch of {n} samples per step, read as {accumulate} micro-batches "
        f"(schedule.accumulate) of {n / accumulate:g} samples, which do not split evenly over {world} process(es); "
        f"every task's sub-batch must be a multiple of accumulate x processes = {parts} (samples per micro-batch and "
        f"process: {sizes}; {hint})", source, "schedule.batch_size")


def _fits(schedule, batch_size, world, accumulate=1):
    try:
        return _splits_evenly(schedule.with_batch_size(batch_size), world, accumulate)
    except ValueError:  # fewer samples than tasks
        return False


def collate(samples, fields=None):
    """Stack a list of ``{field: array}`` samples into ``{field: [n, ...] array}``, padding the fields of variable
    size with their declared value (``fields``: name -> Field; :mod:`mtl.data.padding`)."""
    return collate_padded(samples, fields)


def sample_order(reader, size: int, seed: int, rows: int, bucket_batches: int, job_seed: int):
    """The read order of one task: plain epochs, or bucketed by length (``bucket_batches`` > 0 and a reader that
    knows its samples' lengths, :meth:`mtl.readers.base.Reader.lengths`)."""
    order = SampleOrder(size, seed)
    lengths = reader.lengths() if bucket_batches > 0 else None
    if lengths is None:
        return order
    return BucketedOrder(order, lengths, rows, bucket_batches, job_seed)


class StepDataset(paddle.io.Dataset):
    """Item ``i`` is the batch of step ``start_step + i`` for this rank: ``{task: {field: array}}``."""

    def __init__(self, schedule, readers: dict, seed: int, start_step: int, end_step: int, world: int = 1,
                 rank: int = 0, label_ranges=None, accumulate: int = 1, bucket_batches: int = 0):
        super().__init__()
        self.accumulate = int(accumulate)  # the step's rows of this rank: its share of each micro-batch, in order
        self.label_ranges = dict(label_ranges or {})  # {task: (field, num_classes)}: labels must be in [0, C)
        self.schedule = schedule
        self.readers = readers
        orders = {}  # by order key: tasks of one key (schedule.same_rows) share one order, bucketed ones too
        for name in readers:
            key = schedule.order_key(name)
            if key not in orders:
                orders[key] = sample_order(readers[key], len(readers[key]), task_seed(seed, key),
                                           schedule.possible_sizes(key)[0], int(bucket_batches), seed)
        self.orders = {name: orders[schedule.order_key(name)] for name in readers}
        self.start_step = int(start_step)
        self.end_step = int(end_step)
        self.world = int(world)
        self.rank = int(rank)
        self.fields = {name: [f.name for f in r.fields()] for name, r in readers.items()}
        self.declared = {name: {f.name: f for f in r.fields()} for name, r in readers.items()}
        self.board = ReadingBoard(readers, readers)  # which sample each reading process is on (the watchdog's)

    def __len__(self):
        return max(0, self.end_step - self.start_step)

    def __getitem__(self, i):
        """The step's batch; any fault (a user error, or an exception in a reader) comes back as an error item
        instead of an exception: raised in a DataLoader worker it would become an unreadable SystemError, and every
        rank must learn of it in the same step (see :mod:`mtl.data.loader`)."""
        step = self.start_step + int(i)
        try:
            batch = self._batch(step)
            self.board.done(step)
            return batch
        except ReaderFault as fault:
            return error_item(fault, fault.details)
        except MtlError as exc:
            return error_item(exc)
        except Exception as exc:  # a bug outside any reader: still one line, traceback in the rank's log
            return error_item(DataError(f"building the batch of step {step + 1} failed: {type(exc).__name__}: "
                                        f"{exc}"), format_fault(exc))

    def _batch(self, step):
        batch = {}
        for task, n in self.schedule.plan(step).items():
            start = self.schedule.consumed(task, step)
            part = rank_rows(n, self.world, self.rank, self.accumulate)
            idx = self.orders[task].indices(start, n)[part]
            if self.readers[task].epoch_aware:  # epoch-aware readers take (index, epoch): random flips per epoch
                keys = [(int(j), int(e)) for j, e in zip(idx, self.orders[task].epochs(start, n)[part])]
            else:
                keys = [int(j) for j in idx]
            batch[task] = collate([self._sample(task, key, step) for key in keys], self.declared[task])
            if task in self.label_ranges:
                check_labels(task, batch[task], *self.label_ranges[task], indices=idx, step=step)
        return batch

    def _sample(self, task, key, step):
        """``reader[key]`` with every declared field; a fault names the task, the reader and the sample."""
        reader = self.readers[task]
        index = key[0] if isinstance(key, tuple) else key
        where = f"task '{task}': reader '{reader.registered_name or type(reader).__name__}', sample {index} " \
                f"(step {step + 1})"
        self.board.mark(step, task, index)
        try:
            sample = reader[key]
        except MtlError as exc:  # the reader's own sentence; its traceback still goes to the rank's log
            raise ReaderFault(f"{where}: {exc}", details=format_fault(exc)) from exc
        except Exception as exc:
            raise ReaderFault(f"{where}: the reader raised {type(exc).__name__}: {exc}",
                              details=format_fault(exc)) from exc
        if not isinstance(sample, dict):
            raise ReaderFault(f"{where}: the reader returned {type(sample).__name__}, expected a dict of arrays "
                              f"with the fields {self.fields[task]}")
        missing = [name for name in self.fields[task] if name not in sample]
        if missing:
            raise ReaderFault(f"{where}: the sample lacks the declared field(s) {missing} (it has "
                              f"{sorted(sample)}); every sample must carry every field of the reader's fields()")
        return sample


class ReaderFault(DataError):
    """A reader failed on one sample: the one-line message, the original traceback (``details``) for the log."""

    def __init__(self, message, details=None):
        super().__init__(message)
        self.details = details


def check_labels(task, batch, field, num_classes, indices=None, step=None, split="training"):
    """Raise DataError when a class label of ``batch[field]`` lies outside ``[0, num_classes)``."""
    labels = np.asarray(batch[field]).reshape(len(batch[field]), -1)[:, 0]
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if len(bad):
        j = int(bad[0])
        row = f"sample {int(indices[j])}" if indices is not None else f"row {j}"
        where = f"{row} of the {split} split"
        when = f" (step {step})" if step is not None else ""
        raise DataError(f"task '{task}': {where}{when} has {field} {labels[j]}, outside [0, {num_classes}) of its "
                        f"head; fix the data or the head's num_classes")


def eval_count(reader, max_samples=None) -> int:
    """How many samples of the split an evaluation reads: all, or the first ``max_samples``."""
    return len(reader) if max_samples is None else min(len(reader), int(max_samples))


def length_order(reader, max_samples=None):
    """The evaluation's sample indices shortest first (ties in sample order), for a reader that knows its samples'
    lengths (:meth:`mtl.readers.base.Reader.lengths`; text); None for the others. A batch of texts is padded to its
    longest one, and an LSTM or attention costs ``rows x longest``: on the genre dev split of
    ``examples/configs/palm_classify.yaml`` (1000 texts, 13 pieces at the median, 111 at most) batches of 256 in
    sample order cost 93,840 piece positions, in this order 37,272 (17,471 are real pieces)."""
    lengths = reader.lengths()
    if lengths is None:
        return None
    n = eval_count(reader, max_samples)
    return np.argsort(np.asarray(lengths)[:n], kind="stable")


def iterate_eval(reader, batch_size: int, max_samples=None, order=None):
    """Batches ``{field: array}`` of a whole evaluation split (no shuffling, no rank slicing): in sample order, or
    in ``order`` (the split's sample indices, e.g. :func:`length_order`)."""
    n = eval_count(reader, max_samples)
    indices = range(n) if order is None else order
    def fields():  # asked for only when a batch needs padding
        return {f.name: f for f in reader.fields()}

    for start in range(0, n, batch_size):
        yield collate([reader[int(i)] for i in indices[start:start + batch_size]], fields)
