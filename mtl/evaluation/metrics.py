"""Evaluation metrics in plain numpy: face verification (k-fold, VAL@FAR), ROC, accuracy, multi-label and regression.

Verification folds are stratified by kind and do not depend on the order of the pairs (:func:`stratified_folds`):
insightface's contiguous folds in file order put one kind in each fold of a list written positives first.

Nothing here imports Paddle: heads hand over numpy arrays (embeddings, scores, labels) of the whole evaluation split.
"""
import numpy as np

from mtl.core.arrays import unit_rows

DEFAULT_THRESHOLDS = np.arange(0.0, 4.0, 0.01)


def fold_slices(n: int, folds: int):
    """Contiguous, unshuffled folds like ``sklearn.model_selection.KFold(folds, shuffle=False)``.

    The first ``n % folds`` folds hold ``n // folds + 1`` items, the others ``n // folds``.
    """
    base, extra = divmod(n, folds)
    start = 0
    for k in range(folds):
        size = base + (1 if k < extra else 0)
        yield start, start + size
        start += size


def contiguous_folds(n: int, folds: int) -> np.ndarray:
    """The fold of each of ``n`` items under :func:`fold_slices` (insightface's folds: the file's own order)."""
    fold_of = np.empty(n, dtype=np.int64)
    for k, (lo, hi) in enumerate(fold_slices(n, folds)):
        fold_of[lo:hi] = k
    return fold_of


FOLD_SEED = 0  # the fixed seed of the stratified folds: the same pairs give the same folds on every machine


def _key_rank(keys, seed: int) -> np.ndarray:
    """A seeded pseudo-random order of ``keys`` that depends only on each key's value (blake2b of seed and key)."""
    import hashlib

    digests = [hashlib.blake2b(f"{seed}\x00".encode() + (k if isinstance(k, bytes) else str(k).encode()),
                               digest_size=8).digest() for k in keys]
    return np.argsort(np.array([int.from_bytes(d, "big") for d in digests], dtype=np.uint64), kind="stable")


def stratified_folds(issame, folds: int, keys=None, seed: int = FOLD_SEED) -> np.ndarray:
    """The fold of every pair, stratified by kind and independent of the pairs' order in the file.

    Within each kind (same pairs first, then different pairs) the pairs are put in the order of a seeded hash of
    their ``keys`` (what identifies a pair: its two image paths, or its two images' bytes; default its position) and
    dealt to the folds in turn, the different pairs continuing where the same pairs stopped. Every fold then holds
    ``P_same / folds`` and ``P_diff / folds`` pairs (each within one) and the total differs by at most one between
    folds; a list given in another order (or with a pair's two images swapped, when the keys are symmetric) gets the
    same folds, hence the same figures. Contiguous folds in file order (insightface's) give a fold of one kind when a
    user's list holds every positive pair first.
    """
    same = np.asarray(issame).astype(bool).reshape(-1)
    keys = np.arange(len(same)) if keys is None else list(keys)
    if len(keys) != len(same):
        raise ValueError(f"stratified_folds got {len(keys)} keys for {len(same)} pairs")
    fold_of = np.empty(len(same), dtype=np.int64)
    dealt = 0
    for kind in (True, False):
        members = np.flatnonzero(same == kind)
        ordered = members[_key_rank([keys[i] for i in members], seed)]
        fold_of[ordered] = (dealt + np.arange(len(ordered))) % folds
        dealt += len(ordered)
    return fold_of


MIN_PAIRS_PER_KIND = 20  # below this many pairs of one kind, 10 folds hold one or two of them each


# The metrics that are counts (of pairs, people, images), not rates, errors or thresholds: the tables print them whole
# (:func:`mtl.train.reporting.format_value`), every other metric with four digits, whatever its value. A head or an
# evaluation that reports a count names it here: verification_pairs (mtl.evaluation.pairs), identification_gallery
# and identification_probes (mtl.evaluation.identification). ``<set>/<name>`` is the count ``name`` of a set.
COUNT_METRICS = frozenset({"verification_pairs", "identification_gallery", "identification_probes"})


