"""The real-face pieces: open-set splits, the pairs builder, augmentation, PGM packing and a shortened ORL recipe.

References: held-out identities are checked against the list file's labels; pair counts against combinatorics
(sum over identities of n_c (n_c - 1) / 2); augmentation against the formula applied by hand to Pillow's decode
with the same documented draws; packed pixels against Pillow decoding the source PGM files.
"""
import json
import os
import sys

import numpy as np
import pytest
from PIL import Image

from mtl.commands import data as datatools
from mtl.core.errors import ConfigError
from mtl.data.recordio import RecordIOReader, unpack
from mtl.data.transforms import Augment, normalize, to_pixels
from mtl.evaluation.pairs import open_set_pairs, open_set_verification
from mtl.readers.image_list import ImageListReader
from mtl.readers.recordio_reader import image_rows
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORL = os.path.join(ROOT, "examples", "data", "orl")
LIST_A = os.path.join(ORL, "orl_a.txt")


def list_labels(path):
    """Labels of a label list, read here without the reader."""
    rows = [line.split("\t") for line in open(path) if line.strip() and not line.startswith("#")]
    return np.array([int(r[1]) for r in rows])


# ----------------------------------------------------------------------------------------------- open-set splits
def test_held_out_identities_never_reach_training_over_an_epoch():
    train = ImageListReader(LIST_A, holdout_classes=5, seed=3, image_size=16)
    held = set(train.held_out_labels.tolist())
    assert len(held) == 5 and held <= set(list_labels(LIST_A).tolist())
    seen = {int(train.class_labels[train[i]["label"]]) for i in range(len(train))}  # a whole epoch, decoded
    assert not seen & held
    assert seen == set(list_labels(LIST_A).tolist()) - held
    assert train.num_classes == len(seen) and not train.open_set
    evaluation = ImageListReader(LIST_A, holdout_classes=5, seed=3, image_size=16, split="eval")
    assert evaluation.open_set and set(evaluation.class_labels.tolist()) == held
    assert len(evaluation) == sum(np.isin(list_labels(LIST_A), list(held)))
    # deterministic from the seed; another seed picks other people
    again = ImageListReader(LIST_A, holdout_classes=5, seed=3, image_size=16)
    assert again.held_out_labels.tolist() == train.held_out_labels.tolist()
    other = ImageListReader(LIST_A, holdout_classes=5, seed=4, image_size=16)
    assert other.held_out_labels.tolist() != train.held_out_labels.tolist()


def test_holdout_as_list_fraction_and_errors():
    people = np.unique(list_labels(LIST_A))  # 24 people
    listed = ImageListReader(LIST_A, holdout_classes=[0, 5], image_size=16, split="eval")
    assert listed.held_out_labels.tolist() == [0, 5] and sorted(set(listed.labels().tolist())) == [0, 1]
    assert len(ImageListReader(LIST_A, holdout_classes=0.25, image_size=16).held_out_labels) == round(0.25 * 24)
    for bad, words in (([99], "does not hold"), (24, "nothing is left"), (1.5, "fraction"), ("x", "list of labels")):
        with pytest.raises(ConfigError, match=words):
            ImageListReader(LIST_A, holdout_classes=bad, image_size=16)
    with pytest.raises(ConfigError, match="cannot be combined"):
        ImageListReader(LIST_A, holdout_classes=2, eval_fraction=0.2, image_size=16)
    assert len(people) == 24


def test_pairs_builder_counts():
    labels = np.repeat([0, 1, 2, 3], [5, 4, 1, 3])
    first, second, issame = open_set_pairs(labels, max_positive=1000, seed=0)
    expected_positive = 5 * 4 // 2 + 4 * 3 // 2 + 0 + 3 * 2 // 2
    assert issame.sum() == expected_positive and (~issame).sum() == expected_positive
    assert issame[0::2].all() and not issame[1::2].any()  # alternating
    assert np.array_equal(labels[first] == labels[second], issame)
    pairs = {tuple(sorted(p)) for p in zip(first.tolist(), second.tolist())}
    assert len(pairs) == 2 * expected_positive and all(a != b for a, b in pairs)  # no repeats, no self-pairs
    capped = open_set_pairs(labels, max_positive=7, seed=0)
    assert capped[2].sum() == 7 and (~capped[2]).sum() == 7
    again = open_set_pairs(labels, max_positive=7, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(capped, again))


def test_open_set_verification_separates_identities():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 5)
    centres = rng.standard_normal((6, 32))
    result = open_set_verification(centres[labels] + 0.05 * rng.standard_normal((30, 32)), labels)
    assert result["verification_accuracy"] >= 0.98 and result["verification_pairs"] == 2 * 6 * 10
    noise = open_set_verification(rng.standard_normal((30, 32)), labels)
    assert noise["verification_accuracy"] < 0.8


