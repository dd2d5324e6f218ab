"""Label names (issue 30, item 4) and what ``mtl data inspect`` and a skipping reader say about bad images (item 5).

The reference for every name is the data itself: the sorted sub-folder names that number an image folder, the
folder of each listed image, scikit-learn's own ``target_names``, the digits' attribute and property tables.
"""
import json
import os

import numpy as np
import pytest

from mtl.commands import data as datatools
from mtl.core import registry
from mtl.core.errors import ConfigError
from tests.newcomer_runs import write_images

PEOPLE = ["s1", "s10", "s2", "s12"]  # sorted as text: s1, s10, s12, s2


def people_folder(folder, per_person=2, corrupt=()):
    """Images of :data:`PEOPLE` in one sub-folder each (``per_person`` each, 8 px)."""
    return write_images(str(folder), count=per_person * len(PEOPLE), people=PEOPLE, corrupt=corrupt)


def build_reader(cfg):
    registry.load_builtin()
    return registry.build("reader", cfg)


def saved_figures(monkeypatch):
    import matplotlib.figure

    saved, original = [], matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kw):
        saved.append(fig)
        return original(fig, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


def test_pack_writes_the_folder_names_beside_the_pack_and_every_tool_shows_them(tmp_path, monkeypatch, capsys):
    people_folder(tmp_path / "faces")
    summary = datatools.pack(str(tmp_path / "faces"), str(tmp_path / "packed" / "train"))
    expected = sorted(PEOPLE)  # the order that numbers them
    assert json.load(open(tmp_path / "packed" / "labels.json")) == {"label": expected}
    assert summary["labels"] == str(tmp_path / "packed" / "labels.json")
    reader = build_reader({"type": "recordio", "path": str(tmp_path / "packed"), "image_size": 8})
    assert reader.label_names() == {"label": expected}
    figures = saved_figures(monkeypatch)
    stats = datatools.inspect(str(tmp_path / "packed"), str(tmp_path / "sheet.png"), samples=8)
    assert stats["labels"] == dict(enumerate(expected))
    titles = {ax.get_title() for ax in figures[-1].axes} - {""}
    assert titles == {f"{name} ({label})" for label, name in enumerate(expected)}, titles
    table = datatools.label_table(stats)
    assert all(f"|       {label} | {name:<6} |" in table for label, name in enumerate(expected)), table


def test_holdout_classes_by_name_and_each_splits_names(tmp_path):
    people_folder(tmp_path / "faces")
    datatools.pack(str(tmp_path / "faces"), str(tmp_path / "packed" / "train"))
    cfg = {"type": "recordio", "path": str(tmp_path / "packed"), "image_size": 8, "holdout_classes": ["s12", "s2"]}
    by_label = build_reader({**cfg, "holdout_classes": [2, 3]})  # s12 is label 2, s2 is label 3
    train, held = build_reader(cfg), build_reader({**cfg, "split": "eval"})
    assert train.label_names() == {"label": ["s1", "s10"]} and held.label_names() == {"label": ["s12", "s2"]}
    np.testing.assert_array_equal(train.labels(), by_label.labels())
    with pytest.raises(ConfigError, match=r"holdout_classes names 's3', which is not a label name of the data \(its "
                                          r"names: s1, s10, s12, s2\)"):
        build_reader({**cfg, "holdout_classes": ["s3"]})
    with pytest.raises(ConfigError, match=r"names 's01'.* \(did you mean 's1'\?\)"):
        build_reader({**cfg, "holdout_classes": ["s01"]})


def test_an_image_list_reads_names_off_its_folders_or_its_labels_json(tmp_path):
    rels = people_folder(tmp_path / "faces")
    labels = {name: i for i, name in enumerate(PEOPLE)}  # the list's own numbering, not the sorted one
    (tmp_path / "faces" / "list.txt").write_text("".join(f"{r}\t{labels[r.split('/')[0]]}\n" for r in rels))
    cfg = {"type": "image_list", "list": str(tmp_path / "faces" / "list.txt"), "image_size": 8}
    assert build_reader(cfg).label_names() == {"label": PEOPLE}
    datatools.pack(str(tmp_path / "faces" / "list.txt"), str(tmp_path / "packed" / "train"))
    assert json.load(open(tmp_path / "packed" / "labels.json")) == {"label": PEOPLE}
    (tmp_path / "faces" / "labels.json").write_text(json.dumps({"label": ["ann", "bob", "cid", "dee"]}))
    assert build_reader(cfg).label_names() == {"label": ["ann", "bob", "cid", "dee"]}  # the file wins


def test_a_list_whose_folders_do_not_tell_has_no_names_and_pack_removes_stale_ones(tmp_path):
    write_images(str(tmp_path / "flat"), count=4, people="a")
    (tmp_path / "flat" / "list.txt").write_text("a/0.png\t0\na/1.png\t1\na/2.png\t0\na/3.png\t1\n")  # one folder
    cfg = {"type": "image_list", "list": str(tmp_path / "flat" / "list.txt"), "image_size": 8}
    assert build_reader(cfg).label_names() == {}
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "labels.json").write_text(json.dumps({"label": ["old", "names"]}))
    assert datatools.pack(str(tmp_path / "flat" / "list.txt"), str(tmp_path / "packed"))["labels"] is None
    assert not (tmp_path / "packed" / "labels.json").exists()


