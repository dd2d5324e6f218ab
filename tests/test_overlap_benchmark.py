"""tools/make_overlap_benchmark.py on the six-dataset recipe (validation people held out): every image exactly once,
held-out people untouched, the true pairs right, the condition split as documented, determinism by seed.

The references are the recipe's own list files and Extended Yale B's index.tsv, read here with csv, and the rules as
the tool's docstring states them; not the tool's helpers."""
import csv
import json
import math
import os
import zlib

import numpy as np
import pytest
import yaml

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.readers.concat import ConcatReader
from mtl.train.job import build_reader
from tools import make_overlap_benchmark as tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIX = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")
TASKS = os.path.join(ROOT, "examples", "configs", "faces_six")
SMALL = {"image_size": 8, "channels": 3}


def rows(path):
    """``[(path, label)]`` of a label list, in order."""
    with open(path) as f:
        return [(r[0], int(r[1])) for r in csv.reader(f, delimiter="\t") if r and not r[0].startswith("#")]


def azimuths():
    """``{path: light azimuth}`` of Extended Yale B."""
    with open(os.path.join(ROOT, "examples", "data", "faces", "yaleb", "index.tsv")) as f:
        return {r[0]: float(r[4]) for r in csv.reader(f, delimiter="\t") if not r[0].startswith("#")}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """``(folder, benchmark.json, the recipe's validated config)`` of F = 0.5, seed 0."""
    out = tmp_path_factory.mktemp("overlap")
    info = tool.main(["--config", SIX, "--fraction", "0.5", "--seed", "0", "--out", str(out)])
    return out, info, load_job(SIX)


def originals(cfg):
    """``{dataset: (rows of its list, held-out labels)}`` from the recipe's task files."""
    return {t["name"]: (rows(t["reader"]["list"]), sorted(t["reader"]["holdout_classes"])) for t in cfg["tasks"]}


def person_of(out, info, task):
    """``[(path, person)]`` of a source's list: classes mapped back to the data's labels (training people through
    benchmark.json, held-out people through their rank after the training people)."""
    dataset = task.rsplit("_", 1)[0]
    people = info["persons"][task] + (info["datasets"][dataset]["held_out_people"] if task.endswith("_a") else [])
    return [(path, people[label]) for path, label in rows(os.path.join(out, "lists", task + ".txt"))]


def test_every_image_exactly_once_with_its_person(bench):
    out, info, cfg = bench
    for name, (listed, _) in originals(cfg).items():
        a, b = person_of(out, info, f"{name}_a"), person_of(out, info, f"{name}_b")
        assert sorted(a + b) == sorted(listed), name  # the same (image, person) rows, each once
        assert len({p for p, _ in a + b}) == len(listed)
        order = {path: i for i, (path, _) in enumerate(listed)}
        for source in (a, b):  # each list keeps the dataset's list order
            assert [order[p] for p, _ in source] == sorted(order[p] for p, _ in source)


def test_held_out_people_untouched_and_only_in_source_a(bench):
    out, info, cfg = bench
    overlap = load_job(str(out / "faces_overlap.yaml"))
    tasks = {t["name"]: t for t in overlap["tasks"]}
    assert len(tasks) == 12
    for task in cfg["tasks"]:
        name, held = task["name"], set(task["reader"]["holdout_classes"])
        assert {p for _, p in person_of(out, info, f"{name}_b")}.isdisjoint(held)
        assert held <= {p for _, p in person_of(out, info, f"{name}_a")}
        assert not tasks[f"{name}_b"]["eval"]["enabled"]
        before = build_reader(task, {"split": "eval"}, SMALL)
        after = build_reader(tasks[f"{name}_a"], {"split": "eval"}, SMALL)
        assert after.open_set and len(after) == len(before) and np.array_equal(after.labels(), before.labels())
        for i in range(0, len(before), 5):
            assert np.array_equal(after[i]["image"], before[i]["image"]), (name, i)
        training = build_reader(tasks[f"{name}_a"], None, SMALL)
        assert set(np.asarray(training.class_labels)) == set(range(len(info["persons"][f"{name}_a"])))


def test_the_true_pairs_are_the_people_in_both_sources(bench):
    out, info, cfg = bench
    pairs = json.load(open(out / "duplicates.json"))
    assert all(set(p) == {"task_a", "class_a", "task_b", "class_b", "similarity"} for p in pairs)
    found = {}
    for p in pairs:
        person_a = info["persons"][p["task_a"]][p["class_a"]]
        assert info["persons"][p["task_b"]][p["class_b"]] == person_a
        found.setdefault(p["task_a"][:-2], set()).add(person_a)
    for name, (listed, held) in originals(cfg).items():
        a = {q for _, q in person_of(out, info, f"{name}_a")}
        b = {q for _, q in person_of(out, info, f"{name}_b")}
        training = {q for _, q in listed} - set(held)
        assert found.get(name, set()) == a & b == set(info["datasets"][name]["shared_people"]), name
        assert len(a & b) == math.floor(0.5 * len(training) + 0.5)
        drawn = np.random.default_rng([0, zlib.crc32(name.encode())]).choice(sorted(training), len(a & b), False)
        assert a & b == set(drawn.tolist())