# ----------------------------------------------------------------------------------------------- augmentation
def test_augmentation_deterministic_and_off_for_evaluation():
    augment = {"crop_scale": 0.7, "rotate": 15, "translate": 0.05, "brightness": 0.3, "contrast": 0.3, "erase": 0.5}
    a = ImageListReader(LIST_A, image_size=32, augment=augment, seed=7)
    b = ImageListReader(LIST_A, image_size=32, augment=augment, seed=7)
    for index, epoch in ((0, 0), (3, 1), (40, 5)):
        assert np.array_equal(a[(index, epoch)]["image"], b[(index, epoch)]["image"])
    assert not np.array_equal(a[(3, 0)]["image"], a[(3, 1)]["image"])  # another epoch, another view
    plain = ImageListReader(LIST_A, image_size=32)
    assert not np.array_equal(a[(3, 0)]["image"], plain[3]["image"])
    evaluation = ImageListReader(LIST_A, image_size=32, augment=augment, split="eval", holdout_classes=2)
    reference = ImageListReader(LIST_A, image_size=32, split="eval", holdout_classes=2)
    for i in (0, 7):
        assert np.array_equal(evaluation[(i, 3)]["image"], reference[(i, 3)]["image"])
    a.set_augmentation(False)
    assert np.array_equal(a[(3, 0)]["image"], plain[(3, 0)]["image"])


def test_brightness_contrast_match_hand_computation():
    pixels = to_pixels(Image.open(os.path.join(ORL, "s1", "1.png")).convert("RGB"), 24)
    out = Augment(brightness=0.4, contrast=0.3)(pixels, False, 11, 2, 5)
    rng = np.random.default_rng([11, 2, 5])  # the documented draw order: brightness, then contrast
    b, c = rng.uniform(0.6, 1.4), rng.uniform(0.7, 1.3)
    x = np.clip(pixels.astype(np.float64) * b, 0, None)  # brightness on the [0, 255] scale
    y = x.transpose(2, 0, 1) / 127.5 - 1.0
    y = np.clip((y - y.mean()) * c + y.mean(), -1.0, 1.0)
    assert np.allclose(out, y, atol=1e-5)
    assert np.array_equal(normalize(pixels), Augment()(pixels, False, 11, 2, 5))  # nothing configured: identity


def test_augment_config_errors():
    for cfg, words in (({"rotat": 5}, "unknown key"), ({"erase": 2}, "augment.erase"), ("yes", "mapping")):
        with pytest.raises(ConfigError, match=words):
            ImageListReader(LIST_A, image_size=16, augment=cfg)


# ----------------------------------------------------------------------------------------------- packing
@pytest.mark.parametrize("ext", ["pgm", "tiff", "bmp"])
def test_pack_folder_of_any_format_round_trips_pixel_exactly(tmp_path, ext):
    sources = {}
    for person in (1, 2):
        os.makedirs(tmp_path / "faces" / f"s{person}")
        for k in (1, 2, 3):
            image = Image.open(os.path.join(ORL, f"s{person}", f"{k}.png"))
            path = str(tmp_path / "faces" / f"s{person}" / f"{k}.{ext}")
            image.save(path)
            sources[(person - 1, k)] = np.asarray(Image.open(path).convert("RGB"))
    summary = datatools.pack(str(tmp_path / "faces"), str(tmp_path / "out" / "train"))
    assert (summary["records"], summary["classes"], summary["image_size"]) == (6, 2, "92x112")
    records = RecordIOReader(str(tmp_path / "out" / "train.rec"), str(tmp_path / "out" / "train.idx"))
    rows, classes = image_rows(records)
    assert classes == 2
    for n, row in enumerate(rows):
        header, data = unpack(records.read_row(int(row)))
        decoded = np.asarray(Image.open(__import__("io").BytesIO(data)).convert("RGB"))
        assert np.array_equal(decoded, sources[(int(header.label), n % 3 + 1)])


# ----------------------------------------------------------------------------------------------- the recipe
@pytest.mark.slow
def test_shortened_orl_recipe_runs_and_evaluates_unseen_people(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "examples", "train_joint.py"),
                           os.path.join(ROOT, "examples", "configs", "faces_orl.yaml"), "--set",
                           f"output_dir={tmp_path / 'run'}", "log.progress=false", "log.plot=false",
                           "schedule.steps=6", "averaging.min_average_window=2"],
                          capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.load(open(tmp_path / "run" / "summary.json"))
    assert set(summary["tasks"]) == {"orl_a", "orl_b"}
    for info in summary["tasks"].values():
        # people 21-30: 10 x C(10, 2) = 450 positive pairs and as many negatives; chance is 0.5 +- 0.017 on 900
        # pairs and an untrained CNN 0.79 (docs/faces.md): 0.7 is far from chance, not a trained-model claim
        assert info["eval_averaged"]["verification_pairs"] == 900
        assert 0.7 <= info["eval_averaged"]["verification_accuracy"] <= 1.0
    overlap = warm_python.run([sys.executable, "-m", "mtl.cli", "overlap", str(tmp_path / "run"), "--json",
                              str(tmp_path / "o.json"), "--sets"], capture_output=True, text=True, env=env,
                             cwd=str(tmp_path), timeout=600)
    assert overlap.returncode == 0, overlap.stderr[-3000:]
    found = sorted(json.load(open(tmp_path / "o.json")), key=lambda m: -m["similarity"])
    assert found and all(set(m) == {"task_a", "label_a", "name_a", "task_b", "label_b", "name_b", "similarity"}
                     for m in found)
    # people 7-14 are in both datasets: 8 of the 14 x 14 class pairs are one person (by the list files' labels, which
    # mtl overlap gives: the recipe's task files hold people 21-30 out and their heads renumber the rest)
    same = [m["label_a"] == m["label_b"] for m in found[:5]]
    assert same[0] and sum(same) >= 3, found[:5]  # chance: 0.04 for the first, 0.2 of the five
    assert "verification images are as close to a training identity" in overlap.stdout
