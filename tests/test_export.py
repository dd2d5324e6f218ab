"""Export: the inference model embeds like the in-training backbone (averaged weights), heads merged from shards."""
import json
import os
import sys

import numpy as np
import paddle
import pytest

from mtl.core.errors import ConfigError
from mtl.core.safe_pickle import load_paddle_file
from mtl.serving.export import embed, export
from mtl.store.layout import latest_checkpoint
from tests import warm_python
from tests.small_runs import train_run


@pytest.mark.parametrize("averaging", [True, False])
def test_exported_model_matches_training_backbone(tmp_path, averaging):
    job, trainer = train_run(tmp_path, averaging)
    out = str(tmp_path / "export")
    meta = export(str(tmp_path / "run"), out)
    assert meta["averaged"] is averaging and meta["step"] == 8 and meta["feature_size"] == 16
    x = np.random.RandomState(1).randn(5, 1, 8, 8).astype("float32")
    np.save(tmp_path / "x.npy", x)
    exported = embed(out, [str(tmp_path / "x.npy")])
    backbone = job.model.backbone
    backbone.eval()
    if averaging:
        with trainer.averager.apply():
            reference = backbone({"image": paddle.to_tensor(x)}).numpy()
        live = backbone({"image": paddle.to_tensor(x)}).numpy()
        assert not np.allclose(live, reference)  # the averaged weights really differ from the live ones
    else:
        reference = backbone({"image": paddle.to_tensor(x)}).numpy()
    np.testing.assert_allclose(exported, reference, rtol=1e-4, atol=1e-5)
    heads = np.load(os.path.join(out, "heads", "ids.npz"))
    assert heads["weight"].shape == (6, 16)
    kind = np.load(os.path.join(out, "heads", "kind.npz"))
    assert kind["weight"].shape == (4, 16) and kind["bias"].shape == (4,)
    ckpt = latest_checkpoint(str(tmp_path / "run"))
    name = "kind.shard0of1.averaged.pdparams" if averaging else "kind.shard0of1.pdparams"
    np.testing.assert_array_equal(kind["weight"], load_paddle_file(os.path.join(ckpt, "heads", name))["weight"])


