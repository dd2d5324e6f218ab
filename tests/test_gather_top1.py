"""The one-collective batch gather and the top-1 settled inside the softmax's all-reduces (fewer
collectives per step), against numpy: ids travel exactly as float columns, two ranks gather what one process holds,
and the vote gives the global argmax with ties to the lower rank, as ``sharded_top1`` decides. The 2-rank runs that
succeed are in the session's one launch of 2-process runs (tests/shared_runs.py); the one that must fail is a launch
of its own."""
import importlib.util
import os

import numpy as np
import paddle
import pytest

from mtl.parallel import collective, topk
from tests.dist_util import run_distributed
from tests.shared_runs import two_process_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "dist_scripts", "gather_top1.py")
spec = importlib.util.spec_from_file_location("gather_top1_script", SCRIPT)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ids_round_trip_exactly_through_float_columns(dtype):
    ids = np.array([0, 1, -1, 4095, 4096, -4096, -4097, 2 ** 24 + 1, 20_000_123, 2 ** 35 - 1, -(2 ** 35 - 1)])
    columns = collective.pack_ids(paddle.to_tensor(ids), dtype)
    assert columns.dtype == getattr(paddle, dtype) and columns.shape == [len(ids), 2]
    assert np.all(np.abs(columns.numpy()) < 2 ** 24)  # every column value is an exact float32 integer
    assert np.array_equal(collective.unpack_ids(columns).numpy(), ids)


def test_ids_beyond_the_limit_are_refused_when_unpacked():
    """Packing never raises (a rank raising before the all-gather would leave the others waiting)."""
    columns = collective.pack_ids(paddle.to_tensor([3, 2 ** 35]), "float32")
    with pytest.raises(ValueError, match="a class id of 34359738368 or more"):
        collective.unpack_ids(columns)


def test_rank_keys_order_scores_and_break_ties_by_the_lowest_rank():
    """The MAX over ranks of ``rank_key`` picks numpy's argmax over ranks (first maximum: the lowest rank), for
    scores that tie, differ by one float32 step (at every magnitude, denormals and zero included) or are -inf; and
    no two ranks ever get equal keys, so exactly one rank votes. Reference: numpy on the float32 scores."""
    rng = np.random.default_rng(0)
    magnitudes = [0.0, 1.4e-45, 1e-40, 1.2e-38, 1e-3, 1.0, 64.0, 3e38]
    base = np.array([m * sign for m in magnitudes for sign in (1, -1)] + [-np.inf], dtype=np.float32)
    up = np.nextafter(base, np.float32(np.inf))
    for world in (2, 3, 64, 4096):
        scores = np.stack([rng.choice(np.concatenate([base, up]), size=200) for _ in range(world)]).astype(np.float32)
        scores[:, :len(base)] = base  # every rank ties on these columns
        scores[world - 1, len(base):2 * len(base)] = up  # the last rank wins these by one float32 step
        keys = np.stack([topk.rank_key(paddle.to_tensor(row), r).numpy() for r, row in enumerate(scores)])
        assert keys.dtype == np.float64
        np.testing.assert_array_equal(np.argmax(keys, axis=0), np.argmax(scores, axis=0))
        assert np.all((keys == keys.max(axis=0)).sum(axis=0) == 1)
    nan = topk.rank_key(paddle.to_tensor([np.nan], dtype="float32"), 1).numpy()
    assert np.isnan(nan).all()


def test_votes_at_world_one_give_the_local_best():
    best, ids = paddle.to_tensor([0.5, np.nan], dtype="float32"), paddle.to_tensor([4, 9])
    votes = topk.top1_votes(best, best, ids)
    assert np.array_equal(topk.top1_from_votes(votes, best, ids).numpy(), [4, -1])


@two_process_run("gather_top1")
def _two_ranks(folder):
    return {"call": [SCRIPT, "main", str(folder)]}, str(folder)


@two_process_run("gather_top1_huge")
def _two_ranks_huge(folder):
    return {"call": [SCRIPT, "main", str(folder), "--huge"]}, str(folder)


