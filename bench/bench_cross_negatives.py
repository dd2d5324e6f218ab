"""What cross-head negatives cost: the training step with and without them, on the shape of the large-scale recipe.

The shape of ``examples/configs/ms1mv3_glint360k_r50_pfc01.yaml`` scaled down to fit a CPU: an ArcFace head over
93431 / ``--scale`` classes and a CosFace head over 360232 / ``--scale`` classes, both under Partial FC 0.1, 512-d
embeddings, one GPU's 128 rows of the recipe's 1024-image step split 1 : 3 between the two tasks (32 + 96), SGD with
momentum. The backbone is a single linear layer from 64 numbers (``--backbone mlp``): the step is the heads' almost
alone, the worst case for the ratio (an IResNet-50 in front adds the same time to both sides; ``--backbone cnn``
puts a small CNN on 3 x 32 x 32 images in front instead).

Arms, each trained in fresh processes, interleaved over ``--rounds`` rounds (the order flips every round because the
machine's load drifts):

* ``separate``: one head per task, no cross-head negatives (today's recipe);
* ``cross``: ``cross_negatives: {tasks: all, rate: 1.0, mask: online, update: own}`` (each task's samples also
  scored against the other head's classes as a memory bank, the online same-person mask after its warm-up, which
  the timed steps are past);
* ``cross_sampled``: the same at ``rate: 0.1`` (a tenth of the other head's classes);
* ``cross_both``, ``cross_sampled_both``: ``cross`` and ``cross_sampled`` with ``update: both`` (the default: the
  other head's scored rows learn from the sample too: one more product per extra chunk, their gradient merged with
  the head's own sampled rows, and the optimizer updates every row either head scored);
* ``cross_shared_both``: ``rows: shared`` with ``update: both``: each head scores the rows the other head samples
  for itself at the step (its Partial FC 0.1 sample), as one merged head over both would, so the optimizer updates
  no row beyond the two heads' own samples; ``cross_shared_nomask``: the same without the same-person mask (which
  a merged head cannot have);
* ``merged``: what a user would otherwise run to push the two datasets' people apart: one ArcFace head over both
  tasks' classes (93431 + 360232) / ``--scale``, Partial FC 0.1, all 128 rows of the step (no cross-head
  negatives; the same-person problem it has is what the other arms answer).

Printed: the median step time of each arm (pooled over rounds) and its ratios to ``separate`` and to ``merged``
measured in the same run.

    .venv/bin/python bench/bench_cross_negatives.py [--scale 10] [--steps 8] [--rounds 3] [--backbone mlp|cnn]
        [--arms separate cross_shared_both merged ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ARMS = {"separate": None,
        "cross": {"tasks": "all", "rate": 1.0, "mask": "online", "warmup": 2, "update": "own"},
        "cross_sampled": {"tasks": "all", "rate": 0.1, "mask": "online", "warmup": 2, "update": "own"},
        "cross_both": {"tasks": "all", "rate": 1.0, "mask": "online", "warmup": 2, "update": "both"},
        "cross_sampled_both": {"tasks": "all", "rate": 0.1, "mask": "online", "warmup": 2, "update": "both"},
        "cross_shared_both": {"tasks": "all", "rate": 1.0, "rows": "shared", "mask": "online", "warmup": 2,
                              "update": "both"},
        "cross_shared_nomask": {"tasks": "all", "rate": 1.0, "rows": "shared", "mask": "none", "warmup": 2,
                                "update": "both"},
        "merged": None}
BACKBONES = {"mlp": ({"type": "mlp", "input_shape": [64], "hidden": [], "embedding_size": 512}, [64]),
             "cnn": ({"type": "cnn", "channels": [16, 32, 64], "embedding_size": 512, "input_size": 32,
                      "in_channels": 3}, [3, 32, 32])}
MARKER = "BENCH "


def job(arm, scale, backbone, out):
    """The job of one arm (``mtl.config.loading.load_job`` checks it as any job)."""
    from mtl.config.loading import load_job

    spec, shape = BACKBONES[backbone]

    def task(name, head, classes, margin, ratio, seed):
        return {"name": name, "ratio": ratio, "eval": None,
                "reader": {"type": "synthetic", "num_samples": 4096, "num_classes": classes, "seed": seed,
                           "shape": shape, "image_field": "image" if backbone == "cnn" else "features"},
                "head": {"type": head, "num_classes": classes, "margin": margin, "scale": 64.0,
                         "sample_ratio": 0.1}}

    tasks = [task("ms1mv3", "arcface", 93431 // scale, [1.0, 0.5, 0.0], 1, 1),
             task("glint360k", "cosface", 360232 // scale, [1.0, 0.0, 0.4], 3, 2)]
    if arm == "merged":  # one head over both datasets' classes, every row of the step
        tasks = [task("merged", "arcface", 93431 // scale + 360232 // scale, [1.0, 0.5, 0.0], 1, 1)]
    data = {"seed": 0, "output_dir": out, "device": "cpu", "tasks": tasks, "backbone": dict(spec),
            "schedule": {"batch_size": 128, "steps": 1000},
            "optimizer": {"type": "momentum", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "decay": "none"},
            "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}, "averaging": {"type": "none"}}
    if backbone == "mlp":
        data["backbone"]["input_field"] = "features"
    if ARMS[arm] is not None:
        data["cross_negatives"] = dict(ARMS[arm])
    return load_job(data=data)


def worker(arm, scale, backbone, steps):
    """Train 3 warm-up + ``steps`` timed steps of one arm in this process; print one JSON line."""
    from mtl.data.steps import StepDataset
    from mtl.train.job import build_job
    from mtl.train.step import as_tensors
    from mtl.train.trainer import Trainer

    built = build_job(job(arm, scale, backbone, tempfile.mkdtemp(prefix="bench_cross_")), announce_plan=False)
    trainer = Trainer(built, console=lambda *a: None)
    data = StepDataset(built.schedule, {t.name: t.reader for t in built.tasks}, 0, 0, steps + 3)
    times = []
    for step in range(steps + 3):
        batch = as_tensors(data[step])  # outside the timing, as the DataLoader does it
        started = time.perf_counter()
        trainer.train_step(batch, step)
        times.append(time.perf_counter() - started)
    trainer.release()
    print(MARKER + json.dumps({"arm": arm, "times": times[3:]}), flush=True)


def run_arm(arm, args):
    """One fresh process of ``arm``: its timed steps (seconds)."""
    done = subprocess.run([sys.executable, __file__, "--worker", arm, "--scale", str(args.scale), "--steps",
                           str(args.steps), "--backbone", args.backbone], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
    if done.returncode != 0:
        sys.exit(f"arm {arm} failed:\n{done.stderr[-3000:]}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith(MARKER))[len(MARKER):])["times"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10, help="the recipe's class counts divided by this")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backbone", choices=sorted(BACKBONES), default="mlp")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                        help="the arms to time (separate and merged are always timed: the ratios' baselines)")
    parser.add_argument("--worker", choices=sorted(ARMS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.scale, args.backbone, args.steps)
    arms = [arm for arm in ARMS if arm in args.arms or arm in ("separate", "merged")]
    times = {arm: [] for arm in arms}
    for round_ in range(args.rounds):
        for arm in (arms if round_ % 2 == 0 else arms[::-1]):
            times[arm] += run_arm(arm, args)
            print(f"round {round_ + 1}/{args.rounds}: {arm} done", file=sys.stderr, flush=True)
    base = statistics.median(times["separate"])
    print(f"ms1mv3 + glint360k shape / {args.scale}: arcface {93431 // args.scale} and cosface "
          f"{360232 // args.scale} classes, Partial FC 0.1, 512-d, 32 + 96 rows per step, backbone {args.backbone}; "
          f"{args.rounds} rounds x {args.steps} steps")
    merged = statistics.median(times["merged"])
    for arm, values in times.items():
        median = statistics.median(values)
        print(f"  {arm:18s} {median * 1000:7.1f} ms per step  x{median / base:.3f} of separate  "
              f"x{median / merged:.3f} of merged")


if __name__ == "__main__":
    main()
