"""Multi-label and regression heads: loss and gradients against numpy, finite differences, the replicated-rank rule."""
import sys

import numpy as np
import paddle
import pytest

from mtl.core import registry
from mtl.core.errors import ConfigError
from mtl.evaluation import metrics
from tests.lazy import LazyModule

skm = LazyModule("sklearn.metrics")  # the reference


def build(cfg, feature_size=6):
    """Build through the registry; ``feature_size`` (and the multi-label ``num_classes``) sit in the config because
    the registry's required-parameter check runs before context keywords are added."""
    cfg = {"feature_size": feature_size, **cfg}
    if cfg["type"] == "multilabel":
        cfg.setdefault("num_classes", 5)
    return registry.build("head", cfg, feature_size=feature_size)


def weights(head):
    return head.linear.weight.numpy().astype(np.float64), head.linear.bias.numpy().astype(np.float64)


def run(head, x, y):
    """Forward + backward; returns (output, grad of features, grad of weight, grad of bias)."""
    features = paddle.to_tensor(x, stop_gradient=False)
    head.clear_gradients()
    out = head(features, paddle.to_tensor(y))
    out.loss.backward()
    return out, features.grad.numpy(), head.linear.weight.grad.numpy(), head.linear.bias.grad.numpy()


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def numpy_bce(x, y, w, b, pos_weight=1.0):
    """Mean BCE-with-logits and its gradients: dl/dz = sigmoid(z) (p y + 1 - y) - p y per cell."""
    z = x @ w + b
    p = np.broadcast_to(pos_weight, z.shape)
    cell = -(p * y * np.log(sigmoid(z)) + (1 - y) * np.log(1 - sigmoid(z)))
    g = (sigmoid(z) * (p * y + 1 - y) - p * y) / z.size
    return cell.mean(), g @ w.T, x.T @ g, g.sum(0)


def numpy_regression(x, y, w, b, loss, delta=1.0):
    """Mean element-wise regression loss and its gradients."""
    d = x @ w + b - y
    if loss == "mse":
        cell, dcell = d * d, 2 * d
    elif loss == "l1":
        cell, dcell = np.abs(d), np.sign(d)
    else:
        small = np.abs(d) < delta
        cell = np.where(small, 0.5 * d * d, delta * np.abs(d) - 0.5 * delta * delta)
        dcell = np.where(small, d, delta * np.sign(d))
    g = dcell / d.size
    return cell.mean(), g @ w.T, x.T @ g, g.sum(0)


@pytest.fixture
def data():
    rng = np.random.RandomState(0)
    x = rng.randn(12, 6).astype(np.float32)
    targets = (rng.rand(12, 5) < 0.4).astype(np.float32)
    return x, targets


@pytest.mark.parametrize("pos_weight", [None, 2.5, [0.5, 1.0, 2.0, 3.0, 4.0]])
def test_multilabel_loss_and_gradients_match_numpy(data, pos_weight):
    x, y = data
    paddle.seed(1)
    head = build({"type": "multilabel", "pos_weight": pos_weight})
    assert head.num_classes == 5 and not head.sharded
    assert [f.describe() for f in head.fields()] == ["labels[5] float32"]
    out, gx, gw, gb = run(head, x, y)
    w, b = weights(head)
    loss, want_gx, want_gw, want_gb = numpy_bce(x.astype(np.float64), y, w, b, 1.0 if pos_weight is None
                                                else np.asarray(pos_weight))
    assert float(out.loss) == pytest.approx(loss, rel=1e-5)
    assert float(out.global_loss) == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gb, want_gb, rtol=1e-4, atol=1e-7)
    predicted = (sigmoid(x @ w + b) >= 0.5).astype(int)
    want_f1 = skm.f1_score(y, predicted, average="micro", zero_division=0)
    assert float(out.metrics["micro_f1"]) == pytest.approx(want_f1, rel=1e-5)


@pytest.mark.parametrize("loss,delta", [("mse", 1.0), ("l1", 1.0), ("smooth_l1", 1.0), ("smooth_l1", 0.4)])
def test_regression_loss_and_gradients_match_numpy(loss, delta):
    rng = np.random.RandomState(2)
    x = rng.randn(10, 6).astype(np.float32)
    y = (2 * rng.randn(10, 3)).astype(np.float32)
    paddle.seed(3)
    head = build({"type": "regression", "num_outputs": 3, "loss": loss, "delta": delta})
    assert [f.describe() for f in head.fields()] == ["target[3] float32"]
    assert head.primary_metric == "rmse" and head.higher_is_better is False and not head.sharded
    out, gx, gw, gb = run(head, x, y)
    w, b = weights(head)
    d = x.astype(np.float64) @ w + b - y
    if loss == "smooth_l1":  # both branches of the Huber loss are exercised, and no |d| sits on the kink
        assert (np.abs(d) < delta).any() and (np.abs(d) > delta).any()
        assert np.min(np.abs(np.abs(d) - delta)) > 1e-3
    want_loss, want_gx, want_gw, want_gb = numpy_regression(x.astype(np.float64), y, w, b, loss, delta)
    assert float(out.loss) == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gb, want_gb, rtol=1e-4, atol=1e-7)
    assert float(out.metrics["mae"]) == pytest.approx(np.abs(d).mean(), rel=1e-5)
    assert float(out.metrics["rmse"]) == pytest.approx(np.sqrt((d * d).mean()), rel=1e-5)


