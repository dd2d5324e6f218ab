"""1 process vs 2 processes (paddle.distributed.launch, gloo): same per-step losses, same final weights.

The 2-process runs come from the session's one launch, the 1-process runs train in this process
(tests/shared_runs.py); the joint-mode runs are shared with tests/test_reshard.py and
tests/test_reliability_multinode.py (tests/equivalence.py)."""
import json
import os

import numpy as np
import pytest

from mtl.core.safe_pickle import load_paddle_file
from mtl.store.layout import merged_head_state
from tests import equivalence
from tests.shared_runs import train_here

pytestmark = pytest.mark.distributed

SHARDED = {"arc7": 7, "arc1": 1, "cos5": 5, "soft3": 3}


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def final_weights(out, averaged=False):
    """Backbone and every head's full weight (shards concatenated) from the final checkpoint."""
    ckpt = os.path.join(out, "checkpoints", "step_20")
    name = "backbone.averaged.pdparams" if averaged else "backbone.pdparams"
    state = {f"backbone.{k}": v for k, v in load_paddle_file(os.path.join(ckpt, name)).items()}
    for task in list(SHARDED) + ["reg"]:
        for k, v in merged_head_state(ckpt, task, averaged).items():
            state[f"{task}.{k}"] = v
    return state


@pytest.mark.parametrize("mode", [pytest.param("joint", marks=pytest.mark.two_process_runs("equivalence_joint")),
                                  pytest.param("sample", marks=pytest.mark.two_process_runs("equivalence_sample"))])
def test_one_and_two_processes_agree(one_process, two_process, tmp_path, mode):
    # joint mode also clips gradients: the global norm must include every rank's shard exactly once
    if mode == "joint":
        one = one_process["equivalence_joint"]
    else:
        one = str(tmp_path / "one")
        train_here(*equivalence.argv(one, equivalence.SAMPLE))
    two = two_process[f"equivalence_{mode}"]
    a, b = losses(one), losses(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 21))
    worst = 0.0
    tasks_seen = set()
    for ra, rb in zip(a, b):
        keys = {k for k in ra if k.startswith("loss/")}
        assert keys == {k for k in rb if k.startswith("loss/")}, (ra["step"], keys)
        tasks_seen |= keys
        for k in keys | {"loss"} | ({"grad_norm"} if mode == "joint" else set()):
            assert np.isfinite(ra[k]) and np.isfinite(rb[k]), (ra["step"], k, ra[k], rb[k])
            worst = max(worst, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8))
    assert worst <= 1e-4, f"largest relative loss difference {worst:.3g}"
    assert len(tasks_seen) == 5
    for averaged in (False, True):
        wa, wb = final_weights(one, averaged), final_weights(two, averaged)
        assert wa.keys() == wb.keys()
        for k in wa:
            np.testing.assert_allclose(wb[k], wa[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} averaged={averaged}")
    # each rank holds only its shard: C_k rows
    ckpt = os.path.join(two, "checkpoints", "step_20", "heads")
    for task, classes in SHARDED.items():
        for k in range(2):
            shard = load_paddle_file(os.path.join(ckpt, f"{task}.shard{k}of2.pdparams"))
            assert shard["weight"].shape[0] == classes // 2 + (k < classes % 2), (task, k)
    s2 = json.load(open(os.path.join(two, "summary.json")))
    s1 = json.load(open(os.path.join(one, "summary.json")))
    assert s2["world_size"] == 2 and s1["world_size"] == 1
    for task, info in s1["tasks"].items():
        for metric, value in (info["eval"] or {}).items():
            assert s2["tasks"][task]["eval"][metric] == pytest.approx(value, rel=1e-3, abs=1e-3), (task, metric)
