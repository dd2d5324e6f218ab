"""``schedule.same_rows`` (every task reads the same samples in each step, LibMTL's single-input mode): refused at
load time where it cannot hold (sample mode, unequal sub-batches) and when the job is built where the readers differ
(sizes, inputs); MGDA-UB on the paired rows' Gram matrix. Which rows each task reads: tests/test_data.py; 1
against 2 processes: tests/test_arch_training.py (the ``adapters_same_rows`` run of
tests/dist_scripts/architectures_all.py)."""
import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.errors import ConfigError
from mtl.job import build_job


def job(**schedule):
    """Two classification tasks over the synthetic reader's 40 inputs of seed 7 (``reader``: more keys of task b)."""
    more = schedule.pop("reader", {})
    task = {"type": "synthetic", "num_samples": 40, "num_classes": 4, "seed": 7}
    return {"tasks": [{"name": "a", "reader": task, "head": {"type": "softmax"}},
                      {"name": "b", "reader": {**task, **more}, "head": {"type": "softmax"}}],
            "backbone": {"type": "mlp"}, "schedule": {"batch_size": 8, "steps": 2, "same_rows": True, **schedule}}


@pytest.mark.parametrize("schedule, text", [
    ({"mode": "sample"}, "this needs schedule.mode: joint"),
    ({"batch_size": 9}, "same sub-batch for every task, the ratios give 'a' 5, 'b' 4: give every task the same "
                        "ratio")])
def test_same_rows_is_refused_at_load_time_where_it_cannot_hold(schedule, text):
    with pytest.raises(ConfigError) as caught:
        load_job(data=job(**schedule))
    assert caught.value.key == "schedule.same_rows" and text in str(caught.value)


@pytest.mark.parametrize("reader, text", [
    ({"num_samples": 41}, "training splits differ in size ('a' 40, 'b' 41)"),
    ({"seed": 8}, "training sample 0 of task 'b' has another 'image' than task 'a''s")])
def test_same_rows_refuses_readers_of_other_inputs_when_the_job_is_built(reader, text):
    cfg = load_job(data=job(reader=reader))
    with pytest.raises(ConfigError) as caught:
        build_job(cfg, announce_plan=False)
    assert caught.value.key == "schedule.same_rows" and text in str(caught.value)



def test_representation_gram_pairs_rows_only_when_they_are_the_same_inputs():
    from mtl.train.balancing import representation_gram

    rng = np.random.RandomState(0)
    grads = {t: rng.randn(6, 5) for t in ("a", "b", "c")}
    tensors = {t: paddle.to_tensor(g, dtype="float32") for t, g in grads.items()}
    as32 = np.stack([np.asarray(g, np.float32).astype(np.float64) for g in grads.values()])
    full = np.einsum("trd,srd->ts", as32, as32)
    np.testing.assert_allclose(representation_gram(tensors, ["a", "b", "c"], paired=True).numpy(), full, rtol=1e-12)
    np.testing.assert_allclose(representation_gram(tensors, ["a", "b", "c"]).numpy(), np.diag(np.diag(full)),
                               rtol=1e-12)


def test_mgda_ub_on_same_rows_is_sener_and_koltuns_min_norm_of_the_paired_gram(tmp_path):
    """One step of MGDA-UB on two tasks over the same images: the logged alpha is the two-task min-norm point of the
    Gram matrix of the paired rows' feature gradients (Sener and Koltun, Algorithm 1: alpha = clip((G_bb - G_ab) /
    (G_aa + G_bb - 2 G_ab), 0, 1)), not the diagonal's G_bb / (G_aa + G_bb)."""
    import json
    import os

    from mtl.data.steps import StepDataset
    from mtl.runtime import select_device
    from mtl.train.trainer import Trainer

    select_device("cpu")
    raw = job(reader={"target": "multilabel"}, steps=1)
    raw.update(output_dir=str(tmp_path / "run"), weighting={"type": "mgda", "representation": True},
               log={"every": 1, "progress": False, "plot": False}, data={"num_workers": 0})
    raw["tasks"][1]["head"] = {"type": "multilabel"}
    Trainer(build_job(load_job(data=raw)), console=lambda *a: None, overwrite=True).run()
    with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
        logged = next(r for r in map(json.loads, f) if "alpha/a" in r)
    fresh = build_job(load_job(data=raw), announce_plan=False)  # the same initial weights
    batch = StepDataset(fresh.schedule, {t.name: t.reader for t in fresh.tasks}, raw.get("seed", 0), 0, 1)[0]
    tensors = {t: {k: paddle.to_tensor(v) for k, v in sub.items()} for t, sub in batch.items()}
    np.testing.assert_array_equal(batch["a"]["image"], batch["b"]["image"])
    fresh.model.forward(tensors, step=0)
    fresh.model.backward_heads()
    g = {t: v.numpy().astype(np.float64).reshape(len(v), -1) for t, v in fresh.model.feature_gradients().items()}
    aa, bb, ab = (g["a"] * g["a"]).sum(), (g["b"] * g["b"]).sum(), (g["a"] * g["b"]).sum()
    expected = float(np.clip((bb - ab) / (aa + bb - 2 * ab), 0.0, 1.0))
    assert logged["alpha/a"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert abs(expected - bb / (aa + bb)) > 1e-3, (expected, bb / (aa + bb))  # 100 x the tolerance above
