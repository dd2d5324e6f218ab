"""Memory over a long run: does the resident memory of a training job grow with every step?

    OMP_NUM_THREADS=1 python bench/bench_soak.py [--steps 5000] [--jobs demo,partial_fc] [--cnn]

Trains each job in this process (its DataLoader workers are child processes) for ``--steps`` steps and records the
resident memory (RSS, ``/proc/PID/status``) of every process of the job each 100 steps: this one and its loader
workers. Jobs: ``demo``, the demo's three digits heads (examples/configs/demo.yaml: two ArcFace heads, one softmax,
window averaging, one loader worker; on an MLP unless ``--cnn``: the job where a growth of 2.6 KB a step was measured,
issue 55), and ``partial_fc``, a face job of a 20,000-class ArcFace head with Partial FC (``sample_ratio: 0.1``) and a
CosFace head, two loader workers. Both log every step into ``metrics.jsonl`` (``log.every`` 100: the flush period)
and checkpoint every 1,000 steps.

Prints, per job: RSS of each process at step 1,000 (after warm-up), half-way and at the end, the growth of their sum
from step 1,000 to the end (target: under 2 %), and the slope of a least-squares line through the samples of the
second half of the run, in bytes per step, with what a million steps would add at that slope (target: under 100 MiB).
The second half, because a process's heap grows in steps the first times a size is asked for (one step of 0.55 MiB in
the demo's loader worker between steps 1,000 and 2,000, none after): a steady growth shows in both halves, a one-off
only in the first. When a job misses a target it is run again under ``tracemalloc`` (Python allocations only), and
the five source lines whose allocations grew most between step 1,000 and the end are printed: what holds the memory.
"""
import argparse
import os
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WARMUP = 1000
EVERY = 100
GROWTH_TARGET = 0.02  # of the RSS at the end of warm-up
MILLION_TARGET = 100 * 2 ** 20  # bytes a million steps may add


def jobs(folder, steps, cnn):
    """The benchmark's job configs (dicts), by name."""
    common = {"seed": 0, "device": "cpu", "schedule": {"batch_size": 100, "steps": steps},
              "log": {"every": EVERY, "progress": False, "plot": False},
              "checkpoint": {"every": 1000, "keep": 2}, "eval": {"every": 0}}
    backbone = ({"type": "cnn", "channels": [32, 64, 128], "embedding_size": 64} if cnn else
                {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [128], "embedding_size": 64})
    demo = dict(common, output_dir=os.path.join(folder, "demo"), backbone=backbone,
                tasks=["digits_low", "digits_high", "digits_classify"],
                optimizer={"type": "momentum", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005,
                           "warmup_steps": 100, "decay": "cosine"},
                averaging={"type": "window", "average_window_rate": 0.15, "min_average_window": 50,
                           "max_average_window": 200},
                data={"num_workers": 1})
    faces = dict(common, output_dir=os.path.join(folder, "partial_fc"),
                 backbone={"type": "mlp", "input_shape": [1, 8, 8], "hidden": [128], "embedding_size": 64},
                 tasks=[{"name": "ids", "reader": {"type": "synthetic", "num_samples": 40000, "num_classes": 20000,
                                                   "seed": 1},
                         "head": {"type": "arcface", "scale": 32.0, "sample_ratio": 0.1}, "eval": None},
                        {"name": "small", "reader": {"type": "synthetic", "num_samples": 2000, "num_classes": 50,
                                                     "seed": 2},
                         "head": {"type": "cosface", "scale": 32.0}, "eval": None}],
                 optimizer={"type": "momentum", "lr": 0.05, "decay": "none"},
                 data={"num_workers": 2})
    return {"demo": demo, "partial_fc": faces}


