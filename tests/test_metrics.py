"""mtl.evaluation.metrics against independent references: a loop-based verification protocol, scikit-learn and numpy."""
import numpy as np
import pytest

from mtl.core.errors import DataError
from mtl.evaluation import metrics
from mtl.evaluation.pairs import verification_pairs
from tests.lazy import LazyModule
from tests.references.verification import noisy_pairs, reference_verification

skm = LazyModule("sklearn.metrics")  # the reference of the ROC and AP


@pytest.mark.parametrize("pairs,folds,far_target", [(300, 10, 1e-3), (203, 10, 0.05), (157, 7, 0.02)])
def test_verification_matches_loop_reference(pairs, folds, far_target):
    rng = np.random.RandomState(pairs)
    emb, issame = noisy_pairs(rng, pairs, dim=12, noise=0.9)
    got = metrics.verification(emb, issame, folds=folds, far_target=far_target,
                               fold_of=metrics.contiguous_folds(pairs, folds))
    want = reference_verification(emb, issame, folds, metrics.DEFAULT_THRESHOLDS, far_target)
    assert set(got) == {"accuracy", "std", "threshold", "val_at_far", "far"}
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key
    assert 0.6 < got["accuracy"] < 1.0  # the data is neither trivial nor random


def test_verification_custom_thresholds_and_unnormalised_input():
    rng = np.random.RandomState(1)
    emb, issame = noisy_pairs(rng, 120, dim=6, noise=1.2)
    thresholds = np.linspace(0.0, 4.0, 37)
    scaled = emb * rng.uniform(0.5, 3.0, size=(emb.shape[0], 1))  # scale must not matter
    got = metrics.verification(scaled, issame, folds=5, thresholds=thresholds, far_target=0.1,
                               fold_of=metrics.contiguous_folds(120, 5))
    want = reference_verification(emb, issame, 5, thresholds, 0.1)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


def test_verification_perfectly_separable():
    rng = np.random.RandomState(2)
    pairs = 60
    issame = np.arange(pairs) % 3 == 0
    # unit vectors in the plane: squared distance 2 - 2 cos(angle); same pairs < 0.0025, different pairs > 2.6
    base = rng.uniform(0, 2 * np.pi, pairs)
    angle = np.where(issame, rng.uniform(0.0, 0.05, pairs), rng.uniform(1.9, 3.1, pairs))
    emb = np.zeros((2 * pairs, 2))
    emb[0::2] = np.stack([np.cos(base), np.sin(base)], axis=1)
    emb[1::2] = np.stack([np.cos(base + angle), np.sin(base + angle)], axis=1)
    got = metrics.verification(emb, issame)
    assert got["accuracy"] == 1.0 and got["std"] == 0.0
    assert got["threshold"] == pytest.approx(0.01)  # the first grid threshold above every same-pair distance
    assert got["val_at_far"] == 1.0


def test_verification_accepts_strictly_below_threshold():
    """Identical pairs have distance exactly 0; threshold 0 accepts nothing (0 < 0 is false), so 0.01 is chosen."""
    rng = np.random.RandomState(8)
    issame = np.arange(30) % 2 == 0
    first = rng.randn(30, 5)
    emb = np.empty((60, 5))
    emb[0::2] = first
    emb[1::2] = np.where(issame[:, None], first, -first)  # different pairs: opposite vectors, distance 4
    got = metrics.verification(emb, issame, folds=3)
    assert got["accuracy"] == 1.0 and got["threshold"] == pytest.approx(0.01)


def test_verification_rejects_too_few_pairs_and_bad_shapes():
    emb = np.random.RandomState(0).randn(8, 4)
    with pytest.raises(ValueError, match="4 pairs and 10 folds"):
        metrics.verification(emb, [True, False, True, False])
    with pytest.raises(ValueError, match="3 issame"):
        metrics.verification(emb, [True, False, True], folds=2)
    with pytest.raises(ValueError, match=r"\[2P, D\]"):
        metrics.verification(emb[:7], [True] * 3, folds=2)


