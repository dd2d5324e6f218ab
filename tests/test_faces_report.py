"""The face report's arms (examples/faces_arms.py) without training: what each arm's runs set, how each samples, the
held-out images' condition sides, the command line. The report's pipeline itself runs in tests/test_faces_six.py.

References: the recipe's list files and index.tsv read with csv, the schedule's own step batches (naive and oracle
must draw the same images at every step), the arms as the issue states them."""
import csv
import os

import numpy as np
import pytest
import yaml

from examples import faces_report
from examples.faces_arms import Benchmark, Recipe
from mtl.config.loading import load_job
from mtl.config.overrides import parse_override
from mtl.data.scheduler import build_schedule
from mtl.data.steps import StepDataset
from mtl.train.job import build_reader
from tests.references.steps import step_samples
from tools import make_overlap_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIX = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")
TASKS = os.path.join(ROOT, "examples", "configs", "faces_six")
SMALL = {"image_size": 8, "channels": 3}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """``(benchmark config, Recipe)`` of a Yale + UMIST + Extended Yale B variant at F = 0.5."""
    folder = tmp_path_factory.mktemp("bench")
    variant = folder / "variant.yaml"
    variant.write_text(yaml.safe_dump({"base": SIX, "tasks": [os.path.join(TASKS, f"{n}.yaml")
                                                              for n in ("yale", "umist", "yaleb")]}))
    make_overlap_benchmark.build(str(variant), 0.5, 0, str(folder / "b"))
    config = str(folder / "b" / "faces_overlap.yaml")
    return config, Recipe(load_job(config), Benchmark.beside(config))


def one_head_job(recipe, task, tmp_path, name):
    """The validated job of a one-head arm whose task mapping is ``task``."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(task))
    return load_job(recipe.cfg["config_path"], [f"tasks=[{path}]", "cross_negatives.rate=0"])


def test_naive_and_oracle_draw_the_same_images_at_every_step(bench, tmp_path):
    """Same task name, same readers in the same order: the schedule draws the same images (and augmentation) at
    every step; only the labels differ, a person's two source classes becoming one class."""
    config, recipe = bench
    batches = {}
    for name, task in (("naive", recipe.merged_task()), ("oracle", recipe.oracle_task())):
        cfg = one_head_job(recipe, task, tmp_path, name)
        readers = {"merged": build_reader(cfg["tasks"][0], None, SMALL)}
        schedule = build_schedule(dict(cfg["schedule"], batch_size=48), cfg["tasks"], [len(readers["merged"])],
                                  cfg["seed"])
        steps = StepDataset(schedule, readers, cfg["seed"], 0, 40)
        batches[name] = [steps[s]["merged"] for s in (0, 1, 39)]
        drawn = [step_samples(steps, s)["merged"] for s in (0, 1, 39)]
        batches[name + "_indices"] = drawn
    for naive, oracle in zip(batches["naive"], batches["oracle"]):
        assert np.array_equal(naive["image"], oracle["image"])
    assert [i.tolist() for i in batches["naive_indices"]] == [i.tolist() for i in batches["oracle_indices"]]
    naive = np.concatenate([b["label"] for b in batches["naive"]])
    oracle = np.concatenate([b["label"] for b in batches["oracle"]])
    assert all(len(set(oracle[naive == c])) == 1 for c in set(naive.tolist()))  # one person per naive class
    assert len(set(naive.tolist())) > len(set(oracle.tolist()))  # duplicates merged


def test_the_arms_set_what_the_issue_names(bench):
    config, recipe = bench
    expected = {"dropout": {"tasks": "all", "rate": 1.0e-4, "mask": "none"},
                "cross": {"tasks": "all", "rate": 1.0, "mask": "online"},
                "cross_oracle": {"tasks": "all", "rate": 1.0, "mask": "pairs",
                                 "pairs": os.path.join(os.path.dirname(config), "duplicates.json")}}
    for arm, spec in expected.items():
        (name, overrides), = recipe.runs(arm, ["head.scale=12"])
        assert name == arm and parse_override(overrides[0]) == (["cross_negatives"], spec)
        assert overrides[1:] == [f"tasks.{n}.head.scale=12" for n in range(6)]
    assert recipe.runs("separate") == [("separate", ["cross_negatives.rate=0"])]  # the recipe's own negatives off
    for arm, placeholder in (("naive", "MERGED_TASK_FILE"), ("oracle", "ORACLE_TASK_FILE")):
        (name, overrides), = recipe.runs(arm)
        assert overrides == [f"tasks=[{placeholder}]", "schedule.batch_size=192", "cross_negatives.rate=0"]
    assert [t["name"] for t in recipe.identity] == [f"{n}_{s}" for n in ("yale", "umist", "yaleb") for s in "ab"]
    assert sorted(recipe.eval_readers) == ["umist_a", "yale_a", "yaleb_a"]


