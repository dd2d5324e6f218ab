"""Train weighting_all.py's small job once per newer strategy (nash_mtl ... db_mtl), in 1 process or
under paddle.distributed.launch.

Usage: weighting_more.py OUT_ROOT [STEPS [UNTIL [NAMES]]]: one run per strategy in OUT_ROOT/<name>; with UNTIL,
every run stops after step UNTIL and is then resumed to STEPS in the same folder (through a real checkpoint);
NAMES: a comma-separated subset. The job (two arcface heads with class counts that do not split evenly over 2
processes, one softmax head, an MLP backbone) is weighting_all.py's.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

STRATEGIES = {
    "nash_mtl": {"type": "nash_mtl"},
    "nash_mtl_every": {"type": "nash_mtl", "update_weights_every": 3, "max_norm": 0.5},
    "imtl_g": {"type": "imtl_g"},
    "imtl_l": {"type": "imtl_l", "lr": 0.05},
    "aligned_mtl": {"type": "aligned_mtl"},
    "upgrad": {"type": "upgrad"},
    "db_mtl": {"type": "db_mtl", "beta": 0.9, "beta_sigma": 0.5},
    "gradvac": {"type": "gradvac", "beta": 0.5},
    "graddrop": {"type": "graddrop", "leak": 0.2},
    "stch": {"type": "stch", "mu": 0.5, "warmup_steps": 3, "nadir_steps": 4},
    "fairgrad": {"type": "fairgrad", "alpha": 0.5},
    "fairgrad_clipped": {"type": "fairgrad", "alpha": 2.0, "max_norm": 1.0},
}


def main(*argv):
    """``weighting_more.py ARGV``; ``argv`` defaults to the command line (a launch of several runs passes it)."""
    argv = [str(a) for a in argv] or sys.argv[1:]
    out_root, steps = argv[0], int(argv[1]) if len(argv) > 1 else 20
    until = int(argv[2]) if len(argv) > 2 and argv[2] != "-" else None
    from mtl.config.loading import load_job
    from mtl.core.runtime import init_distributed, select_device
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer
    from tests.dist_scripts.weighting_all import job

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
