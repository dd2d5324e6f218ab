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
from tools.task_gradients import load_checkpoint, report, task_gradients


def test_norms_and_cosines_are_each_tasks_own_gradient(tmp_path):
    from mtl.backbones import rows
    from mtl.data.steps import StepDataset
    from mtl.train.step import as_tensors

    cfg = load_job(data=text_job(tmp_path))
    tasks, norms, cosines = task_gradients(build_job(cfg, announce_plan=False), [0, 1], cfg["seed"])
    built = build_job(cfg, announce_plan=False)  # the same initial weights (seed 3)
    model = built.model
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
    assert "| norm (share) |" in report(tasks, norms, cosines)
    assert np.all(norms[:, 1:] > 0)  # upos: the tagger starts at 0


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
