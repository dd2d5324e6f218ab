"""Durable, verifiable checkpoints: a SHA-256 per file (checked against hashlib over the bytes on disk), fsync before
the rename, and ``--resume`` past a damaged newest checkpoint, compared with an uninterrupted run."""
import copy
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from mtl.core.errors import ConfigError
from mtl.core.safe_pickle import load_paddle_file
from mtl.store import checkpoint, integrity, layout
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests.small_runs import TASKS, job_cfg

SHARD = os.path.join("heads", "arc.shard0of1.pdparams")
ARC = {"name": "arc", "reader": {"type": "synthetic", "num_samples": 36, "num_classes": 5, "seed": 3},
       "head": {"type": "arcface", "scale": 8.0}, "eval": None}


def cfg(tmp_path, **over):
    return job_cfg(tmp_path, tasks=copy.deepcopy([TASKS[0], ARC]), checkpoint={"every": 3, "keep": 5}, **over)


def train(tmp_path, resume=False, **over):
    return Trainer(build_job(cfg(tmp_path, **over)), resume=resume, console=lambda *a: None).run()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An uninterrupted run of 6 steps with checkpoints at steps 3 and 6 (copied by the tests that damage it)."""
    tmp = tmp_path_factory.mktemp("full")
    train(tmp)
    return tmp


def copy_run(finished, tmp_path):
    shutil.copytree(finished / "run", tmp_path / "run")
    return tmp_path / "run" / "checkpoints"


def test_state_json_records_the_sha256_and_size_of_every_file(finished):
    ckpt = finished / "run" / "checkpoints" / "step_6"
    files = json.loads((ckpt / "state.json").read_text())["files"]
    on_disk = sorted(os.path.relpath(os.path.join(d, f), ckpt) for d, _, names in os.walk(ckpt) for f in names
                     if f != "state.json")
    assert sorted(files) == on_disk and SHARD in files and "optimizer.rank0.pdopt" in files
    for rel, entry in files.items():
        data = (ckpt / rel).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}, rel
    assert integrity.verify(str(ckpt)) == ""


def test_every_file_and_folder_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(integrity, "fsync_file", lambda p: events.append(("file", os.path.abspath(p))))
    monkeypatch.setattr(integrity, "fsync_dir", lambda p: events.append(("dir", os.path.abspath(p))))
    real_replace = os.replace
    monkeypatch.setattr(checkpoint.os, "replace", lambda a, b: (events.append(("rename", a)), real_replace(a, b)))
    train(tmp_path, schedule={"steps": 3})
    rename = next(i for i, e in enumerate(events) if e[0] == "rename" and ".step_" in e[1])  # (not job.json's)
    tmp = events[rename][1]
    final = tmp_path / "run" / "checkpoints" / "step_3"
    written = {os.path.join(tmp, os.path.relpath(os.path.join(d, f), final)) for d, _, names in os.walk(final)
               for f in names if f != "state.json"}
    assert written == {p for kind, p in events[:rename] if kind == "file"}
    assert {tmp, os.path.join(tmp, "heads")} <= {p for kind, p in events[:rename] if kind == "dir"}
    assert ("dir", str(final.parent)) in events[rename:]  # the rename itself made durable


@pytest.mark.parametrize("damage", ["truncate", "alter"])
def test_resume_skips_a_damaged_newest_checkpoint_and_matches_an_uninterrupted_run(finished, tmp_path, damage,
                                                                                   capsys):
    root = copy_run(finished, tmp_path)
    shard = root / "step_6" / SHARD
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x01  # one bit, same size
    shard.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"step_6' is damaged: heads/arc.shard0of1.pdparams"):
        checkpoint.load(str(root / "step_6"), *_loadable(tmp_path))
    capsys.readouterr()
    summary = train(tmp_path, resume=True)
    err = capsys.readouterr().err.strip().splitlines()
    warning = [line for line in err if "damaged" in line]
    assert len(warning) == 1, err
    expected = "truncated" if damage == "truncate" else "SHA-256"
    assert "step_6' is damaged (heads/arc.shard0of1.pdparams" in warning[0] and expected in warning[0]
    assert warning[0].endswith("step_3' instead"), warning[0]
    assert summary["resumed_from"].endswith("step_3")
    for name in ("backbone.pdparams", SHARD, "optimizer.rank0.pdopt"):  # bit-identical to the uninterrupted run
        a = load_paddle_file(str(finished / "run" / "checkpoints" / "step_6" / name))
        b = load_paddle_file(str(root / "step_6" / name))
        for key in a:
            if isinstance(a[key], np.ndarray):
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name} {key}")


def _loadable(tmp_path):
    job = build_job(cfg(tmp_path))
    trainer = Trainer(job, resume=True, console=lambda *a: None)
    return job.model, trainer.optimizer, job.schedule, trainer.averager


def test_no_checkpoint_verifies(finished, tmp_path):
    root = copy_run(finished, tmp_path)
    for step in (3, 6):
        (root / f"step_{step}" / "backbone.pdparams").write_bytes(b"")
    messages = []
    assert layout.latest_checkpoint(str(tmp_path / "run"), report=messages.append) is None
    assert messages == [f"checkpoint '{root / 'step_6'}' is damaged (backbone.pdparams has 0 bytes, "
                        f"{(finished / 'run' / 'checkpoints' / 'step_6' / 'backbone.pdparams').stat().st_size} "
                        f"were written (truncated or replaced)); no older checkpoint verifies"]


def test_unreadable_state_json_is_damage_and_a_checkpoint_without_checksums_is_accepted(finished, tmp_path):
    root = copy_run(finished, tmp_path)
    (root / "step_6" / "state.json").write_text('{"step": 6, "wor')  # cut short
    assert integrity.verify(str(root / "step_6")).startswith("state.json is unreadable")
    assert layout.latest_checkpoint(str(tmp_path / "run"), report=lambda m: None) == str(root / "step_3")
    state = json.loads((root / "step_3" / "state.json").read_text())
    del state["files"]  # written before checksums existed
    (root / "step_3" / "state.json").write_text(json.dumps(state))
    assert integrity.verify(str(root / "step_3")) == ""
