"""Fine-tuning: frozen parameters (bit-identical, no optimizer state), frozen BatchNorm statistics, learning-rate
multipliers against one SGD / momentum step computed by hand, config errors, and the recipe
(examples/configs/finetune_insightface.yaml) from a converted model, resumed bit-identically."""
import copy
import os

import numpy as np
import paddle
import pytest

from mtl.cli import main as mtl_main
from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.core.safe_pickle import load_paddle_file
from mtl.data.steps import StepDataset
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests.references.torch_format import insightface_names, randomized, torch_layout, write_torch_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "examples", "configs", "finetune_insightface.yaml")
TASKS = [{"name": "cls", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 5, "shape": [1, 8, 8],
                                    "seed": 1}, "head": {"type": "softmax"}, "eval": None}]


def job_cfg(tmp_path, backbone, **over):
    data = {"seed": 0, "output_dir": str(tmp_path / "run"), "tasks": copy.deepcopy(TASKS), "backbone": backbone,
            "schedule": {"batch_size": 8, "steps": 4},
            "optimizer": {"type": "momentum", "lr": 0.1, "warmup_steps": 0, "decay": "none", "weight_decay": 0.01},
            "log": {"every": 1, "progress": False, "plot": False}, "data": {"num_workers": 0}}
    data.update(over)
    return load_job(data=data)


def arrays(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


CNN = {"type": "cnn", "channels": [4, 8], "embedding_size": 6, "embedding_bn": True}


def test_frozen_parameters_stay_bit_identical_and_hold_no_optimizer_state(tmp_path):
    cfg = job_cfg(tmp_path, {**CNN, "freeze": ["body.0", "body.1"], "freeze_bn": True},
                  checkpoint={"every": 4})
    job = build_job(cfg)
    before = arrays(job.model)
    Trainer(job, console=lambda *a: None).run()
    after = arrays(job.model)
    frozen = [k for k in before if k.startswith(("backbone.body.0.", "backbone.body.1."))]
    assert sorted(frozen) == ["backbone.body.0.weight", "backbone.body.1._mean", "backbone.body.1._variance",
                              "backbone.body.1.bias", "backbone.body.1.weight"]
    for key in frozen + [k for k in before if k.endswith(("_mean", "_variance"))]:  # freeze_bn: every statistic
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    for key in ("backbone.body.3.weight", "backbone.body.4.weight", "backbone.fc.weight", "heads.cls.weight"):
        assert not np.array_equal(after[key], before[key]), key
    state = load_paddle_file(str(tmp_path / "run" / "checkpoints" / "step_4" / "optimizer.rank0.pdopt"))
    owners = {k.split("::")[0] for k in state if isinstance(k, str) and "::" in k}
    assert not owners & {"backbone.body.0.weight", "backbone.body.1.weight", "backbone.body.1.bias"}
    assert {"backbone.body.3.weight", "backbone.fc.weight", "heads.cls.weight"} <= owners


def test_freeze_bn_uses_running_statistics_in_training():
    """A frozen-statistics BatchNorm computes in training what it computes in evaluation."""
    from mtl.train.finetune import freeze_batchnorm

    model = randomized({"type": "iresnet18", "input_size": 16, "embedding_size": 8})
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype("float32"))
    expected = model.eval()({"image": x}).numpy()
    freeze_batchnorm(model)
    np.testing.assert_array_equal(model.train()({"image": x}).numpy(), expected)


def hand_step(kind, w, g, lr, mult, wd, momentum=0.9):
    """One step of Paddle's SGD / Momentum (L2 weight decay) from zero velocity, with the learning rate lr * mult."""
    step = g + np.float32(wd) * w
    scaled = np.float32(lr) * np.float32(mult)
    return w - scaled * step  # momentum's first step: v = 0 * momentum + step


@pytest.mark.parametrize("kind", ["sgd", "momentum"])
def test_lr_multipliers_scale_one_step_as_computed_by_hand(kind, tmp_path):
    backbone = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "embedding_size": 8}
    table = {"backbone.layers.0": 0.1, "backbone": 0.5, "heads": {"cls": 2.0}}  # nested = dotted
    cfg = job_cfg(tmp_path, backbone, optimizer={"type": kind, "lr": 0.2, "warmup_steps": 0, "decay": "none",
                                                 "weight_decay": 0.01, "lr_mult": table},
                  schedule={"batch_size": 8, "steps": 1})
    job = build_job(cfg)
    w0 = arrays(job.model)
    # the gradients of step 0, from a copy of the model at the same weights
    ref = build_job(cfg)
    ref.model.set_state_dict(job.model.state_dict())
    batch = StepDataset(ref.schedule, {t.name: t.reader for t in ref.tasks}, 0, 0, 1)[0]
    forward = ref.model({t: {k: paddle.to_tensor(v) for k, v in b.items()} for t, b in batch.items()}, 0)
    ref.model.backward(forward)
    grads = {n: p.grad.numpy() for n, p in ref.model.named_parameters() if p.grad is not None}
    Trainer(job, console=lambda *a: None).run()
    mults = {"backbone.layers.0.weight": 0.1, "backbone.layers.0.bias": 0.1, "backbone.layers.2.weight": 0.5,
             "backbone.layers.2.bias": 0.5, "heads.cls.weight": 2.0, "heads.cls.bias": 2.0}
    assert sorted(grads) == sorted(mults)
    got = arrays(job.model)
    for name, mult in mults.items():
        want = hand_step(kind, w0[name], grads[name], 0.2, mult, 0.01)
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
        assert not np.allclose(got[name], hand_step(kind, w0[name], grads[name], 0.2, 1.0, 0.01), rtol=1e-4)


