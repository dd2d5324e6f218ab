"""Verification over every pair of held-out images: the all-people figures of the face report.

All ``N (N - 1) / 2`` pairs of the images (no sampled subset), scored by the cosine of the unit embeddings (the
squared L2 distance of the per-dataset protocol is ``d = 2 - 2 cos``). Negatives are then mostly pairs of people of
two datasets: the question a deployed model faces, everyone against everyone.

* **Large people capped by weight.** Image i of a person with ``n_i`` images weighs ``w_i = min(1, cap / n_i)`` and
  pair (i, j) weighs ``w_i w_j``: a person counts as at most ``cap`` images (in expectation what subsampling ``cap``
  of them would give, without throwing images away). ``CAP = 20`` was fixed before any figure was seen: with it, the
  eight held-out people of Extended Yale B (about 64 images each) hold a positive weight of 1575 instead of 16065
  positive pairs (out of 18444 over the six datasets' validation people), against Georgia Tech's ten people's 1050
  (15 images each, uncapped).
* **Weighted rates.** ``TAR(t) = sum of w over positive pairs with cos >= t / sum of w over positive pairs``;
  ``FAR(t)`` likewise over the negative pairs.
* **TAR at FAR f**: ``TAR(t*)`` at the lowest threshold ``t*`` (among the pairs' cosines and +inf) with
  ``FAR(t*) <= f``, i.e. the highest TAR whose FAR does not exceed f (computed on all pairs, no folds).
* **10-fold accuracy**: the pairs in 10 folds (a permutation by ``default_rng(seed)``, then contiguous slices, the
  first ``P % 10`` one pair larger); for each fold, the threshold of the protocol's grid (``d < t``, t = 0, 0.01, ...,
  3.99) with the best balanced accuracy ``(TAR + 1 - FAR) / 2`` on the other nine (the first on ties), and that
  fold's balanced accuracy at it; the mean over folds. Balanced: positives and negatives count half each, as in the
  1:1 pairs of the per-dataset protocol (here negatives outnumber positives by about 20 to 1).
* **Cross-condition**: the weighted TAR, at the threshold ``t*`` of FAR 1e-3, of the positive pairs whose two images
  lie on opposite sides of the split condition (:mod:`mtl.evaluation.conditions`): does the model bridge the light
  side, or the halves of a person's images, that the overlap benchmark splits its shared people by?

Memory: a few arrays of ``N (N - 1) / 2`` numbers (0.4 million pairs for the 898 images of the six datasets'
validation people).
"""
from dataclasses import dataclass

import numpy as np

from mtl.core.arrays import unit_rows
from mtl.core.errors import DataError
from mtl.evaluation.conditions import cross_condition
from mtl.evaluation.metrics import DEFAULT_THRESHOLDS, fold_slices

CAP = 20
FARS = (1e-2, 1e-3)
CROSS_FAR = 1e-3


def image_weights(labels, cap: float = CAP) -> np.ndarray:
    """``w_i = min(1, cap / n_i)``, ``n_i`` the image count of image i's person (float64)."""
    labels = np.asarray(labels).reshape(-1)
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return np.minimum(1.0, float(cap) / counts[inverse.reshape(-1)])


@dataclass
class PairSet:
    """Every pair ``i < j`` of a set of images: cosine, same person, weight ``w_i w_j``, cross-condition."""

    cosine: np.ndarray
    same: np.ndarray
    weight: np.ndarray
    cross: np.ndarray

    @classmethod
    def of(cls, features, labels, weights, sides=None) -> "PairSet":
        """The pairs of ``features`` [N, D] (normalised here, float64), person ``labels`` [N], image ``weights``
        [N] and condition ``sides`` [N] (None: no pair is cross-condition)."""
        unit = unit_rows(np.asarray(features, dtype=np.float64))
        labels = np.asarray(labels).reshape(-1)
        first, second = np.triu_indices(len(labels), k=1)
        same = labels[first] == labels[second]
        if not same.any() or same.all():
            raise DataError(f"all-pairs verification needs two people and one person with two images; got "
                            f"{len(labels)} images of {len(np.unique(labels))} people")
        cosine = np.einsum("ij,ij->i", unit[first], unit[second])
        weights = np.asarray(weights, dtype=np.float64)
        cross = np.zeros(len(first), dtype=bool) if sides is None else \
            same & cross_condition(np.asarray(sides)[first], np.asarray(sides)[second])
        return cls(cosine, same, weights[first] * weights[second], cross)


