"""The verification protocol written as plain loops (the reference of tests/test_metrics.py and
tests/test_verification_folds.py), and noisy random pairs to score."""
import numpy as np

from tests.lazy import LazyModule

model_selection = LazyModule("sklearn.model_selection")


def reference_verification(embeddings, issame, folds, thresholds, far_target, splits=None):
    """The LFW protocol written as plain loops over folds and thresholds; ``splits`` (train, test) index pairs,
    default sklearn's unshuffled KFold (insightface's folds)."""
    emb = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    dist = np.array([np.sum((emb[2 * i] - emb[2 * i + 1]) ** 2) for i in range(len(issame))])
    issame = np.asarray(issame, dtype=bool)

    def accept_stats(threshold, d, s):
        accepted = d < threshold
        acc = np.mean(accepted == s)
        val = np.sum(accepted & s) / max(np.sum(s), 1)
        far = np.sum(accepted & ~s) / max(np.sum(~s), 1)
        return acc, val, far

    accs, best_ts, vals, fars = [], [], [], []
    if splits is None:
        splits = model_selection.KFold(n_splits=folds, shuffle=False).split(np.arange(len(issame)))
    for train, test in splits:
        best_acc, best_t = -1.0, None
        for t in thresholds:
            acc = accept_stats(t, dist[train], issame[train])[0]
            if acc > best_acc:
                best_acc, best_t = acc, t
        best_ts.append(best_t)
        accs.append(accept_stats(best_t, dist[test], issame[test])[0])
        # VAL: walk up the threshold grid until the training FAR reaches the target, then interpolate
        val_t, prev = 0.0, None
        for t in thresholds:
            far = accept_stats(t, dist[train], issame[train])[2]
            if far >= far_target:
                if far == far_target or prev is None:
                    val_t = t
                else:
                    val_t = prev[0] + (far_target - prev[1]) * (t - prev[0]) / (far - prev[1])
                break
            prev = (t, far)
        _, val, far = accept_stats(val_t, dist[test], issame[test])
        vals.append(val)
        fars.append(far)
    return dict(accuracy=np.mean(accs), std=np.std(accs), threshold=np.mean(best_ts), val_at_far=np.mean(vals),
                far=np.mean(fars))


def noisy_pairs(rng, pairs, dim, noise):
    """Random unit-ish embeddings: "same" pairs are one vector plus noise, "different" pairs are independent."""
    issame = rng.rand(pairs) < 0.5
    first = rng.randn(pairs, dim)
    second = np.where(issame[:, None], first + noise * rng.randn(pairs, dim), rng.randn(pairs, dim))
    emb = np.empty((2 * pairs, dim))
    emb[0::2], emb[1::2] = first, second
    return emb, issame