def test_sampling_per_arm_from_the_lists(bench):
    """Separate arms: each source's ratio share (32 of 192 each); merged arms: the merged share in proportion to each
    dataset's training images, counted here from the lists."""
    config, recipe = bench
    folder = os.path.dirname(config)
    info = recipe.benchmark.info
    images = {}
    for name, d in info["datasets"].items():
        for task in d["tasks"]:
            with open(os.path.join(folder, "oracle", task + ".txt")) as f:
                images[name] = images.get(name, 0) + sum(1 for line in f if not line.startswith("#"))
    total = sum(images.values())
    for arm in ("naive", "oracle"):
        assert recipe.sampling(arm) == {n: round(192 * c / total, 2) for n, c in images.items()}
    assert recipe.sampling("separate") == recipe.sampling("cross") == {n: 64.0 for n in images}


def test_held_out_sides_follow_the_light_and_the_halves(bench):
    _, recipe = bench
    with open(os.path.join(ROOT, "examples", "data", "faces", "yaleb", "index.tsv")) as f:
        light = [(r[0], int(r[1]) - 1, float(r[4])) for r in csv.reader(f, delimiter="\t") if not r[0].startswith("#")]
    held = set(recipe.benchmark.info["datasets"]["yaleb"]["held_out_people"])
    expected = [0 if a < 0 else 1 if a > 0 else -1 for _, p, a in light if p in held]
    assert recipe.sides["yaleb_a"].tolist() == expected
    labels = recipe.eval_readers["umist_a"].labels()
    for person in np.unique(labels):
        sides = recipe.sides["umist_a"][labels == person]
        half = -(-len(sides) // 2)
        assert sides.tolist() == [0] * half + [1] * (len(sides) - half)


def test_command_line_arms(bench, capsys):
    config, _ = bench
    assert faces_report.parse_args(["--config", config]).arms == ["naive", "oracle", "separate", "dropout",
                                                                  "cross", "cross_oracle", "two_stage"]
    assert faces_report.parse_args([]).arms == ["separate", "merged", "cross", "two_stage"]
    assert faces_report.parse_args(["--only", "joint", "alone", "merged"]).arms == ["separate", "alone", "merged"]
    for argv, words in ((["--arms", "oracle"], "needs the overlap benchmark"), (["--arms", "orcale"], "unknown arm"),
                        (["--arms", "cross", "--only", "joint"], "cannot be combined"),
                        (["--arms", "two_stage"], "needs separate too")):
        with pytest.raises(SystemExit):
            faces_report.parse_args(argv)
        assert words in capsys.readouterr().err


def test_every_arm_trains_the_steps_the_epochs_give_the_joint_job(bench):
    """A config given in epochs: each dataset alone and the merged arms would count the epochs over their own first
    task (other steps, the review of 2026-12-04 found); every arm's runs take the joint job's steps instead."""
    from mtl.train.job import planned_steps

    config, _ = bench
    recipe = Recipe(load_job(config, ["schedule.epochs=2"]), Benchmark.beside(config))
    joint = planned_steps(recipe.cfg)
    alone = {}
    for name, overrides in recipe.runs("alone"):
        cfg = load_job(config, ["schedule.epochs=2", *overrides])
        alone[name] = planned_steps(cfg)
        own = [o for o in overrides if not o.startswith("schedule.steps")]
        unpinned = load_job(config, ["schedule.epochs=2", *own])
        alone[name + " unpinned"] = planned_steps(unpinned)
    assert {v for k, v in alone.items() if "unpinned" not in k} == {joint}
    assert len({v for k, v in alone.items() if "unpinned" in k}) > 1  # the pin matters: their own epochs differ
    for arm in ("merged", "naive", "oracle"):
        (_, overrides), = recipe.runs(arm)
        assert f"schedule.steps={joint}" in overrides
