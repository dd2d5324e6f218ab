"""Single-process checks of the margin function and the sharded classification heads.

References: an independent numpy implementation of the forward and backward math (float64), finite differences,
and structural properties (monotone margin, Partial FC keeps positives, unsampled rows get no gradient).
"""
import math

import numpy as np
import paddle
import pytest

from mtl.core import registry
from mtl.core.errors import ConfigError
from mtl.evaluation.pairs import verification_pairs
from mtl.headkit.margin import MIN_SIN_THETA, check_margin, margin_value_and_slope
from mtl.headkit.sharded import INIT_BLOCK, initial_class_rows
from mtl.parallel import distributed
from tests.references.margin import MARGINS, assert_close, np_ce, np_dpsi, np_margin_head, np_psi, run_head

ArcFaceHead = registry.plugin_class("head", "arcface")
CosFaceHead = registry.plugin_class("head", "cosface")
SoftmaxHead = registry.plugin_class("head", "softmax")


def batch(n=8, d=6, num_classes=7, seed=1):
    rng = np.random.RandomState(seed)
    return rng.randn(n, d), rng.randint(0, num_classes, size=n)


# ---------------------------------------------------------------- margin function
def margin_values(c, margin):
    """(value, d value / d cos) of the margin the heads use, in float64."""
    value, slope = margin_value_and_slope(paddle.to_tensor(c, dtype="float64"), *check_margin(margin))
    return value.numpy(), slope.numpy()


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_margin_is_textbook_below_pi_and_monotone_continuous_past_it(name):
    m1, m2, m3 = MARGINS[name]
    c = np.linspace(-1.0, 1.0, 20001)
    value, _ = margin_values(c, (m1, m2, m3))
    phi = m1 * np.arccos(c) + m2
    below = phi <= np.pi
    assert np.allclose(value[below], np.cos(phi[below]) - m3, rtol=0, atol=1e-12)
    assert np.all(np.diff(value) >= -1e-12), "margin must not decrease as cos grows (theta shrinks)"
    assert np.max(np.abs(np.diff(value))) < 0.05, "margin must be continuous"
    if (~below).any():  # the fallback differs from the textbook formula, which turns back up past pi
        assert np.max(np.abs(value[~below] - (np.cos(phi[~below]) - m3))) > 1e-3


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_margin_derivative_matches_finite_differences(name):
    m1, m2, m3 = MARGINS[name]
    crossings = [math.cos((j * math.pi - m2) / m1) for j in (1, 2) if 0 <= (j * math.pi - m2) / m1 <= math.pi]
    points = [-0.95, -0.5, -0.1, 0.2, 0.6, 0.9, 0.99]
    for cross in crossings:  # both sides of m1*theta + m2 = k*pi, off the exact point
        points += [cross - 1e-2, cross - 1e-3, cross + 1e-3, cross + 1e-2]
    c = np.clip(np.array(points), -0.999, 0.999)
    _, grad = margin_values(c, (m1, m2, m3))
    h = 1e-6
    numeric = (margin_values(c + h, (m1, m2, m3))[0] - margin_values(c - h, (m1, m2, m3))[0]) / (2 * h)
    assert_close(grad, numeric, 1e-6, f"{name} margin derivative")
    assert_close(grad, np_dpsi(c, m1, m2, m3), 1e-10, f"{name} margin derivative vs formula")


def test_margin_derivative_is_finite_at_and_beyond_the_poles():
    c = np.array([-1.0 - 1e-7, -1.0, 1.0, 1.0 + 1e-7])
    for margin in MARGINS.values():
        value, grad = margin_values(c, margin)
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(grad))
        assert np.all(np.abs(grad) <= margin[0] / MIN_SIN_THETA + 1e-9)


