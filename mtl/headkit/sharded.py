"""Class-sharded heads (model parallel): the balanced class split, a deterministic initialisation, global top-k.

Sharding: rank k of W holds the rows of classes ``[s_k, s_k + C_k)`` (``mtl.parallel.distributed.shard_range``) of
the class weight, a parameter of shape ``[C_k, D]`` (one row per class, so that Partial FC can gather rows) marked
``is_distributed``. Initial rows are drawn per block of ``INIT_BLOCK`` classes from a generator seeded by
``(seed, block)``: the concatenated shards equal the world-1 initialisation for any world size, and each rank
draws only the blocks its range touches. Every head gathers the rows of all ranks itself
(``mtl.parallel.collective.gather_batch``) and scores them against its own shard.
"""
import numpy as np
import paddle

from mtl.core.arrays import to_numpy
from mtl.core.errors import ParameterError
from mtl.headkit.base import Head
from mtl.parallel import collective, distributed
from mtl.parallel.topk import sharded_topk

INIT_BLOCK = 4096
INIT_STD = 0.01
INIT_WRITE_ROWS = INIT_BLOCK  # rows drawn and written at a time while building a shard (transients of ~2 MB)
EVAL_CHUNK_ELEMENTS = 1 << 24  # scores per evaluation chunk and rank (64 MiB in float32)


def initial_class_rows(num_classes: int, dim: int, seed: int, start: int, count: int, std: float = INIT_STD):
    """Rows ``[start, start + count)`` of the ``[num_classes, dim]`` initial weight ~ N(0, std^2), float32.

    Row block b (classes ``[b * INIT_BLOCK, (b + 1) * INIT_BLOCK)``) is the prefix of
    ``default_rng([seed, b]).standard_normal``; the result does not depend on how the rows are split.
    """
    if start < 0 or count < 0 or start + count > num_classes:
        raise ValueError(f"rows [{start}, {start + count}) are outside [0, {num_classes})")
    rows = np.empty((count, dim), dtype=np.float32)
    end = start + count
    done = start
    while done < end:
        block = done // INIT_BLOCK
        block_start = block * INIT_BLOCK
        block_end = min(end, block_start + INIT_BLOCK)
        drawn = np.random.default_rng([int(seed), block]).standard_normal((block_end - block_start, dim),
                                                                        dtype=np.float32)
        rows[done - start:block_end - start] = drawn[done - block_start:]
        done = block_end
    return rows * np.float32(std)


def sample_classes_globally(positives, num_classes: int, count: int, seed: int, step: int) -> np.ndarray:
    """Partial FC's class sample of one step: sorted global ids, every positive plus random negatives, ``count`` in all.

    Drawn over all ``num_classes`` classes from ``default_rng([seed, step])`` alone, so the set does not depend on
    the process count: each rank keeps the ids of its own range (:func:`shard_of_sample`). ``count`` is raised to
    the number of distinct ``positives`` if they outnumber it. The m = count - P negatives are the first m distinct
    non-positive values of a stream of uniform integers in ``[0, C)`` (a uniformly random m-subset of the C - P
    negatives), drawn in batches sized to the expected acceptance rate: memory and work are O(count), never O(C).
    When m exceeds half the negatives, the C - P - m excluded ones are drawn that way instead (then count >= C / 2,
    so the final O(C) mask is O(count)).
    """
    positives = np.unique(np.asarray(positives, dtype=np.int64))
    count = max(int(count), len(positives))
    pool = num_classes - len(positives)  # negatives to choose from
    wanted = min(count - len(positives), pool)
    rng = np.random.default_rng([int(seed), int(step)])
    if wanted <= pool // 2:
        negatives = _distinct_negatives(rng, num_classes, positives, wanted)
    else:
        keep = np.ones(num_classes, dtype=bool)
        keep[positives] = False
        keep[_distinct_negatives(rng, num_classes, positives, pool - wanted)] = False
        negatives = np.flatnonzero(keep)
    return np.sort(np.concatenate([positives, negatives]))


def _distinct_negatives(rng, num_classes: int, positives: np.ndarray, wanted: int) -> np.ndarray:
    """The first ``wanted`` distinct values of ``rng.integers(0, num_classes)`` draws that are not ``positives``."""
    taken = np.zeros(0, dtype=np.int64)
    while len(taken) < wanted:
        free = num_classes - len(positives) - len(taken)
        batch = int((wanted - len(taken)) * num_classes / free * 1.1) + 16  # expected draws for the rest, +10 %
        stream = np.concatenate([taken, rng.integers(0, num_classes, size=batch, dtype=np.int64)])
        first = np.sort(np.unique(stream, return_index=True)[1])  # first occurrences, in draw order
        stream = stream[first]
        if len(positives):
            stream = stream[~np.isin(stream, positives, assume_unique=True)]
        taken = stream[:wanted]
    return taken


def shard_of_sample(sampled: np.ndarray, shard_start: int, shard_size: int) -> np.ndarray:
    """Local row ids (sorted) of the sampled global ids that fall in the shard ``[shard_start, +shard_size)``."""
    low, high = np.searchsorted(sampled, [shard_start, shard_start + shard_size])
    return sampled[low:high] - shard_start


def positive_int(value, name: str) -> int:
    """``value`` as an int >= 1, or a ValueError naming the parameter."""
    if value is None or isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ParameterError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


