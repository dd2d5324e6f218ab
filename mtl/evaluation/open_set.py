"""Open-set verification: 1:1 pairs built from the identities of a split that no head trained on.

A face model is judged on people it never saw. Pairs are deterministic: every positive pair (two images of one
identity) up to ``max_positive`` (a seeded subset beyond it), and the same number of negative pairs (two images of
different identities) drawn without repetition from ``default_rng(seed)``; positives and negatives alternate so
that the protocol's contiguous folds hold both kinds. Scored with :func:`mtl.evaluation.metrics.verification`
(squared L2 distance of unit embeddings, 10 folds, best threshold on 9, accuracy on the 10th).
"""
import numpy as np

from mtl.errors import DataError


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


def open_set_verification(features, labels, max_positive: int = 3000, seed: int = 0, folds: int = 10):
    """``{"verification_accuracy", "verification_std", ..., "verification_pairs"}`` of ``features`` [N, D] on the
    pairs of :func:`open_set_pairs` (embeddings L2-normalised, no flip)."""
    from mtl.evaluation.metrics import verification

    feats = np.asarray(features, dtype=np.float64)
    first, second, issame = open_set_pairs(labels, max_positive, seed)
    pairs = np.empty((2 * len(first), feats.shape[1]), dtype=np.float64)
    pairs[0::2], pairs[1::2] = feats[first], feats[second]
    result = verification(pairs, issame, folds=min(folds, len(issame)))
    metrics = {f"verification_{k}": float(v) for k, v in result.items()}
    metrics["verification_pairs"] = float(len(issame))
    return metrics
