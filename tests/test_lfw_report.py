"""The LFW report (issue 52) on a shortened run over the vendored subset, and the recipe's step at 1 and 2 processes.

The outside dataset is made here: numbered person folders holding copies of two people of View 2's set 3 (planted
test people), a copy of one training person, and people of the Yale faces (strangers). The report's filter must
remove the planted test people before any arm trains; no arm's training data may then hold an image of a set-3
person, whichever dataset brings it (checked by name for LFW, by the bytes of every image for the outside data)."""
import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pytest
import yaml

from mtl.data.lfw import read_people
from tests import warm_python
from tests.dist_util import ROOT
from tests.shared_runs import one_process_run, two_process_run

SUBSET = os.path.join(ROOT, "examples", "data", "lfw_subset")
YALE = os.path.join(ROOT, "examples", "data", "faces", "yale")
RECIPE = os.path.join(ROOT, "examples", "configs", "lfw_glint.yaml")
STEPS = 6


def set_people(number):
    return [p.name for p in read_people(os.path.join(SUBSET, "people.txt"))[number - 1]]


def make_outside(folder):
    """Planted copies: 9001 and 9002 are set-3 people (test people of split set3), 9003 a training person;
    Yale's s1..s4 are strangers. Returns {outside class: the LFW person it copies}."""
    test = [p for p in read_people(os.path.join(SUBSET, "people.txt"))[2] if p.images >= 2][:2]
    training = [p for p in read_people(os.path.join(SUBSET, "people.txt"))[0] if p.images >= 2][:1]
    copies = {"9001": test[0].name, "9002": test[1].name, "9003": training[0].name}
    for number, name in copies.items():
        shutil.copytree(os.path.join(SUBSET, "images", name), os.path.join(folder, number))
    for person in ("s1", "s2", "s3", "s4"):
        shutil.copytree(os.path.join(YALE, person), os.path.join(folder, f"yale_{person}"))
    return copies


