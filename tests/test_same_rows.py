"""``schedule.same_rows`` (every task reads the same samples in each step, LibMTL's single-input mode): refused at
load time where it cannot hold (sample mode, unequal sub-batches) and when the job is built where the readers differ
(sizes, inputs); a task whose reader alters its inputs (masked LM) keeps rows and a backbone pass of its own; MGDA-UB
on the paired rows' Gram matrix. Which rows each task reads: tests/test_data.py; 1
against 2 processes: tests/test_arch_training.py (the ``adapters_same_rows`` run of
tests/dist_scripts/architectures_all.py)."""
import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.train.job import build_job
from tests.same_rows_jobs import text_job


def job(**schedule):
    """Two classification tasks over the synthetic reader's 40 inputs of seed 7 (``reader``: more keys of task b;
    ``ratios``: the tasks')."""
    more, ratios = schedule.pop("reader", {}), schedule.pop("ratios", [1, 1])
    task = {"type": "synthetic", "num_samples": 40, "num_classes": 4, "seed": 7}
    return {"tasks": [{"name": "a", "reader": task, "head": {"type": "softmax"}, "ratio": ratios[0]},
                      {"name": "b", "reader": {**task, **more}, "head": {"type": "softmax"}, "ratio": ratios[1]}],
            "backbone": {"type": "mlp"}, "schedule": {"batch_size": 8, "steps": 2, "same_rows": True, **schedule}}


@pytest.mark.parametrize("schedule, text", [
    ({"mode": "sample"}, "this needs schedule.mode: joint"),
    ({"batch_size": 9}, "same sub-batch for every task, the ratios give 'a' 5, 'b' 4: make schedule.batch_size a "
                        "multiple of the 2 tasks"),
    ({"batch_size": 9, "ratios": [2, 1]}, "the ratios give 'a' 6, 'b' 3: give every task the same ratio")])
def test_same_rows_is_refused_at_load_time_where_it_cannot_hold(schedule, text):
    with pytest.raises(ConfigError) as caught:
        load_job(data=job(**schedule))
    assert caught.value.key == "schedule.same_rows" and text in str(caught.value)


def test_same_rows_gives_a_masked_lm_task_rows_of_its_own(tmp_path, capsys):
    """Masked LM corrupts its texts, so its rows are never the other tasks' inputs: it keeps its own order and sub-batch
    (any size) while the others share theirs; the start says so."""
    schedule = build_job(load_job(data=text_job(tmp_path))).schedule
    assert ("schedule.same_rows: 'upos', 'genre' read the same 4 samples a step (one backbone pass); 'mlm' reads 2 of "
            "its own through a pass of its own (a reader that alters its inputs)") in capsys.readouterr().out
    assert schedule.sizes == {"upos": 4, "genre": 4, "mlm": 2} and schedule.own_rows == ["mlm"]
    assert [schedule.order_key(t) for t in ("upos", "genre", "mlm")] == ["upos", "upos", "mlm"]
    assert schedule.row_sharing() == ["upos", "genre"] and schedule.state_dict()["own_rows"] == ["mlm"]


@pytest.mark.parametrize("change, text", [
    ({"batch_size": 9}, "'upos' 4, 'genre' 3: choose schedule.batch_size so that the tasks that share rows get equal "
                        "sub-batches (the next that does: 10)"),
    ({"ratios": (2, 1, 0.5)}, "give every task that shares rows the same ratio")])
def test_same_rows_with_a_masked_lm_task_is_refused_where_the_shared_rows_cannot_hold(tmp_path, change, text):
    cfg = text_job(tmp_path, **change)
    with pytest.raises(ConfigError) as caught:
        load_job(data=cfg)
    assert caught.value.key == "schedule.same_rows" and text in str(caught.value)


def test_same_rows_is_refused_when_every_task_alters_its_inputs(tmp_path):
    cfg = text_job(tmp_path)
    cfg["tasks"] = [cfg["tasks"][2], {**cfg["tasks"][2], "name": "mlm2"}]
    with pytest.raises(ConfigError) as caught:
        load_job(data=cfg)
    assert caught.value.key == "schedule.same_rows" and "every task's reader changes its inputs (mlm, mlm2)" in str(
        caught.value)


