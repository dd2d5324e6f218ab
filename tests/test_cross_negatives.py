"""Cross-head negatives (mtl/headkit/cross_negatives.py) against a float64 numpy reference of the masked softmax, its
loss and gradients: the other heads' classes as plain negatives (no margin; no gradient of their own, or with
``update: both`` the gradient a merged head's rows would get), the
same-person classes out of the sample's softmax; with masks from pairs and from the online rule, a sampled rate,
Partial FC on the own head, several chunks, the numpy and the Paddle-op passes."""
import json
import os

import numpy as np
import paddle
import pytest

from mtl.core import arrays
from mtl.core.registry import plugin_class
from mtl.headkit import class_rows
from mtl.headkit.cross_negatives import CrossNegatives, planned_bytes
from mtl.headkit.online_rule import estimated_pairs, normal_quantile
from mtl.optimizer.sparse import StepRows
from tests import equivalence
from tests.references.margin import assert_close, np_ce, np_dpsi, np_psi
from tests.shared_runs import one_process_run, train_here, two_process_run

ArcFaceHead = plugin_class("head", "arcface")
ARC = (1.0, 0.5, 0.0)
SCALE = 16.0
CFG = {"rate": 1.0, "tasks": "all", "mask": "none", "pairs": None, "update": "own", "warmup": 0, "quantile": 0.05,
       "momentum": 0.9, "floor": 0.2, "rows": "drawn"}


@pytest.fixture(params=["host", "device"])
def passes(request, monkeypatch):
    """The chunk passes in numpy on the host or in Paddle ops, over several chunks (other heads' too)."""
    monkeypatch.setattr(arrays, "HOST_PATHS", request.param == "host")
    monkeypatch.setattr(class_rows, "CHUNK_ROWS", 3)
    return request.param


def np_cross_head(x, w_own, labels, others, removed, margin, scale, own_columns=None, with_others=False):
    """Loss and gradients (features, own centres) of a margin head whose softmax also holds ``others`` (a list of
    ``[C_b, D]`` centres: plain cosines, no margin), ``removed[b] [N, C_b]`` True where a class leaves the sample's
    softmax; ``own_columns``: the own classes scored (Partial FC), all by default. ``with_others``: also the
    gradient of the loss with respect to each of ``others`` (appended: what ``update: both`` gives them). float64."""
    n = len(labels)
    own_columns = np.arange(len(w_own)) if own_columns is None else np.asarray(own_columns)
    xn = np.linalg.norm(x, axis=1, keepdims=True)
    xh = x / xn
    blocks = [w_own[own_columns]] + list(others)
    w = np.concatenate(blocks)
    wn = np.linalg.norm(w, axis=1, keepdims=True)
    wh = w / wn
    c = xh @ wh.T
    target = np.searchsorted(own_columns, labels)
    rows = np.arange(n)
    z = scale * c
    z[rows, target] = scale * np_psi(c[rows, target], *margin)
    gone = np.zeros(c.shape, bool)
    offset = len(own_columns)
    for block, mask in zip(others, removed):
        gone[:, offset:offset + len(block)] = mask
        offset += len(block)
    z[gone] = -np.inf
    loss, dz = np_ce(z, target)
    dz[gone] = 0.0
    dc = scale * dz
    dc[rows, target] *= np_dpsi(c[rows, target], *margin)
    dxh = dc @ wh
    dx = (dxh - xh * (xh * dxh).sum(1, keepdims=True)) / xn
    own = len(own_columns)
    dwh = dc[:, :own].T @ xh
    dw_cols = (dwh - wh[:own] * (wh[:own] * dwh).sum(1, keepdims=True)) / wn[:own]
    dw = np.zeros_like(w_own)
    dw[own_columns] = dw_cols
    if not with_others:
        return loss, dx, dw, c
    all_dwh = dc.T @ xh  # d loss / d w_hat of every column; w_hat = w / |w|
    all_dw = (all_dwh - wh * (wh * all_dwh).sum(1, keepdims=True)) / wn
    bounds = np.cumsum([own] + [len(b) for b in others])
    return loss, dx, dw, c, [all_dw[b:e] for b, e in zip(bounds[:-1], bounds[1:])]


def heads(partial=1.0):
    """Three margin heads of 11, 7 and 5 classes (the first with Partial FC at ``partial``)."""
    return {"a": ArcFaceHead(num_classes=11, feature_size=4, scale=SCALE, seed=3, sample_ratio=partial),
            "b": ArcFaceHead(num_classes=7, feature_size=4, scale=SCALE, seed=4),
            "c": ArcFaceHead(num_classes=5, feature_size=4, scale=SCALE, seed=5)}


