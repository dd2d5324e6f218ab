"""1:1 verification of a backbone on face verification sets (.bin or pairs lists), with ROC curves.

Protocol (InsightFace's): embedding = normalize(f(x) + f(flip x)); squared L2 distance of each pair; thresholds 0 to
4 step 0.01; 10 folds without shuffling, best threshold on 9 folds, accuracy on the 10th; accuracy +- std and
VAL@FAR=1e-3 from :func:`mtl.evaluation.metrics.verification`.
"""
import os

import numpy as np
import paddle

from mtl.arrays import unit_rows
from mtl.evaluation.metrics import pair_distances, roc_curve, verification
from mtl.low_precision import float32, inference_autocast


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


def evaluate_sets(backbone, sets, batch_size=128, image_field="image", roc_path=None, title="ROC", flip=True):
    """``{"<set>/accuracy", "<set>/std", "<set>/val_at_far", ...}`` for loaded sets; optional ROC PNG."""
    results, curves = {}, {}
    for vset in sets:
        emb = embed_pairs(backbone, vset, batch_size, image_field, flip)
        res = verification(emb, vset.issame, folds=min(10, vset.num_pairs))
        for k, v in res.items():
            results[f"{vset.name}/{k}"] = float(v)
        fpr, tpr, _ = roc_curve(pair_distances(emb), vset.issame)
        curves[f"{vset.name} (accuracy {res['accuracy']:.4f})"] = (np.asarray(fpr), np.asarray(tpr))
    if roc_path and curves:
        os.makedirs(os.path.dirname(roc_path) or ".", exist_ok=True)
        plot_roc(curves, roc_path, title)
    return results
