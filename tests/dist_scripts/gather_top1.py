"""Two ranks: the batch gather (labels travelling as float columns of the features) and the top-1 settled by votes.

Usage: ``python -m paddle.distributed.launch --nproc_per_node 2 gather_top1.py OUT_DIR [--huge | --mismatch]``, or
``main(OUT_DIR[, FLAG])`` in a launch of several runs; writes ``OUT_DIR/rank{k}.npz``, which
``tests/test_gather_top1.py`` checks against numpy. With ``--mismatch`` the ranks pass 3 and 5 rows while claiming
equal rows, which must fail; with ``--huge`` one rank passes a label out of range.
"""
import os
import sys

import numpy as np

FEATURES = np.arange(8 * 5, dtype=np.float32).reshape(8, 5) / 7.0
# ids past float32's 2**24, negative ids and the largest allowed magnitude must all arrive exactly
LABELS = np.array([0, 3, 2 ** 24 + 1, 20_000_123, -1, -4097, 2 ** 35 - 1, -(2 ** 35 - 1)], dtype=np.int64)
WEIGHTS = np.linspace(-1.0, 1.0, 8 * 5, dtype=np.float32).reshape(8, 5)  # d(sum(X * WEIGHTS)) / dX
SPLITS = {"equal": [0, 4, 8], "uneven": [0, 3, 8]}
# per rank: best scores and their global ids; row 0 ties (the lower rank must win), row 3 is NaN on both ranks
BEST = [np.array([1.0, 2.0, 3.0, np.nan, -np.inf], np.float32), np.array([1.0, 5.0, 0.5, np.nan, 0.0], np.float32)]
IDS = [np.array([10, 20, 2 ** 30 + 1, 7, -1], np.int64), np.array([11, 21, 31, 8, 2 ** 25 + 3], np.int64)]


def main(out_dir, *flags):
    import paddle
    import paddle.distributed as dist

    from mtl.parallel import collective, distributed, topk

    dist.init_parallel_env()
    rank = dist.get_rank()
    if "--mismatch" in flags:
        rows = 3 if rank == 0 else 5
        collective.gather_batch(paddle.ones([rows, 4]), paddle.arange(rows), equal_rows=True)
        print(f"rank {rank} gathered unequal rows without noticing", flush=True)
        return
    if "--huge" in flags:  # rank 1 alone holds a label out of range: both ranks must refuse, neither may hang
        labels = paddle.to_tensor([0, 2 ** 35 if rank else 1])
        try:
            collective.gather_batch(paddle.ones([2, 4]), labels, equal_rows=True)
        except ValueError as exc:
            print(f"rank {rank} refused: {exc}", flush=True)
        return
    out = {}
    for name, bounds in SPLITS.items():
        begin, end = bounds[rank], bounds[rank + 1]
        x = paddle.to_tensor(FEATURES[begin:end], stop_gradient=False)
        gathered, labels = collective.gather_batch(x, paddle.to_tensor(LABELS[begin:end]), equal_rows=name == "equal")
        (gathered * paddle.to_tensor(WEIGHTS)).sum().backward()
        out.update({f"{name}/features": gathered.numpy(), f"{name}/labels": labels.numpy(),
                    f"{name}/grad": x.grad.numpy(), f"{name}/labels_stop_gradient": np.array(labels.stop_gradient)})
    best, ids = paddle.to_tensor(BEST[rank]), paddle.to_tensor(IDS[rank])
    peak = distributed.all_reduce_max(best)
    votes = distributed.all_reduce_sum(topk.top1_votes(best, peak, ids))
    out["top1"] = topk.top1_from_votes(votes, best, ids).numpy()
    out["top1_no_tie"] = topk.top1_from_votes(votes[:, 1:3], best[1:3], ids[1:3]).numpy()
    keys = topk.rank_key(best, rank)  # the margin heads' form: float64 rank keys, one voter per row, no tie-break
    keyed = distributed.all_reduce_sum(topk.top1_votes(keys, distributed.all_reduce_max(keys), ids))
    out["top1_keyed"] = topk.top1_from_votes(keyed, best, ids, exclusive=True).numpy()
    out["keyed_voters"] = keyed[2].numpy()
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **out)
    print(f"rank {rank} saved", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