def digests(paths):
    return {hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


def training_files(job_file):
    """Every image file the job's tasks train on, built as the job builds its readers."""
    from mtl.config.loading import load_job
    from mtl.core import registry

    job = load_job(job_file)
    files = []
    for task in job["tasks"]:
        files += registry.build("reader", task["reader"], image_size=32).sample_files()
    return files


def same_framing_recipe(folder):
    """The recipe with its tasks inline and the outside task framed as the LFW task (its crop), so that a planted
    copy of an LFW image embeds exactly as the original does, even with a model of a few steps."""
    recipe = yaml.safe_load(open(RECIPE))
    tasks = [yaml.safe_load(open(os.path.join(os.path.dirname(RECIPE), t))) for t in recipe["tasks"]]
    tasks[1]["reader"]["preprocess"] = tasks[0]["reader"]["preprocess"]
    recipe["tasks"] = tasks
    path = os.path.join(folder, "recipe.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(recipe, f)
    return path


@pytest.mark.slow
@pytest.mark.subprocess
def test_report_on_a_shortened_view2_split_keeps_every_test_person_out(tmp_path):
    outside = tmp_path / "outside"
    copies = make_outside(str(outside))
    out = tmp_path / "out"
    recipe = same_framing_recipe(str(tmp_path))
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "examples", "lfw_report.py"), "--lfw", SUBSET,
                            "--config", recipe,
                            "--glint", str(outside), "--view", "2", "--sets", "3", "--steps", str(STEPS),
                            "--filter-threshold", "0.9999", "--threads", "1", "--out", str(out),
                            "--json", str(tmp_path / "r.json"), "--variants-tried", "7"],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[5/5] " in proc.stdout and "min left" in proc.stdout
    report = json.load(open(tmp_path / "r.json"))
    assert set(report["arms"]) == {"lfw_alone", "separate", "naive", "dedup", "cross"}
    for arm in report["arms"].values():
        assert len(arm["accuracy"]) == 1 and 0.0 <= arm["accuracy"][0] <= 1.0 and len(arm["auc"]) == 1
    removed = {(r["class"], r["person"]) for r in report["removed"]["set3"]}
    assert removed == {("9001", copies["9001"]), ("9002", copies["9002"])}
    assert [d[:2] for d in report["duplicates"]] == [["9003", copies["9003"]]]
    assert report["variants_tried"] == 7 and (out / "report.md").is_file() and (out / "roc.png").stat().st_size
    test_names = set(set_people(3))
    test_images = digests(os.path.join(SUBSET, "images", n, f) for n in test_names
                          for f in os.listdir(os.path.join(SUBSET, "images", n)))
    for arm in report["arms"]:
        files = training_files(str(out / arm / "set3" / "job_asked.yaml"))
        assert files and not {os.path.basename(os.path.dirname(f)) for f in files} & test_names, arm
        assert not digests(files) & test_images, arm  # no copy of a test person's image, under any name
        assert os.path.isdir(out / arm / "set3" / "export")
    kept = open(out / "filter" / "set3" / "kept.txt").read()
    assert "9001" not in kept and "9003" in kept
    again = warm_python.run([sys.executable, os.path.join(ROOT, "examples", "lfw_report.py"), "--lfw", SUBSET,
                             "--config", recipe, "--glint", str(outside), "--view", "2", "--sets", "3",
                             "--steps", str(STEPS),
                             "--filter-threshold", "0.9999", "--threads", "1", "--out", str(out), "--reuse",
                             "--arms", "lfw_alone", "cross"], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("kept (--reuse)") == 2


def recipe_argv(folder):
    """The recipe on the subset (View 1's training people) and Yale as the outside data, a same-person pair given
    by name, synchronised BatchNorm so that 1 and 2 processes compute the same statistics."""
    pairs = os.path.join(folder, "pairs.json")
    lfw_person = [p.name for p in read_people(os.path.join(SUBSET, "peopleDevTrain.txt"))[0] if p.images >= 2][0]
    with open(pairs, "w") as f:
        json.dump([{"task_a": "glint", "name_a": "s1", "task_b": "lfw", "name_b": lfw_person}], f)
    return [RECIPE, "--set", f"output_dir={folder}", f"tasks.0.reader.root={SUBSET}/images",
            f"tasks.0.reader.people={SUBSET}/peopleDevTrain.txt", f"tasks.1.reader.root={YALE}",
            "cross_negatives.mask=pairs", f"cross_negatives.pairs={pairs}", f"schedule.steps={STEPS}",
            "schedule.batch_size=16", "distributed.sync_bn=true", "log.every=1", "log.progress=false",
            "log.plot=false", "data.num_workers=0", "optimizer.warmup_steps=2"]


@one_process_run("lfw_recipe")
def _one_recipe(folder):
    return recipe_argv(str(folder)), str(folder)


@two_process_run("lfw_recipe")
def _two_recipe(folder):
    return {"train": recipe_argv(str(folder))}, str(folder)


def step_records(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


@pytest.mark.distributed
@pytest.mark.two_process_runs("lfw_recipe")
def test_the_recipes_step_agrees_at_one_and_two_processes(one_process, two_process):
    a, b = step_records(one_process["lfw_recipe"]), step_records(two_process["lfw_recipe"])
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    # The first two steps: the forward and backward at equal weights, then after one update. Later steps drift apart
    # (the sum over 2 processes rounds differently, and the recipe's rate amplifies it: at step 5 the losses differ
    # by 1.6 % on these LFW crops; with a rate of 1e-9 all six steps agree within 1e-4): they are held to 5 %, which
    # a wrong sum, scale or mask of the distributed step exceeds at once.
    def worst(pairs):
        return max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8) for ra, rb in pairs for k in ra
                   if k.startswith("loss") or k == "grad_norm")
    assert worst(zip(a[:2], b[:2])) <= 1e-4, worst(zip(a[:2], b[:2]))
    assert worst(zip(a, b)) <= 0.05, worst(zip(a, b))
    assert {"loss/lfw", "loss/glint"} <= set(a[0])
    job = yaml.safe_load(open(os.path.join(one_process["lfw_recipe"], "job.json")))
    assert job["cross_negatives"]["mask"] == "pairs"
    assert np.isfinite([r["loss"] for r in a]).all()


class PlantedMatcher:
    """A stand-in for the independent matcher: each image's descriptor is its person's vector plus noise, all of
    them shifted by one large common offset (dlib's descriptors are not centred: strangers' cosines near 0.84)."""

    def __init__(self, seed=0):
        self.rng, self.people, self.asked = np.random.default_rng(seed), {}, []

    def features(self, paths, progress=None):
        self.asked += list(paths)
        out = []
        for path in paths:
            person = os.path.basename(os.path.dirname(path))
            person = COPIES.get(person, person)
            if person not in self.people:
                self.people[person] = self.rng.standard_normal(16)
            out.append(20.0 + self.people[person] + 0.3 * self.rng.standard_normal(16))
        return np.stack(out)


