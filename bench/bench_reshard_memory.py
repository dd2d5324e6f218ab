"""Peak memory of a resume at another process count: a 1M-class head written by 4 processes, read by rank 0 of 2.

    python bench/bench_reshard_memory.py [--classes 1000000] [--dim 128] [--saved 4] [--world 2]

Writes a checkpoint folder as the trainer lays it out (the head's 4 shards, each rank's optimizer file with the
shard's momentum velocity and a small replicated part), then, each in a fresh process so that the peaks do not mix,
reads rank 0's new shard and optimizer state two ways and prints each one's peak resident memory (``ru_maxrss``) and
the ratio:

* ``streamed``: ``mtl.store.reshard`` as the trainer calls it: only the saved ranks holding rank 0's rows, one file
  at a time, keeping the overlapping rows;
* ``all files``: the way it was read before (every shard and every rank's optimizer file loaded, concatenated into
  the full head, then cut), written out here as the baseline.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def write_checkpoint(folder, classes, dim, saved):
    """A checkpoint of one sharded head ``ids`` over ``saved`` ranks (weights, momentum velocities), as paddle.save
    writes it."""
    import paddle

    from mtl.parallel.distributed import shard_range

    os.makedirs(os.path.join(folder, "heads"))
    rng = np.random.default_rng(0)
    for k in range(saved):
        _, count = shard_range(classes, saved, k)
        paddle.save({"weight": rng.standard_normal((count, dim), dtype=np.float32)},
                    os.path.join(folder, "heads", f"ids.shard{k}of{saved}.pdparams"))
        paddle.save({"heads.ids.weight::velocity_0": rng.standard_normal((count, dim), dtype=np.float32),
                     "backbone.body.0.weight::velocity_0": np.zeros((64, 3, 3, 3), np.float32),
                     "LR_Scheduler": {"last_epoch": 10, "last_lr": 0.1}},
                    os.path.join(folder, f"optimizer.rank{k}.pdopt"))
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"step": 10, "world_size": saved}, f)


def read_streamed(folder, classes, saved, world):
    from mtl.store import reshard

    head = reshard.head_state(folder, "ids", saved, world, 0, total=classes)
    state = reshard.rank_state(folder, saved, world, 0, {"ids": classes})
    return head["weight"].shape, state["optimizer"]["heads.ids.weight::velocity_0"].shape


def read_all_files(folder, classes, saved, world):
    """The earlier way: every saved rank's files loaded, the full arrays assembled, then rank 0's block cut."""
    from mtl.core.safe_pickle import load_paddle_file
    from mtl.parallel.distributed import shard_range

    start, count = shard_range(classes, world, 0)
    shards = [load_paddle_file(os.path.join(folder, "heads", f"ids.shard{k}of{saved}.pdparams")) for k in range(saved)]
    weight = np.concatenate([s["weight"] for s in shards])[start:start + count]
    optimizers = [load_paddle_file(os.path.join(folder, f"optimizer.rank{k}.pdopt")) for k in range(saved)]
    velocity = np.concatenate([o["heads.ids.weight::velocity_0"] for o in optimizers])[start:start + count]
    return weight.shape, velocity.shape


def child(args):
    """In a fresh process: read rank 0's state one way, print its peak memory."""
    started = time.perf_counter()
    shapes = {"streamed": read_streamed, "all_files": read_all_files}[args.child](args.folder, args.classes,
                                                                                 args.saved, args.world)
    print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "seconds": time.perf_counter() - started, "shapes": [list(s) for s in shapes]}))


def measure(kind, folder, args):
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--folder", folder, "--classes",
                          str(args.classes), "--saved", str(args.saved), "--world", str(args.world)],
                         capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--saved", type=int, default=4)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--child", choices=["streamed", "all_files"])
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory(prefix="mtl_reshard_bench_") as root:
        folder = os.path.join(root, "step_10")
        write_checkpoint(folder, args.classes, args.dim, args.saved)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs) / 2 ** 20
        results = {kind: measure(kind, folder, args) for kind in ("all_files", "streamed")}
    assert results["streamed"]["shapes"] == results["all_files"]["shapes"]
    print(f"checkpoint: {args.classes} classes x {args.dim}, {args.saved} processes, {size:.0f} MiB on disk; "
          f"rank 0 of {args.world} reads its shard and optimizer state")
    for kind, r in results.items():
        print(f"  {kind:9s}: peak {r['peak_mib']:7.0f} MiB, {r['seconds']:.2f} s")
    print(f"ratio streamed / all files: {results['streamed']['peak_mib'] / results['all_files']['peak_mib']:.2f}")


if __name__ == "__main__":
    main()
