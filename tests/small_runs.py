"""A small trained run that the export and evaluation tests start from (tests/test_export.py,
tests/test_ecosystem_eval.py)."""
from mtl.config.loading import load_job
from mtl.job import build_job
from mtl.train.trainer import Trainer


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
