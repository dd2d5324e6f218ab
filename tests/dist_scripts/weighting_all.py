"""Train the same small job once per task-weighting strategy (1 process, or under paddle.distributed.launch).

Usage: weighting_all.py OUT_ROOT [STEPS [UNTIL [NAMES]]]: one run per strategy (or per comma-separated name of NAMES)
in OUT_ROOT/<name>; with UNTIL, every run stops after step UNTIL and is then resumed to STEPS in the same folder (the
exact-resume check).
Two arcface heads with class counts that do not split evenly over 2 processes and one softmax head; no BatchNorm.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

STRATEGIES = {
    "static": {"type": "static"},
    "uncertainty": {"type": "uncertainty", "lr": 0.05},
    "dwa": {"type": "dwa", "temperature": 2.0},
    "rlw": {"type": "rlw"},
    "famo": {"type": "famo", "w_lr": 0.05},
    "gradnorm": {"type": "gradnorm", "alpha": 1.5, "lr": 0.05},
    "pcgrad": {"type": "pcgrad"},
    "cagrad": {"type": "cagrad", "c": 0.4},
    "mgda": {"type": "mgda"},
    "mgda_ub": {"type": "mgda", "representation": True},
}


def job(out, weighting, steps):
    """The job's raw config."""
    return {
        "seed": 5, "device": "cpu", "output_dir": out, "weighting": weighting,
        "tasks": [
            {"name": "arc7", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 7, "seed": 1},
             "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}, "eval": None},
            {"name": "arc5", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 5, "seed": 2},
             "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}, "eval": None},
            {"name": "soft3", "reader": {"type": "synthetic", "num_samples": 30, "num_classes": 3, "seed": 3},
             "head": {"type": "softmax"}, "eval": None},
        ],
        "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [32], "embedding_size": 16},
        "schedule": {"mode": "joint", "batch_size": 12, "steps": steps},
        "optimizer": {"type": "momentum", "lr": 0.05, "weight_decay": 0.0005, "decay": "none"},
        "log": {"every": 1, "progress": False, "plot": False},
        "checkpoint": {"every": 5, "keep": 1}, "data": {"num_workers": 0},
    }


def main(*argv):
    """``weighting_all.py ARGV``; ``argv`` defaults to the command line (a launch of several runs passes it)."""
    argv = [str(a) for a in argv] or sys.argv[1:]
    out_root, steps = argv[0], int(argv[1]) if len(argv) > 1 else 20
    until = int(argv[2]) if len(argv) > 2 else None
    from mtl.config.loading import load_job
    from mtl.core.runtime import init_distributed, select_device
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    select_device("cpu")
    init_distributed()
    names = argv[3].split(",") if len(argv) > 3 else list(STRATEGIES)
    for name in names:
        out = os.path.join(out_root, name)
        cfg = load_job(data=job(out, STRATEGIES[name], steps))
        if until is None:
            Trainer(build_job(cfg), console=lambda *a: None, overwrite=True).run()
            continue
        Trainer(build_job(cfg), console=lambda *a: None, overwrite=True).run(until=until)
        Trainer(build_job(cfg), console=lambda *a: None, resume=True).run()


if __name__ == "__main__":
    main()
