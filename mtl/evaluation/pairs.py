"""Verification pairs from class labels (the pair builders of evaluation) and their scoring.

Two builders for two questions. ``verification_pairs``: one positive and one negative partner per sample, for a
head's closed-set split. ``open_set_pairs`` (open-set verification: a split of identities no head trained on, the
way a face model is judged): every positive pair (two images of one identity) up to ``max_positive`` (a seeded
subset beyond it), and the same number of negative pairs drawn without repetition from ``default_rng(seed)``.
Positives and negatives alternate (in a seeded order), so that contiguous folds are already stratified:
``score_pairs`` applies :func:`mtl.evaluation.metrics.verification` with those folds (squared L2 distance of unit
embeddings, k folds, best threshold on k - 1, accuracy on the last), which keeps every figure recorded before the
stratified folds of user files came in.
"""
import numpy as np

from mtl.core.errors import DataError


def verification_pairs(labels: np.ndarray, seed: int = 0):
    """Balanced 1:1 pairs from class labels: ``(first, second, issame)`` index arrays.

    Every sample whose class has at least two samples gets one positive partner (another sample of its class) and
    one negative partner (a sample of another class), both drawn from ``RandomState(seed)``: P positive and
    P negative pairs, alternating.
    """
    labels = np.asarray(labels).reshape(-1)
    rng = np.random.RandomState(seed)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    _, group_start, group_size = np.unique(sorted_labels, return_index=True, return_counts=True)
    if len(group_size) < 2 or group_size.max() < 2:
        raise DataError("verification needs an evaluation split with at least two classes and one class "
                        f"with two samples; got {len(labels)} samples of {len(group_size)} classes")
    group_of = np.repeat(np.arange(len(group_size)), group_size)  # group of each sorted position
    eligible = group_size[group_of] >= 2
    anchors = np.flatnonzero(eligible)  # sorted positions
    starts, sizes = group_start[group_of[anchors]], group_size[group_of[anchors]]
    offset = rng.randint(0, sizes - 1)  # another member: skip the anchor's own position
    offset = offset + (offset >= anchors - starts)
    positive = order[starts + offset]
    first = order[anchors]
    negative = rng.randint(0, len(labels), size=len(first))
    for _ in range(64):
        clash = labels[negative] == labels[first]
        if not clash.any():
            break
        negative[clash] = rng.randint(0, len(labels), size=int(clash.sum()))
    for i in np.flatnonzero(labels[negative] == labels[first]):  # rare: a dominant class
        negative[i] = rng.choice(np.flatnonzero(labels != labels[first[i]]))
    # interleaved (positive, negative, positive, ...): the protocol's contiguous folds then hold both kinds
    pair_first = np.repeat(first, 2)
    pair_second = np.stack([positive, negative], axis=1).reshape(-1)
    issame = np.tile(np.array([True, False]), len(first))
    return pair_first, pair_second, issame


def open_set_pairs(labels, max_positive: int = 3000, seed: int = 0):
    """``(first, second, issame)`` index arrays: P positive and P negative pairs, alternating (P <= max_positive).

    Positives: all ``i < j`` with equal labels (a seeded subset of ``max_positive`` when there are more), in an order
    shuffled by ``default_rng(seed)`` so that every fold mixes identities. Negatives: P distinct unordered pairs of
    different labels, drawn from the same generator.
    """
    labels = np.asarray(labels).reshape(-1)
    n = len(labels)
    first, second = np.triu_indices(n, k=1)
    same = labels[first] == labels[second]
    positives = np.flatnonzero(same)
    negatives = np.flatnonzero(~same)
    if len(positives) == 0 or len(negatives) == 0:
        raise DataError(f"open-set verification needs two identities and one identity with two images; got "
                        f"{n} images of {len(np.unique(labels))} identities")
    rng = np.random.default_rng(int(seed))
    if len(positives) > max_positive:
        positives = np.sort(rng.choice(positives, size=int(max_positive), replace=False))
    count = min(len(positives), len(negatives))
    positives = rng.permutation(positives[:count])  # mixed identities in every fold of the protocol
    negatives = rng.choice(negatives, size=count, replace=False)
    order = np.stack([positives, negatives], axis=1).reshape(-1)
    issame = np.tile(np.array([True, False]), count)
    return first[order], second[order], issame


def score_pairs(embeddings, first, second, issame, folds: int = 10) -> dict:
    """``{"verification_accuracy", "verification_std", ...}`` of the pairs ``(first[i], second[i])`` of
    ``embeddings`` [N, D] (in their own dtype), with ``min(folds, pairs)`` contiguous folds: the pairs of the builders
    above alternate by construction, so each fold holds both kinds."""
    from mtl.evaluation.metrics import contiguous_folds, verification

    pairs = np.empty((2 * len(first), embeddings.shape[1]), dtype=embeddings.dtype)
    pairs[0::2], pairs[1::2] = embeddings[first], embeddings[second]
    folds = min(folds, len(issame))
    result = verification(pairs, issame, folds=folds, fold_of=contiguous_folds(len(issame), folds))
    return {f"verification_{k}": float(v) for k, v in result.items()}  # accuracy, std, threshold, ...


def open_set_verification(features, labels, max_positive: int = 3000, seed: int = 0, folds: int = 10):
    """``{"verification_accuracy", "verification_std", ..., "verification_pairs"}`` of ``features`` [N, D] on the
    pairs of :func:`open_set_pairs` (embeddings L2-normalised, no flip)."""
    first, second, issame = open_set_pairs(labels, max_positive, seed)
    metrics = score_pairs(np.asarray(features, dtype=np.float64), first, second, issame, folds)
    metrics["verification_pairs"] = float(len(issame))
    return metrics
