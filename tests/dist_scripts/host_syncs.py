"""The host synchronisations of each training step, counted (tests/host_syncs.py) on the device path (the Paddle-op
passes a GPU runs; ``mtl.core.arrays.HOST_PATHS`` off) for the job of ``JOB``: ``main(OUT_DIR)`` writes
``OUT_DIR/rank{k}.json`` ({"counts": [per step], "sites": [per step {site: count}]}). Runs at 1 process in the test
process and at 2 in the session's launch (tests/shared_runs.py)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

STEPS = 6


VARIANTS = ("plain", "accumulate", "filtering")


def job_data(output_dir, log_every=1, variant="plain"):
    """Four tasks: ArcFace (full softmax), ArcFace with Partial FC, softmax (sharded), regression (replicated);
    ``variant``: ``accumulate`` reads each step as 2 micro-batches, ``filtering`` gives the ArcFace head inter-class
    filtering (threshold 0.3)."""
    def reader(seed, **extra):
        return {"type": "synthetic", "num_samples": 64, "seed": seed, **extra}

    arc = {"type": "arcface", "scale": 8.0}
    if variant == "filtering":
        arc["interclass_filtering_threshold"] = 0.3
    return {"seed": 0, "output_dir": str(output_dir), "device": "cpu",
            "tasks": [{"name": "arc", "reader": reader(1, num_classes=20), "head": arc},
                      {"name": "pfc", "reader": reader(2, num_classes=40),
                       "head": {"type": "arcface", "scale": 8.0, "sample_ratio": 0.2}},
                      {"name": "soft", "reader": reader(3, num_classes=10), "head": {"type": "softmax"}},
                      {"name": "reg", "reader": reader(4, target="regression"), "head": {"type": "regression"}}],
            "backbone": {"type": "mlp", "hidden": [16], "embedding_size": 8},
            "schedule": {"batch_size": 16 if variant == "accumulate" else 8, "steps": STEPS + 1, "mode": "joint",
                         "accumulate": 2 if variant == "accumulate" else 1},
            "optimizer": {"type": "momentum", "lr": 0.05, "decay": "none", "clip_norm": 1.0},
            "log": {"every": log_every, "progress": False, "plot": False}, "data": {"num_workers": 0}}


def count_steps(output_dir, log_every=1, variant="plain"):
    """Train ``STEPS`` steps of the job (``until``: no final evaluation) and count every step's syncs: the step's
    agreement (``Trainer._agree``) and the step itself (``Trainer._step``: forward, backward, update, its record).
    Returns ``{"counts": [...], "sites": [...]}``."""
    from mtl.config.loading import load_job
    from mtl.core import arrays
    from mtl.core.runtime import init_distributed, select_device
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer
    from tests.host_syncs import HostSyncCounter

    select_device("cpu")
    init_distributed()
    host_paths, arrays.HOST_PATHS = arrays.HOST_PATHS, False
    try:
        trainer = Trainer(build_job(load_job(data=job_data(output_dir, log_every, variant)), announce_plan=False),
                          console=lambda *a: None)
        counter, steps = HostSyncCounter(), []
        trainer._agree, trainer._step = _counted(trainer._agree, counter, None), _counted(trainer._step, counter, steps)
        trainer.run(until=STEPS)
    finally:
        arrays.HOST_PATHS = host_paths
    return {"counts": [count for count, _ in steps], "sites": [sites for _, sites in steps]}


def _counted(method, counter, steps):
    """``method`` counted; ``steps`` given: each call closes a step's count (agreement included)."""
    def wrapped(*args):
        with counter:
            result = method(*args)
        if steps is not None:
            steps.append((counter.count, dict(counter.sites)))
            counter.reset()
        return result
    return wrapped


def main(out_dir):
    """Every variant at this process count: ``OUT_DIR/{variant}_rank{k}.json``."""
    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    for variant in VARIANTS:
        result = count_steps(os.path.join(out_dir, variant), variant=variant)
        with open(os.path.join(out_dir, f"{variant}_rank{rank}.json"), "w") as f:
            json.dump(result, f)
