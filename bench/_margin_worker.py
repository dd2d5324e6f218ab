"""Worker of ``bench/bench_margin_head.py``: time the ``arcface`` head's training step in this process.

One process (no launcher) or one rank of ``python -m paddle.distributed.launch``. Every rank builds the same global
batch (``batch`` rows of ``dim`` features, labels uniform over C, from ``--seed``) and takes its contiguous slice;
the head (``heads.arcface.ArcFaceHead`` through the registry) holds this rank's ``C_k`` class centres. A step is
forward + backward + one momentum update + clearing the gradients; each step starts after a barrier, and the loss is
read on the host inside the timed region. Memory (KiB, host RSS):
  ``baseline``   = VmRSS after ``import paddle``, the process group and the inputs;
  ``build_peak`` = peak RSS while the head and optimizer were built;
  ``peak``       = peak RSS over the steps (the peak is reset after the build through ``/proc/self/clear_refs``,
                   so the construction's transient copies do not count; without that file it includes them).
The head's own cost is ``peak - baseline``. Prints one line ``MARGIN_BENCH {json}``.

With Partial FC (``--sample-ratio`` < 1) the step includes the head's own row-sparse update of the sampled rows.
``--device-passes``: run the head's chunk passes and the row-sparse update in Paddle ops even on CPU (the GPU path;
``bench/bench_host_passes.py`` compares the two).
"""
import argparse
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MARKER = "MARGIN_BENCH "


def resident_kib(field: str = "VmRSS") -> int:
    """A field of /proc/self/status in KiB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_kib() -> int:
    """Peak resident set of this process in KiB (``ru_maxrss`` is KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def reset_peak() -> bool:
    """Reset the peak-RSS counter (Linux >= 4.0: write 5 to /proc/self/clear_refs); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def run(args):
    """Build the head, run ``warmup + steps`` steps and return the measurements."""
    from mtl.core.runtime import tune_malloc

    tune_malloc()  # as `mtl train` does before Paddle allocates anything
    import numpy as np
    import paddle

    from mtl.core import arrays, registry
    from mtl.core.runtime import init_distributed, select_device
    from mtl.optimizer.sparse import RowSparseOptimizer
    from mtl.parallel import distributed

    arrays.HOST_PATHS = not args.device_passes
    device = select_device("auto")
    rank, world = init_distributed()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split over {world} processes")
    rng = np.random.default_rng(args.seed)
    features = rng.standard_normal((args.batch, args.dim), dtype=np.float32)
    labels = rng.integers(0, args.classes, size=args.batch)
    rows = args.batch // world
    x = paddle.to_tensor(features[rank * rows:(rank + 1) * rows], stop_gradient=False)
    y = paddle.to_tensor(labels[rank * rows:(rank + 1) * rows])
    registry.load_builtin()
    baseline = resident_kib()

    start = time.perf_counter()
    head = registry.build("head", {"type": "arcface", "num_classes": args.classes,
                                   "sample_ratio": args.sample_ratio}, feature_size=args.dim)
    head.equal_rows = True  # as in the joint model: every rank passes the same rows (no exchange of row counts)
    optimizer = paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=head.parameters())
    build_s = time.perf_counter() - start
    build_peak = peak_kib()
    after_build = resident_kib()
    peak_was_reset = reset_peak()

    times, losses = [], []
    sparse = RowSparseOptimizer({"type": "momentum", "momentum": 0.9, "weight_decay": 0.0})
    for step in range(args.warmup + args.steps):
        distributed.barrier()
        start = time.perf_counter()
        out = head(x, y, step)
        out.loss.backward()
        optimizer.step()
        sparse.step(out.rows, 0.1)  # Partial FC: the sampled rows and their momentum
        optimizer.clear_grad()
        x.clear_gradient()
        losses.append(float(out.loss))
        times.append(time.perf_counter() - start)
    result = {
        "rank": rank, "world": world, "device": device, "classes": args.classes, "shard": head.shard_size,
        "sample_ratio": args.sample_ratio, "threads": os.environ.get("OMP_NUM_THREADS", ""),
        "warmup": args.warmup, "times": times[args.warmup:], "loss0": losses[0] if losses else None, "build_s": build_s,
        "baseline_kib": baseline, "after_build_kib": after_build, "build_peak_kib": build_peak,
        "peak_kib": peak_kib(), "peak_was_reset": peak_was_reset,
    }
    if device.startswith("gpu"):
        result["gpu_peak_bytes"] = int(paddle.device.cuda.max_memory_allocated())
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, required=True)
    parser.add_argument("--sample-ratio", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=128, help="global batch rows")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device-passes", action="store_true", help="Paddle ops for the chunk passes on CPU too")
    args = parser.parse_args(argv)
    print(MARKER + json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