# ---------------------------------------------------------------- heads against numpy
@pytest.mark.parametrize("name", sorted(MARGINS))
def test_margin_head_loss_and_gradients_match_numpy(name, float64):
    x, y = batch()
    if name == "sphere_fallback":
        x[:3] = -x[:3]  # push some targets past m1*theta + m2 = pi
    head = ArcFaceHead(num_classes=7, feature_size=6, margin=list(MARGINS[name]), scale=16.0, seed=3)
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    loss, ref_dx, ref_dw, cos = np_margin_head(x, w, y, MARGINS[name], 16.0)
    if name == "sphere_fallback":
        m1, m2, _ = MARGINS[name]
        assert np.any(m1 * np.arccos(cos[np.arange(8), y]) + m2 > np.pi), "test must reach the fallback"
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "centre gradient")
    assert float(out.metrics["accuracy"]) == np.mean(cos.argmax(axis=1) == y)


def test_margin_head_float32_matches_numpy():
    x, y = batch()
    head = ArcFaceHead(num_classes=7, feature_size=6)
    w = head.weight.numpy().astype(np.float64)
    out, dx, dw = run_head(head, x, y)
    loss, ref_dx, ref_dw, _ = np_margin_head(x, w, y, (1.0, 0.5, 0.0), 64.0)
    assert abs(float(out.loss) - loss) <= 1e-5 * abs(loss)
    assert_close(dx, ref_dx, 1e-4, "feature gradient (float32)")
    assert_close(dw, ref_dw, 1e-4, "centre gradient (float32)")


def test_margin_head_gradient_matches_finite_differences(float64):
    x, y = batch(n=5, d=4, num_classes=6, seed=2)
    head = ArcFaceHead(num_classes=6, feature_size=4, margin=[1.2, 0.3, 0.2], scale=8.0)
    w0 = head.weight.numpy().copy()
    _, dx, dw = run_head(head, x, y)

    def loss_at(xv, wv):
        head.weight.set_value(wv)
        with paddle.no_grad():
            return float(head(paddle.to_tensor(xv), paddle.to_tensor(y)).loss)

    h = 1e-6
    num_dx, num_dw = np.zeros_like(x), np.zeros_like(w0)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        num_dx[idx] = (loss_at(x + e, w0) - loss_at(x - e, w0)) / (2 * h)
    for idx in np.ndindex(*w0.shape):
        e = np.zeros_like(w0)
        e[idx] = h
        num_dw[idx] = (loss_at(x, w0 + e) - loss_at(x, w0 - e)) / (2 * h)
    assert_close(dx, num_dx, 1e-6, "feature gradient vs finite differences")
    assert_close(dw, num_dw, 1e-6, "centre gradient vs finite differences")


def test_softmax_head_matches_numpy(float64):
    x, y = batch(num_classes=5)
    head = SoftmaxHead(num_classes=5, feature_size=6, topk=3, seed=4)
    head.bias.set_value(np.linspace(-0.5, 0.5, 5))
    w, b = head.weight.numpy().copy(), head.bias.numpy().copy()
    feats = paddle.to_tensor(x, stop_gradient=False)
    out = head(feats, paddle.to_tensor(y))
    out.loss.backward()
    dx, dw = feats.grad.numpy(), head.weight.grad.numpy()
    z = x @ w.T + b
    loss, dz = np_ce(z, y)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, dz @ w, 1e-10, "feature gradient")
    assert_close(dw, dz.T @ x, 1e-10, "weight gradient")
    assert_close(head.bias.grad.numpy(), dz.sum(0), 1e-10, "bias gradient")
    top3 = np.argsort(-z, axis=1)[:, :3]
    assert float(out.metrics["accuracy"]) == np.mean(top3[:, 0] == y)
    assert float(out.metrics["top3_accuracy"]) == np.mean((top3 == y[:, None]).any(1))
    result = head.evaluate(x, y)
    assert result["accuracy"] == np.mean(top3[:, 0] == y)
    assert result["top3_accuracy"] == np.mean((top3 == y[:, None]).any(1))
    assert SoftmaxHead(num_classes=2, feature_size=6).topk == 2  # capped at C


