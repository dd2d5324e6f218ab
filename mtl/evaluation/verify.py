"""1:1 verification of a backbone on face verification sets (.bin or pairs lists), with ROC curves.

Protocol (InsightFace's): embedding = normalize(f(x) + f(flip x)); squared L2 distance of each pair; thresholds 0 to
4 step 0.01; 10 folds, best threshold on 9 folds, accuracy on the 10th; accuracy +- std and VAL@FAR=1e-3 from
:func:`mtl.evaluation.metrics.verification`. The folds are stratified by kind and drawn from the pairs' own images
(:func:`set_folds`), so that a list in any order scores the same; ``fold_order="file"`` keeps insightface's
contiguous folds in file order (LFW's, CFP's and AgeDB's ``.bin`` files hold both kinds in each tenth).
"""
import os

import numpy as np
import paddle

from mtl.core.arrays import unit_rows
from mtl.core.errors import DataError
from mtl.core.low_precision import float32, inference_autocast
from mtl.evaluation.metrics import contiguous_folds, pair_distances, roc_curve, stratified_folds, verification

FOLD_ORDERS = ("stratified", "file")


@paddle.no_grad()
def embed_pairs(backbone, vset, batch_size=128, image_field="image", flip=True):
    """normalize(f(x) + f(flip x)) (``flip=False``: normalize(f(x))) for every image of the set, [2P, D] numpy
    (backbone in eval mode)."""
    was_training = backbone.training
    backbone.eval()
    out = []
    try:
        for plain, flipped in zip(vset.batches(batch_size, flip=False), vset.batches(batch_size, flip=True)):
            with inference_autocast(backbone):  # O2: the backbone's weights are bfloat16/float16
                f = float32(backbone({image_field: paddle.to_tensor(plain)}))
                if flip:
                    f = f + float32(backbone({image_field: paddle.to_tensor(flipped)}))
            out.append(f.numpy())
    finally:
        if was_training:
            backbone.train()
    emb = np.concatenate(out).astype(np.float64)
    return unit_rows(emb)


def plot_roc(curves, path, title):
    """PNG of ROC curves ``{label: (fpr, tpr)}`` on a log-FAR axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for label, (fpr, tpr) in curves.items():
        ax.plot(np.maximum(fpr, 1e-4), tpr, label=label)
    ax.set_xscale("log")
    ax.set_xlim(1e-4, 1)
    ax.set_xlabel("false accept rate")
    ax.set_ylabel("true accept rate")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def set_folds(vset, folds: int = 10, order: str = "stratified") -> np.ndarray:
    """The fold of every pair of ``vset``: stratified by kind from the pairs' keys (their images, whatever their place
    in the file), or ``order="file"``: contiguous tenths of the file, refused when one holds a single kind."""
    if order == "stratified":
        return stratified_folds(vset.issame, folds, keys=vset.pair_keys)
    if order != "file":
        raise ValueError(f"fold order must be one of {FOLD_ORDERS}, got {order!r}")
    fold_of = contiguous_folds(vset.num_pairs, folds)
    for k in range(folds):
        kinds = set(vset.issame[fold_of == k].tolist())
        if len(kinds) < 2:
            which = "same-person" if kinds == {True} else "different-person"
            raise DataError(f"verification set '{vset.source or vset.name}': fold {k + 1} of {folds} in the file's "
                            f"order holds only {which} pairs, so its accuracy says nothing; use the stratified folds "
                            "(the default) or order the file as LFW's pairs are (each tenth both kinds)")
    return fold_of


def evaluate_sets(backbone, sets, batch_size=128, image_field="image", roc_path=None, title="ROC", flip=True,
                  fold_order="stratified"):
    """``{"<set>/accuracy", "<set>/std", "<set>/val_at_far", ...}`` for loaded sets; optional ROC PNG."""
    results, curves = {}, {}
    for vset in sets:
        emb = embed_pairs(backbone, vset, batch_size, image_field, flip)
        folds = min(10, vset.num_pairs)
        res = verification(emb, vset.issame, folds=folds, fold_of=set_folds(vset, folds, fold_order))
        for k, v in res.items():
            results[f"{vset.name}/{k}"] = float(v)
        fpr, tpr, _ = roc_curve(pair_distances(emb), vset.issame)
        curves[f"{vset.name} (accuracy {res['accuracy']:.4f})"] = (np.asarray(fpr), np.asarray(tpr))
    if roc_path and curves:
        os.makedirs(os.path.dirname(roc_path) or ".", exist_ok=True)
        plot_roc(curves, roc_path, title)
    return results