def test_shared_people_split_by_condition_and_the_others_alternate(bench):
    out, info, cfg = bench
    light = azimuths()
    for name, (listed, held) in originals(cfg).items():
        a, b = dict(person_of(out, info, f"{name}_a")), dict(person_of(out, info, f"{name}_b"))
        shared = info["datasets"][name]["shared_people"]
        assert info["datasets"][name]["rule"] == ("light azimuth" if name == "yaleb" else "halves")
        for person in shared:
            images = [p for p, q in listed if q == person]
            if name == "yaleb":
                front = [p for p in images if light[p] == 0]
                assert {p for p in images if light[p] < 0} | set(front[0::2]) == {p for p in images if p in a}
                assert {p for p in images if light[p] > 0} | set(front[1::2]) == {p for p in images if p in b}
            else:
                half = math.ceil(len(images) / 2)
                assert [p in a for p in images] == [True] * half + [False] * (len(images) - half)
                assert [p in b for p in images] == [False] * half + [True] * (len(images) - half)
        others = sorted({q for _, q in listed} - set(held) - set(shared))
        for k, person in enumerate(others):
            images = {p for p, q in listed if q == person}
            assert images <= set(a if k % 2 == 0 else b) and images.isdisjoint(b if k % 2 == 0 else a)


def test_the_other_keys_are_kept_and_the_heads_copied(bench):
    out, _, cfg = bench
    overlap = load_job(str(out / "faces_overlap.yaml"))
    skip = ("tasks", "output_dir", "config_path", "config_dir", "source")
    assert {k: v for k, v in overlap.items() if k not in skip} == {k: v for k, v in cfg.items() if k not in skip}
    assert overlap["output_dir"] == "runs/faces_overlap"
    for task in cfg["tasks"]:
        for source in "ab":
            mine = next(t for t in overlap["tasks"] if t["name"] == f"{task['name']}_{source}")
            assert mine["head"] == task["head"] and mine["ratio"] == task["ratio"] / 2
            assert mine["loss_weight"] == task["loss_weight"] / 2  # each dataset keeps its share of the loss
            kept = ("preprocess", "augment", "type")
            assert {k: mine["reader"].get(k) for k in kept} == {k: task["reader"].get(k) for k in kept}


def test_oracle_lists_hold_the_same_training_images_with_true_persons(bench):
    """The oracle's concat (shared_labels) and the naive merge of the sources' training readers yield the same
    images in the same order; the oracle's labels are one per person over every dataset, the naive's one per source
    class."""
    out, info, cfg = bench
    overlap = load_job(str(out / "faces_overlap.yaml"))
    people, offset, lists = {}, 0, originals(cfg)  # read once (was: all six lists again for every row below)
    for name, (listed, held) in lists.items():
        people.update({(name, q): offset + i for i, q in enumerate(sorted({q for _, q in listed} - set(held)))})
        offset += len({q for _, q in listed} - set(held))
    assert info["people"] == offset
    sources = []
    for task in overlap["tasks"]:
        dataset = task["name"][:-2]
        oracle = rows(os.path.join(out, "oracle", task["name"] + ".txt"))
        held = set(lists[dataset][1])
        training = [(p, q) for p, q in person_of(out, info, task["name"]) if q not in held]
        assert oracle == [(p, people[(dataset, q)]) for p, q in training]
        sources.append({**task["reader"], "list": os.path.join(out, "oracle", task["name"] + ".txt"),
                        "holdout_classes": None, "num_classes": offset})
    oracle = ConcatReader(sources, shared_labels=True, **SMALL)
    naive = ConcatReader([t["reader"] for t in overlap["tasks"]], **SMALL)
    assert oracle.num_classes == offset and naive.num_classes == sum(len(v) for v in info["persons"].values())
    assert len(oracle) == len(naive)
    for i in range(0, len(naive), 97):
        assert np.array_equal(oracle[i]["image"], naive[i]["image"])
    with pytest.raises(ConfigError, match="shared_labels"):
        ConcatReader(sources, shared_labels="yes", **SMALL)


def two_datasets(tmp_path):
    """A variant of the recipe with Yale and UMIST only."""
    variant = tmp_path / "variant.yaml"
    variant.write_text(yaml.safe_dump({"base": SIX, "tasks": [os.path.join(TASKS, "yale.yaml"),
                                                              os.path.join(TASKS, "umist.yaml")]}))
    return str(variant)


def test_determinism_by_seed_and_the_extreme_fractions(tmp_path):
    config = two_datasets(tmp_path)

    def files(folder):
        return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
                for d, _, names in os.walk(folder) for f in names}

    first, again, other = (tool.build(config, 0.5, seed, str(tmp_path / name))
                           for seed, name in ((3, "first"), (3, "again"), (4, "other")))
    assert files(tmp_path / "first") == files(tmp_path / "again")
    assert first == again
    assert any(first["datasets"][n]["shared_people"] != other["datasets"][n]["shared_people"]
               for n in first["datasets"])
    none, every = tool.build(config, 0.0, 3, str(tmp_path / "none")), tool.build(config, 1.0, 3, str(tmp_path / "all"))
    assert json.load(open(tmp_path / "none" / "duplicates.json")) == []
    for name, d in every["datasets"].items():
        assert d["shared_people"] == d["training_people"] and not none["datasets"][name]["shared_people"]


def test_bad_arguments_are_one_sentence(tmp_path, capsys):
    with pytest.raises(SystemExit):
        tool.parse_args(["--config", SIX, "--fraction", "1.5", "--out", str(tmp_path)])
    assert "--fraction must be in [0, 1]" in capsys.readouterr().err
    digits = os.path.join(ROOT, "examples", "configs", "demo.yaml")
    with pytest.raises(ConfigError, match="no task reads an image_list"):
        tool.build(digits, 0.5, 0, str(tmp_path / "x"))
