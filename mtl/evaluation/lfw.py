"""LFW's verification protocol (Huang et al. 2007, LFW's README sections 3-5) and its ROC files.

* View 1 (development): the threshold is chosen on ``pairsDevTrain.txt`` (the one with the highest accuracy on its
  2,200 pairs), the accuracy is measured on ``pairsDevTest.txt`` (1,000 pairs).
* View 2 (reporting), set k: the threshold is chosen on the other nine sets' 5,400 pairs, the accuracy is measured on
  set k's 600. In LFW's unrestricted configuration each set is scored by its own model, trained without the people
  of set k; LFW reports the mean accuracy over the ten sets and its standard error ``std / sqrt(10)``.

The embedding and distance are those of :mod:`mtl.evaluation.verify` (normalize(f(x) [+ f(flip x)]), squared L2, a
pair is "same" when its distance is below the threshold, thresholds 0..4 step 0.01, the first best on ties).
ROC points are written in LFW's own format (``"tpr fpr"`` per line, each point the mean over the sets scored at
one threshold), so that a curve of ours plots beside the published ones (``published_roc/`` of an LFW copy).
"""
import os
from typing import Dict, List, Sequence

import numpy as np

from mtl.core.arrays import unit_rows
from mtl.core.errors import DataError
from mtl.evaluation.metrics import DEFAULT_THRESHOLDS, _accept_counts, roc_curve

ROC_THRESHOLDS = np.linspace(0.0, 4.0, 2001)  # the points of a written ROC: every 0.002 of squared distance
FAR_POINT = 1e-2  # TAR is read at this FAR (a set's 300 different pairs: 3 false accepts)


def images_root(lfw_dir: str) -> str:
    """Where an LFW copy keeps its person folders: ``DIR/images`` when it exists (this project's layout), else
    ``DIR/lfw`` or ``DIR/lfw-deepfunneled`` (LFW's archives), else ``DIR`` itself."""
    for name in ("images", "lfw-deepfunneled", "lfw"):
        if os.path.isdir(os.path.join(lfw_dir, name)):
            return os.path.join(lfw_dir, name)
    return lfw_dir


def pair_distances_by_path(embeddings: Dict[str, np.ndarray], pair_set) -> np.ndarray:
    """Squared L2 distances of a :class:`mtl.data.lfw.PairSet`'s pairs from ``{relative path: embedding}``."""
    first = unit_rows(np.stack([embeddings[p] for p in pair_set.first]).astype(np.float64))
    second = unit_rows(np.stack([embeddings[p] for p in pair_set.second]).astype(np.float64))
    return np.sum(np.square(first - second), axis=1)


def best_threshold(distances, issame, thresholds=DEFAULT_THRESHOLDS) -> float:
    """The threshold of highest accuracy on these pairs (the first of the grid on ties)."""
    same = np.asarray(issame, dtype=bool)
    true_accept, false_accept = _accept_counts(np.asarray(distances, dtype=np.float64), same, thresholds)
    correct = true_accept + (int(np.sum(~same)) - false_accept)
    return float(thresholds[int(np.argmax(correct))])


def tar_at_far(distances, issame, far: float = FAR_POINT) -> float:
    """The highest true accept rate whose false accept rate does not exceed ``far`` (every distance a threshold)."""
    fpr, tpr, _ = roc_curve(distances, issame)
    return float(np.max(tpr[fpr <= far]))


def auc(distances, issame) -> float:
    """Area under the ROC curve (trapezoids over every distinct distance)."""
    fpr, tpr, _ = roc_curve(distances, issame)
    fpr, tpr = np.r_[fpr, 1.0], np.r_[tpr, 1.0]
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


def score_set(distances: Sequence[np.ndarray], issame: Sequence[np.ndarray], test: int) -> dict:
    """LFW's protocol for set ``test`` of ``distances``/``issame`` (one array per set): the threshold from every
    other set's pairs, the accuracy, AUC and TAR at FAR 1e-2 on set ``test``'s pairs."""
    if not 0 <= test < len(distances):
        raise DataError(f"set {test + 1} does not exist: the view has {len(distances)} sets")
    others = [k for k in range(len(distances)) if k != test]
    threshold = best_threshold(np.concatenate([distances[k] for k in others]),
                               np.concatenate([issame[k] for k in others]))
    d, same = np.asarray(distances[test]), np.asarray(issame[test], dtype=bool)
    return {"accuracy": float(np.mean((d < threshold) == same)), "threshold": threshold, "auc": auc(d, same),
            f"tar_far_{FAR_POINT:.0e}".replace("e-0", "e-"): tar_at_far(d, same), "pairs": int(len(same))}


def roc_points(distances: Sequence[np.ndarray], issame: Sequence[np.ndarray], thresholds=ROC_THRESHOLDS):
    """``(tpr, fpr)`` at each threshold, each the mean over the given sets (LFW's averaged ROC)."""
    tprs, fprs = [], []
    for d, same in zip(distances, issame):
        same = np.asarray(same, dtype=bool)
        true_accept, false_accept = _accept_counts(np.asarray(d, dtype=np.float64), same, thresholds)
        tprs.append(true_accept / max(int(same.sum()), 1))
        fprs.append(false_accept / max(int((~same).sum()), 1))
    return np.mean(tprs, axis=0), np.mean(fprs, axis=0)


def write_roc(path: str, tpr, fpr):
    """LFW's ROC file: one ``"tpr fpr"`` line per threshold, ten decimals (as the published files)."""
    with open(path, "w") as f:
        f.writelines(f"{t:.10f} {r:.10f}\n" for t, r in zip(tpr, fpr))


def read_roc(path: str):
    """``(tpr, fpr)`` of an LFW ROC file (published or ours); lines with NaN are skipped."""
    from mtl.core.utf8 import open_utf8

    rows = []
    with open_utf8(path, "ROC file") as f:
        for number, line in enumerate(f, start=1):
            cells = line.split()
            if not cells:
                continue
            try:
                tpr, fpr = float(cells[0]), float(cells[1])
            except (IndexError, ValueError):
                raise DataError(f"ROC file '{path}' line {number}: expected 'tpr fpr', got {line.strip()!r}") from None
            if np.isfinite(tpr) and np.isfinite(fpr):
                rows.append((tpr, fpr))
    if not rows:
        raise DataError(f"ROC file '{path}' holds no point")
    tpr, fpr = np.array(rows).T
    return tpr, fpr


def summary(accuracies: List[float]) -> dict:
    """LFW's figure of a View 2 result: the mean accuracy and its standard error ``S_E = sigma / sqrt(n)`` with
    ``sigma^2 = sum (p_i - mean)^2 / (n - 1)`` (Huang et al. 2007, section 5: n = 10 sets, divided by 9)."""
    values = np.asarray(accuracies, dtype=np.float64)
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"mean": float(values.mean()), "se": se}
