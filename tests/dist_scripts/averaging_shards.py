"""Each rank averages its shard of a [5, 3] head weight (tests/test_averaging.py compares the concatenated averages
with one process averaging the full weight). Usage: ``python -m paddle.distributed.launch --nproc_per_node 2
averaging_shards.py OUT_DIR``, or ``main(OUT_DIR)`` in a launch of several runs; writes ``OUT_DIR/rank{k}.npy``."""
import os
import sys


def main(out_dir):
    import numpy as np
    import paddle
    import paddle.distributed as dist

    from mtl.parallel.distributed import shard_range
    from mtl.train.averaging import WindowAverage

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    start, count = shard_range(5, world, rank)
    shard = paddle.create_parameter([count, 3], "float32")
    averager = WindowAverage({"head.weight": shard}, 0.15, 3, 8)
    for step in range(25):
        full = np.random.default_rng(step).standard_normal([5, 3]).astype("float32")
        with paddle.no_grad():
            shard.set_value(full[start:start + count])
        averager.step()
    with averager.apply():
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), shard.numpy())
    dist.barrier()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(sys.argv[1])