def is_count(name) -> bool:
    """Whether the metric called ``name`` (or ``<set>/<name>``) is a count (:data:`COUNT_METRICS`)."""
    return name is not None and str(name).rsplit("/", 1)[-1] in COUNT_METRICS


def small_folds_warning(issame, folds: int = 10):
    """A sentence when a verification list holds fewer than :data:`MIN_PAIRS_PER_KIND` pairs of either kind (its
    fold accuracies then move in steps of 1/2 or more, and its std means little), else None."""
    same = np.asarray(issame).astype(bool)
    n_same, n_diff = int(same.sum()), int((~same).sum())
    if min(n_same, n_diff) >= MIN_PAIRS_PER_KIND:
        return None
    return (f"warning: {n_same} same-person and {n_diff} different-person pairs: with fewer than "
            f"{MIN_PAIRS_PER_KIND} of either kind the {folds} folds are too small for the accuracy and its std to "
            "mean much; add pairs")


def _accept_counts(distances, issame, thresholds):
    """For every threshold t: (true accepts, false accepts), where a pair is accepted when ``distance < t``."""
    same = np.sort(distances[issame])
    diff = np.sort(distances[~issame])
    true_accept = np.searchsorted(same, thresholds, side="left")
    false_accept = np.searchsorted(diff, thresholds, side="left")
    return true_accept, false_accept


def _threshold_at_far(far, thresholds, far_target):
    """Threshold at which the (non-decreasing) FAR curve reaches ``far_target``, by linear interpolation.

    With ``j`` the first grid index where ``far[j] >= far_target``: ``far[j] == far_target`` gives ``thresholds[j]``;
    otherwise interpolate between grid points ``j - 1`` and ``j``. If the FAR never reaches the target the threshold is
    0 (nothing is accepted), as in the insightface protocol.
    """
    reached = np.nonzero(far >= far_target)[0]
    if reached.size == 0:
        return 0.0
    j = int(reached[0])
    if far[j] == far_target or j == 0:
        return float(thresholds[j])
    t0, t1 = thresholds[j - 1], thresholds[j]
    f0, f1 = far[j - 1], far[j]
    return float(t0 + (far_target - f0) * (t1 - t0) / (f1 - f0))


def verification(embeddings, issame, folds=10, thresholds=None, far_target=1e-3, fold_of=None):
    """k-fold face-verification accuracy and VAL at a target FAR (the LFW / insightface protocol).

    ``embeddings`` is [2P, D]: pair i is rows 2i and 2i+1. The caller passes L2-normalised embeddings (for the
    standard protocol, ``normalize(f(x) + f(flip(x)))``); they are normalised again here defensively, which is a no-op
    on unit vectors. ``issame`` is [P] booleans. Distance = squared L2 ``||e_2i - e_2i+1||^2`` in [0, 4]; a pair is
    predicted "same" when ``distance < threshold``. ``fold_of`` [P] gives each pair's fold (0 .. folds - 1); the
    default is :func:`stratified_folds` by position (seeded; callers with a user's file pass the folds of the
    pairs' own keys, callers whose pairs alternate by construction may pass :func:`contiguous_folds`). For each fold
    the threshold with the highest accuracy on the other folds (first one on ties) is applied to the held-out fold.
    VAL@FAR: on the training folds, the threshold where the false-accept rate reaches ``far_target`` (linear
    interpolation over the threshold grid), then VAL = true accepts / same pairs on the held-out fold.

    Returns ``{"accuracy": mean held-out accuracy, "std": its std over folds, "threshold": mean best threshold,
    "val_at_far": mean VAL, "far": mean held-out FAR at the VAL threshold}``.
    """
    emb = np.asarray(embeddings, dtype=np.float64)
    same = np.asarray(issame).astype(bool).reshape(-1)
    _check_pairs(emb, same, folds)
    fold_of = stratified_folds(same, folds) if fold_of is None else np.asarray(fold_of).reshape(-1)
    if fold_of.shape != same.shape:
        raise ValueError(f"verification got {fold_of.shape[0]} fold numbers for {same.shape[0]} pairs")
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    emb = unit_rows(emb)
    distances = np.sum(np.square(emb[0::2] - emb[1::2]), axis=1)
    per_fold = [_fold_result(distances, same, fold_of == k, thresholds, far_target) for k in range(folds)]
    accuracies, best_thresholds, vals, fars = (np.array(column) for column in zip(*per_fold))
    return {
        "accuracy": float(np.mean(accuracies)),
        "std": float(np.std(accuracies)),
        "threshold": float(np.mean(best_thresholds)),
        "val_at_far": float(np.mean(vals)),
        "far": float(np.mean(fars)),
    }