def attach(built, **cfg):
    cross = CrossNegatives({**CFG, **cfg}, built, seed=9)
    for name, head in built.items():
        head.attach_cross_negatives(cross, name)
    return cross


def run(head, x, y, step=0):
    head.train()
    feats = paddle.to_tensor(x.astype(paddle.get_default_dtype()), stop_gradient=False)
    out = head(feats, paddle.to_tensor(y), step)
    out.loss.backward()
    return out, feats.grad.numpy(), head.weight_gradient(out)


def data(seed=1, n=10):
    rng = np.random.RandomState(seed)
    return rng.randn(n, 4), rng.randint(0, 11, size=n)


def test_all_other_classes_as_negatives_with_no_mask(passes, float64):
    built = heads()
    attach(built)
    x, y = data()
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    out, dx, dw = run(built["a"], x, y)
    no_mask = [np.zeros((len(y), 7), bool), np.zeros((len(y), 5), bool)]
    loss, ref_dx, ref_dw, _ = np_cross_head(x, w["a"], y, [w["b"], w["c"]], no_mask, ARC, SCALE)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "own centre gradient")
    assert built["b"].weight.grad is None and built["c"].weight.grad is None  # no gradient to the other heads
    separate = np_cross_head(x, w["a"], y, [], [], ARC, SCALE)[0]
    assert loss > separate  # more negatives, a larger loss


def test_update_both_gives_the_other_heads_rows_the_gradient_of_this_head(passes, float64, tmp_path):
    """``update: both``: the other heads' scored rows get the loss's gradient (masked classes none), settled once
    after the backward: into ``weight.grad`` of a whole-shard head, into a Partial FC head's row gradient; a rate
    of 0.5 gives only the sampled rows a gradient."""
    x, y = data(4)
    path = tmp_path / "same.json"
    path.write_text(json.dumps([{"task_a": "a", "class_a": int(y[0]), "task_b": "b", "class_b": 2}]))
    built = {**heads(), "c": ArcFaceHead(num_classes=5, feature_size=4, scale=SCALE, seed=5, sample_ratio=0.5)}
    cross = attach(built, update="both", mask="pairs", pairs=str(path))
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    out, dx, dw = run(built["a"], x, y)
    removed_b, keep_c = np.zeros((len(y), 7), bool), np.zeros((len(y), 5), bool)
    removed_b[y == y[0], 2] = True
    loss, ref_dx, ref_dw, _, (ref_b, ref_c) = np_cross_head(x, w["a"], y, [w["b"], w["c"]], [removed_b, keep_c],
                                                            ARC, SCALE, with_others=True)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "own centre gradient")
    assert built["b"].weight.grad is None  # nothing reaches the other heads before the step settles
    plan = planned_bytes({**CFG, "update": "both"}, {"a": 11, "b": 7, "c": 5}, len(y), 4, 1, 0)["a"]
    held = sum(int(e.rows.grad.numel()) * e.rows.grad.element_size() for e in cross.received)
    assert plan["their rows' gradient (update: both)"] == held == 12 * 4 * 8  # the memory plan counts the copies
    rows = cross.settle()
    assert_close(built["b"].weight.grad.numpy(), ref_b, 1e-10, "whole-shard head b: weight.grad")
    assert len(rows) == 1 and rows[0].parameter is built["c"].weight  # Partial FC head c: rows to update
    dense = np.zeros_like(w["c"])
    dense[rows[0].index.numpy()] = rows[0].grad.numpy()
    assert_close(dense, ref_c, 1e-10, "Partial FC head c: its rows' gradient")
    assert cross.settle() == []  # settled once


def test_a_strategy_that_rescales_a_task_rescales_what_it_gave_the_other_heads(float64):
    """TaskBalancer.rescale_heads scales task a's head gradients by a factor; what a's loss gave head b's rows is
    scaled with them (``rescale``), what b's own loss gave them is not."""
    built = {k: h for k, h in heads().items() if k != "c"}
    cross = attach(built, update="both")
    x, y = data(6)
    run(built["a"], x, y)
    alone = cross.received[0].rows.grad.numpy().copy()
    cross.rescale("b", 3.0)  # another task's factor: nothing of a's
    cross.rescale("a", 0.25)
    cross.settle()
    assert_close(built["b"].weight.grad.numpy(), 0.25 * alone, 1e-12, "a's contribution to b, rescaled")


