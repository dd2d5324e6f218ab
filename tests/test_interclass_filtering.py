"""Inter-class filtering and known same-person pairs of the margin head (mtl/headkit/filtering.py) against a numpy
reference of the masked loss and its gradients, with the chunk passes in numpy (host) and in Paddle ops (device),
over several chunks, with the full softmax and Partial FC; 2 processes with sharded centres in
tests/test_sharded_heads.py's shared run (cases ``filter*``)."""
import json

import numpy as np
import paddle
import pytest

from mtl.core import arrays
from mtl.core.registry import plugin_class
from mtl.headkit import class_rows
from mtl.headkit.filtering import same_person_pairs
from tests.references.margin import assert_close, np_ce, np_dpsi, np_psi, run_head
from tests.sharded_heads_run import script  # registers the shared 2-process run "sharded_heads"

ArcFaceHead = plugin_class("head", "arcface")
ARC = (1.0, 0.5, 0.0)


def np_filtered_head(x, w, labels, margin, scale, threshold=None, mode="zero", pairs=()):
    """Loss and gradients (features, centres) of the margin head with filtered negatives, float64: a negative j of
    sample n is filtered when cos_jn > threshold or (labels_n, j) is a listed pair (columns of ``w``); its logit
    becomes 0 (zero: a constant) or leaves the softmax (remove); either way it passes no gradient."""
    rows = np.arange(len(labels))
    xn, wn = np.linalg.norm(x, axis=1, keepdims=True), np.linalg.norm(w, axis=1, keepdims=True)
    xh, wh = x / xn, w / wn
    c = xh @ wh.T
    dirty = c > threshold if threshold is not None else np.zeros(c.shape, bool)
    for a, b in pairs:
        dirty[labels == a, b] = True
    dirty[rows, labels] = False
    z = scale * c
    z[rows, labels] = scale * np_psi(c[rows, labels], *margin)
    z[dirty] = 0.0 if mode == "zero" else -np.inf
    loss, dz = np_ce(z, labels)
    dz[dirty] = 0.0
    dc = scale * dz
    dc[rows, labels] *= np_dpsi(c[rows, labels], *margin)
    dxh, dwh = dc @ wh, dc.T @ xh
    dx = (dxh - xh * (xh * dxh).sum(1, keepdims=True)) / xn
    dw = (dwh - wh * (wh * dwh).sum(1, keepdims=True)) / wn
    return loss, dx, dw, c, dirty


@pytest.fixture(params=["host", "device"])
def passes(request, monkeypatch):
    """The chunk passes in numpy on the host or in Paddle ops (the device path), over several chunks."""
    monkeypatch.setattr(arrays, "HOST_PATHS", request.param == "host")
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 3)  # several chunks, filtered entries in each
    return request.param


def _data(seed, n=10, d=4, classes=11):
    rng = np.random.RandomState(seed)
    return rng.randn(n, d), rng.randint(0, classes, size=n)


@pytest.mark.parametrize("mode", ["zero", "remove"])
def test_threshold_filtering_matches_numpy(passes, float64, mode):
    x, y = _data(1)
    head = ArcFaceHead(num_classes=11, feature_size=4, scale=16.0, seed=3, interclass_filtering_threshold=0.2,
                       interclass_filtering_mode=mode)
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    loss, ref_dx, ref_dw, cos, dirty = np_filtered_head(x, w, y, ARC, 16.0, 0.2, mode)
    assert 5 <= dirty.sum() <= 60  # the case filters something, not everything
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "centre gradient")
    assert float(out.metrics["accuracy"]) == pytest.approx(np.mean(cos.argmax(axis=1) == y))  # top-1 before filtering
    unfiltered = np_filtered_head(x, w, y, ARC, 16.0)[0]
    assert (loss < unfiltered) if mode == "remove" else loss != unfiltered


