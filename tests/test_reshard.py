"""Resume at another process count: 2 -> 1 and 1 -> 2 processes continue like an uninterrupted run; offline
re-sharding round-trips exactly; `mtl checkpoint info` says what a checkpoint holds.

The job is the joint-mode equivalence job with checkpoints every 5 steps (tests/equivalence.py); its uninterrupted
1-process run is shared with tests/test_distributed_training.py. The 2-process runs (cut at step 10, or resumed from
a 1-process cut) are in the session's one launch; the 1-process runs train in this process (tests/shared_runs.py).
Every resume starts in a process that did not train the cut run."""
import contextlib
import io
import json
import os

import numpy as np
import paddle
import pytest

from mtl.cli import build_parser
from mtl.config.loading import load_job
from mtl.core.safe_pickle import load_paddle_file
from mtl.optimizer.joint import JointOptimizer
from mtl.store import checkpoint
from mtl.store.layout import merged_head_state
from mtl.train.job import build_job
from tests import equivalence
from tests.shared_runs import train_here, two_process_run

SHARDED = ("arc7", "arc1", "cos5", "soft3")
PARTIAL_FC = ["tasks.0.head.sample_ratio=0.5"]  # arc7: Partial FC, its class sample drawn from (seed, step)
CUT = 10


def overrides(partial_fc):
    return equivalence.JOINT + (PARTIAL_FC if partial_fc else [])


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def mtl(*args):
    """``mtl ARGS`` (the command's parser and function, in this process); what it printed."""
    parsed = build_parser().parse_args([str(a) for a in args])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        parsed.func(parsed)
    return printed.getvalue()


def _cut_at_two(folder, partial_fc):
    """2 processes, stopped by --until after step 10 (resumed at 1 process by the test)."""
    out = folder / "cut"
    return {"train": equivalence.argv(out, overrides(partial_fc), "--until", str(CUT))}, str(out)


def _resumed_at_two(folder, partial_fc):
    """1 process stopped by --until after step 10 (here, now), then resumed at 2 processes in the launch."""
    out = folder / "cut"
    train_here(*equivalence.argv(out, overrides(partial_fc), "--until", str(CUT)))
    return {"train": equivalence.argv(out, overrides(partial_fc), "--resume")}, str(out)


for _first, _build in ((2, _cut_at_two), (1, _resumed_at_two)):
    for _pfc in (False, True):
        two_process_run(f"reshard_{_first}to{3 - _first}_pfc{int(_pfc)}")(
            lambda folder, build=_build, pfc=_pfc: build(folder, pfc))


@pytest.fixture(scope="module")
def full_runs(one_process, tmp_path_factory):
    """Uninterrupted 1-process runs, by whether arc7 uses Partial FC (trained on first use)."""
    root, runs = tmp_path_factory.mktemp("reshard"), {True: None}

    def get(partial_fc=False):
        if not partial_fc:
            return one_process["equivalence_joint"]
        if runs[True] is None:
            runs[True] = str(root / "full_pfc1")
            train_here(*equivalence.argv(runs[True], overrides(True)))
        return runs[True]
    return get


@pytest.fixture(scope="module")
def uninterrupted(full_runs):
    return full_runs(False)


def _case(first, second, partial_fc):
    name = f"reshard_{first}to{second}_pfc{int(partial_fc)}"
    return pytest.param(first, second, partial_fc, marks=pytest.mark.two_process_runs(name), id=f"{first}-{second}-"
                        f"{partial_fc}")


@pytest.mark.distributed
@pytest.mark.parametrize("first,second,partial_fc", [_case(2, 1, False), _case(1, 2, False), _case(2, 1, True),
                                                     _case(1, 2, True)])
def test_resume_at_another_process_count(full_runs, two_process, tmp_path, first, second, partial_fc):
    out = two_process[f"reshard_{first}to{second}_pfc{int(partial_fc)}"]
    ckpt = os.path.join(out, "checkpoints", f"step_{CUT}")
    switch = {t: merged_head_state(ckpt, t) for t in SHARDED}
    if second == 1:
        train_here(*equivalence.argv(out, overrides(partial_fc), "--resume"))
    a, b = losses(full_runs(partial_fc)), losses(out)
    assert [r["step"] for r in b] == list(range(1, 21))
    keys = [k for k in a[0] if k.startswith("loss/")]
    worst = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-6) for ra, rb in zip(a, b) for k in keys if k in rb)
    assert worst <= 1e-4, worst
    if first == 2:  # loading the 2-process checkpoint in this (1-process) test gives exactly the merged shards
        extra = PARTIAL_FC if partial_fc else []
        job = build_job(load_job(equivalence.JOB, [f"output_dir={tmp_path / 'probe'}", *extra]))
        optimizer = JointOptimizer(job.cfg["optimizer"], job.model, job.cfg["schedule"]["steps"])
        checkpoint.load(ckpt, job.model, optimizer, job.schedule)
        for task in SHARDED:
            for key, value in job.model.heads[task].state_dict().items():
                np.testing.assert_array_equal(value.numpy(), switch[task][key], err_msg=f"{task}.{key}")


