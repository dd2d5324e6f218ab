"""The best classes over every shard (model-parallel heads): top-k by one all-gather, top-1 by votes.

Two forms of one question. ``sharded_topk`` (evaluation, the softmax head's metrics): each rank's local top-k
candidates, one all-gather, every rank merges them. ``top1_votes`` / ``top1_from_votes`` (the margin heads' training
step): the top-1 settled inside the all-reduces the softmax already makes, with ``sharded_top1`` (k = 1 by
all-gather) as the tie-break fallback. Ties go to the lower rank in both, as a single-process argmax decides.
"""
import paddle
import paddle.distributed as dist

from mtl.parallel import distributed
from mtl.parallel.collective import pack_ids, unpack_ids


def sharded_topk(logits: paddle.Tensor, class_ids: paddle.Tensor, k: int) -> paddle.Tensor:
    """Global class ids ``[N, k]`` of the k largest logits over every shard (no gradient).

    ``class_ids [C_k]`` are the global ids of this shard's columns; ``k`` must not exceed the total class count.
    Each rank takes its local top-k, pads with -inf to k, and one all-gather of (value, id) pairs in float64
    (ids exact up to 2**53) lets every rank merge the candidates of all ranks.
    """
    with paddle.no_grad():
        n, c = logits.shape
        if int(k) == 1:  # max + argmax (several times faster than topk on a wide row), then the top-1 merge
            if c == 0:  # a rank without classes takes part in the same all-gather with empty candidates
                best, ids = paddle.full([n], float("-inf"), dtype="float64"), paddle.full([n], -1, dtype="int64")
            else:
                best = logits.max(axis=1)
                ids = paddle.gather(class_ids.astype("int64"), logits.argmax(axis=1))
            return sharded_top1(best, ids).unsqueeze(1)
        local_k = min(int(k), c)
        values = paddle.full([n, k], float("-inf"), dtype="float64")
        ids = paddle.full([n, k], -1.0, dtype="float64")
        if local_k > 0:
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


FLOAT32_MAX = float(3.4028234663852886e38)
KEY_STEP = 2.0 ** -48  # per rank, relative: below half of float32's spacing (2**-24 relative) for up to 2**23 ranks
KEY_FLOOR = 2.0 ** -126  # the magnitude the step is taken of near zero (float32's denormals are 2**-149 apart)


def rank_key(scores: paddle.Tensor, rank: int) -> paddle.Tensor:
    """float64 keys of float32 ``scores`` whose MAX over ranks is the best score and, among equal scores, the lowest
    rank's: ``s - rank * 2**-48 * max(|s|, 2**-126)`` (``s`` clipped to float32's range, so that -inf ranks too).

    Two different float32 scores lie at least 2**-24 (relative) or 2**-149 apart, more than any rank's offset, so
    the keys keep their order; equal scores get keys that fall strictly with the rank (float64 rounds at 2**-53).
    Every rank's key then differs from every other's, and exactly one rank holds the MAX (none for a NaN score):
    the votes need no tie-break, no host read and no all-gather. NaN stays NaN.
    """
    s = paddle.clip(scores.astype("float64"), -FLOAT32_MAX, FLOAT32_MAX)
    return s - (int(rank) * KEY_STEP) * paddle.maximum(paddle.abs(s), paddle.full_like(s, KEY_FLOOR))


def top1_votes(best: paddle.Tensor, global_best: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
    """This rank's rows of the SUM all-reduce that settles the global top-1 without an all-gather of its own:
    ``[3, N]`` = (hi, lo, 1) of its best id (:func:`pack_ids`) where its best score equals ``global_best`` (the
    scores' all-reduce MAX, folded into the softmax's), else zeros. Summed over ranks, a row with one voter holds
    that rank's id exactly; see :func:`top1_from_votes`. With :func:`rank_key` scores only one rank votes."""
    mine = (best == global_best).astype(best.dtype)
    return paddle.concat([pack_ids(ids, best.dtype).T * mine, mine.unsqueeze(0)], axis=0)


def top1_from_votes(votes: paddle.Tensor, best: paddle.Tensor, ids: paddle.Tensor,
                    exclusive: bool = False) -> paddle.Tensor:
    """Global top-1 ids ``[N]`` from the summed :func:`top1_votes`: the one voter's id. Where ranks tie on the best
    score, the lowest rank's, as :func:`sharded_top1` decides (one host read to find ties, then one all-gather,
    taken by every rank alike since the sums are equal everywhere); ``exclusive`` (the votes of :func:`rank_key`
    scores, which cannot tie): neither. -1 where no rank voted (a NaN score)."""
    count = votes[2]
    tied = not exclusive and distributed.is_distributed() and bool((count > 1).any())
    predicted = sharded_top1(best, ids) if tied else unpack_ids(votes[:2].T, check=False)
    return paddle.where(count > 0, predicted, paddle.full_like(ids, -1))


def top1_across_shards(best: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
    """Global top-1 class ids ``[N]`` from each rank's best scores ``[N]`` and their global ``ids`` (ties to the
    lowest rank, as one argmax over all classes): one MAX all-reduce of :func:`rank_key` scores and one SUM of the
    winners' votes; the margin head's training accuracy, outside its loss."""
    if not distributed.is_distributed():
        return ids
    with paddle.no_grad():
        keyed = best.dtype == paddle.float32
        score = rank_key(best, distributed.rank()) if keyed else best
        winner = distributed.all_reduce_max(score)
        votes = distributed.all_reduce_sum(top1_votes(score, winner, ids))
        return top1_from_votes(votes, best, ids, keyed)