def _check_pairs(emb, same, folds):
    if emb.ndim != 2 or emb.shape[0] % 2:
        raise ValueError(f"verification expects embeddings of shape [2P, D], got {list(emb.shape)}")
    pairs = emb.shape[0] // 2
    if same.shape[0] != pairs:
        raise ValueError(f"verification got {emb.shape[0]} embeddings ({pairs} pairs) but {same.shape[0]} issame flags")
    if pairs < folds:
        raise ValueError(f"verification needs at least as many pairs as folds: got {pairs} pairs and {folds} folds")


def _fold_result(distances, same, test, thresholds, far_target):
    """(accuracy, best threshold, VAL, FAR) of the held-out pairs ``test`` (a mask) with thresholds from the others."""
    train = ~test
    # accuracy on the training folds for every threshold: (true accepts + true rejects) / pairs
    ta, fa = _accept_counts(distances[train], same[train], thresholds)
    n_diff_train = int(np.sum(~same[train]))
    best = int(np.argmax(ta + (n_diff_train - fa)))  # first maximum on ties
    d_test, s_test = distances[test], same[test]
    accuracy = float(np.mean((d_test < thresholds[best]) == s_test))
    val_threshold = _threshold_at_far(fa / max(n_diff_train, 1), thresholds, far_target)
    accepted = d_test < val_threshold
    n_same_test, n_diff_test = int(np.sum(s_test)), int(np.sum(~s_test))
    val = np.sum(accepted & s_test) / n_same_test if n_same_test else 0.0
    far = np.sum(accepted & ~s_test) / n_diff_test if n_diff_test else 0.0
    return accuracy, thresholds[best], val, far


def pair_distances(embeddings):
    """Squared L2 distances of the (L2-normalised) pairs of a [2P, D] embedding array; shape [P]."""
    emb = np.asarray(embeddings, dtype=np.float64)
    emb = unit_rows(emb)
    return np.sum(np.square(emb[0::2] - emb[1::2]), axis=1)


def roc_curve(distances, issame):
    """ROC of a distance-based verifier: pairs with ``distance <= threshold`` are accepted as "same".

    Returns ``(fpr, tpr, thresholds)``: thresholds are ``-inf`` (accept nothing) followed by every distinct distance in
    increasing order; ``tpr = accepted same / same``, ``fpr = accepted different / different`` (0 when a class is
    absent). Equivalent to ``sklearn.metrics.roc_curve(issame, -distances, drop_intermediate=False)`` with negated
    thresholds.
    """
    d = np.asarray(distances, dtype=np.float64).reshape(-1)
    same = np.asarray(issame).astype(bool).reshape(-1)
    if d.shape != same.shape:
        raise ValueError(f"roc_curve got {d.shape[0]} distances but {same.shape[0]} issame flags")
    order = np.argsort(d, kind="stable")
    d, same = d[order], same[order]
    last_of_value = np.r_[np.nonzero(np.diff(d))[0], d.size - 1] if d.size else np.array([], dtype=int)
    tp = np.cumsum(same)[last_of_value]
    fp = np.cumsum(~same)[last_of_value]
    n_same, n_diff = int(same.sum()), int((~same).sum())
    tpr = np.r_[0.0, tp / n_same] if n_same else np.zeros(tp.size + 1)
    fpr = np.r_[0.0, fp / n_diff] if n_diff else np.zeros(fp.size + 1)
    thresholds = np.r_[-np.inf, d[last_of_value]]
    return fpr, tpr, thresholds