@pytest.fixture(scope="module")
def ranks(two_process):
    out_dir = two_process["gather_top1"]
    return [dict(np.load(os.path.join(out_dir, f"rank{k}.npz"))) for k in range(2)]


@pytest.mark.distributed
@pytest.mark.two_process_runs("gather_top1")
@pytest.mark.parametrize("split", ["equal", "uneven"])
def test_two_ranks_gather_features_and_labels_in_one_collective(ranks, split):
    bounds = script.SPLITS[split]
    for k, got in enumerate(ranks):
        assert np.array_equal(got[f"{split}/features"], script.FEATURES)
        assert np.array_equal(got[f"{split}/labels"], script.LABELS) and got[f"{split}/labels"].dtype == np.int64
        assert bool(got[f"{split}/labels_stop_gradient"])
        # both ranks differentiate sum(X * WEIGHTS): each rank's rows get the sum over ranks, 2 * WEIGHTS
        np.testing.assert_array_equal(got[f"{split}/grad"], 2 * script.WEIGHTS[bounds[k]:bounds[k + 1]])


@pytest.mark.distributed
@pytest.mark.two_process_runs("gather_top1")
def test_two_ranks_top1_votes_match_the_argmax_over_ranks(ranks):
    scores, ids = np.stack(script.BEST), np.stack(script.IDS)
    expected = ids[np.argmax(scores, axis=0), np.arange(scores.shape[1])]  # first maximum: the lower rank on ties
    expected[np.isnan(scores).all(axis=0)] = -1
    assert expected[0] == 10  # the tie of row 0 goes to rank 0
    for got in ranks:
        assert np.array_equal(got["top1"], expected)  # with a tie: the all-gather fallback
        assert np.array_equal(got["top1_no_tie"], expected[1:3])  # without: the votes alone
        assert np.array_equal(got["top1_keyed"], expected)  # rank keys: the tie settled inside the MAX
        assert np.array_equal(got["keyed_voters"], (~np.isnan(scores).all(axis=0)).astype(np.float32))


@pytest.mark.distributed
@pytest.mark.two_process_runs("gather_top1_huge")
def test_a_label_out_of_range_on_one_rank_is_refused_by_both(two_process):
    output = two_process.output("gather_top1_huge")  # the launch's console and both ranks' logs
    for rank in (0, 1):
        assert f"rank {rank} refused: a class id of 34359738368 or more" in output


@pytest.mark.distributed
def test_unequal_rows_under_equal_rows_never_pass_silently(tmp_path):
    """Over 2 ranks (3 and 5 rows) gloo itself aborts the rank with fewer rows; the other rank then reports our
    sentence (when its data arrived first), gloo's connection error, or is stopped by the launcher, depending on the
    race. Whichever: the run fails and no rank goes on with the batch (the guard alone is tested below)."""
    code, output = run_distributed(SCRIPT, nproc=2, args=[str(tmp_path), "--mismatch"], timeout=120)
    assert code != 0, output[-3000:]
    assert "without noticing" not in output


def test_a_gathered_row_count_other_than_assumed_raises_a_sentence(monkeypatch):
    """The guard itself, deterministically: this rank (0 of 2, 2 rows) receives another rank's rows that say 3."""
    from mtl.parallel import distributed

    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    other = paddle.concat([paddle.zeros([2, 3]), collective.pack_ids(paddle.to_tensor([5, 6]), "float32"),
                           paddle.full([2, 1], 3.0)], axis=1)
    monkeypatch.setattr(collective, "_gather_padded", lambda x, counts: paddle.concat([x, other], axis=0))
    features = paddle.ones([2, 3])
    features.stop_gradient = False
    with pytest.raises(RuntimeError, match="rank 0 passed 2 rows to a head told that every rank passes as many"):
        collective.gather_batch(features, paddle.to_tensor([1, 2]), equal_rows=True)
    other[:, 5] = 2.0  # the count this rank assumed: the same gather goes through
    gathered, labels = collective.gather_batch(features, paddle.to_tensor([1, 2]), equal_rows=True)
    assert gathered.shape == [4, 3] and labels.numpy().tolist() == [1, 2, 5, 6]