def test_update_both_at_a_sampled_rate_merges_with_the_heads_own_rows(passes, float64):
    """At rate 0.5 only the sampled rows of the other heads get a gradient; a Partial FC head's own sampled rows
    and the rows another head's loss gave it become one row gradient over their union, gradients summed."""
    built = {"a": ArcFaceHead(num_classes=11, feature_size=4, scale=SCALE, seed=3),
             "c": ArcFaceHead(num_classes=9, feature_size=4, scale=SCALE, seed=5, sample_ratio=0.4)}
    cross = attach(built, update="both", rate=0.5)
    x, y = data(5)
    yc = np.random.RandomState(6).randint(0, 9, size=6)
    xc = np.random.RandomState(7).randn(6, 4)
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    picked = cross.sources("a", 0)[0].index.numpy()
    run(built["a"], x, y)
    out_c = run(built["c"], xc, yc)[0]
    own = np.sort(built["c"].last_sampled_classes.numpy())
    picked_c = cross.sources("c", 0)[0].index.numpy()
    free = [np.zeros((len(y), len(picked)), bool)]
    _, _, own_a, _, (from_a,) = np_cross_head(x, w["a"], y, [w["c"][picked]], free, ARC, SCALE, with_others=True)
    free = [np.zeros((len(yc), len(picked_c)), bool)]
    _, _, own_c, _, (from_c,) = np_cross_head(xc, w["c"], yc, [w["a"][picked_c]], free, ARC, SCALE, own,
                                              with_others=True)
    step_rows = StepRows()  # as the optimizer takes them: c's own sampled rows, then what the step hook settles
    step_rows.add(out_c.rows)
    step_rows.add(cross.settle())
    rows = step_rows.merged()
    assert len(rows) == 1 and rows[0].parameter is built["c"].weight
    assert np.array_equal(rows[0].index.numpy(), np.union1d(own, picked))
    expected = own_c.copy()
    expected[picked] += from_a
    dense = np.zeros_like(w["c"])
    dense[rows[0].index.numpy()] = rows[0].grad.numpy()
    assert_close(dense, expected, 1e-10, "union of c's sampled rows and the rows a's loss gave it")
    expected = own_a.copy()
    expected[picked_c] += from_c
    assert_close(built["a"].weight.grad.numpy(), expected, 1e-10, "a's weight.grad: its own loss's and c's")


def _shared_pair():
    """Two Partial FC margin heads (11 classes at 0.5, 9 at 0.4) scoring each other's own step rows, update both."""
    built = {"a": ArcFaceHead(num_classes=11, feature_size=4, scale=SCALE, seed=3, sample_ratio=0.5),
             "c": ArcFaceHead(num_classes=9, feature_size=4, scale=SCALE, seed=5, sample_ratio=0.4)}
    return built, attach(built, update="both", rows="shared")