def operating_points(cosine, same, weight):
    """``(thresholds, far, tar)``: for +inf and every distinct cosine in decreasing order, the weighted FAR and TAR
    of accepting ``cos >= t`` (both non-decreasing)."""
    order = np.argsort(-np.asarray(cosine), kind="stable")
    c, s, w = np.asarray(cosine)[order], np.asarray(same)[order], np.asarray(weight)[order]
    positive = np.cumsum(np.where(s, w, 0.0))
    negative = np.cumsum(np.where(s, 0.0, w))
    last = np.r_[np.flatnonzero(np.diff(c) != 0), len(c) - 1]
    thresholds = np.r_[np.inf, c[last]]
    return thresholds, np.r_[0.0, negative[last]] / negative[-1], np.r_[0.0, positive[last]] / positive[-1]


def tar_at_far(points, far: float):
    """``(tar, threshold)``: the TAR at the lowest threshold whose FAR is at most ``far``."""
    thresholds, fars, tars = points
    k = int(np.searchsorted(fars, far, side="right")) - 1
    return float(tars[k]), float(thresholds[k])


def accepted_share(pairs: PairSet, mask, threshold: float):
    """Weighted share of the pairs ``mask`` with ``cos >= threshold`` (None when ``mask`` holds no pair)."""
    total = float(pairs.weight[mask].sum())
    if total == 0.0:
        return None
    return float(pairs.weight[mask & (pairs.cosine >= threshold)].sum() / total)


def _accepted_by_fold(distance, weight, fold_of, folds, thresholds):
    """``[folds, thresholds]`` weight of the pairs with ``d < t`` per fold, and ``[folds]`` each fold's total."""
    accepted = np.zeros((folds, len(thresholds)))
    totals = np.zeros(folds)
    for k in range(folds):
        mine = fold_of == k
        order = np.argsort(distance[mine], kind="stable")
        cumulative = np.r_[0.0, np.cumsum(weight[mine][order])]
        accepted[k] = cumulative[np.searchsorted(distance[mine][order], thresholds, side="left")]
        totals[k] = cumulative[-1]
    return accepted, totals


def fold_accuracy(pairs: PairSet, folds: int = 10, seed: int = 0, thresholds=None) -> float:
    """The mean held-out balanced accuracy of ``folds`` folds (threshold from the others, see the module)."""
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    distance = 2.0 - 2.0 * pairs.cosine
    order = np.random.default_rng(int(seed)).permutation(len(distance))
    fold_of = np.empty(len(distance), dtype=np.int64)
    for k, (lo, hi) in enumerate(fold_slices(len(distance), folds)):
        fold_of[order[lo:hi]] = k
    pos, pos_total = _accepted_by_fold(distance[pairs.same], pairs.weight[pairs.same], fold_of[pairs.same], folds,
                                       thresholds)
    neg, neg_total = _accepted_by_fold(distance[~pairs.same], pairs.weight[~pairs.same], fold_of[~pairs.same], folds,
                                       thresholds)
    if (pos_total == 0).any() or (neg_total == 0).any():
        raise DataError(f"all-pairs verification: {len(distance)} pairs leave a fold without positive or negative "
                        f"pairs ({folds} folds)")
    accuracies = []
    for k in range(folds):
        train_tar = (pos.sum(axis=0) - pos[k]) / (pos_total.sum() - pos_total[k])
        train_far = (neg.sum(axis=0) - neg[k]) / (neg_total.sum() - neg_total[k])
        best = int(np.argmax(0.5 * (train_tar + 1.0 - train_far)))
        accuracies.append(0.5 * (pos[k, best] / pos_total[k] + 1.0 - neg[k, best] / neg_total[k]))
    return float(np.mean(accuracies))


def far_grid(points, fars) -> np.ndarray:
    """The TAR at FAR f (as :func:`tar_at_far`) for every f of ``fars``: an ROC sampled for plots and averages."""
    thresholds, far, tar = points
    return tar[np.searchsorted(far, np.asarray(fars, dtype=np.float64), side="right") - 1]


def all_people(features, labels, sides=None, cap: float = CAP, fars=FARS, plot_fars=None) -> dict:
    """``{"accuracy", "tar_far_1e-2", "tar_far_1e-3", "cross_condition", "pairs", "positive_pairs",
    "cross_condition_pairs"}`` of every pair of the images, and ``"roc"``: the TAR at each FAR of ``plot_fars``."""
    pairs = PairSet.of(features, labels, image_weights(labels, cap), sides)
    points = operating_points(pairs.cosine, pairs.same, pairs.weight)
    out = {"accuracy": fold_accuracy(pairs)}
    for far in fars:
        out[f"tar_far_{far:.0e}".replace("e-0", "e-")] = tar_at_far(points, far)[0]
    out["cross_condition"] = accepted_share(pairs, pairs.cross, tar_at_far(points, CROSS_FAR)[1])
    out.update(pairs=int(len(pairs.same)), positive_pairs=int(pairs.same.sum()),
               cross_condition_pairs=int(pairs.cross.sum()))
    if plot_fars is not None:
        out["roc"] = far_grid(points, plot_fars).tolist()
    return out