def test_a_task_of_its_own_rows_gets_a_backbone_pass_of_its_own_and_the_gradient_of_the_sum(tmp_path):
    """One step of the same_rows text job: the encoder runs once over the shared rows (4 sentences for upos and
    genre) and once over masked LM's own 2 corrupted ones; the gradient of every parameter equals ``paddle.grad`` of
    the weighted sum of the three losses computed by hand, each head on the encoder's output of its own inputs."""
    from mtl.backbones import rows
    from mtl.data.steps import StepDataset
    from mtl.train.step import as_tensors

    built = build_job(load_job(data=text_job(tmp_path)), announce_plan=False)
    model = built.model
    batch = as_tensors(StepDataset(built.schedule, {t.name: t.reader for t in built.tasks}, 3, 0, 1)[0])
    np.testing.assert_array_equal(batch["upos"]["token_ids"].numpy(), batch["genre"]["token_ids"].numpy())
    assert (batch["mlm"]["mlm_labels"].numpy() >= 0).any()
    params = [p for p in model.parameters() if not p.stop_gradient]
    total = 0.0
    for task in ("upos", "genre", "mlm"):  # the reference: each task's own inputs through the encoder
        head = model.heads[task]
        feats = model.backbone({k: v for k, v in batch[task].items()})
        feature = rows.select(feats, head.reads, model.backbone.default_output)
        total = total + head(feature, head.labels_of(batch[task])).loss * model.loss_weights[task]
    expected = paddle.grad([total], params, allow_unused=True)
    seen = []
    model.backbone.register_forward_pre_hook(lambda layer, inputs: seen.append(int(inputs[0]["token_ids"].shape[0])))
    model.backward(model.forward(batch, step=0))
    assert seen == [4, 2]
    for param, reference in zip(params, expected):
        got = np.zeros(param.shape) if param.grad is None else param.grad.numpy()
        want = np.zeros(param.shape) if reference is None else reference.numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=param.name)


@pytest.mark.parametrize("reader, text", [
    ({"num_samples": 41}, "training splits differ in size ('a' 40, 'b' 41)"),
    ({"seed": 8}, "at training sample 0 the 'image' of task 'b' differs from that of task 'a'")])
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
    names = ["a", "b", "c"]
    np.testing.assert_allclose(representation_gram(tensors, names, paired=dict.fromkeys(names, "z")).numpy(), full,
                               rtol=1e-12)
    np.testing.assert_allclose(representation_gram(tensors, names).numpy(), np.diag(np.diag(full)), rtol=1e-12)
    own = full.copy()  # c on rows of its own (masked LM under same_rows): it pairs with no other task
    own[2, :2] = own[:2, 2] = 0.0
    np.testing.assert_allclose(representation_gram(tensors, names, paired={"a": "z", "b": "z"}).numpy(), own,
                               rtol=1e-12)
    apart = np.diag(np.diag(full))  # a and b on the same rows but reading different outputs of the backbone
    apart[0, 2] = apart[2, 0] = full[0, 2]
    np.testing.assert_allclose(representation_gram(tensors, names, paired={"a": "z", "b": "y", "c": "z"}).numpy(),
                               apart, rtol=1e-12)