def test_the_bundled_readers_name_their_classes_attributes_and_outputs():
    import sklearn.datasets

    from mtl.readers.digit_features import ATTRIBUTES, PROPERTIES

    iris = build_reader({"type": "table", "dataset": "iris"}).label_names()
    assert iris["label"] == list(sklearn.datasets.load_iris().target_names)
    assert build_reader({"type": "table", "dataset": "linnerud"}).label_names() == {
        "target": list(sklearn.datasets.load_linnerud().target_names)}
    digits = build_reader({"type": "digits", "classes": [3, 7]}).label_names()
    assert digits == {"label": ["3", "7"], "labels": list(ATTRIBUTES), "target": list(PROPERTIES)}


# ---- 5. bad images ----------------------------------------------------------------------------------------------
def test_inspect_decodes_every_image_and_names_the_bad_ones(tmp_path, capsys):
    rels = people_folder(tmp_path / "faces", corrupt=["s1/bad.png", "s2/worse.png"])
    lines = [f"{r}\t{PEOPLE.index(r.split('/')[0])}" for r in rels] + ["s1/bad.png\t0", "s2/worse.png\t2"]
    (tmp_path / "faces" / "list.txt").write_text("\n".join(lines) + "\n")
    listed = str(tmp_path / "faces" / "list.txt")
    stats = datatools.inspect(listed, None, samples=3)  # the sample alone would miss them
    assert stats["bad_records"] == 2 and stats["decoded"] == "every image"
    assert [b.split("(")[1].split(")")[0] for b in stats["bad"]] == ["'s1/bad.png'", "'s2/worse.png'"], stats["bad"]
    quick = datatools.inspect(listed, None, samples=3, check="sample")
    assert quick["decoded"].startswith("only the 3 sampled images") and "--check all" in quick["decoded"]


def test_a_run_that_skips_bad_images_says_so_and_names_them(tmp_path):
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    rels = people_folder(tmp_path / "faces", per_person=3, corrupt=["s10/bad.png"])
    lines = [f"{r}\t{PEOPLE.index(r.split('/')[0])}" for r in rels] + ["s10/bad.png\t1"]
    (tmp_path / "faces" / "list.txt").write_text("\n".join(lines) + "\n")
    data = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"),
            "tasks": [{"name": "faces", "reader": {"type": "image_list", "list": str(tmp_path / "faces" / "list.txt"),
                                                   "on_bad_sample": "skip", "decoder": "pillow"},
                       "head": {"type": "softmax"}, "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [3, 8, 8], "hidden": [8], "embedding_size": 8},
            "schedule": {"batch_size": 13, "steps": 2}, "log": {"progress": False, "plot": False},
            "data": {"num_workers": 0}}
    printed = []
    Trainer(build_job(load_job(data=data), announce_plan=False), console=printed.append).run()
    said = [p for p in printed if "skipped" in p]
    assert len(said) == 1 and said[0].startswith("task 'faces': 1 bad sample(s) skipped (on_bad_sample: skip)"), said
    assert "('s10/bad.png')" in said[0]
    summary = json.load(open(tmp_path / "run" / "summary.json"))["tasks"]["faces"]
    assert summary["bad_samples"] == 1 and "s10/bad.png" in summary["skipped"][0]


# ---- names in a run, its export and mtl overlap ------------------------------------------------------------------
def two_dataset_run(tmp_path):
    """A 2-step run of two image-list tasks whose people are named by their folders; (run folder, names)."""
    from mtl.commands.train import add_train_args, train

    tasks, names = [], {}
    for task, people in (("left", ["ann", "bob", "cid"]), ("right", ["dee", "eve"])):
        rels = write_images(str(tmp_path / task), count=2 * len(people), people=people)
        (tmp_path / task / "list.txt").write_text("".join(f"{r}\t{people.index(r.split('/')[0])}\n" for r in rels))
        tasks.append({"name": task, "reader": {"type": "image_list", "list": str(tmp_path / task / "list.txt")},
                      "head": {"type": "arcface", "scale": 8.0}, "eval": None})
        names[task] = people
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"), "tasks": tasks,
           "backbone": {"type": "mlp", "input_shape": [3, 8, 8], "hidden": [8], "embedding_size": 8},
           "schedule": {"batch_size": 4, "steps": 2}, "log": {"progress": False, "plot": False},
           "data": {"num_workers": 0}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    import argparse

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    train(parser.parse_args([str(tmp_path / "job.yaml")]))
    return str(tmp_path / "run"), names


def test_a_run_its_export_and_mtl_overlap_carry_the_names(tmp_path, capsys):
    from mtl.serving.export import export
    from mtl.studies.overlap import report

    run, names = two_dataset_run(tmp_path)
    recorded = json.load(open(os.path.join(run, "data.json")))["label_names"]
    assert recorded == {task: {"label": people} for task, people in names.items()}
    meta = export(run, str(tmp_path / "export"))
    assert meta["label_names"] == recorded
    capsys.readouterr()
    found = report(run, centres=True, threshold=-1.0, json_path=str(tmp_path / "o.json"))
    assert found and all(m["name_a"] == names["left"][m["class_a"]] and m["name_b"] == names["right"][m["class_b"]]
                         for m in found)
    out = capsys.readouterr().out
    m = found[0]
    assert f"| left     | {m['class_a']} ({m['name_a']})" in out, out