@pytest.mark.parametrize("over, key, words", [
    ({"backbone": {**CNN, "freeze": ["body.7"]}}, "backbone.freeze.0", "names no parameter of the backbone"),
    ({"backbone": {**CNN, "freeze": ["body.1.weight"]}}, "backbone.freeze", "BatchNorm 'body.1'"),
    ({"backbone": {**CNN, "freeze": "body"}}, "backbone.freeze", "expected a list"),
    ({"backbone": {**CNN, "freeze_bn": "yes"}}, "backbone.freeze_bn", "true or false"),
    ({"optimizer": {"lr_mult": {"backbone.trunk": 0.1}}}, "optimizer.lr_mult.backbone.trunk", "names no parameter"),
    ({"optimizer": {"lr_mult": {"heads": -1}}}, "optimizer.lr_mult", "'heads': expected a learning-rate multiplier"),
])
def test_config_errors_name_the_key(over, key, words, tmp_path):
    with pytest.raises(ConfigError, match=words) as info:
        build_job(job_cfg(tmp_path, over.pop("backbone", CNN), **over))
    assert info.value.key == key


def converted_random_model(tmp_path):
    """A random-weight IResNet-18 (16x16 input) written in insightface's layout and converted by mtl convert."""
    source = randomized({"type": "iresnet18", "input_size": 16, "embedding_size": 16}, seed=4)
    path, dst = str(tmp_path / "r18.pth"), str(tmp_path / "r18.pdparams")
    state, storages = torch_layout(insightface_names(source))
    write_torch_file(path, state, storages)
    mtl_main(["convert", "insightface", path, dst, "--arch", "iresnet18"])
    return dst, source


def recipe(tmp_path, pretrained, name, steps=4):
    overrides = ["backbone.type=iresnet18", "backbone.input_size=16", "backbone.embedding_size=16",
                 f"backbone.pretrained={pretrained}", f"output_dir={tmp_path / name}", f"schedule.steps={steps}",
                 "schedule.batch_size=8", "checkpoint.every=2", "optimizer.warmup_steps=1", "log.every=1",
                 "log.progress=false", "log.plot=false", "data.num_workers=0"]
    return load_job(RECIPE, overrides)


@pytest.mark.slow
def test_recipe_from_a_converted_model_resumes_bit_identically(tmp_path):
    """The recipe starts from the converted weights (the backbone's frozen part and every BatchNorm statistic stay
    as converted) with a new 20-class head; stopped at step 2 and resumed, it ends where an uninterrupted run ends."""
    pretrained, source = converted_random_model(tmp_path)
    full = build_job(recipe(tmp_path, pretrained, "full"))
    start = {k: v.numpy().copy() for k, v in source.state_dict().items()}
    np.testing.assert_array_equal(full.backbone.layer2[0].conv1.weight.numpy(), start["layer2.0.conv1.weight"])
    assert full.task("orl").head.class_count() == 20
    Trainer(full, console=lambda *a: None).run()
    end = arrays(full.backbone)
    for key in [k for k in start if k.startswith(("conv1", "bn1", "prelu", "layer1"))] + \
            [k for k in start if k.endswith(("_mean", "_variance"))]:
        np.testing.assert_array_equal(end[key], start[key], err_msg=key)
    assert not np.array_equal(end["layer2.0.conv1.weight"], start["layer2.0.conv1.weight"])
    first = build_job(recipe(tmp_path, pretrained, "stopped"))
    Trainer(first, console=lambda *a: None).run(until=2)
    resumed = build_job(recipe(tmp_path, pretrained, "stopped"))
    trainer = Trainer(resumed, resume=True, console=lambda *a: None)
    assert trainer.start_step == 2
    trainer.run()
    a, b = arrays(full.model), arrays(resumed.model)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_lr_multiplier_reaches_the_row_sparse_update(tmp_path):
    """Partial FC's sampled rows are updated by the row-sparse optimizer, which applies the head's multiplier too:
    after one SGD step from the same weights and batch, the rows moved by exactly half as much with heads: 0.5."""
    task = {"name": "pfc", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 30, "seed": 3},
            "head": {"type": "arcface", "scale": 8.0, "sample_ratio": 0.2}, "eval": None}
    moved = {}
    for mult in (1.0, 0.5):
        cfg = job_cfg(tmp_path / str(mult), CNN, tasks=[task], schedule={"batch_size": 8, "steps": 1},
                      optimizer={"type": "sgd", "lr": 0.5, "warmup_steps": 0, "decay": "none", "weight_decay": 0.0,
                                 "lr_mult": {"heads": mult}})
        job = build_job(cfg)
        before = arrays(job.model)
        Trainer(job, console=lambda *a: None).run()
        moved[mult] = {k: arrays(job.model)[k] - before[k] for k in before if k.startswith("heads.")}
    for key, delta in moved[1.0].items():
        assert np.abs(delta).max() > 0, key
        np.testing.assert_allclose(moved[0.5][key], 0.5 * delta, rtol=1e-5, atol=1e-9, err_msg=key)
