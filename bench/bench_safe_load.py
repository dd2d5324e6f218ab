"""The safe reader against ``paddle.load``: the time to read a head checkpoint's files, measured in one run.

A 100k-class ArcFace head's weight [100000, 128] and its momentum (what ``heads/<task>.shard0of1.pdparams`` and the
optimizer file hold) are written with ``paddle.save`` into a temporary folder, then read ``--rounds`` times each way,
alternating: :func:`mtl.core.safe_pickle.load_paddle_file` (numpy arrays, no code from the file) and ``paddle.load``
(the reference; these files are the benchmark's own). Printed: the median time of each and the ratio safe / paddle.

    .venv/bin/python bench/bench_safe_load.py [--classes 100000] [--dim 128] [--rounds 7]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import paddle

    from mtl.core.safe_pickle import load_paddle_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench_safe_load_")
    weight = np.random.RandomState(0).randn(args.classes, args.dim).astype(np.float32)
    paths = [os.path.join(folder, "head.pdparams"), os.path.join(folder, "optimizer.pdopt")]
    paddle.save({"weight": paddle.to_tensor(weight)}, paths[0])
    paddle.save({"weight_velocity_0": paddle.to_tensor(weight * 0.1), "LR_Scheduler": {"last_epoch": 3}}, paths[1])
    readers = {"safe": lambda p: load_paddle_file(p), "paddle.load": lambda p: paddle.load(p)}
    times = {name: [] for name in readers}
    for round_ in range(args.rounds):
        for name in (list(readers) if round_ % 2 == 0 else list(reversed(readers))):
            started = time.perf_counter()
            states = [readers[name](p) for p in paths]
            times[name].append(time.perf_counter() - started)
            assert np.array_equal(np.asarray(states[0]["weight"]), weight)
    safe, ref = statistics.median(times["safe"]), statistics.median(times["paddle.load"])
    size = sum(os.path.getsize(p) for p in paths) / 2 ** 20
    print(f"{args.classes} x {args.dim} head + momentum ({size:.0f} MiB), median of {args.rounds}: safe reader "
          f"{safe:.3f} s, paddle.load {ref:.3f} s, ratio {safe / ref:.2f}")


if __name__ == "__main__":
    main()
