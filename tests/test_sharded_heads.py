"""Two processes (gloo) against one: the sharded heads must give the single-process loss and gradients.

One run of ``tests/dist_scripts/sharded_heads.py`` (in the session's one launch of 2-process runs,
tests/shared_runs.py) runs every case; each case here reruns the same head in this process on the whole global batch
(world 1, the reference) and compares.
"""
import os

import numpy as np
import paddle
import pytest

from mtl.core import registry
from mtl.parallel import distributed
from tests.references.margin import np_margin_head
from tests.sharded_heads_run import script

WORLD = 2
MEASURED = {}  # what -> (max abs difference, max relative difference), printed at the end with -s


@pytest.fixture(scope="module")
def ranks(two_process):
    """Per-rank arrays of the distributed run."""
    out_dir = two_process["sharded_heads"]
    yield [dict(np.load(os.path.join(out_dir, f"rank{k}.npz"))) for k in range(WORLD)]
    print("\nlargest differences, 2 ranks vs 1 process (abs, rel):")
    for what, (err, rel) in sorted(MEASURED.items()):
        print(f"  {what}: {err:.2e} {rel:.2e}")


def single_process(name):
    """The same head at world 1 on the whole batch: loss, gradients, init, metrics, eval predictions."""
    cfg, _ = script.CASES[name]
    registry.load_builtin()
    head = registry.build("head", cfg, feature_size=script.FEATURE_SIZE)
    features, labels, evaluation = script.global_batch(cfg["num_classes"])
    ref = {"weight_init": head.weight.numpy().copy()}
    feats = paddle.to_tensor(features, stop_gradient=False)
    out = head(feats, paddle.to_tensor(labels))
    out.loss.backward()
    ref.update(loss=out.loss.numpy(), feature_grad=feats.grad.numpy(), weight_grad=head.weight.grad.numpy())
    ref.update({f"metric_{k}": v.numpy() for k, v in out.metrics.items()})
    softmax = cfg["type"] == "softmax"
    if softmax:
        ref["bias_grad"] = head.bias.grad.numpy()
    ref["eval_topk"] = head.predict_topk(evaluation, head.topk if softmax else 1)
    return ref


def close(name, what, actual, expected, rtol=1e-5, atol=1e-7):
    diff = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    err = float(diff.max()) if diff.size else 0.0
    rel = float(np.max(diff / (np.abs(expected) + atol))) if diff.size else 0.0
    MEASURED[f"{name} {what}"] = (err, rel)
    assert np.allclose(actual, expected, rtol=rtol, atol=atol), (
        f"{name}: {what} differs: max abs {err:.3e}, max rel {rel:.3e}")


FULL_CASES = [name for name in script.CASES if not name.startswith("partial")]


@pytest.mark.distributed
@pytest.mark.two_process_runs("sharded_heads")
@pytest.mark.parametrize("name", FULL_CASES)
def test_two_ranks_match_one_process(ranks, name):
    ref = single_process(name)
    cfg, split = script.CASES[name]
    key = lambda what: f"{name}/{what}"  # noqa: E731
    for k in range(WORLD):
        start, count = distributed.shard_range(cfg["num_classes"], WORLD, k)
        expected_params = count * script.FEATURE_SIZE + (count if cfg["type"] == "softmax" else 0)
        assert ranks[k][key("weight_init")].shape == (count, script.FEATURE_SIZE)
        assert int(ranks[k][key("param_count")]) == expected_params
        close(name, f"loss rank {k}", ranks[k][key("loss")], ref["loss"])
        for metric in (m for m in ref if m.startswith("metric_")):
            assert float(ranks[k][key(metric)]) == float(ref[metric]), f"{name}: {metric} on rank {k}"
        assert np.array_equal(ranks[k][key("eval_topk")], ref["eval_topk"]), f"{name}: eval predictions"
    assert np.array_equal(np.concatenate([r[key("weight_init")] for r in ranks]), ref["weight_init"])
    close(name, "feature grad", np.concatenate([r[key("feature_grad")] for r in ranks]), ref["feature_grad"])
    close(name, "weight grad", np.concatenate([r[key("weight_grad")] for r in ranks]), ref["weight_grad"])
    if "bias_grad" in ref:
        close(name, "bias grad", np.concatenate([r[key("bias_grad")] for r in ranks]), ref["bias_grad"])
    rows = [script.split_rows(split, k) for k in range(WORLD)]
    assert [ranks[k][key("feature_grad")].shape[0] for k in range(WORLD)] == [e - b for b, e in rows]


@pytest.mark.distributed
@pytest.mark.two_process_runs("sharded_heads")
def test_two_ranks_partial_fc_equals_margin_loss_over_the_union_of_samples(ranks):
    """Each rank samples its own classes; the loss is the full margin loss restricted to the union of samples."""
    name = "partial_fc9"
    cfg, _ = script.CASES[name]
    features, labels, _ = script.global_batch(cfg["num_classes"])
    init = np.concatenate([r[f"{name}/weight_init"] for r in ranks]).astype(np.float64)
    sampled = np.concatenate([r[f"{name}/sampled"] for r in ranks])
    for k in range(WORLD):
        start, count = distributed.shard_range(cfg["num_classes"], WORLD, k)
        mine = ranks[k][f"{name}/sampled"]
        owned = set(int(c) for c in labels if start <= c < start + count)
        assert owned <= set(mine.tolist()) and len(mine) == max(int(np.ceil(0.5 * count)), len(owned))
        grad = ranks[k][f"{name}/weight_grad"]
        untouched = np.setdiff1d(np.arange(start, start + count), mine) - start
        assert np.all(grad[untouched] == 0.0)
    loss, dx, dw, cos = np_margin_head(features.astype(np.float64), init[sampled], np.searchsorted(sampled, labels),
                                       (1.0, 0.5, 0.0), cfg["scale"])
    accuracy = np.mean(sampled[cos.argmax(axis=1)] == labels)  # top-1 over the union of samples (votes of 2 ranks)
    for k in range(WORLD):
        close(name, f"loss rank {k}", ranks[k][f"{name}/loss"], loss)
        assert float(ranks[k][f"{name}/metric_accuracy"]) == accuracy
    close(name, "feature grad", np.concatenate([r[f"{name}/feature_grad"] for r in ranks]), dx, rtol=1e-4, atol=1e-6)
    full_grad = np.concatenate([r[f"{name}/weight_grad"] for r in ranks])
    close(name, "weight grad", full_grad[sampled], dw, rtol=1e-4, atol=1e-6)