def test_roc_curve_matches_sklearn():
    rng = np.random.RandomState(3)
    distances = np.round(rng.rand(200) * 4, 1)  # rounded: many ties
    issame = rng.rand(200) < 0.4
    fpr, tpr, thresholds = metrics.roc_curve(distances, issame)
    sk_fpr, sk_tpr, sk_thr = skm.roc_curve(issame, -distances, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    np.testing.assert_allclose(thresholds[1:], -sk_thr[1:])
    assert thresholds[0] == -np.inf


def test_accuracy_and_topk_match_sklearn():
    rng = np.random.RandomState(4)
    scores = rng.randn(150, 7)
    labels = rng.randint(0, 7, size=150)
    assert metrics.accuracy(scores, labels) == pytest.approx(skm.accuracy_score(labels, scores.argmax(1)))
    assert metrics.accuracy(scores.argmax(1), labels) == pytest.approx(skm.accuracy_score(labels, scores.argmax(1)))
    for k in (1, 2, 5):
        want = skm.top_k_accuracy_score(labels, scores, k=k, labels=np.arange(7))
        assert metrics.topk_accuracy(scores, labels, k) == pytest.approx(want), k


def test_topk_ties_agree_with_argmax():
    scores = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [3.0, 3.0, 3.0]])
    labels = np.array([1, 1, 2])
    assert metrics.topk_accuracy(scores, labels, 1) == metrics.accuracy(scores, labels) == pytest.approx(1 / 3)
    assert metrics.topk_accuracy(scores, labels, 2) == pytest.approx(2 / 3)


def test_multilabel_scores_match_sklearn():
    rng = np.random.RandomState(5)
    n, c = 120, 6
    targets = (rng.rand(n, c) < np.linspace(0.05, 0.6, c)).astype(np.float32)
    targets[:, 2] = 0  # a class without positives: skipped by mAP, F1 = 0 in the macro average
    scores = np.round(1 / (1 + np.exp(-(2 * targets - 1 + 1.5 * rng.randn(n, c)))), 2)  # ties included
    got = metrics.multilabel_scores(scores, targets, threshold=0.5)
    predicted = (scores >= 0.5).astype(int)
    assert got["micro_f1"] == pytest.approx(skm.f1_score(targets, predicted, average="micro", zero_division=0))
    assert got["macro_f1"] == pytest.approx(skm.f1_score(targets, predicted, average="macro", zero_division=0))
    aps = [skm.average_precision_score(targets[:, j], scores[:, j]) for j in range(c) if targets[:, j].any()]
    assert len(aps) == c - 1
    assert got["mAP"] == pytest.approx(np.mean(aps))
    other = metrics.multilabel_scores(scores, targets, threshold=0.3)
    predicted = (scores >= 0.3).astype(int)
    assert other["micro_f1"] == pytest.approx(skm.f1_score(targets, predicted, average="micro", zero_division=0))


def test_regression_scores_match_numpy():
    rng = np.random.RandomState(6)
    pred, target = rng.randn(50, 3), rng.randn(50, 3)
    got = metrics.regression_scores(pred, target)
    assert got["mae"] == pytest.approx(np.abs(pred - target).mean())
    assert got["rmse"] == pytest.approx(np.sqrt(((pred - target) ** 2).mean()))
    assert metrics.regression_scores(pred[:, 0], pred[:, 0].reshape(-1, 1)) == {"mae": 0.0, "rmse": 0.0}


def test_verification_pairs_properties():
    """The one pair builder (mtl.evaluation.pairs): deterministic, balanced, interleaved, right labels."""
    rng = np.random.RandomState(7)
    labels = rng.randint(0, 12, size=200)
    labels[:3] = [100, 101, 102]  # singletons: no positive partner
    first, second, issame = verification_pairs(labels, seed=3)
    again = verification_pairs(labels, seed=3)
    for a, b in zip((first, second, issame), again):
        np.testing.assert_array_equal(a, b)
    assert issame.sum() == (~issame).sum() == 197  # balanced: one pair per sample that has a positive partner
    np.testing.assert_array_equal(issame, np.arange(len(issame)) % 2 == 0)  # interleaved
    assert np.all(first != second)
    assert np.all(labels[first[issame]] == labels[second[issame]])
    assert np.all(labels[first[~issame]] != labels[second[~issame]])
    np.testing.assert_array_equal(np.sort(first[issame]), np.arange(3, 200))  # each anchor once
    other = verification_pairs(labels, seed=4)
    assert not np.array_equal(other[1], second)


def test_verification_pairs_draws_every_partner():
    labels = np.array([0, 1, 0, 2, 0, 1])
    seen_pos, seen_neg = set(), set()
    for seed in range(60):
        first, second, issame = verification_pairs(labels, seed=seed)
        seen_pos |= {int(b) for a, b in zip(first[issame], second[issame]) if a == 0}
        seen_neg |= {int(b) for a, b in zip(first[~issame], second[~issame]) if a == 0}
    assert seen_pos == {2, 4}
    assert seen_neg == {1, 3, 5}
    with pytest.raises(DataError, match="two classes"):
        verification_pairs(np.zeros(5, dtype=int))
