"""Partial FC's row-sparse update: only sampled class centres and their momentum change, as Paddle's Momentum would."""
import copy

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core import arrays
from mtl.core.errors import ConfigError
from mtl.data.steps import StepDataset
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests.row_updates import recorded_updates

LR, MOMENTUM, WD = 0.05, 0.9, 5e-4


def job_cfg(tmp_path, optimizer="momentum", clip=None):
    return load_job(data={
        "seed": 0, "output_dir": str(tmp_path / "run"),
        "tasks": [{"name": "pfc", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 40, "seed": 1},
                   "head": {"type": "arcface", "scale": 8.0, "sample_ratio": 0.2}}],
        "backbone": {"type": "mlp", "hidden": [16], "embedding_size": 8},
        "schedule": {"batch_size": 6, "steps": 4},
        "optimizer": {"type": optimizer, "lr": LR, "momentum": MOMENTUM, "weight_decay": WD, "decay": "none",
                      "clip_norm": clip},
        "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}})


def test_only_sampled_rows_and_their_momentum_change(tmp_path):
    job = build_job(job_cfg(tmp_path))
    trainer = Trainer(job, console=lambda *a: None)
    head = job.model.heads["pfc"]
    ds = StepDataset(job.schedule, {"pfc": job.task("pfc").reader}, 0, 0, 4)
    w = head.weight.numpy().astype(np.float64)
    v = np.zeros_like(w)
    updates = recorded_updates(trainer)
    for step in range(4):
        trainer.train_step(ds[step], step)
        sampled = head.last_sampled_classes.numpy()
        grad = updates[-1][head.weight.name].astype(np.float64)   # dense view of the sampled rows' gradient
        assert len(sampled) == 8                             # ceil(0.2 * 40)
        rest = np.setdiff1d(np.arange(40), sampled)
        new_w, new_v = head.weight.numpy(), trainer.optimizer.sparse.velocity(head.weight).numpy()
        # untouched rows: bit for bit, weight and momentum
        np.testing.assert_array_equal(new_w[rest], w[rest].astype(np.float32))
        np.testing.assert_array_equal(new_v[rest], v[rest].astype(np.float32))
        # sampled rows: Paddle Momentum with L2 decay, g' = g + wd w, v = mu v + g', w = w - lr v
        v[sampled] = MOMENTUM * v[sampled] + grad[sampled] + WD * w[sampled]
        w[sampled] = w[sampled] - LR * v[sampled]
        np.testing.assert_allclose(new_w[sampled], w[sampled], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(new_v[sampled], v[sampled], rtol=1e-5, atol=1e-7)
        w, v = new_w.astype(np.float64), new_v.astype(np.float64)


@pytest.mark.parametrize("host", [True, False])
def test_sparse_update_equals_paddle_momentum_on_the_sampled_rows(monkeypatch, host):
    """Independent reference: Paddle's own Momentum on a parameter holding just the sampled rows (our update in
    numpy on the host and in Paddle ops)."""
    from mtl.optimizer.sparse import row_sparse_momentum_

    monkeypatch.setattr(arrays, "HOST_PATHS", host)
    rng = np.random.RandomState(0)
    full = paddle.to_tensor(rng.randn(10, 4).astype("float32"))
    velocity = paddle.zeros_like(full)
    index = paddle.to_tensor(np.array([1, 4, 7]))
    sub = paddle.create_parameter([3, 4], "float32")
    sub.set_value(full.numpy()[[1, 4, 7]])
    opt = paddle.optimizer.Momentum(0.1, momentum=0.8, parameters=[sub], weight_decay=0.01)
    for _ in range(3):
        g = rng.randn(3, 4).astype("float32")
        sub.grad = paddle.to_tensor(g)
        opt.step()
        row_sparse_momentum_(full, velocity, index, paddle.to_tensor(g), 0.1, 0.8, 0.01)
    np.testing.assert_allclose(full.numpy()[[1, 4, 7]], sub.numpy(), rtol=1e-6, atol=1e-7)


def test_partial_fc_with_an_optimizer_without_a_row_update_is_a_start_up_error(tmp_path, monkeypatch):
    from mtl.optimizer import sparse

    monkeypatch.setattr(sparse, "SPARSE_OPTIMIZERS", ("sgd", "momentum"))
    with pytest.raises(ConfigError, match="optimizer.type.*sgd, momentum, not 'adamw'"):
        build_job(job_cfg(tmp_path, optimizer="adamw"))


def test_clipping_sees_the_sampled_rows(tmp_path):
    """With a tiny clip norm every gradient, the sampled rows' included, is scaled by clip / norm."""
    job = build_job(job_cfg(tmp_path, clip=1e-3))
    trainer = Trainer(job, console=lambda *a: None)
    ds = StepDataset(job.schedule, {"pfc": job.task("pfc").reader}, 0, 0, 1)
    ref = build_job(job_cfg(tmp_path))
    ref.model.set_state_dict(copy.deepcopy(job.model.state_dict()))
    t2 = Trainer(ref, console=lambda *a: None)
    seen_clipped, seen_full = recorded_updates(trainer), recorded_updates(t2)
    norm = trainer.train_step(ds[0], 0).grad_norm
    t2.train_step(ds[0], 0)
    g_clipped = seen_clipped[0][job.model.heads["pfc"].weight.name]
    g_full = seen_full[0][ref.model.heads["pfc"].weight.name]
    np.testing.assert_allclose(g_clipped, g_full * (1e-3 / norm), rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("grad_dtype", ["float32", "float64"])
@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.0, 0.01), (0.8, 0.0), (0.8, 0.01)])
def test_host_update_takes_the_same_float_steps_as_the_device_update(monkeypatch, momentum, weight_decay, grad_dtype):
    """Bit for bit: the numpy update on the host and the Paddle-op update (a float64 gradient is first rounded to the
    weight's float32, as the device path does), and the gradient is left as it was."""
    from mtl.optimizer.sparse import row_sparse_momentum_

    rng = np.random.RandomState(1)
    start, grads = rng.randn(12, 5).astype("float32"), [rng.randn(4, 5).astype(grad_dtype) for _ in range(3)]
    index = paddle.to_tensor(np.array([0, 3, 8, 11]))
    results = []
    for host in (True, False):
        monkeypatch.setattr(arrays, "HOST_PATHS", host)
        weight = paddle.to_tensor(start.copy())
        velocity = paddle.zeros_like(weight) if momentum else None
        for g in grads:
            grad = paddle.to_tensor(g.copy())
            row_sparse_momentum_(weight, velocity, index, grad, 0.1, momentum, weight_decay)
            np.testing.assert_array_equal(grad.numpy(), g)
        results.append((weight.numpy(), None if velocity is None else velocity.numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    if momentum:
        np.testing.assert_array_equal(results[0][1], results[1][1])
