"""The large-scale recipes of examples/configs/ (docs/large-scale.md) load as written and train a few steps on
synthetic data at tiny sizes (readers, class counts, image size, batch and steps replaced through --set)."""
import json
import os

import numpy as np
import pytest

from mtl.config.loading import load_job
from tests.dist_util import ROOT
from tests.shared_runs import train_here

CONFIGS = os.path.join(ROOT, "examples", "configs")
TINY = ["schedule.steps=3", "log.every=1", "log.progress=false", "log.plot=false", "checkpoint.every=0",
        "data.num_workers=0", "optimizer.warmup_steps=1", "backbone.input_size=18", "backbone.embedding_size=16"]


def synthetic(task, classes, seed):
    return [f"tasks.{task}.reader={{type: synthetic, num_samples: 48, num_classes: {classes}, seed: {seed}}}",
            f"tasks.{task}.head.num_classes={classes}"]


RECIPES = {
    "ms1mv3_glint360k_r50_pfc01.yaml": synthetic(0, 40, 1) + synthetic(1, 60, 2) + [
        "schedule.batch_size=8", "backbone.type=iresnet50"],
    "webface42m_vit_t_adamw_pfc03.yaml": synthetic(0, 50, 3) + [
        "schedule.batch_size=16", "backbone.patch_size=9", "backbone.embed_dim=32", "backbone.depth=2",
        "backbone.num_heads=2", "backbone.recompute=true"],
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_loads_as_written(name):
    cfg = load_job(os.path.join(CONFIGS, name))
    heads = [t["head"] for t in cfg["tasks"]]
    assert all(h["sample_ratio"] < 1 for h in heads) and cfg["optimizer"]["decay"] == "poly"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_trains_a_few_steps_on_synthetic_data(tmp_path, name):
    out = tmp_path / "run"
    train_here(os.path.join(CONFIGS, name), "--set", f"output_dir={out}", *TINY, *RECIPES[name])
    with open(out / "metrics.jsonl") as f:
        records = [r for r in map(json.loads, f) if "lr" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(np.isfinite(v) for r in records for k, v in r.items() if k.startswith("loss"))
    assert records[0]["lr"] == 0.0 and records[1]["lr"] > 0  # one warm-up step, then the poly decay
    with open(out / "job.json") as f:
        job = json.load(f)
    assert job["schedule"]["accumulate"] == (4 if "vit" in name else 1)