def test_shared_rows_score_the_other_heads_own_sample_and_update_no_other_row(passes, float64):
    """``rows: shared``: a sample of a scores, as negatives, exactly the rows c samples for itself at the step
    (drawn before either forward), and c's merged row update is over its own sample alone; every gradient as the
    numpy reference of the masked softmax over a's sampled rows and c's."""
    built, cross = _shared_pair()
    assert cross.needs_step_samples
    x, y = data(5)
    yc, xc = np.random.RandomState(6).randint(0, 9, size=6), np.random.RandomState(7).randn(6, 4)
    assert cross.sources("a", 0) == []  # c has drawn no sample for step 0: no rows of it yet
    for name, labels in (("a", y), ("c", yc)):
        built[name].train()
        built[name].prepare_step(0, labels, 1)  # what the joint model does first when a hook needs the samples
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    picked_c, picked_a = cross.sources("a", 0)[0].index.numpy(), cross.sources("c", 0)[0].index.numpy()
    out_a, dx, dw_a = run(built["a"], x, y)
    out_c = run(built["c"], xc, yc)[0]
    own_a, own_c = (np.sort(built[k].last_sampled_classes.numpy()) for k in ("a", "c"))
    assert np.array_equal(picked_c, own_c) and np.array_equal(picked_a, own_a)  # each other's own samples
    assert set(yc) <= set(own_c) and len(own_c) == 4  # c's positives are negatives of a's samples
    free = [np.zeros((len(y), len(own_c)), bool)]
    loss, ref_dx, ref_a, _, (from_a,) = np_cross_head(x, w["a"], y, [w["c"][own_c]], free, ARC, SCALE, own_a,
                                                      with_others=True)
    assert abs(float(out_a.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    free = [np.zeros((len(yc), len(own_a)), bool)]
    ref_c, (from_c,) = (lambda r: (r[2], r[4]))(np_cross_head(xc, w["c"], yc, [w["a"][own_a]], free, ARC, SCALE,
                                                              own_c, with_others=True))
    held = {e.rows.source: int(e.rows.grad.numel()) * e.rows.grad.element_size() for e in cross.received}
    # the memory plan bounds the other head's sample (a global row beyond it: a positive its ratio did not cover)
    plan = planned_bytes({**CFG, "update": "both", "rows": "shared"}, {"a": 11, "c": 9}, 1, 4, 1, 0,
                         {"a": 0.5, "c": 0.4})
    for task, other_classes in (("a", 9), ("c", 11)):
        bound = plan[task]["their rows' gradient (update: both)"]
        assert held[task] <= bound < other_classes * 4 * 8, (task, held[task], bound)
    step_rows = StepRows()
    step_rows.add(out_a.rows + out_c.rows)
    step_rows.add(cross.settle())
    merged = {r.parameter.name: r for r in step_rows.merged()}
    for name, own, ref, other in (("a", own_a, ref_a, from_c), ("c", own_c, ref_c, from_a)):
        rows = merged[built[name].weight.name]
        assert np.array_equal(rows.index.numpy(), own)  # no row beyond the head's own sample
        expected = ref.copy()
        expected[own] += other
        dense = np.zeros_like(w[name])
        dense[own] = rows.grad.numpy()
        assert_close(dense, expected, 1e-10, f"{name}'s rows: its own loss's gradient and the other head's")


def test_shared_rows_of_a_head_without_partial_fc_are_all_its_rows(float64):
    """``rows: shared`` with whole-shard heads scores every row, as ``rows: drawn`` at rate 1.0: the same loss."""
    x, y = data(8)
    losses = []
    for rows in ("drawn", "shared"):
        built = heads()
        attach(built, rows=rows)
        for head in built.values():
            head.train()
            head.prepare_step(0, y % head.num_classes, 1)
        losses.append(float(run(built["a"], x, y)[0].loss))
    assert losses[0] == losses[1]


def test_shared_rows_of_a_head_absent_from_the_step_are_none(float64):
    """A head whose task has no samples in the step drew no sample of its own: the other head's samples score none
    of its rows that step (the loss of the separate head), and the rows it drew at an earlier step are not used."""
    built, cross = _shared_pair()
    x, y = data(5)
    built["c"].train()
    built["c"].prepare_step(0, np.array([1, 2]), 1)  # c took part in step 0, not in step 1
    built["a"].train()
    built["a"].prepare_step(1, y, 1)
    assert cross.sources("a", 1) == [] and len(cross.sources("a", 0)) == 1
    w = built["a"].weight.numpy().copy()
    out = run(built["a"], x, y, step=1)[0]
    own = np.sort(built["a"].last_sampled_classes.numpy())
    loss = np_cross_head(x, w, y, [], [], ARC, SCALE, own)[0]
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)


@pytest.mark.parametrize("sets, key, words", [
    (["cross_negatives.rate=0.1"], "cross_negatives.rate", "rows: shared scores every row.*rate must be 1.0, got 0.1"),
    (["cross_negatives.rate=1.0", "schedule.mode=sample", "schedule.batch_size=8"], "cross_negatives.rows",
     "with schedule.mode: sample a step holds one task"),
])
def test_shared_rows_are_refused_at_load_time_where_they_cannot_work(sets, key, words):
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=words) as info:
        load_job(equivalence.JOB, ["cross_negatives.rows=shared", *sets])
    assert info.value.key == key