def rss_of(pid) -> int:
    """Resident bytes of process ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def children(pid):
    """Process ids below ``pid`` (its loader workers)."""
    from tests.dist_util import _descendants

    return _descendants(pid)


class Sampler:
    """RSS of every process of the job every ``EVERY`` steps; with ``trace``, tracemalloc snapshots at the end of
    warm-up and at the end."""

    def __init__(self, trace=False):
        self.samples, self.trace, self.snapshots = [], trace, {}

    def __call__(self, step):
        if step % EVERY:
            return
        pids = [os.getpid()] + children(os.getpid())
        self.samples.append((step, [rss_of(p) for p in pids]))
        if self.trace and step == WARMUP:
            tracemalloc.start(5)
            self.snapshots["warm"] = tracemalloc.take_snapshot()

    def finish(self):
        if self.trace and "warm" in self.snapshots:
            self.snapshots["end"] = tracemalloc.take_snapshot()
            tracemalloc.stop()


def train(cfg, sampler):
    """Train ``cfg`` in this process, calling ``sampler(step)`` after every step."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    class Sampled(Trainer):
        def _after_step(self, step, result, loop):
            super()._after_step(step, result, loop)
            sampler(step)

    trainer = Sampled(build_job(load_job(data=cfg)), console=lambda *a, **k: None)
    started = time.perf_counter()
    trainer.run()
    sampler.finish()
    return time.perf_counter() - started


def slope(points):
    """Least-squares slope (bytes per step) of ``[(step, bytes)]``."""
    n = len(points)
    mx = sum(s for s, _ in points) / n
    my = sum(b for _, b in points) / n
    var = sum((s - mx) ** 2 for s, _ in points)
    return sum((s - mx) * (b - my) for s, b in points) / var if var else 0.0


def report(name, samples, seconds, steps):
    """Print the job's figures; True when it meets both targets."""
    after = [(s, sum(each)) for s, each in samples if s >= WARMUP]
    start, end = after[0][1], after[-1][1]
    growth, per_step = (end - start) / start, slope(after[len(after) // 2:])
    million = per_step * 1e6
    ok = growth < GROWTH_TARGET and million < MILLION_TARGET
    print(f"{name}: {steps} steps in {seconds:.0f} s ({steps / seconds:.0f} steps/s), {len(samples[-1][1])} processes "
          f"(the trainer, then its loader workers)")
    marks = {s: each for s, each in samples}
    for step in (after[0][0], after[len(after) // 2][0], after[-1][0]):
        print(f"  RSS at step {step:6d}: " + ", ".join(f"{b / 2 ** 20:.2f}" for b in marks[step]) + " MiB")
    print(f"  growth from step {after[0][0]} to {after[-1][0]}: {(end - start) / 2 ** 20:+.2f} MiB, "
          f"{100 * growth:+.3f} % (target < {100 * GROWTH_TARGET:.0f} %)")
    print(f"  slope over the second half (from step {after[len(after) // 2][0]}): {per_step:+.1f} bytes/step -> "
          f"{million / 2 ** 20:+.1f} MiB per million steps (target < {MILLION_TARGET / 2 ** 20:.0f} MiB): "
          f"{'ok' if ok else 'MISSED'}")
    return ok


def contributors(sampler, top=5):
    """The source lines whose Python allocations grew most from the end of warm-up to the end."""
    stats = sampler.snapshots["end"].compare_to(sampler.snapshots["warm"], "lineno")
    print("  largest growth of Python allocations (tracemalloc, from step 1000 to the end):")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        print(f"    {stat.size_diff / 2 ** 20:+8.2f} MiB  {stat.count_diff:+8d} blocks  "
              f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--jobs", default="demo,partial_fc")
    parser.add_argument("--cnn", action="store_true", help="the demo's own CNN backbone (slower) instead of an MLP")
    args = parser.parse_args()
    from mtl.core.runtime import set_threads, tune_malloc

    set_threads()
    tune_malloc()
    missed = []
    for name in args.jobs.split(","):
        with tempfile.TemporaryDirectory(prefix="mtl_soak_") as folder:
            sampler = Sampler()
            seconds = train(jobs(folder, args.steps, args.cnn)[name], sampler)
            if not report(name, sampler.samples, seconds, args.steps):
                missed.append(name)
        if name in missed:
            with tempfile.TemporaryDirectory(prefix="mtl_soak_") as folder:
                sampler = Sampler(trace=True)
                train(jobs(folder, args.steps, args.cnn)[name], sampler)
                contributors(sampler)
    print("all targets met" if not missed else f"targets missed: {', '.join(missed)}")


if __name__ == "__main__":
    main()
