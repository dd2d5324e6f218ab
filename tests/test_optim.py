"""Learning-rate schedules against their formulas; global-norm clipping against numpy."""
import math

import numpy as np
import paddle
import pytest

from mtl.config.keys import OPTIMIZER
from mtl.config.schema import validate
from mtl.parallel.strategy import global_grad_norm, scale_to_norm
from mtl.train.optim import build_lr, build_optimizer


def cfg(**kw):
    return validate(OPTIMIZER, kw, "<test>", "optimizer")


def lrs(sched, n):
    out = []
    for _ in range(n):
        out.append(sched.get_lr() if hasattr(sched, "get_lr") else sched())
        sched.step()
    return out


def test_warmup_then_cosine():
    c = cfg(lr=0.2, warmup_steps=4, decay="cosine", min_lr=0.01)
    got = lrs(build_lr(c, total_steps=14), 14)
    want = [0.2 * t / 4 for t in range(4)]
    want += [0.01 + (0.2 - 0.01) * (1 + math.cos(math.pi * t / 10)) / 2 for t in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_step_decay_and_constant():
    got = lrs(build_lr(cfg(lr=1.0, decay="step", step_size=3, gamma=0.5), 10), 9)
    np.testing.assert_allclose(got, [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25])
    assert lrs(build_lr(cfg(lr=0.3, decay="none"), 10), 5) == [0.3] * 5


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adamw"])
def test_optimizer_types(kind):
    layer = paddle.nn.Linear(3, 2)
    opt, _ = build_optimizer(cfg(type=kind, lr=0.1, weight_decay=0.01), layer.parameters(), 10)
    expected = {"sgd": paddle.optimizer.SGD, "momentum": paddle.optimizer.Momentum, "adamw": paddle.optimizer.AdamW}
    assert isinstance(opt, expected[kind])


def test_clip_global_norm_matches_numpy():
    rng = np.random.RandomState(0)
    params = [paddle.create_parameter([4, 3], "float32"), paddle.create_parameter([5], "float32"),
              paddle.create_parameter([2, 2], "float32")]
    grads = [rng.randn(*p.shape).astype("float32") for p in params]
    for p, g in zip(params, grads):
        p.grad = paddle.to_tensor(g)
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
    got = global_grad_norm(params[:2], params[2:])
    scale_to_norm(params, got, max_norm=1.0)
    assert got == pytest.approx(norm, rel=1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), g / norm, rtol=1e-5)
    # below the threshold nothing changes
    scale_to_norm(params, global_grad_norm(params, []), max_norm=100.0)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), g / norm, rtol=1e-5)