# ---------------------------------------------------------------- Partial FC
def test_partial_fc_keeps_positives_and_count_and_gradients_only_sampled_rows(float64):
    x, _ = batch(n=8, d=6)
    y = np.array([3, 3, 11, 11, 17, 3, 11, 17])  # 3 distinct positives
    head = ArcFaceHead(num_classes=20, feature_size=6, sample_ratio=0.3, scale=16.0, seed=5)
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    sampled = head.last_sampled_classes.numpy()
    assert len(sampled) == math.ceil(0.3 * 20) and set(y) <= set(sampled.tolist())
    assert np.all(np.diff(sampled) > 0)
    untouched = np.setdiff1d(np.arange(20), sampled)
    assert np.all(dw[untouched] == 0.0)
    assert np.all(np.abs(dw[sampled]).sum(1) > 0)
    # the loss is the margin loss over the sampled classes only
    loss, ref_dx, ref_dw, _ = np_margin_head(x, w[sampled], np.searchsorted(sampled, y), (1.0, 0.5, 0.0), 16.0)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient (Partial FC)")
    assert_close(dw[sampled], ref_dw, 1e-10, "sampled centre gradient")
    # reproducible from (seed, step): a fresh head draws the same sample at step 0; other steps draw anew, and a step
    # drawn again is the same draw (the head counts no steps of its own)
    again = ArcFaceHead(num_classes=20, feature_size=6, sample_ratio=0.3, seed=5)
    again(paddle.to_tensor(x), paddle.to_tensor(y), 0)
    assert np.array_equal(again.last_sampled_classes.numpy(), sampled)
    draws = {}
    for step in (1, 2, 3, 4, 2):
        again(paddle.to_tensor(x), paddle.to_tensor(y), step)
        draws.setdefault(step, set()).add(tuple(again.last_sampled_classes.numpy()))
    assert len(set().union(*draws.values())) > 1 and len(draws[2]) == 1


def test_partial_fc_keeps_every_positive_when_they_outnumber_the_sample():
    x, _ = batch(n=8, d=6)
    y = np.array([0, 2, 4, 6, 8, 10, 12, 12])  # 7 distinct positives, sample of ceil(0.1 * 20) = 2
    head = ArcFaceHead(num_classes=20, feature_size=6, sample_ratio=0.1)
    run_head(head, x, y)
    assert head.last_sampled_classes.numpy().tolist() == sorted(set(y.tolist()))


# ---------------------------------------------------------------- sharding
@pytest.mark.parametrize("num_classes", [1, 3, 7, INIT_BLOCK + 5])
def test_concatenated_initial_shards_equal_the_world_one_init(num_classes):
    full = initial_class_rows(num_classes, 2, seed=9, start=0, count=num_classes)
    if num_classes > INIT_BLOCK:  # N(0, 0.01^2) rows; the second block is not a copy of the first
        assert abs(full.std() / 0.01 - 1) < 0.2
        assert not np.array_equal(full[:5], full[INIT_BLOCK:INIT_BLOCK + 5])
    for world in (1, 2, 3, 5):
        ranges = [distributed.shard_range(num_classes, world, k) for k in range(world)]
        assert sum(c for _, c in ranges) == num_classes
        assert [s for s, _ in ranges] == list(np.cumsum([0] + [c for _, c in ranges])[:-1])
        shards = [initial_class_rows(num_classes, 2, 9, s, c) for s, c in ranges]
        assert np.array_equal(np.concatenate(shards), full)


def test_heads_built_as_rank_k_hold_their_shard_even_with_fewer_classes_than_ranks(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 5)
    full = initial_class_rows(3, 4, seed=0, start=0, count=3)
    counts = []
    for k in range(5):
        monkeypatch.setattr(distributed, "rank", lambda k=k: k)
        for cls in (ArcFaceHead, CosFaceHead, SoftmaxHead):
            head = cls(num_classes=3, feature_size=4)
            start, count = distributed.shard_range(3, 5, k)
            assert head.weight.shape == [count, 4] and head.weight.is_distributed
            assert np.array_equal(head.weight.numpy(), full[start:start + count])
            assert head.class_ids.numpy().tolist() == list(range(start, start + count))
        counts.append(count)
    assert counts == [1, 1, 1, 0, 0]