def accuracy(logits_or_pred, labels):
    """Fraction of correct predictions; scores of shape [N, C] are turned into classes by argmax (first on ties)."""
    pred = np.asarray(logits_or_pred)
    labels = np.asarray(labels).reshape(-1)
    if pred.ndim == 2:
        pred = np.argmax(pred, axis=1)
    pred = pred.reshape(-1)
    if pred.shape != labels.shape:
        raise ValueError(f"accuracy got {pred.shape[0]} predictions but {labels.shape[0]} labels")
    return float(np.mean(pred == labels)) if labels.size else 0.0


def topk_accuracy(scores, labels, k):
    """Fraction of samples whose label is among the ``k`` highest scores of [N, C] ``scores``.

    The rank of the label is the number of classes ordered before it: higher score, or equal score and lower index
    (so k=1 agrees with :func:`accuracy`'s argmax).
    """
    scores = np.asarray(scores)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if scores.ndim != 2 or scores.shape[0] != labels.shape[0]:
        raise ValueError(f"topk_accuracy expects scores [N, C] and labels [N], got {scores.shape} and {labels.shape}")
    rows = np.arange(labels.shape[0])
    target = scores[rows, labels][:, None]
    before = (scores > target) | ((scores == target) & (np.arange(scores.shape[1])[None, :] < labels[:, None]))
    rank = before.sum(axis=1)
    return float(np.mean(rank < k)) if labels.size else 0.0


def average_precision(scores, targets):
    """Average precision of one class: ``AP = sum_n (R_n - R_{n-1}) * P_n`` over distinct score thresholds.

    ``R_n``, ``P_n`` are recall and precision when every sample scoring ``>=`` the n-th highest distinct score is
    called positive (ties enter together), as in ``sklearn.metrics.average_precision_score``. NaN without positives.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    targets = np.asarray(targets).reshape(-1) > 0
    positives = int(targets.sum())
    if positives == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    s, t = scores[order], targets[order]
    last_of_value = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
    tp = np.cumsum(t)[last_of_value]
    called = last_of_value + 1
    precision = tp / called
    recall = tp / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def multilabel_scores(scores, targets, threshold=0.5):
    """Multi-label metrics of [N, C] ``scores`` (probabilities) against 0/1 ``targets``.

    A label is predicted when ``score >= threshold``. ``micro_f1 = 2TP / (2TP + FP + FN)`` over all cells;
    ``macro_f1`` = mean over classes of the per-class F1 (0 for a class with 0/0, like sklearn's ``zero_division=0``);
    ``mAP`` = mean over classes of :func:`average_precision`, skipping classes without a positive target.
    """
    scores = np.asarray(scores, dtype=np.float64)
    targets = np.asarray(targets) > 0.5
    if scores.shape != targets.shape or scores.ndim != 2:
        raise ValueError(f"multilabel_scores expects scores and targets of one shape [N, C], got "
                         f"{list(scores.shape)} and {list(targets.shape)}")
    predicted = scores >= threshold
    tp = np.sum(predicted & targets, axis=0)
    fp = np.sum(predicted & ~targets, axis=0)
    fn = np.sum(~predicted & targets, axis=0)
    micro_den = 2 * tp.sum() + fp.sum() + fn.sum()
    micro_f1 = 2 * tp.sum() / micro_den if micro_den else 0.0
    per_class_den = 2 * tp + fp + fn
    per_class_f1 = np.where(per_class_den > 0, 2 * tp / np.maximum(per_class_den, 1), 0.0)
    aps = [average_precision(scores[:, c], targets[:, c]) for c in range(scores.shape[1]) if targets[:, c].any()]
    return {
        "micro_f1": float(micro_f1),
        "macro_f1": float(np.mean(per_class_f1)) if per_class_f1.size else 0.0,
        "mAP": float(np.mean(aps)) if aps else float("nan"),
    }


def regression_scores(pred, target):
    """Mean absolute error and root-mean-square error over every element: ``mean|p - y|``, ``sqrt(mean (p - y)^2)``."""
    pred = np.asarray(pred, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if pred.size != target.size:
        raise ValueError(f"regression_scores got {pred.size} predictions but {target.size} targets")
    diff = pred.reshape(-1) - target.reshape(-1)
    if diff.size == 0:
        return {"mae": float("nan"), "rmse": float("nan")}
    return {"mae": float(np.mean(np.abs(diff))), "rmse": float(np.sqrt(np.mean(diff * diff)))}