def test_zero_mode_is_the_peers_logit_zeroing(passes, float64):
    """arcface_torch's CombinedMarginLoss (losses.py): dirty = cos > t off the target, logits = (1 - dirty) * cos,
    then the ArcFace margin and the scale, then the cross-entropy (partial_fc_v2.py); transcribed in numpy."""
    x, y = _data(2)
    head = ArcFaceHead(num_classes=11, feature_size=4, scale=16.0, seed=4, interclass_filtering_threshold=0.2)
    w = head.weight.numpy().copy()
    out = head(paddle.to_tensor(x), paddle.to_tensor(y))
    cos = np.clip((x / np.linalg.norm(x, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T,
                  -1, 1)
    rows = np.arange(len(y))
    dirty = (cos > 0.2).astype(np.float64)
    dirty[rows, y] = 0.0
    logits = (1 - dirty) * cos
    theta = np.arccos(logits)
    theta[rows, y] += 0.5
    peer = np_ce(np.cos(theta) * 16.0, y)[0]
    assert abs(float(out.loss) - peer) <= 1e-9 * peer


@pytest.mark.parametrize("mode", ["zero", "remove"])
def test_same_person_pairs_and_threshold_with_partial_fc_match_numpy(passes, float64, tmp_path, mode):
    """Pairs from an ``mtl overlap --json`` file into a merged head (offsets a: 0, b: 20): classes 3 ~ 21 and
    5 ~ 27; a pair naming a task the head does not hold is dropped. Partial FC: the reference runs on the sample."""
    pairs = [{"task_a": "a", "class_a": 3, "task_b": "b", "class_b": 1, "similarity": 0.9},
             {"task_a": "a", "class_a": 5, "task_b": "b", "class_b": 7, "similarity": 0.8},
             {"task_a": "a", "class_a": 6, "task_b": "c", "class_b": 0, "similarity": 0.8}]
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps(pairs))
    x, _ = _data(3, n=8)
    y = np.array([3, 21, 5, 27, 3, 9, 0, 27])
    head = ArcFaceHead(num_classes=30, feature_size=4, scale=16.0, seed=5, sample_ratio=0.5,
                       interclass_filtering_threshold=0.4, interclass_filtering_mode=mode,
                       same_person={"pairs": str(path), "offsets": {"a": 0, "b": 20}})
    assert head.filtering.pairs.tolist() == [[3, 21], [5, 27], [21, 3], [27, 5]]
    w = head.weight.numpy().copy()
    out, dx, dw = run_head(head, x, y)
    sampled = head.last_sampled_classes.numpy()
    assert {21, 27, 3, 5} <= set(sampled.tolist())  # positives: every pair is in the sample
    column = {int(c): i for i, c in enumerate(sampled)}
    listed = [(column[a], column[b]) for a, b in head.filtering.pairs.tolist()]
    loss, ref_dx, ref_dw, _, dirty = np_filtered_head(x, w[sampled], np.searchsorted(sampled, y), ARC, 16.0, 0.4,
                                                      mode, listed)
    assert dirty[0, column[21]] and dirty[1, column[3]]
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw[sampled], ref_dw, 1e-10, "sampled centre gradient")


def test_options_are_checked():
    with pytest.raises(ValueError, match="interclass_filtering_threshold"):
        ArcFaceHead(num_classes=5, feature_size=4, interclass_filtering_threshold=1.5)
    with pytest.raises(ValueError, match="interclass_filtering_mode"):
        ArcFaceHead(num_classes=5, feature_size=4, interclass_filtering_mode="drop")
    with pytest.raises(ValueError, match="outside this head's"):
        same_person_pairs({"pairs": [{"task_a": "a", "class_a": 1, "task_b": "b", "class_b": 3}],
                           "offsets": {"a": 0, "b": 4}}, num_classes=5)
    with pytest.raises(ValueError, match="offsets must map"):
        same_person_pairs({"pairs": []}, num_classes=5)


@pytest.mark.distributed
@pytest.mark.two_process_runs("sharded_heads")
@pytest.mark.parametrize("name", ["filter7_pairs", "partial_fc10_filter_remove"])
def test_two_ranks_with_sharded_centres_match_numpy(two_process, name):
    """The 2-rank run of tests/dist_scripts/sharded_heads.py (centres split 4 + 3 and 5 + 5 classes, the paired
    classes on different ranks, the default passes: host on CPU) against the numpy reference of the whole batch
    (over the union of the ranks' samples for Partial FC)."""
    import os

    ranks = [dict(np.load(os.path.join(two_process["sharded_heads"], f"rank{k}.npz"))) for k in range(2)]
    cfg, _ = script.CASES[name]
    features, labels, _ = script.global_batch(cfg["num_classes"])
    init = np.concatenate([r[f"{name}/weight_init"] for r in ranks]).astype(np.float64)
    scored = np.concatenate([r[f"{name}/sampled"] for r in ranks]) if f"{name}/sampled" in ranks[0] \
        else np.arange(cfg["num_classes"])
    pairs = same_person_pairs(cfg["same_person"], cfg["num_classes"])
    column = {int(c): i for i, c in enumerate(scored)}
    listed = [(column[a], column[b]) for a, b in pairs.tolist() if a in column and b in column]
    target = np.searchsorted(scored, labels)
    loss, dx, dw, _, dirty = np_filtered_head(features.astype(np.float64), init[scored], target, ARC, cfg["scale"],
                                              cfg["interclass_filtering_threshold"],
                                              cfg.get("interclass_filtering_mode", "zero"), listed)
    assert dirty.any() and listed
    for rank in ranks:
        assert abs(float(rank[f"{name}/loss"]) - loss) <= 1e-5 * loss
    got_dx = np.concatenate([r[f"{name}/feature_grad"] for r in ranks])
    got_dw = np.concatenate([r[f"{name}/weight_grad"] for r in ranks])[scored]
    assert_close(got_dx, dx, 1e-4, "feature gradient")
    assert_close(got_dw, dw, 1e-4, "centre gradient")
    print(f"\n{name}, 2 ranks vs numpy: loss {abs(float(ranks[0][f'{name}/loss']) - loss) / loss:.1e}, gradients "
          f"{np.abs(got_dx - dx).max() / np.abs(dx).max():.1e} (features), "
          f"{np.abs(got_dw - dw).max() / np.abs(dw).max():.1e} (centres), relative")