class ShardedClassHead(Head):
    """Base of heads whose class weight is split by class across ranks (model parallel)."""

    sharded = True

    def __init__(self, num_classes, feature_size, label_field="label", seed=0):
        if feature_size is None:
            raise ParameterError("feature_size is not set (the runner passes the backbone's feature size)")
        super().__init__(positive_int(feature_size, "feature_size"), label_field)
        self.num_classes = positive_int(num_classes, "num_classes")
        if isinstance(seed, bool) or int(seed) != seed or int(seed) < 0:
            raise ParameterError(f"seed must be an integer >= 0, got {seed!r}")
        self.seed = int(seed)
        self.world_size = distributed.world_size()
        self.rank = distributed.rank()
        self.shard_start, self.shard_size = distributed.shard_range(self.num_classes, self.world_size, self.rank)
        # zero-filled, then written in place block by block: Paddle 3.3's Assign initializer turns the array into a
        # Python list of floats (1M x 128 classes: 52 s and a 15 GB peak), and one set_value of the whole array
        # peaks at ~3x the weight; by blocks the build peaks at the weight plus INIT_WRITE_ROWS rows
        self.weight = self.create_parameter(
            [self.shard_size, self.feature_size], dtype=paddle.get_default_dtype(),
            default_initializer=paddle.nn.initializer.Constant(0.0),
        )
        self._write_initial_rows()
        self.weight.is_distributed = True

    @property
    def class_ids(self) -> paddle.Tensor:
        """Global ids ``[C_k]`` of this shard's classes (made when asked: 8 bytes per class not kept at 20M)."""
        return paddle.arange(self.shard_start, self.shard_start + self.shard_size, dtype="int64")

    @classmethod
    def step_bytes(cls, options: dict, shard: int, global_rows: int, dim: int, item: int) -> dict:
        """Memory of one training step: the dense ``[C_k, D]`` gradient, the ``[N, C_k]`` logits and the softmax
        buffer that becomes their gradient (``mtl.headkit.chunked_softmax``)."""
        return {"gradient": shard * dim * item, "logits and their gradient": 2 * global_rows * shard * item}

    @classmethod
    def planned_bytes(cls, options, global_rows, world_size, rank, optimizer_slots, accumulate=1):
        """Per process: the ``[C_k, D]`` weight, its optimizer state and :meth:`step_bytes`; ``{}`` when the options
        lack a size (the constructor will say so)."""
        try:
            classes = positive_int(options.get("num_classes"), "num_classes")
            dim = positive_int(options.get("feature_size"), "feature_size")
        except (TypeError, ValueError):
            return {}
        item = np.dtype(paddle.get_default_dtype()).itemsize
        shard = distributed.shard_range(classes, world_size, rank)[1]
        plan = {"weight": shard * dim * item, "optimizer state": optimizer_slots * shard * dim * item}
        plan.update(cls.step_bytes(options, shard, global_rows, dim, item))
        return plan

    @paddle.no_grad()
    def _write_initial_rows(self):
        """Fill this shard's weight with :func:`initial_class_rows`, ``INIT_WRITE_ROWS`` rows at a time, in place."""
        for begin in range(0, self.shard_size, INIT_WRITE_ROWS):
            count = min(INIT_WRITE_ROWS, self.shard_size - begin)
            rows = initial_class_rows(self.num_classes, self.feature_size, self.seed, self.shard_start + begin, count)
            self.weight[begin:begin + count] = paddle.to_tensor(rows, dtype=self.weight.dtype)

    def class_count(self):
        """The head's class count: its labels are class ids in ``[0, num_classes)``."""
        return self.num_classes

    def gather_batch(self, features, labels):
        """Rows and int64 labels of every rank, in rank order (features differentiable; one all-gather, and no
        exchange of row counts when :attr:`equal_rows`)."""
        if not isinstance(labels, paddle.Tensor):
            labels = paddle.to_tensor(np.asarray(labels))
        return collective.gather_batch(features, labels, self.equal_rows)

    def shard_logits(self, features: paddle.Tensor) -> paddle.Tensor:  # pragma: no cover - abstract
        """Scores ``[N, C_k]`` of this shard's classes for ``features [N, D]`` (used by evaluation)."""
        raise NotImplementedError

    def topk_metrics(self, logits, labels, k: int):
        """Top-1 (and top-k if k > 1) accuracy of the global batch as tensors; one collective."""
        ids = sharded_topk(logits.detach(), self.class_ids, k)
        hits = (ids == labels.unsqueeze(1)).astype("float32")
        metrics = {"accuracy": hits[:, 0].mean()}
        if 1 < k < self.num_classes:
            metrics[f"top{k}_accuracy"] = hits.max(axis=1).mean()
        return metrics

    def predict_topk(self, features, k: int) -> np.ndarray:
        """Global class ids ``[M, k]`` of the best scores over all shards; ``features`` equal on every rank.

        Rows go in chunks of at most ``EVAL_CHUNK_ELEMENTS / ceil(C / W)`` so a chunk's scores stay small; the
        chunk size depends only on (C, W), so every rank issues the same number of collectives.
        """
        feats = to_numpy(features).astype(paddle.get_default_dtype())
        widest_shard = -(-self.num_classes // self.world_size)
        chunk_rows = max(1, min(4096, EVAL_CHUNK_ELEMENTS // widest_shard))
        out = []
        with paddle.no_grad():
            for begin in range(0, feats.shape[0], chunk_rows):
                logits = self.shard_logits(paddle.to_tensor(feats[begin:begin + chunk_rows]))
                out.append(sharded_topk(logits, self.class_ids, k).numpy())
        return np.concatenate(out) if out else np.zeros((0, k), dtype=np.int64)