# ---------------------------------------------------------------- config, fused path, evaluation
def test_config_errors_name_the_parameter():
    registry.load_builtin()
    bad = [({"margin": [1.0, -0.1, 0.0]}, "m2"), ({"sample_ratio": 0}, "sample_ratio"),
           ({"fused": "maybe"}, "fused"), ({"scale": -1}, "scale")]
    if not paddle.is_compiled_with_cuda():
        bad.append(({"fused": True}, "CUDA"))
    for params, word in bad:
        with pytest.raises(ConfigError, match=word):
            registry.build("head", {"type": "arcface", "num_classes": 4, **params}, feature_size=3)
    cosface = registry.build("head", {"type": "cosface", "num_classes": 4}, feature_size=3)
    assert cosface.margin == (1.0, 0.0, 0.35) and cosface.fused is False


def test_fused_path_passes_cosines_and_margins_to_margin_cross_entropy(monkeypatch, float64):
    """margin_cross_entropy replaced by a numpy-backed stand-in: the fused branch must hand it the same math."""
    calls = []

    def fake(logits, label, margin1, margin2, margin3, scale, group, reduction):
        calls.append((margin1, margin2, margin3, scale, group, reduction))
        cos = logits.numpy()
        lab = label.numpy()
        z = scale * cos
        z[np.arange(len(lab)), lab] = scale * np_psi(cos[np.arange(len(lab)), lab], margin1, margin2, margin3)
        return paddle.to_tensor(np_ce(z, lab)[0])

    monkeypatch.setattr(paddle.nn.functional, "margin_cross_entropy", fake)
    x, y = batch()
    head = ArcFaceHead(num_classes=7, feature_size=6, scale=16.0)
    head.fused = True
    fused_loss = float(head(paddle.to_tensor(x), paddle.to_tensor(y)).loss)
    assert calls == [(1.0, 0.5, 0.0, 16.0, False, "mean")]
    head.fused = False
    assert abs(fused_loss - float(head(paddle.to_tensor(x), paddle.to_tensor(y)).loss)) < 1e-12


def test_verification_pairs_are_balanced_and_deterministic():
    labels = np.array([0, 0, 1, 2, 2, 2, 3, 4, 4])
    first, second, issame = verification_pairs(labels)
    eligible = np.flatnonzero(np.bincount(labels)[labels] >= 2)
    assert issame.sum() == (~issame).sum() == len(eligible)
    assert np.array_equal(issame, np.tile([True, False], len(eligible)))  # contiguous folds hold both kinds
    assert sorted(first[issame].tolist()) == eligible.tolist()
    assert np.all(labels[first[issame]] == labels[second[issame]]) and np.all(first[issame] != second[issame])
    assert np.all(labels[first[~issame]] != labels[second[~issame]])
    again = verification_pairs(labels)
    assert all(np.array_equal(a, b) for a, b in zip((first, second, issame), again))


def test_arcface_evaluate_reports_verification_and_accuracy():
    x, y = batch(n=40, d=6, num_classes=7, seed=6)
    head = ArcFaceHead(num_classes=7, feature_size=6)
    result = head.evaluate(x, y)
    w = head.weight.numpy()
    cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    assert result["accuracy"] == np.mean(cos.argmax(1) == y)
    assert 0.0 <= result["verification_accuracy"] <= 1.0
    # well separated identities (tight clusters around 7 random centres) verify perfectly
    centres = np.random.RandomState(7).randn(7, 6) * 10.0
    tight = centres[y] + np.random.RandomState(8).randn(40, 6) * 0.01
    assert head.evaluate(tight, y)["verification_accuracy"] == 1.0