def test_same_person_pairs_leave_the_softmax(passes, float64, tmp_path):
    x, y = data(2)
    pairs = [{"task_a": "a", "class_a": int(y[0]), "task_b": "b", "class_b": 3},
             {"task_a": "c", "class_a": 1, "task_b": "a", "class_b": int(y[1])},
             {"task_a": "a", "class_a": int(y[2]), "task_b": "b", "class_b": 0}]
    path = tmp_path / "same.json"
    path.write_text(json.dumps(pairs))
    built = heads()
    attach(built, mask="pairs", pairs=str(path))
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    out, dx, dw = run(built["a"], x, y)
    removed_b, removed_c = np.zeros((len(y), 7), bool), np.zeros((len(y), 5), bool)
    removed_b[y == y[0], 3] = True
    removed_c[y == y[1], 1] = True
    removed_b[y == y[2], 0] = True
    loss, ref_dx, ref_dw, _ = np_cross_head(x, w["a"], y, [w["b"], w["c"]], [removed_b, removed_c], ARC, SCALE)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "own centre gradient")
    unmasked = np_cross_head(x, w["a"], y, [w["b"], w["c"]], [removed_b & False, removed_c & False], ARC, SCALE)[0]
    assert loss < unmasked


def test_a_sampled_rate_and_partial_fc_on_the_own_head(passes, float64):
    built = heads(partial=0.5)
    cross = attach(built, rate=0.5)
    x, y = data(3)
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    sources = cross.sources("a", 0)
    picked = [s.index.numpy() for s in sources]
    assert [len(p) for p in picked] == [4, 3] and all(np.all(np.diff(p) > 0) for p in picked)  # ceil(0.5 C)
    out, dx, dw = run(built["a"], x, y)
    own = np.sort(built["a"].last_sampled_classes.numpy())
    assert set(y) <= set(own) and len(own) == 6  # every positive kept, ceil(0.5 * 11) in all
    no_mask = [np.zeros((len(y), 4), bool), np.zeros((len(y), 3), bool)]
    loss, ref_dx, ref_dw, _ = np_cross_head(x, w["a"], y, [w["b"][picked[0]], w["c"][picked[1]]], no_mask, ARC,
                                            SCALE, own)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "own centre gradient (sampled rows)")
    again = [s.index.numpy() for s in cross.sources("a", 0)]
    assert all(np.array_equal(p, q) for p, q in zip(picked, again))  # from (seed, step, tasks) alone
    assert not all(np.array_equal(p, q) for p, q in zip(picked, [s.index.numpy() for s in cross.sources("a", 1)]))


def test_the_online_rule_removes_what_is_as_close_as_the_own_class(passes, float64):
    built = heads()
    cross = attach(built, mask="online")
    cross.set_state_dict({"mean": 0.3, "var": 0.01})
    tau = 0.3 + normal_quantile(0.05) * 0.1
    assert tau == pytest.approx(0.3 - 1.6448536 * 0.1, abs=1e-7) and cross.threshold() == max(tau, 0.2)
    x, y = data(4)
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    xh = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos_b = xh @ (w["b"] / np.linalg.norm(w["b"], axis=1, keepdims=True)).T
    cos_c = xh @ (w["c"] / np.linalg.norm(w["c"], axis=1, keepdims=True)).T
    limit = cross.threshold()
    removed = [cos_b * SCALE > SCALE * limit, cos_c * SCALE > SCALE * limit]
    assert 3 <= sum(r.sum() for r in removed) <= 60  # the case removes something, not everything
    out, dx, dw = run(built["a"], x, y)
    loss, ref_dx, ref_dw, c = np_cross_head(x, w["a"], y, [w["b"], w["c"]], removed, ARC, SCALE)
    assert abs(float(out.loss) - loss) <= 1e-12 * abs(loss)
    assert_close(dx, ref_dx, 1e-10, "feature gradient")
    assert_close(dw, ref_dw, 1e-10, "own centre gradient")
    own_cos = c[np.arange(len(y)), y]
    mean = 0.9 * 0.3 + 0.1 * own_cos.mean()
    assert cross.state["mean"] == pytest.approx(mean, rel=1e-9)  # the batch's target cosines entered the average
    counted = sum(cross.state["removed"]["a"].values())
    assert counted == sum(r.sum() for r in removed)
    assert float(out.metrics["accuracy"]) == pytest.approx(np.mean(c[:, :11].argmax(axis=1) == y))  # own classes


def test_the_estimated_pairs_are_mutual_and_removed_for_most_samples():
    seen = {"a": {0: 10, 1: 10, 2: 4}, "b": {5: 8, 6: 8}}
    removed = {"a": {"0 b 5": 9, "0 b 6": 2, "1 b 6": 4, "2 b 6": 3},
               "b": {"5 a 0": 7, "6 a 2": 5, "6 a 1": 1}}
    pairs = estimated_pairs(removed, seen)
    # a0-b5: 0.9 and 0.875, mutual; a1-b6: 0.4 < 0.5; a2-b6: 0.75 and 0.625, mutual
    assert [(p["class_a"], p["class_b"]) for p in pairs] == [(0, 5), (2, 6)]
    assert pairs[0]["similarity"] == 0.875 and set(pairs[0]) == {"task_a", "class_a", "task_b", "class_b",
                                                                 "similarity"}


