"""numpy's BLAS threads beside Paddle's: one joint training step on the CPU at 1 BLAS thread against as many as
Paddle's pool (``blas_threads``, ``mtl.core.runtime.set_threads``).

The job is ``bench_overhead.py``'s (a CNN, two ArcFace heads of C and C/2 classes, a softmax head; batch 192) at
several C. The ArcFace heads' chunk passes run in numpy on the CPU (``mtl/headkit/host_chunks.py``), the rest in
Paddle ops, whose OpenMP threads spin for a while after each op. Each setting runs in a fresh process (the thread
counts are read when the libraries load), the settings alternate over the rounds, and the table gives the median
step of each and their ratio (above 1: the single BLAS thread is faster).

    .venv/bin/python bench/bench_threads.py [--rounds 2] [--steps 12] [--full | --quick]

``--full`` adds 1,000,000 classes of full softmax (about 3 s a step, 2.5 GB); ``--quick`` runs 40 classes only.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
from tabulate import tabulate

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [(40, 1.0), (2000, 1.0), (100_000, 1.0), (1_000_000, 0.1)]
FULL = [(1_000_000, 1.0)]


def worker(classes: int, sample_ratio: float, steps: int):
    """Print the median step (s) of ``train_step`` on one fixed batch after 2 warm-up steps."""
    import tempfile
    import time

    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    from bench_overhead import job

    from mtl.data.steps import StepDataset
    from mtl.train.job import build_job
    from mtl.train.step import as_tensors
    from mtl.train.trainer import Trainer

    cfg = job(classes, 192, tempfile.mkdtemp(prefix="mtl_bench_"))
    for task in cfg["tasks"]:
        if task["head"]["type"] == "arcface":
            task["head"]["sample_ratio"] = sample_ratio
    built = build_job(cfg)
    trainer = Trainer(built, console=lambda *a: None)
    raw = StepDataset(built.schedule, {t.name: t.reader for t in built.tasks}, 0, 0, 1)[0]
    rng = np.random.RandomState(0)
    batch = as_tensors({t: {"image": rng.randn(len(v["label"]), 1, 32, 32).astype("float32"), "label": v["label"]}
                        for t, v in raw.items()})
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        trainer.train_step(batch)
        if i >= 2:
            times.append(time.perf_counter() - start)
    print("THREADS_BENCH " + json.dumps({"median_s": float(np.median(times))}))


def run(classes, sample_ratio, steps, threads, blas) -> float:
    """One fresh process at ``threads`` Paddle threads and ``blas`` numpy BLAS threads: its median step (s)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(blas))
    out = subprocess.run([sys.executable, __file__, "--worker", str(classes), str(sample_ratio), str(steps)],
                         env=env, capture_output=True, text=True, timeout=1800)
    line = next((x for x in out.stdout.splitlines() if x.startswith("THREADS_BENCH ")), None)
    if line is None:
        raise SystemExit(f"the worker at {classes} classes failed:\n{out.stderr[-2000:]}")
    return json.loads(line.split(" ", 1)[1])["median_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Paddle's threads (default: cores)")
    parser.add_argument("--full", action="store_true", help="also 1,000,000 classes of full softmax")
    parser.add_argument("--quick", action="store_true", help="40 classes only (a smoke run)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(int(args.worker[0]), float(args.worker[1]), int(args.worker[2]))
    if args.threads < 2:
        raise SystemExit("one core: numpy's BLAS and Paddle run one thread each, there is nothing to compare")
    settings = [1, args.threads]
    rows = []
    for classes, ratio in CASES[:1] if args.quick else CASES + (FULL if args.full else []):
        steps = args.steps if classes < 1_000_000 or ratio < 1.0 else max(2, args.steps // 4)
        times = {b: [] for b in settings}
        for r in range(args.rounds):
            for blas in (settings if r % 2 == 0 else settings[::-1]):
                times[blas].append(run(classes, ratio, steps, args.threads, blas))
                print(f"  {classes} classes, sample_ratio {ratio}, BLAS threads {blas}: "
                      f"{times[blas][-1] * 1000:.1f} ms", file=sys.stderr)
        one, many = (float(np.median(times[b])) for b in settings)
        rows.append([f"{classes:,}", ratio, f"{one * 1000:.1f}", f"{many * 1000:.1f}", f"{many / one:.2f}"])
    print(tabulate(rows, headers=["classes (C, C/2)", "sample_ratio", "1 BLAS thread (ms)",
                                  f"{args.threads} BLAS threads (ms)", f"{args.threads} / 1"], tablefmt="github"))
    print(f"(Paddle's threads: {args.threads}; median step over {args.rounds} alternating round(s) of "
          f"{args.steps} steps each)")


if __name__ == "__main__":
    main()
