"""Run the sharded classification heads under ``paddle.distributed.launch`` and save every rank's results.

Usage: ``python -m paddle.distributed.launch --nproc_per_node 2 sharded_heads.py OUT_DIR``. Each case builds a head,
feeds this rank's contiguous slice of a fixed global batch, runs forward and backward, and records the loss,
metrics, the gradient of its feature rows, the initial shard, the shard gradient and eval predictions into
``OUT_DIR/rank{k}.npz``. ``tests/sharded_heads_run.py`` loads ``CASES``, ``global_batch`` and ``split_rows``
from this file for the tests to rerun the same heads in one process on the whole batch.
"""
import os
import sys

import numpy as np

FEATURE_SIZE = 6
GLOBAL_BATCH = 8
EVAL_ROWS = 20

# name -> (head config, row split of the global batch over 2 ranks: "half" = 4 + 4, "uneven" = 3 + 5)
CASES = {
    "arcface7": ({"type": "arcface", "num_classes": 7, "scale": 16.0, "seed": 1}, "half"),
    "arcface1": ({"type": "arcface", "num_classes": 1, "scale": 16.0}, "half"),
    "sphere7": ({"type": "arcface", "num_classes": 7, "margin": [2.0, 0.3, 0.1], "scale": 8.0}, "half"),
    "cosface6": ({"type": "cosface", "num_classes": 6, "seed": 2}, "half"),
    "softmax5": ({"type": "softmax", "num_classes": 5, "topk": 3, "seed": 3}, "half"),
    "arcface7_uneven": ({"type": "arcface", "num_classes": 7, "scale": 16.0, "seed": 1}, "uneven"),
    "partial_fc9": ({"type": "arcface", "num_classes": 9, "scale": 16.0, "sample_ratio": 0.5}, "half"),
    # as the joint model runs them: no exchange of row counts (Head.equal_rows)
    "arcface7_equal_rows": ({"type": "arcface", "num_classes": 7, "scale": 16.0, "seed": 1}, "half"),
    "softmax5_equal_rows": ({"type": "softmax", "num_classes": 5, "topk": 3, "seed": 3}, "half"),
    # inter-class filtering (tests/test_interclass_filtering.py): classes 2 ~ 6 are one person, on different ranks
    "filter7_pairs": ({"type": "arcface", "num_classes": 7, "scale": 16.0, "seed": 1,
                       "interclass_filtering_threshold": 0.3, "same_person": {
                           "pairs": [{"task_a": "a", "class_a": 2, "task_b": "b", "class_b": 2}],
                           "offsets": {"a": 0, "b": 4}}}, "half"),
    "partial_fc10_filter_remove": ({"type": "arcface", "num_classes": 10, "scale": 16.0, "sample_ratio": 0.5,
                                    "interclass_filtering_threshold": 0.3, "interclass_filtering_mode": "remove",
                                    "same_person": {"pairs": [{"task_a": "a", "class_a": 1, "task_b": "b",
                                                               "class_b": 1}], "offsets": {"a": 0, "b": 5}}},
                                   "half"),
}


def global_batch(num_classes):
    """Fixed features [8, D], labels [8] and evaluation features [EVAL_ROWS, D] of a case."""
    rng = np.random.RandomState(100 + num_classes)
    features = rng.randn(GLOBAL_BATCH, FEATURE_SIZE).astype(np.float32)
    labels = rng.randint(0, num_classes, size=GLOBAL_BATCH).astype(np.int64)
    evaluation = rng.randn(EVAL_ROWS, FEATURE_SIZE).astype(np.float32)
    return features, labels, evaluation


def split_rows(split, rank):
    """Row range of ``rank`` (of 2) in the global batch."""
    bounds = {"half": [0, 4, 8], "uneven": [0, 3, 8]}[split]
    return bounds[rank], bounds[rank + 1]


def run_case(name, registry, paddle, rank):
    """Forward and backward of one case on this rank's rows; return arrays keyed ``name/what``."""
    cfg, split = CASES[name]
    head = registry.build("head", cfg, feature_size=FEATURE_SIZE)
    head.equal_rows = name.endswith("_equal_rows")
    features, labels, evaluation = global_batch(cfg["num_classes"])
    begin, end = split_rows(split, rank)
    out = {"weight_init": head.weight.numpy().copy(), "param_count": np.array(sum(p.size for p in head.parameters()))}
    feats = paddle.to_tensor(features[begin:end], stop_gradient=False)
    labels_t = paddle.to_tensor(labels[begin:end])
    result = head(feats, labels_t, 0) if head.uses_step else head(feats, labels_t)
    result.loss.backward()
    softmax = cfg["type"] == "softmax"  # else a margin head (arcface, cosface)
    weight_grad = head.weight.grad.numpy() if softmax else head.weight_gradient(result)
    out.update(loss=result.loss.numpy(), feature_grad=feats.grad.numpy(), weight_grad=weight_grad)
    out.update({f"metric_{k}": v.numpy() for k, v in result.metrics.items()})
    if softmax:
        out["bias_grad"] = head.bias.grad.numpy()
    if cfg.get("sample_ratio", 1.0) < 1.0:  # Partial FC
        out["sampled"] = head.last_sampled_classes.numpy()
    out["eval_topk"] = head.predict_topk(evaluation, head.topk if softmax else 1)
    return {f"{name}/{k}": v for k, v in out.items()}


def main(out_dir):
    import paddle
    import paddle.distributed as dist

    from mtl.core import registry

    dist.init_parallel_env()
    registry.load_builtin()
    rank = dist.get_rank()
    arrays = {}
    for name in CASES:
        arrays.update(run_case(name, registry, paddle, rank))
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **arrays)
    print(f"rank {rank} saved {len(arrays)} arrays", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