@pytest.mark.parametrize("cfg", [{"type": "multilabel", "pos_weight": [1.0, 2.0, 0.5, 1.0, 3.0]},
                                 {"type": "regression", "num_outputs": 2, "loss": "smooth_l1", "delta": 0.3}])
def test_head_loss_matches_finite_differences(cfg):
    """Central differences of the float64 loss w.r.t. every feature and a few weights."""
    rng = np.random.RandomState(4)
    paddle.set_default_dtype("float64")
    try:
        paddle.seed(5)
        head = build(cfg, feature_size=4)
    finally:
        paddle.set_default_dtype("float32")
    x = rng.randn(5, 4)
    y = (rng.rand(5, 5) < 0.5).astype(np.float64) if cfg["type"] == "multilabel" else rng.randn(5, 2)
    _, gx, gw, _ = run(head, x, y)

    def loss_at(features):
        with paddle.no_grad():
            return float(head(paddle.to_tensor(features), paddle.to_tensor(y)).loss)

    eps = 1e-6
    numeric = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        numeric[i] = (loss_at(x + step) - loss_at(x - step)) / (2 * eps)
    np.testing.assert_allclose(gx, numeric, rtol=1e-5, atol=1e-9)

    w = head.linear.weight
    base = w.numpy().copy()
    for i in [(0, 0), (1, 1), (3, 1)]:
        values = []
        for sign in (1, -1):
            bumped = base.copy()
            bumped[i] += sign * eps
            w.set_value(bumped)
            values.append(loss_at(x))
        w.set_value(base)
        assert gw[i] == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("cfg", [{"type": "multilabel"}, {"type": "regression", "num_outputs": 5, "loss": "l1"}])
def test_replicated_rule_two_ranks_sum_to_global_mean(data, monkeypatch, cfg):
    """Two equal rank slices at world size 2: their losses and gradients add up to those of the whole batch."""
    x, y = data
    paddle.seed(6)
    head = build(cfg)
    whole, whole_gx, whole_gw, _ = run(head, x, y)
    monkeypatch.setattr(sys.modules[type(head).__module__], "world_size", lambda: 2)
    first, gx0, gw0, _ = run(head, x[:6], y[:6])
    second, gx1, gw1, _ = run(head, x[6:], y[6:])
    assert float(first.loss) + float(second.loss) == pytest.approx(float(whole.loss), rel=1e-5)
    np.testing.assert_allclose(gw0 + gw1, whole_gw, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.concatenate([gx0, gx1]), whole_gx, rtol=1e-4, atol=1e-7)


def test_evaluate_matches_metrics_module(data):
    x, y = data
    paddle.seed(7)
    head = build({"type": "multilabel", "threshold": 0.4})
    assert head.primary_metric == "mAP" and head.higher_is_better
    w, b = weights(head)
    got = head.evaluate(x, y)
    assert got == pytest.approx(metrics.multilabel_scores(sigmoid(x @ w + b), y, threshold=0.4))
    assert head.evaluate(paddle.to_tensor(x), {"labels": paddle.to_tensor(y)}) == pytest.approx(got)

    reg = build({"type": "regression", "num_outputs": 5})
    w, b = weights(reg)
    assert reg.evaluate(x, y) == pytest.approx(metrics.regression_scores(x @ w + b, y))


def test_initialisation_follows_global_seed():
    paddle.seed(11)
    a = build({"type": "regression"})
    paddle.seed(11)
    b = build({"type": "regression"})
    np.testing.assert_array_equal(a.linear.weight.numpy(), b.linear.weight.numpy())
    c = build({"type": "regression"})
    assert not np.array_equal(a.linear.weight.numpy(), c.linear.weight.numpy())


@pytest.mark.parametrize("cfg,match", [
    ({"type": "regression", "loss": "huber"}, "mse, l1, smooth_l1"),
    ({"type": "regression", "delta": 0}, "delta"),
    ({"type": "multilabel", "pos_weight": [1.0, 2.0]}, "pos_weight"),
    ({"type": "multilabel", "threshold": 1.5}, "threshold"),
])
def test_bad_parameters_are_config_errors(cfg, match):
    with pytest.raises(ConfigError, match=match):
        build(cfg)