@pytest.mark.parametrize("architecture", [{"type": "hard"}, {"type": "hard", "tower": [6]}])
def test_mgda_ub_on_same_rows_is_sener_and_koltuns_min_norm_of_the_paired_gram(tmp_path, architecture):
    """One step of MGDA-UB on two tasks over the same images, without and with task towers: the logged alpha is the
    two-task min-norm point (Sener and Koltun, Algorithm 1: alpha = clip((G_bb - G_ab) / (G_aa + G_bb - 2 G_ab), 0,
    1)) of the Gram matrix of dL_t/dz at the backbone's output z, computed here by a forward of our own (one
    backbone pass, each task's tower and head, ``paddle.grad`` to z); not the diagonal's G_bb / (G_aa + G_bb)."""
    import json
    import os

    from mtl.core.runtime import select_device
    from mtl.data.steps import StepDataset
    from mtl.train.trainer import Trainer

    select_device("cpu")
    raw = job(reader={"target": "multilabel"}, steps=1)
    raw.update(output_dir=str(tmp_path / "run"), weighting={"type": "mgda", "representation": True},
               log={"every": 1, "progress": False, "plot": False}, data={"num_workers": 0},
               architecture=architecture)
    raw["tasks"][1]["head"] = {"type": "multilabel"}
    Trainer(build_job(load_job(data=raw)), console=lambda *a: None, overwrite=True).run()
    with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
        logged = next(r for r in map(json.loads, f) if "alpha/a" in r)
    fresh = build_job(load_job(data=raw), announce_plan=False)  # the same initial weights
    batch = StepDataset(fresh.schedule, {t.name: t.reader for t in fresh.tasks}, raw.get("seed", 0), 0, 1)[0]
    np.testing.assert_array_equal(batch["a"]["image"], batch["b"]["image"])
    model = fresh.model
    z = model.backbone({"image": paddle.to_tensor(batch["a"]["image"])})
    g = {}
    for task in ("a", "b"):
        feature = z if model.architecture.is_identity else model.architecture(task, z)
        head = model.heads[task]
        loss = head(feature, head.labels_of({k: paddle.to_tensor(v) for k, v in batch[task].items()})).loss
        (grad,) = paddle.grad([loss], [z], retain_graph=True)
        g[task] = grad.numpy().astype(np.float64)
    aa, bb, ab = (g["a"] * g["a"]).sum(), (g["b"] * g["b"]).sum(), (g["a"] * g["b"]).sum()
    expected = float(np.clip((bb - ab) / (aa + bb - 2 * ab), 0.0, 1.0))
    assert logged["alpha/a"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert abs(expected - bb / (aa + bb)) > 1e-3, (expected, bb / (aa + bb))  # 100 x the tolerance above


def test_the_backbone_runs_once_over_rows_every_task_shares():
    """Under same_rows the backbone sees each step's rows once (4 of the 8), not once per task."""
    built = build_job(load_job(data=job()), announce_plan=False)
    seen = []
    built.model.backbone.register_forward_pre_hook(lambda layer, inputs: seen.append(inputs[0]["image"].shape[0]))
    reader = built.tasks[0].reader
    sub = {"image": paddle.to_tensor(np.stack([reader[i]["image"] for i in range(4)])),
           "label": paddle.to_tensor(np.array([reader[i]["label"] for i in range(4)]))}
    built.model.backward(built.model.forward({"a": sub, "b": sub}, step=0))
    assert seen == [4]


def test_mgda_ub_on_same_rows_is_refused_where_the_task_layers_are_inside_the_backbone():
    raw = job(reader={})
    raw.update(weighting={"type": "mgda", "representation": True}, backbone={"type": "cnn", "channels": [4]},
               architecture={"type": "adapters"})
    with pytest.raises(ConfigError) as caught:
        load_job(data=raw)
    assert caught.value.key == "weighting.representation" and "architecture 'adapters'" in str(caught.value)


@pytest.mark.parametrize("weighting", ["mgda", "imtl_g"])
def test_representation_weighting_on_shared_rows_beside_masked_lm_and_heads_of_two_outputs(tmp_path, weighting):
    """MGDA-UB and IMTL-G (``representation: true``) on the same_rows text job: upos reads the encoder's word
    vectors, genre its pooled vector (they meet at 0 in the Gram matrix, not as a shape error), masked LM its own
    rows (it pairs with none); the alphas of the three tasks are logged every step."""
    import json
    import os

    from mtl.train.trainer import Trainer

    raw = text_job(tmp_path)
    raw["tasks"][1]["head"]["pooling"] = "pooled"
    raw.update(output_dir=str(tmp_path / "run"), weighting={"type": weighting, "representation": True},
               log={"every": 1, "progress": False, "plot": False}, data={"num_workers": 0})
    built = build_job(load_job(data=raw))
    assert [built.model.reads_output(t) for t in ("upos", "genre")] == ["sequence", "pooled"]
    Trainer(built, console=lambda *a: None, overwrite=True).run()
    with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
        logged = [r for r in map(json.loads, f) if "alpha/upos" in r]
    assert len(logged) == 2 and all(np.isfinite([r[f"alpha/{t}"] for t in ("upos", "genre", "mlm")]).all()
                                    for r in logged)


def test_each_task_alone_of_a_same_rows_job_builds_masked_lm_included(tmp_path):
    """The single-task jobs a baseline derives (mtl baseline, the reports' alone runs) have nothing to share: each
    builds, the masked-LM one too (it failed on an empty list of row-sharing tasks)."""
    from mtl.studies.comparison import single_task_config

    cfg = load_job(data=text_job(tmp_path))
    cfg["output_dir"] = str(tmp_path / "run")
    for task, rows in (("upos", 4), ("genre", 4), ("mlm", 2)):
        built = build_job(single_task_config(cfg, task, rows), announce_plan=False)
        assert list(built.model.heads) == [task] and built.schedule.sizes == {task: rows}
