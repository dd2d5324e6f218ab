"""Small jobs several test modules start from: a regression + multi-label job on an MLP (``TASKS``, ``job_cfg``:
tests/test_training.py, tests/test_reliability_checkpoint.py) and a small trained face-and-class run
(``train_run``: tests/test_export.py, tests/test_ecosystem_eval.py)."""
import copy

from mtl.config.loading import load_job
from mtl.train.job import build_job
from mtl.train.trainer import Trainer

TASKS = [
    {"name": "reg", "reader": {"type": "synthetic", "target": "regression", "num_samples": 40, "seed": 1},
     "head": {"type": "regression"}},
    {"name": "ml", "reader": {"type": "synthetic", "target": "multilabel", "num_samples": 30, "num_classes": 4,
                              "seed": 2},
     "head": {"type": "multilabel"}, "ratio": 2.0, "loss_weight": 0.5},
]


def job_cfg(tmp_path, **over):
    """The loaded config of the two :data:`TASKS` on an MLP, 6 steps of 12 samples, into ``tmp_path / "run"``;
    ``over`` replaces top-level keys (a dict updates that section)."""
    data = {"seed": 0, "output_dir": str(tmp_path / "run"), "tasks": copy.deepcopy(TASKS),
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "embedding_size": 8},
            "schedule": {"batch_size": 12, "steps": 6},
            "optimizer": {"type": "momentum", "lr": 0.05, "warmup_steps": 2, "decay": "cosine"},
            "log": {"every": 1, "progress": False, "plot": True}, "data": {"num_workers": 0}}
    for k, v in over.items():
        data[k] = v if not isinstance(v, dict) else {**data.get(k, {}), **v}
    return load_job(data=data)


def train_run(tmp_path, averaging=True, channels=1, size=8):
    """Train two tasks (arcface ids, softmax kinds) on synthetic images for 8 steps into ``tmp_path / "run"``, with
    window averaging or without; returns (job, trainer)."""
    data = {"seed": 0, "output_dir": str(tmp_path / "run"),
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 6,
                                                 "shape": [channels, size, size]},
                       "head": {"type": "arcface", "scale": 8.0}},
                      {"name": "kind", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 4,
                                                  "shape": [channels, size, size], "seed": 5},
                       "head": {"type": "softmax"}}],
            "backbone": {"type": "cnn", "in_channels": channels, "input_size": size, "embedding_size": 16},
            "schedule": {"batch_size": 16, "steps": 8}, "optimizer": {"lr": 0.05},
            "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}}
    if averaging:
        data["averaging"] = {"type": "window", "average_window_rate": 0.5, "min_average_window": 2,
                             "max_average_window": 4}
    job = build_job(load_job(data=data))
    trainer = Trainer(job, console=lambda *a: None)
    trainer.run()
    return job, trainer