def test_before_the_warmup_the_heads_are_separate(float64):
    built = heads()
    attach(built, warmup=5)
    x, y = data(5)
    w = {k: h.weight.numpy().copy() for k, h in built.items()}
    out, _, _ = run(built["a"], x, y, step=4)
    separate = np_cross_head(x, w["a"], y, [], [], ARC, SCALE)[0]
    assert abs(float(out.loss) - separate) <= 1e-12 * abs(separate)


# ---- training: 1 vs 2 processes (a pair's classes on different ranks), stopped and resumed ---------------------
# arc7's class 1 lives on rank 0 of 2 (classes [0, 4)), cos5's class 4 on rank 1 ([3, 5)); arc7's 5 and arc1's 0
# on ranks 1 and 0
PAIRS = [{"task_a": "arc7", "class_a": 1, "task_b": "cos5", "class_b": 4},
         {"task_a": "arc1", "class_a": 0, "task_b": "arc7", "class_b": 5}]
CROSS = ["cross_negatives.rate=1.0", "cross_negatives.mask=pairs", "cross_negatives.warmup=3",
         "cross_negatives.update=own"]  # the memory bank here; update: both in the run after


def _pairs_argv(folder):
    path = folder.parent / f"{folder.name}_pairs.json"
    path.write_text(json.dumps(PAIRS))
    return equivalence.argv(str(folder), equivalence.JOINT + CROSS + [f"cross_negatives.pairs={path}"])


@one_process_run("cross_pairs")
def _one_cross(folder):
    return _pairs_argv(folder), str(folder)


@two_process_run("cross_pairs")
def _two_cross(folder):
    return {"train": _pairs_argv(folder)}, str(folder)


BOTH = ["cross_negatives.rate=0.5", "cross_negatives.mask=none", "cross_negatives.update=both",
        "cross_negatives.warmup=3", "tasks.0.head.sample_ratio=0.5"]  # arc7 with Partial FC, arc1 and cos5 whole


@one_process_run("cross_both")
def _one_both(folder):
    return equivalence.argv(str(folder), equivalence.JOINT + BOTH), str(folder)


@one_process_run("cross_bank")
def _one_bank(folder):  # the same run, the other heads' rows as a memory bank
    return equivalence.argv(str(folder), equivalence.JOINT + BOTH + ["cross_negatives.update=own"]), str(folder)


@two_process_run("cross_both")
def _two_both(folder):
    return {"train": equivalence.argv(str(folder), equivalence.JOINT + BOTH)}, str(folder)


SHARED = ["cross_negatives.rate=1.0", "cross_negatives.rows=shared", "cross_negatives.mask=none",
          "cross_negatives.update=both", "cross_negatives.warmup=3", "tasks.0.head.sample_ratio=0.5",
          "tasks.2.head.sample_ratio=0.6"]  # arc7 and cos5 with Partial FC, each scoring the other's own sample


@one_process_run("cross_shared")
def _one_shared(folder):
    return equivalence.argv(str(folder), equivalence.JOINT + SHARED), str(folder)


@two_process_run("cross_shared")
def _two_shared(folder):
    return {"train": equivalence.argv(str(folder), equivalence.JOINT + SHARED)}, str(folder)


@one_process_run("cross_shared_off")
def _one_shared_off(folder):  # the same Partial FC heads, no cross-head negatives
    return equivalence.argv(str(folder), equivalence.JOINT + SHARED + ["cross_negatives.rate=0.0"]), str(folder)


def step_records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def agreeing_records(one, two):
    """The 1-process run's step records, after checking that the 2-process run's match them (every step; losses and
    the gradient norm within 1e-4 relative)."""
    a, b = step_records(one), step_records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, equivalence.STEPS + 1))
    worst = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8) for ra, rb in zip(a, b) for k in ra
                if k.startswith("loss") or k == "grad_norm")
    assert worst <= 1e-4, worst
    return a


