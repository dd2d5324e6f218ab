"""An architecture's copies of the backbone (``cross_stitch_backbone``: a column per task) are treated as the
backbone is: pretrained weights, ``backbone.freeze``, ``optimizer.lr_mult``; a run's export and ``mtl eval RUN``
use its trained columns. Findings of a review of the architecture, each test failing without its fix."""
import json
import os

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.train.job import build_job
from tests.dist_scripts import architectures_all

STITCHED = {"type": "cross_stitch_backbone"}


def raw_job(out, steps=4, **extra):
    raw = architectures_all.job(str(out), "cross_stitch_backbone_imtl", steps)
    raw.update(weighting={"type": "static"}, distributed={"sync_bn": False}, **extra)
    return raw


def pretrained_file(folder):
    """A .pdparams of the job's CNN with recognisable weights."""
    job = build_job(load_job(data=raw_job(folder / "unused")), announce_plan=False)
    state = {k: paddle.full(v.shape, 0.01 * (i + 1), v.dtype) for i, (k, v) in
             enumerate(job.model.backbone.state_dict().items())}
    path = str(folder / "cnn.pdparams")
    paddle.save(state, path)
    return path, {k: v.numpy() for k, v in state.items()}


def test_copies_start_from_the_pretrained_backbone_freeze_and_take_its_learning_rate(tmp_path):
    path, state = pretrained_file(tmp_path)
    raw = raw_job(tmp_path / "run")
    raw["backbone"] = dict(raw["backbone"], pretrained=path, freeze=["body.0"])
    raw["optimizer"] = dict(raw["optimizer"], lr_mult={"backbone": 0.1, "architecture.stitches": 10.0})
    model = build_job(load_job(data=raw), announce_plan=False).model
    copies = model.architecture.backbone_copies()
    assert len(copies) == 2
    for copy in copies:
        for name, value in copy.state_dict().items():  # Misra et al.: every column starts from the one network
            np.testing.assert_array_equal(value.numpy(), state[name], err_msg=name)
        assert copy.body[0].weight.stop_gradient and not copy.body[1].weight.stop_gradient
    rates = {n: p.optimize_attr["learning_rate"] for n, p in model.named_parameters() if not p.stop_gradient}
    assert rates["backbone.fc.weight"] == rates["architecture.columns.0.fc.weight"] == pytest.approx(0.1)
    assert rates["architecture.columns.1.body.1.weight"] == pytest.approx(0.1)
    assert rates["architecture.stitches.0.0"] == pytest.approx(10.0)
    assert {rates[n] for n in rates if n.startswith("heads.")} == {1.0}


def test_a_trained_runs_export_and_eval_use_its_columns_without_the_pretrained_file(tmp_path, monkeypatch):
    """The copies were built from the job's backbone config, pretrained file included: once it was gone, export
    failed; ``mtl eval RUN`` scored the columns and stitches at their initial weights."""
    from mtl.commands.evaluate_run import evaluate_run
    from mtl.serving.export import export
    from mtl.train.trainer import Trainer

    path, _ = pretrained_file(tmp_path)
    raw = raw_job(tmp_path / "run", steps=6)
    raw["backbone"] = dict(raw["backbone"], pretrained=path)
    job = build_job(load_job(data=raw), announce_plan=False)
    summary = Trainer(job, console=lambda *a: None, overwrite=True).run()
    os.remove(path)
    meta = export(str(tmp_path / "run"), str(tmp_path / "export"), task="soft3")
    assert meta["architecture"]["type"] == "cross_stitch_backbone"
    from mtl.core.safe_pickle import load_paddle_file
    from mtl.evaluation import evaluator

    scored, evaluate = {}, evaluator.Evaluator.evaluate

    def recording(self):  # the weights mtl eval RUN scores with
        scored.update({k: v.numpy() for k, v in self.job.model.architecture.state_dict().items()})
        return evaluate(self)

    monkeypatch.setattr(evaluator.Evaluator, "evaluate", recording)
    results = evaluate_run(str(tmp_path / "run"), console=lambda *a: None)
    trained = load_paddle_file(str(tmp_path / "run" / "checkpoints" / "step_6" / "architecture.pdparams"))
    assert sorted(scored) == sorted(trained) and any(k.startswith("columns.") for k in scored)
    for key, value in trained.items():
        np.testing.assert_array_equal(scored[key], value, err_msg=key)
    with open(tmp_path / "run" / "summary.json") as f:
        assert results["soft3"] == pytest.approx(json.load(f)["tasks"]["soft3"]["eval"], rel=1e-6)
    assert summary is not None


def test_one_task_or_a_backbone_without_stages_is_refused():
    raw = raw_job("unused")
    raw["tasks"] = raw["tasks"][2:]
    with pytest.raises(ConfigError, match="architecture.type: .*this job has one task: use architecture: hard"):
        build_job(load_job(data=raw), announce_plan=False)
