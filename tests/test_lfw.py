"""LFW in the toolkit (issue 52): its protocol files, the folder-per-person reader that keeps a chosen set of people,
and LFW's verification protocol, against direct computations on the vendored subset (examples/data/lfw_subset)."""
import os
import sys

import numpy as np
import pytest

from mtl.core.errors import ConfigError, DataError
from mtl.data import lfw
from mtl.evaluation import lfw as protocol
from tests.dist_util import ROOT
from tests.lazy import LazyModule

skm = LazyModule("sklearn.metrics")
SUBSET = os.path.join(ROOT, "examples", "data", "lfw_subset")
IMAGES = os.path.join(SUBSET, "images")


def plain_people(path):
    """The people file read with no help: ``[[(name, images)]]`` per set."""
    lines = [line.split() for line in open(path) if line.strip()]
    if len(lines[1]) == 1:  # several sets: a count line before each
        sets, at = [], 1
        for _ in range(int(lines[0][0])):
            size = int(lines[at][0])
            sets.append([(n, int(c)) for n, c in lines[at + 1:at + 1 + size]])
            at += 1 + size
        return sets
    return [[(n, int(c)) for n, c in lines[1:]]]


def test_people_files_of_both_views():
    for name, count in (("people.txt", 10), ("peopleDevTrain.txt", 1), ("peopleDevTest.txt", 1)):
        sets = lfw.read_people(os.path.join(SUBSET, name))
        assert len(sets) == count
        assert [[(p.name, p.images) for p in s] for s in sets] == plain_people(os.path.join(SUBSET, name))


def test_pairs_files_of_both_views():
    sets = lfw.read_pairs(os.path.join(SUBSET, "pairs.txt"))
    assert len(sets) == 10 and all(len(s) == 6 for s in sets)
    lines = [line.split() for line in open(os.path.join(SUBSET, "pairs.txt"))][1:]
    first = lines[0]  # a same pair: Name i j
    assert sets[0].first[0] == f"{first[0]}/{first[0]}_{int(first[1]):04d}.jpg"
    assert sets[0].second[0] == f"{first[0]}/{first[0]}_{int(first[2]):04d}.jpg"
    fourth = lines[3]  # a different pair: Name1 i Name2 j
    assert sets[0].second[3] == f"{fourth[2]}/{fourth[2]}_{int(fourth[3]):04d}.jpg"
    assert sets[0].issame.tolist() == [True] * 3 + [False] * 3
    assert sets[9].lines[0] == 1 + 9 * 6 + 1
    view1 = lfw.view_pairs(SUBSET, 1)
    assert len(view1) == 2 and all(len(s) == 6 for s in view1)
    lfw.check_images(IMAGES, view1 + lfw.view_pairs(SUBSET, 2), "subset")


@pytest.mark.parametrize("text,message", [
    ("2\n1\nAnna\t1\n", r"people\.txt' ends after 1 of its 2 sets"),
    ("3\nAnna\t2\nBob\tx\nCid\t1\n", r"people\.txt' line 3: expected 'Name<TAB>number of images', got 'Bob x'"),
    ("2\nAnna\t2\n", r"set 1 announces 2 people but the file ends after 1"),
    ("1\nAnna\t2\nBob\t1\n", r"line 3: more lines than its counts announce"),
    ("two\n", r"line 1: expected the number of people or of sets"),
])
def test_a_bad_people_file_names_its_line(tmp_path, text, message):
    path = tmp_path / "people.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        lfw.read_people(str(path))


@pytest.mark.parametrize("text,message", [
    ("1\nAnna\t1\t2\nAnna\t1\tBob\n", r"pairs\.txt' line 3: expected a different-person pair"),
    ("1\nAnna\t1\nAnna\t1\tBob\t1\n", r"line 2: expected a same-person pair 'Name<TAB>i<TAB>j'"),
    ("1\nAnna\t0\t2\nAnna\t1\tBob\t1\n", r"line 2: .*image numbers from 1"),
    ("2\nAnna\t1\t2\nAnna\t1\tBob\t1\n", r"announces 1 set\(s\) of 2 same and 2 different pairs \(4 lines\), the file "
                                         r"holds 2"),
    ("10 300 7\n", r"line 1: expected 'sets<TAB>pairs per kind'"),
])
def test_a_bad_pairs_file_names_its_line(tmp_path, text, message):
    path = tmp_path / "pairs.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        lfw.read_pairs(str(path))


def build_reader(**kw):
    from mtl.readers.image_folder import ImageFolderReader

    return ImageFolderReader(IMAGES, image_size=16, **kw)


def expected_people(sets=None, exclude=(), min_images=1):
    """The kept people and their image counts, from the people file and the folders, with no help."""
    chosen = [p for k, s in enumerate(plain_people(os.path.join(SUBSET, "people.txt")), start=1)
              if (sets is None or k in sets) and k not in exclude for p in s]
    counts = {name: len(os.listdir(os.path.join(IMAGES, name))) for name, _ in chosen}
    return sorted(name for name, n in counts.items() if n >= min_images), counts


