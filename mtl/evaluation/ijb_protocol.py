"""The scoring half of IJB-B / IJB-C verification (:mod:`mtl.evaluation.ijb` reads and aligns the faces): template
pooling, pair scores, TAR at FAR, in numpy, batched, with progress bars. The numbers are those of insightface's
``eval_ijbc.py`` (``image2template_feature``, ``verification``, its TAR table from ``sklearn.metrics.roc_curve``),
checked against its own functions in tests/test_ijb.py."""
import numpy as np

from mtl.evaluation.ijb import FARS, TEMPLATE_BLOCK


def face_features(plain, flipped, scores, flip=True, detector_score=True):
    """Per-face features of a protocol variant: ``f(x) + f(flip x)`` (or ``f(x)``), times the detector score."""
    feats = plain + flipped if flip else plain.copy()
    if detector_score:
        feats = feats * scores[:, None]
    return feats


def template_features(feats, templates, medias):
    """(sorted template ids [T], unit template features [T, D] float64): per template, the mean feature of each of
    its medias (one video's frames, or one still), summed over its medias, then L2-normalised."""
    unique_templates, template_index = np.unique(templates, return_inverse=True)
    media_keys = np.stack([template_index.reshape(-1), np.asarray(medias)], axis=1)
    groups, group_index, counts = np.unique(media_keys, axis=0, return_inverse=True, return_counts=True)
    order = np.argsort(group_index.reshape(-1), kind="stable")  # faces of one media together, medias in order
    media_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    media_mean = np.add.reduceat(feats[order].astype(np.float64), media_starts, axis=0) / counts[:, None]
    template_starts = np.flatnonzero(np.concatenate([[True], groups[1:, 0] != groups[:-1, 0]]))
    out = np.add.reduceat(media_mean, template_starts, axis=0)  # groups are sorted by template
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return unique_templates, out / np.where(norms > 0, norms, 1.0)


def pair_scores(unique_templates, template_feats, pairs, progress=None):
    """Cosine of every pair's two templates. Pairs are grouped by their first template, ``TEMPLATE_BLOCK`` templates
    at a time, and scored from one matrix product of those templates with the second templates they meet: IJB-C's
    15.6M pairs cover 3 % of its 23k x 23k template pairs, so a few BLAS products beat gathering two feature rows per
    pair (ten times faster on one core). ``progress(n)`` after each block."""
    first = np.searchsorted(unique_templates, pairs[:, 0])
    second = np.searchsorted(unique_templates, pairs[:, 1])
    order = np.argsort(first, kind="stable")
    bounds = np.searchsorted(first[order], np.arange(0, len(unique_templates) + TEMPLATE_BLOCK, TEMPLATE_BLOCK))
    scores = np.empty(len(pairs), dtype=np.float64)
    for block, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if lo == hi:
            continue
        chosen = order[lo:hi]
        columns, column_of = np.unique(second[chosen], return_inverse=True)
        start = block * TEMPLATE_BLOCK
        products = template_feats[start:start + TEMPLATE_BLOCK] @ template_feats[columns].T
        scores[chosen] = products[first[chosen] - start, column_of.reshape(-1)]
        if progress is not None:
            progress(int(hi - lo))
    return scores


def tar_at_far(labels, scores, fars=FARS):
    """(``{far: tar}``, fpr, tpr, AUC): sklearn's ROC, and for each FAR the TAR of the ROC point whose FAR is nearest
    (ties: the later point of sklearn's order, i.e. the larger TAR), as the peer reads it off."""
    from sklearn.metrics import auc, roc_curve

    fpr, tpr, _ = roc_curve(labels, scores)
    area = float(auc(fpr, tpr))
    fpr, tpr = np.flipud(fpr), np.flipud(tpr)
    table = {far: float(tpr[int(np.argmin(np.abs(fpr - far)))]) for far in fars}
    return table, fpr, tpr, area


def evaluate_variants(ijb, plain, flipped, progress_factory=None):
    """``{variant: {"tar": {far: tar}, "auc", "fpr", "tpr", "scores"}}`` for the flip test with and without the
    detector-score weighting, and without the flip test likewise. ``progress_factory(total, desc)`` makes a progress
    bar (an object with ``update(n)`` and ``close()``) for each scoring pass."""
    results = {}
    for flip in (True, False):
        for detector in (True, False):
            name = ("flip" if flip else "no flip") + (" + detector score" if detector else "")
            feats = face_features(plain, flipped, ijb.scores, flip, detector)
            unique_templates, template_feats = template_features(feats, ijb.templates, ijb.medias)
            bar = progress_factory(len(ijb.pairs), f"{ijb.target} pairs, {name}") if progress_factory else None
            scores = pair_scores(unique_templates, template_feats, ijb.pairs, bar.update if bar else None)
            if bar is not None:
                bar.close()
            table, fpr, tpr, area = tar_at_far(ijb.labels, scores)
            results[name] = {"tar": table, "auc": area, "fpr": fpr, "tpr": tpr, "scores": scores}
    return results
