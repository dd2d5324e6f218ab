"""Learning-rate schedules against their formulas; the optimizers' updates (lr, momentum, weight decay, betas) and
global-norm clipping against numpy."""
import math

import numpy as np
import paddle
import pytest

from mtl.config.keys import OPTIMIZER
from mtl.config.schema import validate
from mtl.optimizer.joint import build_lr, build_optimizer
from mtl.parallel.strategy import global_grad_norm, scale_to_norm


def cfg(**kw):
    return validate(OPTIMIZER, kw, "<test>", "optimizer")


def lrs(sched, n):
    out = []
    for _ in range(n):
        out.append(sched.get_lr())
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


def numpy_updates(kind, w, grads, lr, momentum, weight_decay, betas, epsilon=1e-8):
    """The weights after one update per gradient of ``grads``, in float64, as each method's paper and Paddle's
    documentation state them: SGD with L2 decay ``w -= lr (g + wd w)``; Momentum ``v = mu v + (g + wd w)``,
    ``w -= lr v``; AdamW (Loshchilov & Hutter 2019, decoupled decay first, as Paddle applies it)
    ``w -= lr wd w``, ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps sqrt(1 - b2^t))``."""
    w = w.astype(np.float64).copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    b1, b2 = betas
    for t, g in enumerate(grads, start=1):
        if kind == "sgd":
            w -= lr * (g + weight_decay * w)
        elif kind == "momentum":
            v = momentum * v + (g + weight_decay * w)
            w -= lr * v
        else:
            w -= lr * weight_decay * w
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            correction = np.sqrt(1 - b2 ** t)
            w -= lr * correction / (1 - b1 ** t) * m / (np.sqrt(v) + epsilon * correction)
    return w


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adamw"])
def test_three_updates_equal_numpy_with_every_option(kind):
    """lr, momentum, weight_decay and betas (values away from their defaults) reach the update: three steps of the
    optimizer the job builds equal the numpy updates on fixed gradients."""
    options = dict(type=kind, lr=0.3, momentum=0.7, weight_decay=0.05, betas=[0.6, 0.8], decay="none")
    rng = np.random.default_rng(1)
    w0, grads = rng.standard_normal((3, 2)), [rng.standard_normal((3, 2)) for _ in range(3)]
    weight = paddle.create_parameter([3, 2], "float32", default_initializer=paddle.nn.initializer.Assign(w0))
    opt, _ = build_optimizer(cfg(**options), [weight], 10)
    expected = {"sgd": paddle.optimizer.SGD, "momentum": paddle.optimizer.Momentum, "adamw": paddle.optimizer.AdamW}
    assert isinstance(opt, expected[kind])
    for g in grads:
        weight.grad = paddle.to_tensor(g.astype("float32"))
        opt.step()
    want = numpy_updates(kind, w0, grads, 0.3, 0.7, 0.05, (0.6, 0.8))
    np.testing.assert_allclose(weight.numpy(), want, rtol=1e-5, atol=1e-6)
    # every option moves the result: the check above is not blind to any of them
    changed = {"lr": (0.2, 0.7, 0.05, (0.6, 0.8)), "weight_decay": (0.3, 0.7, 0.0, (0.6, 0.8))}
    changed.update({"momentum": (0.3, 0.1, 0.05, (0.6, 0.8))} if kind == "momentum" else {})
    changed.update({"beta1": (0.3, 0.7, 0.05, (0.9, 0.8)), "beta2": (0.3, 0.7, 0.05, (0.6, 0.99))}
                   if kind == "adamw" else {})
    for option, args in changed.items():
        assert np.abs(numpy_updates(kind, w0, grads, *args) - want).max() > 1e-3, option


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


def arcface_torch_poly(step, base, warmup, total, power):
    """arcface_torch's PolynomialLRWarmup._get_closed_form_lr (lr_scheduler.py), transcribed: the rate of step l."""
    if step <= warmup:
        return base * step / warmup
    return base * (1.0 - (min(total, step) - warmup) / (total - warmup)) ** power


def plsc_poly(step, base, warmup, total, warmup_end):
    """PLSC's Poly.get_lr (plsc/scheduler/lr_scheduler.py, decay_unit step, warmup_start_lr 0), transcribed."""
    if step < warmup:
        return warmup_end * step / warmup
    return base * (1 - (step - warmup) / (total - warmup)) ** 2


@pytest.mark.parametrize("warmup", [0, 5])
@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_poly_decay_equals_arcface_torch_closed_form(warmup, power):
    """Every step's rate against arcface_torch's closed form (for step 0 its recursive get_lr returns the base rate
    before the first scheduler.step(); ours is the closed form's 0 when there is a warm-up: docs/large-scale.md)."""
    got = lrs(build_lr(cfg(lr=0.1, warmup_steps=warmup, decay="poly", power=power), total_steps=30), 30)
    want = [arcface_torch_poly(t, 0.1, warmup, 30, power) if warmup else 0.1 * (1 - t / 30) ** power
            for t in range(30)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_poly_decay_with_power_two_equals_plsc_poly_and_ends_at_min_lr():
    got = lrs(build_lr(cfg(lr=0.001, warmup_steps=4, decay="poly", power=2.0), total_steps=20), 20)
    np.testing.assert_allclose(got, [plsc_poly(t, 0.001, 4, 20, 0.001) for t in range(20)], rtol=1e-9, atol=1e-15)
    got = lrs(build_lr(cfg(lr=1.0, decay="poly", power=1.0, min_lr=0.1), total_steps=10), 12)
    np.testing.assert_allclose(got, [0.9 * (1 - min(t, 10) / 10) + 0.1 for t in range(12)], rtol=1e-9)


@pytest.mark.parametrize("warmup", [0, 3])
def test_multistep_decay_by_steps_and_by_fractions(warmup):
    """lr gamma^(number of milestones <= t), milestones counted from step 0 (the warm-up included); fractions of the
    steps round to the same milestones."""
    def want(t):
        if t < warmup:
            return 0.5 * t / warmup
        return 0.5 * 0.1 ** sum(m <= t for m in (4, 8))
    for milestones in ([4, 8], [0.2, 0.4]):
        c = cfg(lr=0.5, warmup_steps=warmup, decay="multistep", milestones=milestones, gamma=0.1)
        np.testing.assert_allclose(lrs(build_lr(c, total_steps=20), 12), [want(t) for t in range(12)], rtol=1e-9)


def test_schedule_errors_are_caught_at_load_time_naming_the_key():
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError

    def job(**optimizer):
        return {"tasks": [{"name": "a", "reader": {"type": "synthetic"}, "head": "softmax"}], "backbone": "mlp",
                "schedule": {"steps": 10}, "optimizer": optimizer}
    with pytest.raises(ConfigError, match="optimizer.milestones.*not a mix"):
        load_job(data=job(decay="multistep", milestones=[2, 0.5]))
    with pytest.raises(ConfigError, match="optimizer.milestones.*needs milestones"):
        load_job(data=job(decay="multistep"))
    with pytest.raises(ConfigError, match=r"optimizer.milestones.*steps \[5, 5\]"):
        load_job(data=job(decay="multistep", milestones=[0.5, 0.52]))
    with pytest.raises(ConfigError, match="optimizer.power"):
        load_job(data=job(decay="poly", power=0))