def test_reshard_round_trip_is_exact(uninterrupted, tmp_path):
    ckpt = os.path.join(uninterrupted, "checkpoints", "step_20")
    two, three = str(tmp_path / "two"), str(tmp_path / "three")
    two_again, back = str(tmp_path / "two_again"), str(tmp_path / "back")
    mtl("checkpoint", "reshard", ckpt, "--world", "2", two)
    mtl("checkpoint", "reshard", two, "--world", "3", three)
    mtl("checkpoint", "reshard", three, "--world", "2", two_again)
    mtl("checkpoint", "reshard", three, "--world", "1", back)
    _assert_same_folders(two, two_again)  # 2 -> 3 -> 2
    expected = [f"{t}.shard{k}of3{s}" for t in SHARDED for k in range(3) for s in (".pdparams", ".averaged.pdparams")]
    assert sorted(os.listdir(os.path.join(three, "heads"))) == sorted(expected + ["reg.averaged.pdparams",
                                                                                 "reg.pdparams"])
    for task in SHARDED:  # 3 shards of 7, 1, 5, 3 classes: balanced split, some empty
        sizes = [load_paddle_file(os.path.join(three, "heads", f"{task}.shard{k}of3.pdparams"))["weight"].shape[0]
                 for k in range(3)]
        total = merged_head_state(ckpt, task)["weight"].shape[0]
        assert sizes == [total // 3 + (k < total % 3) for k in range(3)]
    _assert_same_folders(ckpt, back)  # 1 -> 2 -> 3 -> 1
    info = mtl("checkpoint", "info", three)
    assert "written by  3 process(es)" in info or "3 process(es)" in info
    assert "head arc7" in info and "[7, 16]" in info


def _assert_same_folders(first, second):
    """Every weight, optimizer, averager and random-state file of two checkpoints holds the same values."""
    names = sorted(n for n in os.listdir(first) if n.endswith((".pdopt", ".pdparams")))
    assert names == sorted(n for n in os.listdir(second) if n.endswith((".pdopt", ".pdparams")))
    assert sorted(os.listdir(os.path.join(first, "heads"))) == sorted(os.listdir(os.path.join(second, "heads")))
    for name in names:
        if name.startswith("rng."):  # generator states: the same bytes
            with open(os.path.join(first, name), "rb") as f, open(os.path.join(second, name), "rb") as g:
                assert f.read() == g.read(), name
        else:
            _assert_same(load_paddle_file(os.path.join(first, name)), load_paddle_file(os.path.join(second, name)),
                         name)
    for name in os.listdir(os.path.join(first, "heads")):
        _assert_same(load_paddle_file(os.path.join(first, "heads", name)),
                     load_paddle_file(os.path.join(second, "heads", name)), name)


def _assert_same(a, b, where):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (paddle.Tensor, np.ndarray)):
        x = a.numpy() if isinstance(a, paddle.Tensor) else a
        y = b.numpy() if isinstance(b, paddle.Tensor) else np.asarray(b)
        np.testing.assert_array_equal(x, y, err_msg=where)
    else:
        assert a == b, where


def _damaged_copy(ckpt, tmp_path, how):
    """A copy of ``ckpt`` damaged one way: a flipped byte, a truncated optimizer, the heads removed, bad state."""
    import shutil

    copy = tmp_path / f"ckpt_{how}"
    shutil.copytree(ckpt, copy)
    if how == "flipped":
        with open(copy / "backbone.pdparams", "r+b") as f:
            f.seek(-500, os.SEEK_END)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif how == "truncated":
        with open(copy / "optimizer.rank0.pdopt", "r+b") as f:
            f.truncate(100)
    elif how == "no_heads":
        shutil.rmtree(copy / "heads")
    else:  # state.json: not JSON, or a world size that is not a count
        state = json.load(open(copy / "state.json"))
        (copy / "state.json").write_text('{"step": 20, "world_' if how == "not_json" else
                                         json.dumps({**state, "world_size": "two", "files": None}))
    return copy


@pytest.mark.parametrize("how, words", [
    ("flipped", "backbone.pdparams does not match its SHA-256"),
    ("truncated", "optimizer.rank0.pdopt has 100 bytes"),
    ("no_heads", "is missing"),
    ("not_json", "state.json is unreadable"),
    ("bad_world", "state.json key 'world_size' must be a positive whole number, got 'two'"),
])
def test_a_damaged_checkpoint_is_refused_by_info_and_reshard_and_nothing_is_written(uninterrupted, tmp_path, how,
                                                                                     words):
    """Given as a checkpoint folder (not a run folder), a damaged checkpoint was resharded into new files with new
    checksums (the damage laundered), or left a half-written output; now one sentence, and no output folder."""
    from mtl.core.errors import MtlError

    copy = _damaged_copy(os.path.join(uninterrupted, "checkpoints", "step_20"), tmp_path, how)
    for args in (("info", copy), ("reshard", copy, "--world", "2", tmp_path / "out")):
        with pytest.raises(MtlError, match=words.replace("(", r"\(").replace(")", r"\)")):
            mtl("checkpoint", *args)
        assert sorted(os.listdir(tmp_path)) == [copy.name]  # no out, no partial folder


def test_a_reshard_that_fails_midway_leaves_no_folder(uninterrupted, tmp_path, monkeypatch):
    """A failure while the new files are written (here: the second rank's optimizer state) removes what was written:
    the output folder is the whole checkpoint or nothing, and the same command then succeeds."""
    from mtl.store import reshard as reshard_module

    ckpt, out = os.path.join(uninterrupted, "checkpoints", "step_20"), tmp_path / "out"
    real, calls = reshard_module.rank_state, []

    def failing(path, saved, world, rank, classes=None):
        calls.append(rank)
        if rank == 1:
            raise OSError("No space left on device")
        return real(path, saved, world, rank, classes)

    monkeypatch.setattr(reshard_module, "rank_state", failing)
    with pytest.raises(OSError, match="No space left"):
        mtl("checkpoint", "reshard", ckpt, "--world", "2", out)
    assert calls == [0, 1] and os.listdir(tmp_path) == []
    monkeypatch.setattr(reshard_module, "rank_state", real)
    assert f"written: {out}" in mtl("checkpoint", "reshard", ckpt, "--world", "2", out)
    from mtl.store import integrity

    assert integrity.verify(str(out)) == "" and sorted(os.listdir(tmp_path)) == ["out"]
