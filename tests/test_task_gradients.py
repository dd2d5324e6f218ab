"""tools/task_gradients.py: each task's gradient over the backbone's parameters equals ``paddle.grad`` of that
task's weighted loss computed by hand (each head on the backbone's output of its own inputs), and a checkpoint's
weights are the ones measured."""
import os

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.train.job import build_job
from tests.same_rows_jobs import text_job
from tools.task_gradients import load_checkpoint, report, task_gradient_rows, task_gradients


def test_norms_and_cosines_are_each_tasks_own_gradient(tmp_path):
    from mtl.backbones import rows
    from mtl.data.steps import StepDataset
    from mtl.train.step import as_tensors

    cfg = load_job(data=text_job(tmp_path))
    measured = build_job(cfg, announce_plan=False)
    moved(measured.model)
    tasks, norms, cosines = task_gradients(measured, [0, 1], cfg["seed"])
    built = build_job(cfg, announce_plan=False)  # the same initial weights (seed 3)
    model = built.model
    moved(model)
    model.train()  # the text job has no dropout
    params = [p for p in model.backbone.parameters() if not p.stop_gradient]
    data = StepDataset(built.schedule, {t.name: t.reader for t in built.tasks}, cfg["seed"], 0, 2)
    for step in (0, 1):
        batch = as_tensors(data[step])
        flat = []
        for task in tasks:
            head = model.heads[task]
            feature = rows.select(model.backbone(batch[task]), head.reads, model.backbone.default_output)
            loss = head(feature, head.labels_of(batch[task])).loss * model.loss_weights[task]
            found = paddle.grad([loss], params, allow_unused=True)
            flat.append(np.concatenate([(np.zeros(p.shape) if g is None else g.numpy()).ravel()
                                        for g, p in zip(found, params)]).astype(np.float64))
        matrix = np.stack(flat)
        n = np.linalg.norm(matrix, axis=1)
        np.testing.assert_allclose(norms[step], n, rtol=1e-5)
        np.testing.assert_allclose(cosines[step], matrix @ matrix.T / np.outer(n, n), rtol=1e-4, atol=1e-6)
    assert "| norm (share) |" in report(tasks, norms, cosines) and np.all(norms > 0)


def moved(model):
    """The upos tagger's output layer off its zero start (so that upos has a gradient to compare)."""
    rng = np.random.default_rng(0)
    for p in model.heads["upos"].parameters():
        p.set_value(rng.standard_normal(p.shape).astype("float32") * 0.1)


def steps_batch(built, step=0):
    from mtl.data.steps import StepDataset
    from mtl.train.step import as_tensors

    data = StepDataset(built.schedule, {t.name: t.reader for t in built.tasks}, built.cfg["seed"], 0, step + 1)
    return as_tensors(data[step])


def test_with_dropout_the_tasks_rows_add_up_to_the_joint_gradient(tmp_path):
    """Each task's forward draws the masks the joint step draws: the rows sum to the gradient of one backward of
    the weighted sum (fails when the generator's state is not restored before each forward)."""
    raw = text_job(tmp_path)
    raw["backbone"].update(dropout=0.3, embedding_dropout=0.2)
    built = build_job(load_job(data=raw), announce_plan=False)
    model = built.model
    moved(model)
    model.train()
    batch, draws = steps_batch(built), paddle.get_rng_state()
    rows = task_gradient_rows(model, batch, 0)
    paddle.set_rng_state(draws)
    model.backward(model.forward(batch, step=0))
    joint = np.concatenate([p.grad.numpy().ravel().astype(np.float64) for p in model.shared_parameters()])
    np.testing.assert_allclose(rows.sum(axis=0), joint, rtol=1e-4, atol=1e-7)
    assert np.all(np.linalg.norm(rows, axis=1) > 0)


def test_the_weightings_task_gradients_give_masked_lm_its_tied_embeddings_share(tmp_path):
    """The per-task gradient matrix of the gradient-based weightings (task_gradient_matrix, after the heads'
    backward with ``apart``) holds each task's own gradient: masked LM's row has what its output layer gives the
    tied input embeddings directly, the first task's row does not (before, the first task's row took it)."""
    from mtl.train.balancing import task_gradient_matrix

    built = build_job(load_job(data=text_job(tmp_path)), announce_plan=False)
    model = built.model
    moved(model)
    model.train()
    batch = steps_batch(built)
    expected = task_gradient_rows(model, batch, 0)
    heads = model.backward_heads(model.forward(batch, step=0), apart=True)
    assert set(heads.direct) == {"mlm"}
    matrix = task_gradient_matrix(model, heads, list(model.heads.keys())).numpy().astype(np.float64)
    np.testing.assert_allclose(matrix, expected, rtol=1e-4, atol=1e-7)


def test_a_checkpoints_weights_are_measured_and_a_missing_file_is_named(tmp_path):
    cfg = load_job(data=text_job(tmp_path))
    cfg["output_dir"] = str(tmp_path / "run")
    trained = build_job(cfg, announce_plan=False)
    folder = tmp_path / "ck"
    os.makedirs(folder / "heads")
    for p in trained.model.backbone.parameters():
        p.set_value(p.numpy() * 0.5)
    paddle.save(trained.model.backbone.state_dict(), str(folder / "backbone.pdparams"))
    for task, head in trained.model.heads.items():
        paddle.save(head.state_dict(), str(folder / "heads" / f"{task}.pdparams"))
    fresh = build_job(cfg, announce_plan=False)
    load_checkpoint(fresh.model, str(folder))
    for a, b in zip(fresh.model.backbone.parameters(), trained.model.backbone.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    os.remove(folder / "heads" / "mlm.pdparams")
    with pytest.raises(ConfigError, match="has no .*mlm.pdparams"):
        load_checkpoint(fresh.model, str(folder))
