"""Overhead of the toolkit's joint step against a hand-written Paddle loop doing the same math on the same batch.

Both sides: one CNN backbone over the concatenated batch of three tasks (two ArcFace heads, one softmax head), the
weighted sum of the losses, one backward, one momentum step, one LR-scheduler step. The toolkit side goes through
``Trainer.train_step`` (joint model, heads with their shard/collective plumbing at world 1, two-phase backward,
gradient-sync hook, averager off). Both run at the runner's thread counts (``mtl.core.runtime.set_threads``: Paddle's
pool at cores, numpy's BLAS at 1; a user's own OMP_NUM_THREADS / OPENBLAS_NUM_THREADS stand). Printed: median step
time of each and the ratio (target: at most 1.05).

    python bench/bench_overhead.py [--steps 30] [--batch 192] [--classes 2000]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mtl.core.runtime import set_threads  # noqa: E402

THREADS = set_threads()  # before numpy and Paddle load their thread pools, as the runner does

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from tabulate import tabulate  # noqa: E402

from mtl.config.loading import load_job  # noqa: E402
from mtl.train.job import build_job  # noqa: E402
from mtl.train.step import as_tensors  # noqa: E402
from mtl.train.trainer import Trainer  # noqa: E402


def job(classes, batch, out):
    tasks = [
        {"name": "faces_a", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": classes, "seed": 1},
         "head": {"type": "arcface", "margin": [1.0, 0.3, 0.0], "scale": 32.0}, "eval": None},
        {"name": "faces_b", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": classes // 2,
                                       "seed": 2},
         "head": {"type": "arcface", "margin": [1.0, 0.3, 0.0], "scale": 32.0}, "eval": None},
        {"name": "kind", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 10, "seed": 3},
         "head": {"type": "softmax"}, "ratio": 0.5, "eval": None},
    ]
    return load_job(data={
        "seed": 0, "output_dir": out, "device": "cpu", "tasks": tasks,
        "backbone": {"type": "cnn", "channels": [32, 64, 128], "embedding_size": 128, "input_size": 32},
        "schedule": {"batch_size": batch, "steps": 1000},
        "optimizer": {"type": "momentum", "lr": 0.01, "weight_decay": 0.0, "decay": "none"},
        "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}})


def reference_step(model, sizes, batch, opt, sched, margins, scale):
    """The same math written out by hand: concat, backbone, ArcFace/softmax losses, sum, backward, step."""
    images = paddle.concat([batch[t]["image"] for t in sizes], axis=0)
    feats = paddle.split(model.backbone({"image": images}), list(sizes.values()), axis=0)
    total = 0.0
    for (task, _), f in zip(sizes.items(), feats):
        head, y = model.heads[task], batch[task]["label"]
        if task == "kind":
            logits = paddle.matmul(f, head.weight, transpose_y=True) + head.bias
            loss = F.cross_entropy(logits, y.unsqueeze(1))
            weight = 1.0  # loss_weight of the task (default)
        else:
            w = head.weight
            cos = paddle.matmul(F.normalize(f, axis=1), w, transpose_y=True) * paddle.rsqrt((w * w).sum(axis=1))
            onehot = F.one_hot(y, cos.shape[1])
            m1, m2, m3 = margins
            target = paddle.cos(m1 * paddle.acos(paddle.clip(cos, -1 + 1e-7, 1 - 1e-7)) + m2) - m3
            logits = scale * (cos + onehot * (target - cos))
            loss = F.cross_entropy(logits, y.unsqueeze(1))
            weight = 1.0
        total = total + weight * loss
    total.backward()
    opt.step()
    opt.clear_grad(set_to_zero=False)
    sched.step()
    return total


def timed(fn, steps):
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--classes", type=int, default=2000)
    args = parser.parse_args()
    import tempfile

    out = tempfile.mkdtemp(prefix="mtl_bench_")
    toolkit = build_job(job(args.classes, args.batch, out))
    reference = build_job(job(args.classes, args.batch, out))
    reference.model.set_state_dict(toolkit.model.state_dict())
    trainer = Trainer(toolkit, console=lambda *a: None)
    sched = paddle.optimizer.lr.LambdaDecay(0.01, lambda _: 1.0)
    opt = paddle.optimizer.Momentum(sched, momentum=0.9, parameters=reference.model.parameters())
    from mtl.data.steps import StepDataset

    ds = StepDataset(toolkit.schedule, {t.name: t.reader for t in toolkit.tasks}, 0, 0, 1)
    rng = np.random.RandomState(0)
    raw = ds[0]
    raw = {t: {"image": rng.randn(len(v["label"]), 1, 32, 32).astype("float32"), "label": v["label"]}
           for t, v in raw.items()}
    batch = as_tensors(raw)  # once, as the DataLoader hands tensors to the trainer
    sizes = {t: int(v["label"].shape[0]) for t, v in batch.items()}
    margins = (1.0, 0.3, 0.0)
    # same math check: the first step's total loss from both sides
    first_toolkit = trainer.train_step(batch).total(toolkit.model.loss_weights)
    first_reference = float(reference_step(reference.model, sizes, batch, opt, sched, margins, 32.0))
    for _ in range(3):  # warm-up
        trainer.train_step(batch)
        reference_step(reference.model, sizes, batch, opt, sched, margins, 32.0)
    tk, rf = [], []
    for _ in range(args.steps):  # interleave to share the machine's noise fairly
        tk += timed(lambda: trainer.train_step(batch), 1)
        rf += timed(lambda: reference_step(reference.model, sizes, batch, opt, sched, margins, 32.0), 1)
    med_tk, med_rf = float(np.median(tk)), float(np.median(rf))
    print(tabulate([["hand-written Paddle loop", f"{med_rf * 1000:.1f}", "1.000"],
                    ["mtl Trainer.train_step", f"{med_tk * 1000:.1f}", f"{med_tk / med_rf:.3f}"]],
                   headers=["joint step (batch %d, C=%d/%d/10)" % (args.batch, args.classes, args.classes // 2),
                            "median ms", "ratio"], tablefmt="github"))
    print(f"first-step total loss: toolkit {first_toolkit:.6f}, hand-written {first_reference:.6f}")
    print(f"overhead ratio {med_tk / med_rf:.3f} (target <= 1.05; Paddle's threads {THREADS}, numpy's BLAS threads "
          f"{os.environ['OPENBLAS_NUM_THREADS']})")


if __name__ == "__main__":
    main()
