"""Length-bucketed sample order: the sentences of a step have similar lengths, so padding wastes little.

Positions of a task are cut into buckets of ``batches * rows`` (``rows``: the task's sub-batch of one step). A
bucket's samples are those the plain order (:class:`mtl.data.steps.SampleOrder`) puts there, sorted by length (a
stable sort: equal lengths keep their random order); its ``batches`` runs of ``rows`` are then visited in an order
drawn from ``RandomState(job seed, bucket)``: the same for every task of a job, so that in joint mode every task
reads the same length quantile at a step and their sub-batches concatenate with little padding. The order stays a
pure function of (seed, position): a resumed run and every process count read the same samples.
"""
import numpy as np


class BucketedOrder:
    """A task's positions -> sample indices, bucketed by length (same interface as ``SampleOrder``)."""

    def __init__(self, base, lengths, rows: int, batches: int, job_seed: int):
        self.base = base  # the plain order: its epochs and permutations
        self.size = base.size
        self.lengths = np.asarray(lengths, np.int64)
        if len(self.lengths) != self.size:
            raise ValueError(f"{len(self.lengths)} lengths for {self.size} samples")
        self.rows, self.batches, self.job_seed = int(rows), int(batches), int(job_seed)
        self.span = self.rows * self.batches
        self._cache = {}

    def _bucket(self, bucket: int) -> np.ndarray:
        """The plain positions of one bucket, in bucketed order."""
        if bucket not in self._cache:
            first = bucket * self.span
            plain = self.base.indices(first, self.span)
            ranked = np.argsort(self.lengths[plain], kind="stable")
            runs = ranked.reshape(self.batches, self.rows)
            visit = np.random.RandomState((self.job_seed * 7919 + bucket) % (2**32 - 1)).permutation(self.batches)
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[bucket] = first + runs[visit].reshape(-1)
        return self._cache[bucket]

    def _plain_positions(self, start: int, count: int) -> np.ndarray:
        return np.array([self._bucket(p // self.span)[p % self.span] for p in range(start, start + count)],
                        dtype=np.int64)

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices of positions ``start .. start + count - 1``."""
        return np.array([self.base.indices(int(p), 1)[0] for p in self._plain_positions(start, count)],
                        dtype=np.int64)

    def epochs(self, start: int, count: int) -> np.ndarray:
        """Epoch of each position: that of the plain position its sample came from (a bucket may straddle two)."""
        return self._plain_positions(start, count) // self.size
