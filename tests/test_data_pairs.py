"""``mtl data pairs`` (mtl/commands/data_pairs.py), issue 53 item 26: a verification pairs list of held-out people.

References: pair counts from combinatorics (every same-person pair, sum of n (n - 1) / 2, below the cap), each line's
kind from the folder names of its two images (read off the paths here), the held-out people of a task file from its
list read here, and the written list read back by ``mtl eval``'s own reader of pairs lists.
"""
import os
from collections import Counter
from itertools import combinations

import numpy as np
import pytest
from PIL import Image

from mtl.data.verification_sets import read_pairs
from tests.cli_run import cli, cli_output

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORL = os.path.join(ROOT, "examples", "data", "orl")
COUNTS = {"ann": 4, "bob": 3, "cid": 1, "dee": 5}


@pytest.fixture
def people(tmp_path):
    """A folder of person folders (4, 3, 1 and 5 small PNGs) and a stray file beside them."""
    rng = np.random.default_rng(0)
    for name, count in COUNTS.items():
        (tmp_path / "people" / name).mkdir(parents=True)
        for k in range(count):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "people" / name /
                                                                                 f"{k}.png")
    return tmp_path / "people"


def read_lines(path):
    """``[(image 1, image 2, same)]`` of a pairs list, paths resolved against its folder."""
    folder = os.path.dirname(os.path.abspath(path))
    out = []
    for line in open(path):
        a, b, same = line.rstrip("\n").split("\t")
        out.append((os.path.normpath(os.path.join(folder, a)), os.path.normpath(os.path.join(folder, b)), same))
    return out


def person(path):
    """The person of an image: its folder's name."""
    return os.path.basename(os.path.dirname(path))


def test_every_same_person_pair_and_as_many_others_from_a_folder(people, tmp_path, capsys):
    out = tmp_path / "lists" / "pairs.txt"  # a folder that does not exist yet
    code, said, err = cli_output(["data", "pairs", people, out], capsys)
    assert code == 0, err
    lines = read_lines(out)
    same = [line for line in lines if line[2] == "1"]
    expected = sum(n * (n - 1) // 2 for n in COUNTS.values())  # 6 + 3 + 0 + 10
    assert len(same) == expected == 19 and len(lines) == 2 * expected
    assert all((person(a) == person(b)) == (s == "1") for a, b, s in lines)  # each line's kind is true
    assert {frozenset(line[:2]) for line in same} == {
        frozenset((str(people / n / f"{i}.png"), str(people / n / f"{j}.png")))
        for n, c in COUNTS.items() for i, j in combinations(range(c), 2)}
    assert len({frozenset(line[:2]) for line in lines}) == len(lines)  # no pair twice, no image with itself
    assert all(os.path.isfile(a) and os.path.isfile(b) for a, b, _ in lines)
    loaded = read_pairs(str(out), image_size=8)  # what mtl eval --sets reads
    assert loaded.num_pairs == 38 and loaded.issame.tolist() == [s == "1" for *_, s in lines]
    assert "wrote 38 pairs (19 same-person, 19 different-person) of 4 people (13 images)" in said
    assert "too small" in said and f"mtl eval RUN_DIR --sets {out}" in said  # fewer than 20 of a kind: said


def test_the_cap_the_seed_and_the_people_chosen(people, tmp_path, capsys):
    for name, argv in (("a", ["--positive", "5"]), ("b", ["--positive", "5"]), ("c", ["--positive", "5", "--seed",
                                                                                     "1"])):
        assert cli(["data", "pairs", people, tmp_path / f"{name}.txt", *argv], capsys)[0] == 0
    a, b, c = (read_lines(tmp_path / f"{n}.txt") for n in "abc")
    assert Counter(s for *_, s in a) == {"1": 5, "0": 5}
    assert a == b and a != c  # the seed decides which pairs
    code, err = cli(["data", "pairs", people, tmp_path / "d.txt", "--people", "ann", "3"], capsys)  # dee by label
    assert code == 0, err
    chosen = read_lines(tmp_path / "d.txt")
    assert {person(p) for a_, b_, _ in chosen for p in (a_, b_)} == {"ann", "dee"}
    assert sum(s == "1" for *_, s in chosen) == 6 + 10


def test_a_task_files_held_out_people(tmp_path, capsys):
    """orl_a.yaml holds out people 21-30 (labels 20-29 of its list, ten images each): their 450 same-person pairs."""
    task = os.path.join(ROOT, "examples", "configs", "faces_orl", "orl_a.yaml")
    code, err = cli(["data", "pairs", task, tmp_path / "orl.txt"], capsys)
    assert code == 0, err
    rows = [line.rstrip("\n").split("\t") for line in open(os.path.join(ORL, "orl_a.txt"))
            if line.strip() and not line.startswith("#")]
    held = {os.path.normpath(os.path.join(ORL, p)) for p, label in rows if int(label) >= 20}
    lines = read_lines(tmp_path / "orl.txt")
    assert {p for a, b, _ in lines for p in (a, b)} <= held and len(held) == 100
    assert Counter(s for *_, s in lines) == {"1": 450, "0": 450}
    assert all((person(a) == person(b)) == (s == "1") for a, b, s in lines)
    code, err = cli(["data", "pairs", task, tmp_path / "two.txt", "--people", "s21", "s22"], capsys)
    assert code == 0 and {person(p) for a, b, _ in read_lines(tmp_path / "two.txt") for p in (a, b)} == {"s21", "s22"}


def test_refusals_are_one_sentence(people, tmp_path, capsys):
    (tmp_path / "there.txt").write_text("kept\n")
    code, err = cli(["data", "pairs", people, tmp_path / "there.txt"], capsys)
    assert code != 0 and "exists" in err and (tmp_path / "there.txt").read_text() == "kept\n"
    code, err = cli(["data", "pairs", people, tmp_path / "x.txt", "--people", "anne"], capsys)
    assert code != 0 and "'anne' is not a person" in err and "did you mean 'ann'" in err
    code, err = cli(["data", "pairs", people, tmp_path / "x.txt", "--people", "cid"], capsys)
    assert code != 0 and "make no pair of each kind" in err
    code, err = cli(["data", "pairs", people, tmp_path / "x.txt", "--positive", "0"], capsys)
    assert code != 0 and "--positive" in err
    task = tmp_path / "no_holdout.yaml"
    task.write_text(f"name: t\nreader: {{type: image_list, list: {os.path.join(ORL, 'orl_a.txt')}, "
                    "eval_fraction: 0.2}\nhead: arcface\n")
    code, err = cli(["data", "pairs", task, tmp_path / "x.txt"], capsys)
    assert code != 0 and "holds out no people" in err
    code, err = cli(["data", "pairs", tmp_path / "missing", tmp_path / "x.txt"], capsys)
    assert code != 0 and "does not exist" in err
    from mtl.writers.pack import pack

    pack(str(people), str(tmp_path / "rec" / "train"))
    code, err = cli(["data", "pairs", tmp_path / "rec", tmp_path / "x.txt"], capsys)
    assert code != 0 and "RecordIO pack" in err and "give the folder or label list" in err
    assert not (tmp_path / "x.txt").exists() and "Traceback" not in err
