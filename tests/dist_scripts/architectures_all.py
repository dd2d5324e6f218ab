"""Train the same small job once per architecture (1 process, or under paddle.distributed.launch).

Usage: architectures_all.py OUT_ROOT [STEPS [UNTIL [NAMES]]]: one run per entry of RUNS (or per comma-separated name
of NAMES) in OUT_ROOT/<name>; with UNTIL, every run stops after step UNTIL and is then resumed to STEPS in the same
folder (the exact-resume check). Two ArcFace heads whose classes do not split evenly over 2 processes (7 and 5,
sharded) and one softmax head; MLP backbone without BatchNorm, or the small CNN with synchronised BatchNorm for the
architectures whose task layers are BatchNorms and adapters,
and for the one with a copy of it per task. Each architecture meets a weighting of another kind
(loss-based, Gram-based, matrix-based, representation-based) besides static; task BatchNorms also meet cross-head
negatives, and adapters tasks that read the same images in every step (``schedule.same_rows``; ``EXTRA``).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

MLP = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [32], "embedding_size": 16}
CNN = {"type": "cnn", "channels": [4, 8], "embedding_size": 16}
RUNS = {  # name: (architecture, backbone, weighting)
    "hard_tower": ({"type": "hard", "tower": [12]}, MLP, {"type": "static"}),
    "mmoe": ({"type": "mmoe", "experts": 3, "expert_layers": [12], "tower": [8]}, MLP, {"type": "static"}),
    "mmoe_pcgrad": ({"type": "mmoe", "experts": 3, "expert_layers": [12]}, MLP, {"type": "pcgrad"}),
    "omoe_uncertainty": ({"type": "mmoe", "experts": 3, "expert_layers": [12], "gates": "one"}, MLP,
                         {"type": "uncertainty", "lr": 0.05}),
    "cgc_mgda_ub": ({"type": "cgc", "task_experts": 1, "shared_experts": 2, "expert_layers": [12]}, MLP,
                    {"type": "mgda", "representation": True}),
    "ple_cagrad": ({"type": "ple", "levels": 2, "task_experts": 1, "shared_experts": 1, "expert_layers": [12]}, MLP,
                   {"type": "cagrad", "c": 0.4}),
    "cross_stitch_graddrop": ({"type": "cross_stitch", "layers": [12, 12]}, MLP, {"type": "graddrop"}),
    "task_norm": ({"type": "task_norm", "tower": [8]}, CNN, {"type": "static"}),
    "adapters_gradnorm": ({"type": "adapters"}, CNN, {"type": "gradnorm", "alpha": 1.5, "lr": 0.05}),
    "task_norm_cross": ({"type": "task_norm"}, CNN, {"type": "static"}),
    "adapters_same_rows": ({"type": "adapters"}, CNN, {"type": "static"}),
    "mgda_ub_same_rows": ({"type": "hard"}, MLP, {"type": "mgda", "representation": True}),  # the paired rows' Gram
    # a column of the CNN per task (their BatchNorms synchronised too), stitched after each stage
    "cross_stitch_backbone_imtl": ({"type": "cross_stitch_backbone"}, CNN, {"type": "imtl_g"}),
    # every task's rows in one pass through synchronised BatchNorms, differentiated task by task (Paddle 3.3 crashed
    # in a second backward through a PyLayer after one with retain_graph: JointModel.backward_backbone_per_task)
    "hard_sync_bn_pcgrad": ({"type": "hard"}, CNN, {"type": "pcgrad"}),
    # MultiMNIST's best joint configuration: a column per task over the same images (schedule.same_rows)
    "cross_stitch_backbone_same_rows": ({"type": "cross_stitch_backbone", "tower": [8]}, CNN, {"type": "static"}),
}
SAME_INPUTS = {"type": "synthetic", "num_samples": 48, "num_classes": 7, "seed": 1}  # one set of images, 3 targets
SAME_ROWS = {"tasks": [  # every task reads the same images in each step (schedule.same_rows)
    {"name": "arc7", "reader": SAME_INPUTS, "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]},
     "eval": None},
    {"name": "multi7", "reader": {**SAME_INPUTS, "target": "multilabel"}, "head": {"type": "multilabel"}},
    {"name": "reg", "reader": {**SAME_INPUTS, "target": "regression"}, "head": {"type": "regression"}}],
    "schedule": {"same_rows": True}}
EXTRA = {  # name: more job keys; task BatchNorms keep one embedding, so the ArcFace heads score each other's classes
    "task_norm_cross": {"cross_negatives": {"rate": 1.0, "mask": "online", "warmup": 2, "update": "both"}},
    "adapters_same_rows": SAME_ROWS, "mgda_ub_same_rows": SAME_ROWS, "cross_stitch_backbone_same_rows": SAME_ROWS,
}


def job(out, name, steps):
    """The raw config of run ``name``."""
    architecture, backbone, weighting = RUNS[name]
    extra = dict(EXTRA.get(name, {}))
    schedule = {"mode": "joint", "batch_size": 12, "steps": steps, **extra.pop("schedule", {})}
    return {
        "seed": 5, "device": "cpu", "output_dir": out, "weighting": weighting, "architecture": architecture,
        "tasks": [
            {"name": "arc7", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 7, "seed": 1},
             "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}, "eval": None},
            {"name": "arc5", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 5, "seed": 2},
             "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}, "eval": None},
            {"name": "soft3", "reader": {"type": "synthetic", "num_samples": 30, "num_classes": 3, "seed": 3},
             "head": {"type": "softmax"}},
        ],
        "backbone": backbone, "distributed": {"sync_bn": True},
        "schedule": schedule,
        "optimizer": {"type": "momentum", "lr": 0.05, "weight_decay": 0.0005, "decay": "none"},
        "log": {"every": 1, "progress": False, "plot": False},
        "checkpoint": {"every": 5, "keep": 1}, "data": {"num_workers": 0}, **extra,
    }


def main(*argv):
    """``architectures_all.py ARGV``; ``argv`` defaults to the command line (a launch of several runs passes it)."""
    argv = [str(a) for a in argv] or sys.argv[1:]
    out_root, steps = argv[0], int(argv[1]) if len(argv) > 1 else 12
    until = int(argv[2]) if len(argv) > 2 and argv[2] != "none" else None
    from mtl.config.loading import load_job
    from mtl.core.runtime import init_distributed, select_device
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    select_device("cpu")
    init_distributed()
    names = argv[3].split(",") if len(argv) > 3 else list(RUNS)
    for name in names:
        out = os.path.join(out_root, name)
        cfg = load_job(data=job(out, name, steps))
        if until is None:
            Trainer(build_job(cfg), console=lambda *a: None, overwrite=True).run()
            continue
        Trainer(build_job(cfg), console=lambda *a: None, overwrite=True).run(until=until)
        Trainer(build_job(cfg), console=lambda *a: None, resume=True).run()


if __name__ == "__main__":
    main()