@pytest.mark.parametrize("kw,sets,exclude,minimum", [
    ({}, None, (), 1),
    ({"exclude_sets": [3]}, None, (3,), 1),
    ({"sets": [1, 2], "min_images": 2}, {1, 2}, (), 2),
    ({"exclude_sets": 10, "min_images": 3}, None, (10,), 3),
])
def test_the_reader_keeps_the_chosen_people(kw, sets, exclude, minimum):
    reader = build_reader(people=os.path.join(SUBSET, "people.txt"), **kw)
    names, counts = expected_people(sets, exclude, minimum)
    assert reader.label_names()["label"] == names
    assert np.bincount(reader.labels()).tolist() == [counts[n] for n in names]
    first = reader[0]
    assert first["image"].shape == (3, 16, 16) and int(first["label"]) == 0


def test_the_reader_without_a_people_file_takes_every_folder():
    reader = build_reader(min_images=4)
    names = sorted(d for d in os.listdir(IMAGES) if len(os.listdir(os.path.join(IMAGES, d))) >= 4)
    assert reader.label_names()["label"] == names


def test_the_readers_errors_name_the_file_and_line(tmp_path):
    people = tmp_path / "people.txt"
    people.write_text("2\nAaron_Peirsol\t4\nNobody_Here\t1\n")
    with pytest.raises(DataError, match=r"people\.txt' line 3: 'Nobody_Here' has no folder"):
        build_reader(people=str(people))
    people.write_text("1\nAaron_Peirsol\t9\n")
    with pytest.raises(DataError, match=r"line 2: 'Aaron_Peirsol' has 9 images listed, but .* holds 4"):
        build_reader(people=str(people))
    with pytest.raises(ConfigError, match=r"exclude_sets names set\(s\) \[11\], but people file .* holds sets 1 to 10"):
        build_reader(people=os.path.join(SUBSET, "people.txt"), exclude_sets=[11])
    with pytest.raises(ConfigError, match="name it with people"):
        build_reader(sets=[1])
    with pytest.raises(DataError, match="no person with at least 50 image"):
        build_reader(min_images=50)


def loop_threshold(distances, issame, thresholds):
    """The first grid threshold of highest accuracy, by a loop."""
    best, chosen = -1, None
    for t in thresholds:
        correct = sum((d < t) == s for d, s in zip(distances, issame))
        if correct > best:
            best, chosen = correct, t
    return chosen


def test_score_set_against_loops_and_sklearn():
    rng = np.random.RandomState(0)
    issame = [np.r_[np.ones(30, bool), np.zeros(30, bool)] for _ in range(10)]
    distances = [np.where(s, rng.uniform(0.2, 2.2, 60), rng.uniform(1.2, 3.6, 60)) for s in issame]
    for test in (0, 4, 9):
        got = protocol.score_set(distances, issame, test)
        others = [k for k in range(10) if k != test]
        t = loop_threshold(np.concatenate([distances[k] for k in others]),
                           np.concatenate([issame[k] for k in others]), protocol.DEFAULT_THRESHOLDS)
        assert got["threshold"] == pytest.approx(t)
        assert got["accuracy"] == pytest.approx(np.mean((distances[test] < t) == issame[test]))
        assert got["auc"] == pytest.approx(skm.roc_auc_score(issame[test], -distances[test]))
        fpr, tpr, _ = skm.roc_curve(issame[test], -distances[test])
        assert got["tar_far_1e-2"] == pytest.approx(tpr[fpr <= 1e-2].max())
    assert 0.6 < got["accuracy"] < 0.95


def test_roc_points_are_means_over_sets_in_lfws_format(tmp_path):
    rng = np.random.RandomState(1)
    issame = [rng.rand(40) < 0.5 for _ in range(3)]
    distances = [rng.uniform(0, 4, 40) for _ in range(3)]
    thresholds = np.array([0.5, 1.0, 2.0, 3.5])
    tpr, fpr = protocol.roc_points(distances, issame, thresholds)
    for i, t in enumerate(thresholds):
        assert tpr[i] == pytest.approx(np.mean([np.mean(d[s] < t) for d, s in zip(distances, issame)]))
        assert fpr[i] == pytest.approx(np.mean([np.mean(d[~s] < t) for d, s in zip(distances, issame)]))
    protocol.write_roc(str(tmp_path / "roc.txt"), tpr, fpr)
    first = open(tmp_path / "roc.txt").readline().split()
    assert len(first) == 2 and float(first[0]) == pytest.approx(tpr[0])
    back = protocol.read_roc(str(tmp_path / "roc.txt"))
    np.testing.assert_allclose(back[0], tpr, atol=1e-9)


def test_lfws_standard_error_divides_by_nine():
    values = [0.9, 0.92, 0.88, 0.91, 0.9, 0.93, 0.89, 0.9, 0.92, 0.91]
    got = protocol.summary(values)
    mean = sum(values) / 10
    assert got["se"] == pytest.approx((sum((v - mean) ** 2 for v in values) / 9) ** 0.5 / 10 ** 0.5)


