"""Model-parallel ArcFace head at 1 vs 2 processes, and Partial FC 0.1 against full: step time and peak memory.

The ``arcface`` head (``heads.arcface.ArcFaceHead``) on a global batch of 128 rows, D = 128, C in {10k, 100k, 1M}
(``--quick``: 10k, 100k): one step = forward + backward + momentum update (``bench/_margin_worker.py``). Each
(C, sample_ratio, processes) runs in fresh processes: 1 process without a launcher, 2 processes under
``python -m paddle.distributed.launch --nproc_per_node 2`` (gloo on CPU), each rank with 64 rows and C/2 centres.
The cores are split evenly: OMP_NUM_THREADS = cores / processes (2 cores: 2 threads alone, 1 thread per rank).
Reported: median step time per process (pooled over rounds; the slowest rank for 2 processes) and the ratio
2 procs / 1 proc; per-process peak RSS over the steps minus the RSS before the head was built (the head's own
memory: weight, gradient, momentum, activations) and its ratio; Partial FC (sample_ratio 0.1) / full at each C.
With the cores split evenly the ideal time ratio is about 1 (same arithmetic on the same cores), and the memory
ratio tends to 0.5 as the class-sized tensors dominate. Runs of the same C are interleaved (1 and 2 processes
alternate and the order flips every round) because the machine is shared and its load drifts. Host RSS is the
memory that matters on the CPU build; on GPU read ``gpu_peak_bytes`` in the workers' JSON instead.

    .venv/bin/python bench/bench_margin_head.py [--quick] [--rounds N]
    .venv/bin/python bench/bench_margin_head.py --memory-classes 20000000 [--sample-ratio 0.1] [--steps 3]

``--memory-classes C`` runs only the large-class case (the 20M-class figure): one process, Partial FC,
``--steps`` steps; it prints the step time, the head's peak resident memory (peak RSS over the steps - RSS before the
head), bytes per class, and the memory plan of the same head (``mtl.train.memory_plan``) with measured / planned.
When the plan does not fit the host RAM available it says so and does not run (as ``mtl train`` would refuse the
job).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
WORKER = os.path.join(ROOT, "bench", "_margin_worker.py")
MARKER = "MARGIN_BENCH "
RATIOS = (1.0, 0.1)
WORLDS = (1, 2)
# classes -> (warm-up steps, timed steps) per run and round; fewer at 1M, where a full step takes ~10 s
SCHEDULE = {10_000: (2, 12), 100_000: (1, 5), 1_000_000: (1, 2)}
QUICK_SCHEDULE = {10_000: (1, 6), 100_000: (1, 2)}


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_env(procs: int) -> dict:
    """Environment with the intra-op threads set to cores / processes (at least 1)."""
    threads = str(max(1, cores() // procs))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}


def parse_results(text: str, procs: int):
    """The workers' JSON results, one per rank (the launcher may echo rank 0's log twice)."""
    found = {}
    for line in text.splitlines():
        if line.startswith(MARKER):
            record = json.loads(line[len(MARKER):])
            found[record["rank"]] = record
    if sorted(found) != list(range(procs)):
        raise RuntimeError(f"expected results from ranks 0..{procs - 1}, got {sorted(found)}:\n{text[-6000:]}")
    return [found[k] for k in range(procs)]


def run_worker(procs: int, worker_args, timeout: float = 900):
    """Run the worker on ``procs`` processes and return each rank's result dict."""
    args = [str(a) for a in worker_args]
    if procs == 1:
        env = dict(os.environ, **thread_env(1))
        done = subprocess.run([sys.executable, WORKER, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"worker failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
        return parse_results(done.stdout, 1)
    from tests.dist_util import run_distributed  # launcher on CPU/gloo, logs read from --log_dir

    code, output = run_distributed(WORKER, nproc=procs, args=args, timeout=timeout, env=thread_env(procs))
    if code != 0:
        raise RuntimeError(f"distributed worker failed ({code}):\n{output[-8000:]}")
    return parse_results(output, procs)


def sweep(classes, schedule, rounds, log=print):
    """Every (C, ratio, processes) ``rounds`` times, interleaved; returns {(C, ratio, procs): [per-run results]}."""
    results = {}
    for round_index in range(rounds):
        worlds = WORLDS if round_index % 2 == 0 else WORLDS[::-1]
        for num_classes in classes:
            warmup, steps = schedule[num_classes]
            for ratio in RATIOS:
                for procs in worlds:
                    args = ["--classes", num_classes, "--sample-ratio", ratio, "--warmup", warmup, "--steps", steps]
                    start = time.perf_counter()
                    ranks = run_worker(procs, args)
                    results.setdefault((num_classes, ratio, procs), []).append(ranks)
                    median = max(np.median(r["times"]) for r in ranks)
                    log(f"  round {round_index + 1}: C={num_classes:>9,} ratio={ratio} procs={procs}: "
                        f"{1000 * median:8.1f} ms/step, run {time.perf_counter() - start:5.1f} s")
    return results


def summarize(runs):
    """Median step time (s) of the slowest rank over the pooled rounds, and the largest per-rank head memory (KiB).

    head memory = peak RSS over the steps - RSS before the head was built (both per rank).
    """
    procs = len(runs[0])
    step = max(np.median(np.concatenate([run[k]["times"] for run in runs])) for k in range(procs))
    memory = max(r["peak_kib"] - r["baseline_kib"] for run in runs for r in run)
    build = max(r["build_peak_kib"] - r["baseline_kib"] for run in runs for r in run)
    return {"step": float(step), "memory": memory, "build_memory": build,
            "build_s": max(r["build_s"] for run in runs for r in run), "loss0": runs[0][0]["loss0"]}


def report(results, classes):
    """The 1-vs-2-process table, the Partial FC table and the construction table, as text."""
    from tabulate import tabulate

    stats = {key: summarize(runs) for key, runs in results.items()}
    rows = []
    for num_classes in classes:
        for ratio in RATIOS:
            one, two = stats[(num_classes, ratio, 1)], stats[(num_classes, ratio, 2)]
            rows.append([f"{num_classes:,}", ratio, f"{1000 * one['step']:.1f}", f"{1000 * two['step']:.1f}",
                         f"{two['step'] / one['step']:.2f}", f"{one['memory'] / 1024:.0f}",
                         f"{two['memory'] / 1024:.0f}", f"{two['memory'] / one['memory']:.2f}"])
    scaling = tabulate(rows, ["C", "sample_ratio", "step ms 1 proc", "step ms 2 procs", "time 2/1",
                              "head MiB 1 proc", "head MiB per proc (2)", "memory 2/1"], disable_numparse=True)
    rows = []
    for num_classes in classes:
        row = [f"{num_classes:,}"]
        for procs in WORLDS:
            full, sampled = stats[(num_classes, 1.0, procs)], stats[(num_classes, 0.1, procs)]
            row += [f"{sampled['step'] / full['step']:.2f}", f"{sampled['memory'] / full['memory']:.2f}"]
        rows.append(row)
    partial = tabulate(rows, ["C", "time 0.1/1.0 (1 proc)", "memory 0.1/1.0 (1 proc)", "time 0.1/1.0 (2 procs)",
                              "memory 0.1/1.0 (2 procs)"], disable_numparse=True)
    rows = []
    for num_classes in classes:
        one, two = stats[(num_classes, 1.0, 1)], stats[(num_classes, 1.0, 2)]
        difference = abs(two["loss0"] - one["loss0"]) / abs(one["loss0"])
        rows.append([f"{num_classes:,}", f"{one['build_s']:.2f}", f"{one['build_memory'] / 1024:.0f}",
                     f"{two['build_s']:.2f}", f"{two['build_memory'] / 1024:.0f}", f"{difference:.1e}"])
    build = tabulate(rows, ["C (full)", "build s 1 proc", "build peak MiB 1 proc", "build s 2 procs",
                            "build peak MiB per proc (2)", "first loss |2 procs - 1| / 1"], disable_numparse=True)
    return scaling, partial, build


def memory_run(classes: int, ratio: float, steps: int, log=print):
    """One process at ``classes`` classes: step time, peak head memory, bytes per class, against the plan."""
    from mtl.core.registry import plugin_class

    ArcFaceHead = plugin_class("head", "arcface")
    from mtl.train.memory_plan import available_bytes, gib

    plan = ArcFaceHead.planned_bytes({"num_classes": classes, "feature_size": 128, "sample_ratio": ratio}, 128, 1, 0,
                                     optimizer_slots=1)
    planned, available = sum(plan.values()), available_bytes()
    log(f"C={classes:,} sample_ratio={ratio}: plan {gib(planned)} ({planned / classes:.0f} B/class; "
        + ", ".join(f"{k} {gib(v)}" for k, v in plan.items()) + f"), available {gib(available)}")
    if planned > available:
        log("the plan does not fit the host RAM available: not run (mtl train would refuse this job)")
        return None
    (rank,) = run_worker(1, ["--classes", classes, "--sample-ratio", ratio, "--warmup", 0, "--steps", steps],
                         timeout=3600)
    measured = (rank["peak_kib"] - rank["baseline_kib"]) * 1024
    build = (rank["build_peak_kib"] - rank["baseline_kib"]) * 1024
    log(f"steps {', '.join(f'{t:.2f}' for t in rank['times'])} s (build {rank['build_s']:.1f} s, build peak "
        f"{gib(build)}); head peak {gib(measured)} = {measured / classes:.0f} B/class "
        f"({measured / classes / 1000:.3f} KB); measured / planned {measured / planned:.3f}")
    return {"times": rank["times"], "measured": measured, "planned": planned}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="C in {10k, 100k} and fewer steps")
    parser.add_argument("--rounds", type=int, help="interleaved repetitions of the sweep (default 2; 1 with --quick)")
    parser.add_argument("--memory-classes", type=int, help="only the large-class memory run at this many classes")
    parser.add_argument("--sample-ratio", type=float, default=0.1, help="with --memory-classes (default 0.1)")
    parser.add_argument("--steps", type=int, default=3, help="with --memory-classes (default 3)")
    args = parser.parse_args(argv)
    if args.memory_classes:
        memory_run(args.memory_classes, args.sample_ratio, args.steps)
        return
    began = time.perf_counter()
    schedule = QUICK_SCHEDULE if args.quick else SCHEDULE
    rounds = args.rounds or (1 if args.quick else 2)
    classes = sorted(schedule)
    print(f"arcface head, global batch 128, D 128, momentum step; {cores()} cores: "
          f"1 process x {thread_env(1)['OMP_NUM_THREADS']} threads vs 2 processes x "
          f"{thread_env(2)['OMP_NUM_THREADS']} thread(s) (OMP_NUM_THREADS); {rounds} interleaved round(s); "
          "steps per run (warm-up + timed): " + ", ".join(f"C={c:,}: {w}+{s}" for c, (w, s) in schedule.items()))
    results = sweep(classes, schedule, rounds)
    scaling, partial, build = report(results, classes)
    print("\nStep time (median per process) and head memory (peak RSS over the steps - RSS before building the "
          "head), 1 vs 2 processes:")
    print(scaling)
    print("(cores split evenly: the same arithmetic runs on the same cores either way, so the ideal time 2/1 is about "
          "1.0;\n below 1 means one process does not keep its 2 threads busy. Memory 2/1 tends to 0.5 as C grows.)")
    print("\nPartial FC sample_ratio 0.1 against full (1.0):")
    print(partial)
    print("\nHead construction (largest over rounds) and the first loss at 2 vs 1 processes (same global batch):")
    print(build)
    print(f"\ntotal runtime {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