COPIES = {}


def test_the_filter_with_an_independent_matcher_finds_the_planted_copies(tmp_path):
    """With the independent matcher's descriptors (uncentred, as dlib's are), the planted copies of set-3 people are
    found as test people and the copy of a training person as a pair; every image is described once."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from lfw_arms import recipe_tasks
    from lfw_filter import build_reader, matcher_identities

    from mtl.data.lfw import Split
    from mtl.evaluation.contamination import decide

    outside = tmp_path / "outside"
    copies = make_outside(str(outside))
    COPIES.clear()
    COPIES.update(copies)
    _, tasks = recipe_tasks(RECIPE)
    split = Split(2, 3)
    readers = {"glint": build_reader(str(outside), {}, 16, tasks["glint"]),
               "test": build_reader(os.path.join(SUBSET, "images"), split.test_people(SUBSET), 16, tasks["lfw"]),
               "lfw": build_reader(os.path.join(SUBSET, "images"), split.train_people(SUBSET), 16, tasks["lfw"])}
    matcher = PlantedMatcher()
    found = matcher_identities(matcher, readers, per_class=20)
    decision = decide(found["glint"], found["test"], found["lfw"])
    assert {(r["class"], r["person"]) for r in decision.removed} == {("9001", copies["9001"]),
                                                                       ("9002", copies["9002"])}
    assert [(p["name_a"], p["name_b"]) for p in decision.pairs] == [("9003", copies["9003"])]
    assert len(matcher.asked) == sum(len(r) for r in readers.values())  # every image once (people here have <= 20)


def test_the_merged_lists_mix_the_datasets_as_the_separate_heads_batches_do(tmp_path):
    """lfw_filter.balance repeats each LFW line so that LFW's share of the merged list is its ratio's share."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from lfw_filter import balance, lfw_repeat

    lfw_root = tmp_path / "lfw" / "images"
    listing = tmp_path / "merged" / "train.txt"
    os.makedirs(listing.parent)
    lines = [f"../lfw/images/P{i}/P{i}_0001.jpg\t{i}\n" for i in range(30)]
    lines += [f"../glint/{c}/{j:04d}.jpg\t{30 + c}\n" for c in range(2) for j in range(20)]
    listing.write_text("# merged\n" + "".join(lines))
    tasks = {"lfw": {"ratio": 0.75}, "glint": {"ratio": 0.25}}
    repeat = lfw_repeat(tasks, 30, 40)
    assert repeat == round(3 * 40 / 30) == 4
    balance(str(listing), str(tmp_path / "merged" / "balanced.txt"), str(lfw_root), repeat)
    out = (tmp_path / "merged" / "balanced.txt").read_text().splitlines()
    assert out[0] == "# merged" and len([x for x in out if "lfw/images" in x]) == 120
    assert sorted(x for x in out[1:] if "glint" in x) == sorted(x.rstrip("\n") for x in lines[30:])
    assert lfw_repeat(tasks, 100, 10) == 1  # never fewer than once


def test_the_table_reads_the_reports_json():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from lfw_tables import section

    data = {"view": 2, "arms": {"lfw_alone": {"accuracy": [0.9, 0.8], "mean": 0.85, "se": 0.05, "auc": [0.95, 0.93],
                                              "tar_far_1e-2": [0.5, 0.4]}},
            "differences": {"cross-lfw_alone": {"mean": 0.01, "se": 0.004, "units": ["set1", "set2"]}}}
    text = section(data)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")]
    assert rows == [["`lfw_alone`: LFW's training people alone", "0.8500 ± 0.0500", "0.9400", "0.4500",
                     "0.900 0.800"]]
    assert "- cross - lfw_alone: +0.0100 ± 0.0040 (+2.5 s.e.) over 2 sets" in text


def test_the_pages_tables_are_what_the_committed_results_give():
    """README.md, docs/lfw.md and docs/faces.md show each view's table and paired differences exactly as
    examples/lfw_tables.py makes them from docs/results/lfw/view{1,2}.json (run it with --write after a new report)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from lfw_tables import load, section

    from mtl.core.generated_pages import read_section

    found = 0
    for view in (1, 2):
        data = load(view)
        if data is None:
            continue
        for page in ("README.md", "docs/lfw.md", "docs/faces.md"):
            shown = read_section(os.path.join(ROOT, page), f"lfw-view{view}")
            if shown or page == "docs/lfw.md":
                assert shown == section(data).strip(), (page, view)
                found += 1
    assert found >= 4