@pytest.mark.distributed
@pytest.mark.two_process_runs("cross_pairs")
def test_one_and_two_processes_agree_with_a_pair_across_ranks(one_process, two_process):
    a = agreeing_records(one_process["cross_pairs"], two_process["cross_pairs"])
    separate = step_records(one_process["equivalence_joint"])
    assert any(abs(r["loss/arc7"] - s["loss/arc7"]) > 1e-3 for r, s in zip(a[3:], separate[3:]))  # it took part
    assert all(r["loss/arc7"] == s["loss/arc7"] for r, s in zip(a[:3], separate[:3]))  # separate in the warm-up


@pytest.mark.distributed
@pytest.mark.two_process_runs("cross_both")
def test_update_both_one_and_two_processes_agree(one_process, two_process):
    """``update: both`` with a sampled rate and a Partial FC head: the other heads' rows learn on the rank that
    holds them; 1 and 2 processes agree step for step, and the heads' losses differ from the memory-bank run."""
    a = agreeing_records(one_process["cross_both"], two_process["cross_both"])
    bank = step_records(one_process["cross_bank"])
    assert all(r["loss/cos5"] == s["loss/cos5"] for r, s in zip(a[:4], bank[:4]))  # the warm-up, then one step
    assert any(abs(r["loss/cos5"] - s["loss/cos5"]) > 1e-4 for r, s in zip(a[5:], bank[5:]))  # rows learnt more


@pytest.mark.distributed
@pytest.mark.two_process_runs("cross_shared")
def test_shared_rows_one_and_two_processes_agree(one_process, two_process):
    """``rows: shared`` under Partial FC on two heads: each head's sample is drawn before either forward from the
    labels of every rank; 1 and 2 processes agree step for step, and after the warm-up the run differs from the
    same heads without cross-head negatives."""
    a = agreeing_records(one_process["cross_shared"], two_process["cross_shared"])
    separate = step_records(one_process["cross_shared_off"])  # the same heads, separate
    assert all(r["loss/arc7"] == s["loss/arc7"] for r, s in zip(a[:3], separate[:3]))  # the warm-up
    assert any(abs(r["loss/arc7"] - s["loss/arc7"]) > 1e-4 for r, s in zip(a[3:], separate[3:]))  # it took part


