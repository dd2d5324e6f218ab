"""Verification pairs from class labels: the one pair builder of evaluation (heads and reports use it)."""
import numpy as np

from mtl.errors import DataError


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
