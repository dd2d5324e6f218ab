"""What each architecture costs: parameters and training-step time against ``hard`` measured in the same run.

Three settings, each with the architecture configurations of its benchmark (docs/architectures.md):

* ``multimnist``: Sener and Koltun's LeNet, two tasks, 512 images per step (examples/configs/multimnist.yaml);
* ``faces``: the six-face recipe's CNN, six ArcFace tasks, 192 images per step (examples/configs/faces_six.yaml);
* ``synthetic``: Ma et al.'s benchmark, two regression tasks, 256 samples per step
  (examples/configs/mmoe_synthetic.yaml).

The batches are synthetic images of the recipe's shapes (the same for every architecture), so that only the model's
step is timed: the median CPU time of this process (one intra-op thread: ``OMP_NUM_THREADS=1``) over ``--steps``
training steps after 3 warm-up steps, one architecture after another, so that other processes on the machine do
not count; glibc's allocator keeps freed memory (``tune_malloc``, as ``mtl train`` sets it by default).
Parameters: trainable ones of the backbone and the architecture (the heads are the same for every architecture and
not counted), and the ones gradient-based weighting combines (``JointModel.shared_parameters``).

    python bench/bench_architectures.py [--steps 20] [--settings multimnist faces synthetic] [--json FILE]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from architecture_variants import FACES, MULTIMNIST, SYNTHETIC  # noqa: E402

SETTINGS = {
    "multimnist": {"config": "examples/configs/multimnist.yaml", "shape": [1, 28, 28], "field": "image",
                   "architectures": {"hard (recipe)": [], **MULTIMNIST}},
    "faces": {"config": "examples/configs/faces_six.yaml", "shape": [3, 32, 32], "field": "image",
              # cross-head negatives need one embedding shared by every task: off here, for every architecture
              "architectures": {name: [*spec, "cross_negatives.rate=0"]
                                for name, spec in {"hard (recipe)": [], **FACES}.items()}},
    "synthetic": {"config": "examples/configs/mmoe_synthetic.yaml", "shape": [100], "field": "features",
                  "architectures": {name: [f"architecture={json.dumps(spec)}"] for name, spec in SYNTHETIC.items()}},
}


def batch_for(job, shape, field, seed=0):
    """One step's batch of the job's schedule with random inputs of ``shape`` and each head's labels."""
    import numpy as np
    import paddle

    rng = np.random.RandomState(seed)
    batch = {}
    for task, rows in job.schedule.plan(0).items():
        head = job.task(task).head
        sub = {field: paddle.to_tensor(rng.randn(rows, *shape).astype(np.float32))}
        classes = head.class_count()
        sub[head.label_field] = paddle.to_tensor(rng.randint(0, classes, rows).astype(np.int64)) if classes else \
            paddle.to_tensor(rng.randn(rows, 1).astype(np.float32))
        batch[task] = sub
    return batch


def measure(setting, name, sets, steps, out):
    """``{parameters, shared, median_s}`` of one architecture in one setting."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    spec = SETTINGS[setting]
    cfg = load_job(os.path.join(ROOT, spec["config"]), [*sets, f"output_dir={out}", "log.progress=false",
                                                        "log.plot=false", "data.num_workers=0", "averaging.type=none"])
    job = build_job(cfg, announce_plan=False)
    trainer = Trainer(job, console=lambda *a: None, overwrite=True)
    batch = batch_for(job, spec["shape"], spec["field"])
    times = []
    for step in range(steps + 3):
        start = time.process_time()  # this process's CPU time: the machine's other processes do not count
        trainer.train_step(batch, step)
        times.append(time.process_time() - start)
    model = job.model
    own = [p for p in list(model.backbone.parameters()) + list(model.architecture.parameters()) if not p.stop_gradient]
    times = sorted(times[3:])
    return {"parameters": sum(int(p.numel()) for p in own),
            "shared": sum(int(p.numel()) for p in model.shared_parameters()), "median_s": times[len(times) // 2]}


def run(settings, steps, out):
    """``{setting: {architecture: measure(...)}}``."""
    from mtl.core.runtime import select_device

    select_device("cpu")
    results = {}
    for setting in settings:
        results[setting] = {}
        for name, sets in SETTINGS[setting]["architectures"].items():
            results[setting][name] = measure(setting, name, sets, steps, os.path.join(out, setting, name))
            print(f"  {setting:10s} {name:14s} {results[setting][name]['median_s'] * 1000:8.1f} ms/step", flush=True)
    return results


def table(results):
    """One markdown table per setting: parameters, shared parameters, step time and its ratio to the baseline."""
    from tabulate import tabulate

    text = []
    for setting, rows in results.items():
        base = next(v for k, v in rows.items() if "recipe" in k or k == "shared_bottom")  # the baseline row
        body = [[name, f"{r['parameters']:,}", f"{r['shared']:,}", f"{r['median_s'] * 1000:.1f}",
                 f"{r['median_s'] / base['median_s']:.2f}"] for name, r in rows.items()]
        text.append(f"{setting}:\n\n" + tabulate(body, headers=["architecture", "parameters (backbone + architecture)",
                                                               "shared", "ms / step", "step time / baseline"],
                                               tablefmt="github", disable_numparse=True))
    return "\n\n".join(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out", default=os.path.join("runs", "bench_architectures"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from mtl.core.runtime import set_threads, tune_malloc

    set_threads(1)  # one intra-op thread, before Paddle starts its pool (a no-op once Paddle is imported)
    tune_malloc()  # as `mtl train` does (the job's default): without it every buffer past 32 MiB is a fresh mmap
    results = run(args.settings, args.steps, args.out)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