@pytest.mark.subprocess
def test_embed_cli_with_image_files(tmp_path):
    from PIL import Image

    train_run(tmp_path, averaging=False, channels=3, size=16)
    out = str(tmp_path / "export")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "mtl.cli"]
    env = dict(os.environ, PYTHONPATH=root)
    proc = warm_python.run(cmd + ["export", str(tmp_path / "run"), out], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    rng = np.random.RandomState(0)
    paths = []
    for i in range(3):
        pixels = rng.randint(0, 256, (16, 16, 3), dtype=np.uint8)
        paths.append(str(tmp_path / f"img{i}.png"))
        Image.fromarray(pixels).save(paths[-1])
    proc = warm_python.run(cmd + ["embed", out, *paths, "-o", str(tmp_path / "emb.npy"), "--flip"],
                           capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    emb = np.load(tmp_path / "emb.npy")
    images = np.stack([(np.asarray(Image.open(p).convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255 - 0.5)
                       / 0.5 for p in paths])
    np.save(tmp_path / "imgs.npy", images)
    plain = embed(out, [str(tmp_path / "imgs.npy")])
    mirrored = embed(out, [str(tmp_path / "imgs.npy")], flip=True)
    np.testing.assert_allclose(emb, mirrored, rtol=1e-5, atol=1e-6)
    assert not np.allclose(plain, mirrored)


def test_export_errors(tmp_path):
    with pytest.raises(ConfigError, match="no job.json"):
        export(str(tmp_path), str(tmp_path / "out"))
    train_run(tmp_path, averaging=False)
    with pytest.raises(ConfigError, match="no averaged weights"):
        export(str(tmp_path / "run"), str(tmp_path / "out"), weights="averaged")
    # one embedding for every task (hard): --task may name any of them, but a name that is none of them is a slip
    tasks = [t["name"] for t in json.load(open(tmp_path / "run" / "job.json"))["tasks"]]
    with pytest.raises(ConfigError, match=f"task 'nope' is not a task of the run \\({', '.join(tasks)}\\)"):
        export(str(tmp_path / "run"), str(tmp_path / "out"), task="nope")
    assert not (tmp_path / "out").exists()
    assert export(str(tmp_path / "run"), str(tmp_path / "out"), task=tasks[-1])["task"] is None


def test_an_export_is_written_whole_or_not_at_all(tmp_path):
    """A damaged data.json was named (exit 2), but backbone.json, backbone.pdiparams and heads/ were left without an
    export.json; an export over a folder of other files wrote into it. Found by a fuzzing helper."""
    from mtl.core.errors import DataError

    train_run(tmp_path, averaging=False)
    run, out = tmp_path / "run", tmp_path / "out"
    first = export(str(run), str(out))
    before = {name: (out / name).read_bytes() for name in ("export.json", "backbone.pdiparams")}
    (run / "data.json").write_text("{not json")
    with pytest.raises(DataError, match="data.json"):
        export(str(run), str(out))
    assert {name: (out / name).read_bytes() for name in before} == before  # the earlier export, untouched
    with pytest.raises(DataError, match="data.json"):
        export(str(run), str(tmp_path / "fresh"))
    assert sorted(os.listdir(tmp_path)) == ["out", "run"]  # no half export, no temporary folder
    (run / "data.json").unlink()
    assert export(str(run), str(out))["step"] == first["step"]  # an earlier export is replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="'.*mine' holds files and is not an export"):
        export(str(run), str(tmp_path / "mine"))
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_export_refuses_an_incomplete_set_of_shards(tmp_path):
    train_run(tmp_path, averaging=False)
    heads = os.path.join(latest_checkpoint(str(tmp_path / "run")), "heads")
    os.rename(os.path.join(heads, "ids.shard0of1.pdparams"), os.path.join(heads, "ids.shard0of2.pdparams"))
    state_file = os.path.join(os.path.dirname(heads), "state.json")  # as if assembled by hand: no checksums
    state = json.load(open(state_file))
    del state["files"]
    json.dump(state, open(state_file, "w"))
    with pytest.raises(ConfigError, match=r"lacks shard\(s\) \[1\] of 2 of task 'ids'"):
        export(str(tmp_path / "run"), str(tmp_path / "out"))


def object_npy(path):
    """A .npy file of one object (dtype '|O'): its header says so, and numpy refuses it there without a pickle."""
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\x80\x04N.")


def test_damaged_records_of_a_run_or_an_export_are_one_sentence_each(tmp_path):
    """Each was an AttributeError, TypeError, KeyError, UnicodeDecodeError or numpy ValueError traceback (found by
    a fuzzing helper), or numpy's advice to load a pickled file unsafely."""
    import shutil

    from mtl.core.errors import DataError
    from mtl.serving.inference import open_for_prediction, open_run

    train_run(tmp_path, averaging=False)
    run, out = tmp_path / "run", tmp_path / "out"
    export(str(run), str(out))

    def damaged(folder, name, content):
        copy = tmp_path / f"{folder.name}_{name.replace('/', '_')}_{len(os.listdir(tmp_path))}"
        shutil.copytree(folder, copy)
        (copy / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(copy)

    cases = [
        (lambda: open_run(damaged(run, "job.json", "[1, 2]")), r"job config '.*job.json' holds a JSON list, expected"),
        (lambda: open_run(damaged(run, "job.json", json.dumps({"tasks": "x"}))),
         r"'tasks' must be a list of task mappings with a 'name', got x"),
        (lambda: export(damaged(run, "data.json", json.dumps({"label_names": 5})), str(tmp_path / "e1")),
         r"run data '.*data.json': 'label_names' must map each task to a mapping, got 5"),
        (lambda: embed(damaged(out, "export.json", "[]"), [str(tmp_path / "x.npy")]), "holds a JSON list"),
        (lambda: embed(damaged(out, "export.json", json.dumps({**json.load(open(out / "export.json")),
                                                                "input_shape": "abc"})), [str(tmp_path / "x.npy")]),
         r"has no 'input_field' name with an 'input_shape' of positive whole numbers \(got 'image', 'abc'\)"),
        (lambda: embed(damaged(out, "backbone.json", "{garbage"), [str(tmp_path / "x.npy")]),
         r"its inference program \(backbone.json, backbone.pdiparams\) cannot be loaded \(RuntimeError"),
        (lambda: embed(str(out), [str(tmp_path / "obj.npy")]),
         r"obj.npy' is not a numpy array file \(it holds pickled Python objects, which are never loaded"),
        (lambda: embed(str(out), [str(tmp_path / "zip.npy")]), r"zip.npy' is an .npz archive"),
        (lambda: embed(str(out), [str(tmp_path / "none.npy")]), r"none.npy' holds no input \(shape \[0, 1, 8, 8\]\)"),
    ]
    np.save(tmp_path / "x.npy", np.zeros((2, 1, 8, 8), np.float32))
    object_npy(tmp_path / "obj.npy")
    np.savez(tmp_path / "two.npz", a=np.zeros(2))
    os.rename(tmp_path / "two.npz", tmp_path / "zip.npy")  # an archive saved under a .npy name
    np.save(tmp_path / "none.npy", np.zeros((0, 1, 8, 8), np.float32))
    for run_it, words in cases:
        with pytest.raises(DataError, match=words):
            run_it()
    head = next(n for n in os.listdir(out / "heads"))
    object_npy(tmp_path / "pickled.npy")
    with pytest.raises(DataError, match=rf"head weights '.*{head}' cannot be read as plain arrays \(it holds"):
        open_for_prediction(damaged(out, f"heads/{head}", (tmp_path / "pickled.npy").read_bytes())).head_weights(
            head[:-4])
    with pytest.raises(ConfigError, match=r"checkpoint '.*nosuch' does not exist"):  # was "'run' has no complete ..."
        open_run(str(run), str(tmp_path / "nosuch"))
    with pytest.raises(ConfigError, match=r"checkpoint '.*run' is not a checkpoint folder \(no state.json\)"):
        open_run(str(run), str(run))
    state = damaged(run, "checkpoints/step_8/state.json", b'{"step": "\xe9"}')
    with pytest.raises((DataError, ConfigError), match="no complete checkpoint|state.json"):  # was UnicodeDecodeError
        open_run(state)


def test_a_staged_folder_that_cannot_be_renamed_into_place_puts_the_former_one_back(tmp_path, monkeypatch):
    """A review found the swap lost the earlier export when its second rename failed (or was interrupted): the
    former folder stayed under a hidden name and nothing was at OUT."""
    from mtl.core import staging

    out = tmp_path / "out"
    out.mkdir()
    (out / "export.json").write_text("old")
    real, calls = os.rename, []

    def failing_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk gone")
        real(src, dst)

    monkeypatch.setattr(staging.os, "rename", failing_second)
    with pytest.raises(OSError, match="disk gone"):
        with staging.staged_folder(str(out), replace=True) as stage:
            with open(os.path.join(stage, "export.json"), "w") as f:
                f.write("new")
    assert (out / "export.json").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out"]
    monkeypatch.setattr(staging.os, "rename", real)
    with staging.staged_folder(str(out), replace=True) as stage:
        with open(os.path.join(stage, "export.json"), "w") as f:
            f.write("new")
    assert (out / "export.json").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["out"]
