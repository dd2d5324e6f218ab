"""The held-out part of a face dataset (:mod:`mtl.readers._face`, step 3): held-out images per class
(``eval_fraction``), or held-out identities (``holdout_classes``)."""
import numpy as np

from mtl.core.errors import ParameterError


def holdout_mask(labels: np.ndarray, eval_fraction: float) -> np.ndarray:
    """Boolean eval mask: per class, rank r (file order) is held out when floor((r+1)*f) > floor(r*f)."""
    n = len(labels)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    first = np.searchsorted(sorted_labels, sorted_labels, side="left")
    rank = np.arange(n) - first
    held = np.floor((rank + 1) * eval_fraction) > np.floor(rank * eval_fraction)
    mask = np.zeros(n, dtype=bool)
    mask[order] = held
    return mask


def choose_holdout(classes: np.ndarray, spec, seed: int) -> np.ndarray:
    """The held-out labels among the sorted present ``classes``: ``spec`` is a list of labels, a count (int >= 1) or a
    fraction in (0, 1) (``round(f * C)`` classes, at least 1); counts and fractions are drawn without replacement
    from ``default_rng(seed)``. Raises ValueError with a sentence when the spec does not fit."""
    classes = np.asarray(classes, dtype=np.int64)
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in spec) or not spec:
            raise ParameterError(f"holdout_classes as a list must hold integer labels, got {spec!r}")
        chosen = np.unique(np.asarray(spec, dtype=np.int64))
        missing = np.setdiff1d(chosen, classes)
        if len(missing):
            raise ParameterError(f"holdout_classes names label(s) {missing[:5].tolist()} that the data does not hold")
    elif isinstance(spec, bool) or not isinstance(spec, (int, float)):
        raise ParameterError(f"holdout_classes must be a list of labels, a count or a fraction in (0, 1), got {spec!r}")
    else:
        if isinstance(spec, float) and 0.0 < spec < 1.0:
            count = max(1, int(round(spec * len(classes))))
        elif float(spec) == int(spec) and spec >= 1:
            count = int(spec)
        else:
            raise ParameterError(f"holdout_classes must be a count >= 1 or a fraction in (0, 1), got {spec!r}")
        if count > len(classes):
            raise ParameterError(f"holdout_classes {spec!r} asks for {count} of only {len(classes)} classes")
        chosen = np.sort(np.random.default_rng(int(seed)).choice(classes, size=count, replace=False))
    if len(chosen) >= len(classes):
        raise ParameterError(f"holdout_classes holds out all {len(classes)} classes: nothing is left to train on")
    return chosen