@pytest.fixture(scope="module")
def subset_run(tmp_path_factory):
    """A few steps of one ArcFace head over the subset's people of every View 2 set but 3 (the reader in a job)."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    tmp = tmp_path_factory.mktemp("lfw_run")
    data = {"seed": 0, "output_dir": str(tmp / "run"),
            "tasks": [{"name": "lfw", "reader": {"type": "image_folder", "root": IMAGES,
                                                 "people": os.path.join(SUBSET, "people.txt"), "exclude_sets": [3],
                                                 "min_images": 2},
                       "head": {"type": "arcface", "scale": 8.0}, "eval": None}],
            "backbone": {"type": "cnn", "in_channels": 3, "input_size": 16, "embedding_size": 16},
            "schedule": {"batch_size": 16, "steps": 6}, "optimizer": {"lr": 0.05},
            "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}}
    job = build_job(load_job(data=data))
    Trainer(job, console=lambda *a: None).run()
    return tmp / "run"


def reference_distances(run, pair_sets):
    """Each pair's squared distance of normalize(f(x) + f(flip x)), decoded and normalised here."""
    import paddle

    from mtl.data.transforms import FaceTransform
    from mtl.serving.inference import load_model

    loaded = load_model(str(run))
    loaded.model.eval()
    transform = FaceTransform(16)

    def embed(rel):
        pixels = transform.pixels(open(os.path.join(IMAGES, rel), "rb").read()).astype(np.float32)
        x = ((pixels / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None]
        both = np.concatenate([x, x[..., ::-1]])
        with paddle.no_grad():
            f = loaded.model({"image": paddle.to_tensor(np.ascontiguousarray(both))}).numpy().astype(np.float64)
        e = f[0] + f[1]
        return e / np.linalg.norm(e)

    return [np.array([np.sum((embed(a) - embed(b)) ** 2) for a, b in zip(s.first, s.second)]) for s in pair_sets]


@pytest.mark.parametrize("view,test_set", [(1, None), (2, 3)])
def test_mtl_eval_lfw_against_a_numpy_protocol(subset_run, tmp_path, view, test_set):
    import json

    from mtl.commands.evaluate_lfw import evaluate_lfw

    lines = []
    record = evaluate_lfw(str(subset_run), SUBSET, view, test_set, flip=True, out_dir=str(tmp_path),
                          console=lines.append)
    pair_sets = lfw.view_pairs(SUBSET, view)
    distances = reference_distances(subset_run, pair_sets)
    test = 1 if view == 1 else test_set - 1
    others = [k for k in range(len(pair_sets)) if k != test]
    t = loop_threshold(np.concatenate([distances[k] for k in others]),
                       np.concatenate([pair_sets[k].issame for k in others]), protocol.DEFAULT_THRESHOLDS)
    name = "pairsDevTest" if view == 1 else f"set{test_set}"
    got = record["sets"][name]
    np.testing.assert_allclose(record["distances"][name], distances[test], atol=1e-5)
    assert got["threshold"] == pytest.approx(t, abs=1e-9)
    assert got["accuracy"] == pytest.approx(np.mean((distances[test] < t) == pair_sets[test].issame))
    stem = "view1" if view == 1 else "view2_set3"
    assert json.load(open(tmp_path / f"eval_lfw_{stem}.json"))["sets"][name]["accuracy"] == got["accuracy"]
    tpr, fpr = protocol.read_roc(str(tmp_path / f"roc_lfw_{stem}.txt"))
    assert len(tpr) == len(protocol.ROC_THRESHOLDS) and tpr[-1] == 1.0 and fpr[-1] == 1.0
    assert any(f"Accuracy-Flip on {name}: {got['accuracy']:1.5f}" in line for line in lines)


def test_mtl_eval_lfw_refuses_wrong_options(subset_run, tmp_path):
    from mtl.commands.evaluate_lfw import evaluate_lfw

    with pytest.raises(ConfigError, match="--set applies to --view 2"):
        evaluate_lfw(str(subset_run), SUBSET, 1, 3)
    with pytest.raises(ConfigError, match=r"--set chooses one of View 2's ten sets \(1 to 10\)"):
        evaluate_lfw(str(subset_run), SUBSET, 2, 11)
    with pytest.raises(DataError, match=r"pairs file '.*pairsDevTrain\.txt' does not exist"):
        evaluate_lfw(str(subset_run), str(tmp_path), 1)


def test_mean_face_registration_recovers_a_known_crop():
    """tools/register_mean_faces.py: a pattern shrunk into a box of a larger image is found at that box."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from PIL import Image
    from register_mean_faces import best_boxes

    rng = np.random.default_rng(0)
    fixed = np.asarray(Image.fromarray(rng.uniform(0, 255, (8, 8)).astype(np.float32)).resize((64, 64),
                                                                                              Image.BICUBIC))
    moving = np.full((64, 64), float(fixed.mean()))
    inner = np.asarray(Image.fromarray(fixed.astype(np.float32)).resize((48, 48), Image.BILINEAR))
    moving[6:54, 10:58] = inner  # the fixed image, shrunk into the box left 10, top 6, side 48
    score, side, left, top = best_boxes(moving, fixed, smallest=40, step=2, compare=32)[0]
    assert (side, left, top) == (48, 10, 6) and score > 0.95
