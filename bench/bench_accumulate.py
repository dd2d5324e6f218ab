"""What gradient accumulation costs: the same optimizer step (same global batch) read as K = 1, 2, 4 micro-batches.

Each K trains in a fresh process (so that its peak resident memory is its own): a small face ViT (or the CNN) with an
ArcFace head under Partial FC and a softmax head, static weights, ``--steps`` steps after one warm-up step. Printed per
K: the median step time and its ratio to K = 1 (measured in the same run), the process's peak resident memory, what
the training steps add to the peak reached when the job was built, its ratio, and the activations the memory plan
estimates for one micro-batch.

    python bench/bench_accumulate.py [--steps 6] [--batch 64] [--ks 1,2,4] [--backbone vit|cnn]
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

BACKBONES = {
    "vit": {"type": "vit", "input_size": 56, "patch_size": 7, "embed_dim": 128, "depth": 4, "num_heads": 4,
            "embedding_size": 128, "drop_path_rate": 0.1, "mask_ratio": 0.1},
    "cnn": {"type": "cnn", "channels": [32, 64, 128], "embedding_size": 128, "input_size": 56, "in_channels": 3},
}


def job(backbone, batch, accumulate, out):
    from mtl.config.loading import load_job

    tasks = [{"name": "faces", "reader": {"type": "synthetic", "num_samples": 512, "num_classes": 200, "seed": 1,
                                          "shape": [3, 56, 56]},  # few prototypes: the reader stays small
              "head": {"type": "arcface", "num_classes": 5000, "scale": 32.0, "sample_ratio": 0.3}, "ratio": 3,
              "eval": None},
             {"name": "kind", "reader": {"type": "synthetic", "num_samples": 256, "num_classes": 10, "seed": 2,
                                         "shape": [3, 56, 56]}, "head": "softmax", "eval": None}]
    return load_job(data={
        "seed": 0, "output_dir": out, "device": "cpu", "tasks": tasks, "backbone": dict(BACKBONES[backbone]),
        "schedule": {"batch_size": batch, "steps": 1000, "accumulate": accumulate},
        "optimizer": {"type": "adamw", "lr": 0.001, "weight_decay": 0.05, "decay": "none"},
        "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}})


def worker(backbone, batch, accumulate, steps):
    """Train ``steps`` + 1 steps at ``accumulate`` in this process; print one JSON line."""
    from mtl.data.steps import StepDataset
    from mtl.train.job import build_job
    from mtl.train.memory_plan import plan_job
    from mtl.train.step import as_tensors
    from mtl.train.trainer import Trainer

    cfg = job(backbone, batch, accumulate, tempfile.mkdtemp(prefix="bench_acc_"))
    built = build_job(cfg, announce_plan=False)
    trainer = Trainer(built, console=lambda *a: None)
    readers = {t.name: t.reader for t in built.tasks}
    data = StepDataset(built.schedule, readers, 0, 0, steps + 1, accumulate=accumulate)
    before = peak_rss()
    times = []
    for step in range(steps + 1):
        batch_tensors = as_tensors(data[step])  # outside the timing, as the DataLoader does it
        started = time.perf_counter()
        trainer.train_step(batch_tensors, step)
        times.append(time.perf_counter() - started)
    plan = plan_job(cfg, built.backbone, lambda t: readers[t["name"]].sizes(), 1)
    activations = next(v for k, v in plan[0].parts.items() if k.startswith("activations")) \
        if backbone == "vit" else None
    print("BENCH " + json.dumps({"k": accumulate, "median_s": statistics.median(times[1:]),
                                 "peak_rss": peak_rss(), "training_peak": peak_rss() - before,
                                 "planned_activations": activations}), flush=True)


def peak_rss() -> int:
    """This process's peak resident memory so far (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--backbone", choices=sorted(BACKBONES), default="vit")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return worker(args.backbone, args.batch, args.worker, args.steps)
    rows = []
    for k in (int(v) for v in args.ks.split(",")):
        done = subprocess.run([sys.executable, __file__, "--worker", str(k), "--steps", str(args.steps), "--batch",
                               str(args.batch), "--backbone", args.backbone], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        rows.append(json.loads(next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))[6:]))
    base = rows[0]
    print(f"{args.backbone}, global batch {args.batch}, Partial FC 0.3 over 5000 classes + softmax, AdamW:")
    for row in rows:
        planned = "" if row["planned_activations"] is None else \
            f", planned activations {row['planned_activations'] / 2 ** 20:.1f} MiB"
        print(f"  K={row['k']}: step {row['median_s'] * 1000:.0f} ms (x{row['median_s'] / base['median_s']:.2f}), "
              f"peak RSS {row['peak_rss'] / 2 ** 20:.0f} MiB, of which training adds "
              f"{row['training_peak'] / 2 ** 20:.0f} MiB (x{row['training_peak'] / max(base['training_peak'], 1):.2f})"
              f"{planned}")


if __name__ == "__main__":
    main()