@pytest.mark.slow
def test_a_stopped_and_resumed_online_run_is_bit_identical(tmp_path):
    """The online rule's threshold statistics are in the checkpoint: stopped after step 8 and resumed, the run
    equals an uninterrupted one, loss for loss."""
    online = equivalence.JOINT + ["cross_negatives.rate=0.5", "cross_negatives.mask=online",
                                  "cross_negatives.warmup=4"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    train_here(*equivalence.argv(full, online))
    train_here(*equivalence.argv(cut, online), "--until", "8")
    train_here(*equivalence.argv(cut, online), "--resume")
    a, b = step_records(full), step_records(cut)
    assert [r["step"] for r in b] == list(range(1, equivalence.STEPS + 1))
    assert all(ra[k] == rb[k] for ra, rb in zip(a, b) for k in ra if k.startswith("loss")), "not bit-identical"
    state = json.load(open(os.path.join(full, "checkpoints", "step_20", "state.json")))["cross_negatives"]
    assert state["mean"] is not None and state["var"] >= 0
    assert os.path.isfile(os.path.join(full, "same_person.json"))


@pytest.mark.parametrize("content, words", [
    (None, "do not exist"),
    ("{not json", "cannot be read as JSON"),
    ('{"task_a": "arc7"}', "expected a list of pairs"),
    ('[{"task_a": "arc7", "class_a": -1, "task_b": "cos5", "class_b": 4}]', "entry 0: expected"),
    ('[{"task_a": "arc7", "class_a": 1}]', "entry 0: expected"),
])
def test_a_bad_same_person_file_is_refused_at_load_time_naming_the_key(tmp_path, content, words):
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError

    path = tmp_path / "pairs.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=words) as info:
        load_job(equivalence.JOB, ["cross_negatives.rate=1.0", "cross_negatives.mask=pairs",
                                   f"cross_negatives.pairs={path}"])
    assert info.value.key == "cross_negatives.pairs" and str(path) in str(info.value)


# ---- under an architecture: one embedding needed --------------------------------------------------------------
def _arch_job(architecture, backbone, cross=None):
    """Two ArcFace heads (7 and 5 classes) on synthetic images with ``architecture``; ``cross``: the section."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    tasks = [{"name": n, "reader": {"type": "synthetic", "num_samples": 30, "num_classes": c, "seed": s},
              "head": {"type": "arcface", "scale": SCALE, "margin": list(ARC)}, "eval": None}
             for n, c, s in (("arc7", 7, 1), ("arc5", 5, 2))]
    raw = {"seed": 3, "device": "cpu", "output_dir": "unused", "architecture": architecture, "tasks": tasks,
           "backbone": backbone, "schedule": {"batch_size": 12}, "log": {"progress": False},
           "cross_negatives": cross or {"rate": 1.0, "mask": "none", "warmup": 0, "update": "own"}}
    return build_job(load_job(data=raw), announce_plan=False)


MLP_BN = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "batch_norm": True, "embedding_size": 8}
CNN = {"type": "cnn", "channels": [4, 8], "embedding_size": 8}


@pytest.mark.parametrize("architecture, backbone, accepted", [
    ({"type": "hard"}, MLP_BN, True), ({"type": "task_norm"}, MLP_BN, True), ({"type": "adapters"}, CNN, True),
    ({"type": "hard", "bottom": [6]}, MLP_BN, True), ({"type": "hard", "tower": [6]}, MLP_BN, False),
    ({"type": "task_norm", "tower": [6]}, MLP_BN, False), ({"type": "adapters", "tower": [6]}, CNN, False),
    ({"type": "mmoe", "experts": 2, "expert_layers": [6]}, MLP_BN, False),
    ({"type": "cross_stitch", "layers": [6]}, MLP_BN, False)])
def test_cross_negatives_need_every_task_in_one_embedding(architecture, backbone, accepted):
    """Shared weights with task BatchNorms or adapters (no towers) give one embedding: accepted; towers, experts
    and stitch columns give each task coordinates of its own: refused before training, naming the key."""
    from mtl.core.errors import ConfigError

    if accepted:
        job = _arch_job(architecture, backbone)
        assert [type(h) for h in job.model.step_hooks] == [CrossNegatives] and job.model.architecture.one_embedding
        return
    with pytest.raises(ConfigError, match="cross_negatives.rate") as error:
        _arch_job(architecture, backbone)
    assert error.value.key == "cross_negatives.rate" and "gives each task its own" in str(error.value)


def test_under_task_norm_a_sample_is_scored_through_its_own_norm_against_the_other_heads_centres():
    """task_norm + cross-head negatives, first step: arc7's loss is the numpy masked softmax of arc7's rows
    embedded with arc7's BatchNorm (batch statistics of its rows only) against its own and arc5's centres."""
    from mtl.data.steps import collate

    job = _arch_job({"type": "task_norm"}, MLP_BN)
    norms = job.model.backbone.layers[1].by_task
    for i, norm in enumerate(norms):  # distinct affine per task, so that a mix-up shows
        norm.weight.set_value(np.linspace(0.5, 1.5, 16, dtype=np.float32) * (i + 1))
        norm.bias.set_value(np.full(16, 0.2 * i - 0.1, np.float32))
    batch = {t.name: {k: paddle.to_tensor(v) for k, v in collate([t.reader[i] for i in range(6)]).items()}
             for t in job.tasks}
    job.model.train()
    job.model.prepare_step(batch, 0, 1)
    outputs = job.model.forward(batch, step=0).outputs
    layers = job.model.backbone.layers
    heads = {t.name: t.head.weight.numpy().astype(np.float64) for t in job.tasks}
    f64 = lambda p: p.numpy().astype(np.float64)  # noqa: E731
    for i, (task, other) in enumerate((("arc7", "arc5"), ("arc5", "arc7"))):
        x = batch[task]["image"].numpy().reshape(6, -1).astype(np.float64)
        h = x @ f64(layers[0].weight) + f64(layers[0].bias)
        h = f64(norms[i].weight) * (h - h.mean(0)) / np.sqrt(h.var(0) + norms[i]._epsilon) + f64(norms[i].bias)
        feats = np.maximum(h, 0.0) @ f64(layers[3].weight) + f64(layers[3].bias)
        labels = batch[task]["label"].numpy()
        loss = np_cross_head(feats, heads[task], labels, [heads[other]], [np.zeros((6, len(heads[other])), bool)],
                             ARC, SCALE)[0]
        assert abs(float(outputs[task].loss) - loss) <= 1e-5 * abs(loss), task
        separate = np_cross_head(feats, heads[task], labels, [], [], ARC, SCALE)[0]
        assert loss - separate > 5e-5 * loss, task  # beyond the tolerance: the other head's centres are in it
