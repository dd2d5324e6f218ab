"""The all-people figures of the face report (mtl/evaluation/all_pairs.py, duplicates.py, conditions.py) against
direct float64 counts: every pair enumerated with Python loops, every threshold tried, the definitions of the module
docstrings applied literally."""
import itertools
import json
import math

import numpy as np
import pytest

from mtl.core.errors import DataError
from mtl.evaluation.all_pairs import (
    PairSet,
    all_people,
    far_grid,
    fold_accuracy,
    image_weights,
    operating_points,
    tar_at_far,
)
from mtl.evaluation.conditions import condition_sides, cross_condition
from mtl.evaluation.duplicates import duplicate_scores, read_pairs
from mtl.evaluation.metrics import DEFAULT_THRESHOLDS

CAP = 4


def people(seed=0, counts=(9, 3, 6, 2, 5, 12, 4), dim=6, noise=0.45):
    """Clustered features of people with unequal image counts (some above CAP), and random condition sides."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(counts)), counts)
    centres = rng.standard_normal((len(counts), dim))
    features = centres[labels] + noise * rng.standard_normal((len(labels), dim))
    return features, labels, rng.integers(-1, 2, len(labels))


def reference_pairs(features, labels, sides, cap):
    """``[(cosine, same, weight, cross)]`` of every pair i < j, by the definitions."""
    count = {p: int(np.sum(labels == p)) for p in set(labels.tolist())}
    out = []
    for i, j in itertools.combinations(range(len(labels)), 2):
        a, b = features[i], features[j]
        cosine = float(a @ b / math.sqrt(a @ a) / math.sqrt(b @ b))
        weight = min(1.0, cap / count[labels[i]]) * min(1.0, cap / count[labels[j]])
        same = labels[i] == labels[j]
        cross = same and sides[i] >= 0 and sides[j] >= 0 and sides[i] != sides[j]
        out.append((cosine, same, weight, cross))
    return out


def reference_tar(pairs, far):
    """(TAR, threshold): the lowest threshold of every cosine and +inf whose weighted FAR is at most ``far``."""
    negative = sum(w for _, s, w, _ in pairs if not s)
    positive = sum(w for _, s, w, _ in pairs if s)
    for t in sorted({c for c, _, _, _ in pairs}):  # lowest first
        if sum(w for c, s, w, _ in pairs if not s and c >= t) / negative <= far:
            return sum(w for c, s, w, _ in pairs if s and c >= t) / positive, t
    return 0.0, math.inf


@pytest.mark.parametrize("seed, far", [(0, 1e-2), (1, 1e-3), (2, 0.05), (3, 0.0)])
def test_tar_at_far_and_cross_condition_against_a_direct_count(seed, far):
    features, labels, sides = people(seed)
    reference = reference_pairs(features, labels, sides, CAP)
    pairs = PairSet.of(features, labels, image_weights(labels, CAP), sides)
    points = operating_points(pairs.cosine, pairs.same, pairs.weight)
    tar, threshold = tar_at_far(points, far)
    expected_tar, expected_threshold = reference_tar(reference, far)
    assert tar == pytest.approx(expected_tar, abs=1e-12) and threshold == pytest.approx(expected_threshold, abs=1e-12)
    assert far_grid(points, [far])[0] == pytest.approx(expected_tar, abs=1e-12)
    # cross-condition: the weighted share of the cross-condition positives at the FAR 1e-3 threshold
    t = reference_tar(reference, 1e-3)[1]
    cross = [(c, w) for c, _, w, x in reference if x]
    expected = sum(w for c, w in cross if c >= t) / sum(w for _, w in cross)
    result = all_people(features, labels, sides, cap=CAP)
    assert result["cross_condition"] == pytest.approx(expected, abs=1e-12)
    assert result["tar_far_1e-3"] == pytest.approx(reference_tar(reference, 1e-3)[0], abs=1e-12)
    assert result["tar_far_1e-2"] == pytest.approx(reference_tar(reference, 1e-2)[0], abs=1e-12)
    assert result["pairs"] == len(reference) and result["cross_condition_pairs"] == sum(x for *_, x in reference)


def test_ten_fold_accuracy_against_loops():
    """Folds: a default_rng(0) permutation cut into contiguous slices (the first P % 10 one larger); per fold the
    grid threshold (d < t, d = squared L2 of unit vectors) with the best weighted balanced accuracy on the nine
    others (first on ties), scored on the held-out fold."""
    features, labels, sides = people(4)
    reference = reference_pairs(features, labels, sides, CAP)
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    first, second = zip(*itertools.combinations(range(len(labels)), 2))
    distance = np.array([np.sum((unit[i] - unit[j]) ** 2) for i, j in zip(first, second)])
    same = np.array([s for _, s, _, _ in reference])
    weight = np.array([w for _, _, w, _ in reference])
    order = np.random.default_rng(0).permutation(len(distance))
    sizes = [len(distance) // 10 + (k < len(distance) % 10) for k in range(10)]
    bounds = np.r_[0, np.cumsum(sizes)]
    accuracies = []

    def balanced(mask, t):
        accepted = distance < t
        tar = weight[mask & same & accepted].sum() / weight[mask & same].sum()
        far = weight[mask & ~same & accepted].sum() / weight[mask & ~same].sum()
        return 0.5 * (tar + 1 - far)

    for k in range(10):
        test = np.zeros(len(distance), dtype=bool)
        test[order[bounds[k]:bounds[k + 1]]] = True
        scores = [balanced(~test, t) for t in DEFAULT_THRESHOLDS]
        best = DEFAULT_THRESHOLDS[int(np.argmax(scores))]
        accuracies.append(balanced(test, best))
    pairs = PairSet.of(features, labels, image_weights(labels, CAP), sides)
    assert fold_accuracy(pairs) == pytest.approx(float(np.mean(accuracies)), abs=1e-9)
    assert 0.6 < fold_accuracy(pairs) <= 1.0  # clustered people: far better than chance


def test_image_weights_cap_large_people_only():
    labels = np.array([3, 3, 3, 3, 3, 7, 7, 1])
    assert np.allclose(image_weights(labels, 2), [0.4] * 5 + [1, 1, 1])
    assert np.allclose(image_weights(labels, 20), 1.0)


def test_all_pairs_needs_two_people_and_a_positive():
    with pytest.raises(DataError, match="two people"):
        all_people(np.eye(3), [0, 0, 0])
    with pytest.raises(DataError, match="two people"):
        all_people(np.eye(3), [0, 1, 2])


def test_condition_sides_by_light_and_by_halves():
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1, 2, 2])
    assert condition_sides(labels).tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1]
    light = np.array([-20, 0, 35, 10, -5, 0, 50, 60, 5, -5], dtype=float)
    # person 1 has no image lit from the negative side: halves
    assert condition_sides(labels, light).tolist() == [0, -1, 1, 1, 0, 0, 0, 1, 1, 0]
    assert cross_condition(np.array([0, 0, 1, -1]), np.array([1, 0, 0, 1])).tolist() == [True, False, True, False]


def test_duplicate_precision_and_recall_against_a_count(tmp_path):
    truth = [{"task_a": "a", "class_a": i, "task_b": "b", "class_b": i + 1, "similarity": 1.0} for i in range(5)]
    found = [{"task_a": "b", "class_a": 2, "task_b": "a", "class_b": 1},  # a true pair, listed the other way round
             {"task_a": "a", "class_a": 0, "task_b": "b", "class_b": 1},  # true
             {"task_a": "a", "class_a": 0, "task_b": "b", "class_b": 1},  # the same again: counts once
             {"task_a": "a", "class_a": 3, "task_b": "c", "class_b": 4}]  # wrong
    scores = duplicate_scores(found, truth)
    assert scores == {"pairs": 3, "correct": 2, "true": 5, "precision": 2 / 3, "recall": 2 / 5}
    assert duplicate_scores([], truth)["precision"] is None and duplicate_scores(found, [])["recall"] is None
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(truth))
    assert read_pairs(str(path)) == truth
    path.write_text(json.dumps([{"task_a": "a", "class_a": -1, "task_b": "b", "class_b": 0}]))
    with pytest.raises(DataError, match="entry 0"):
        read_pairs(str(path))
