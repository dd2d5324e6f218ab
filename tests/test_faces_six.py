"""The six-dataset face recipe's data: list files, held-out people, reader preprocessing, merged reader, light targets.

References: the folders on disk (every image listed once), the person number in each path (no held-out person in
any training batch the schedule draws), OpenCV's ``equalizeHist`` and a hand loop of the textbook formula, numpy
slicing and statistics, the sources of a merged reader, ``index.tsv`` read with the csv module.
"""
import csv
import json
import os

import numpy as np
import pytest
import yaml
from PIL import Image

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError, DataError
from mtl.data.preprocess import Preprocess, crop_pixels, equalize_grey, equalize_pixels, standardize_image
from mtl.data.steps import StepDataset
from mtl.readers.concat import ConcatReader
from mtl.readers.image_list import ImageListReader
from tests import warm_python
from tests.references.steps import step_samples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "examples", "data")
SIX = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")
FOLDERS = {"orl": os.path.join(DATA, "orl"), **{n: os.path.join(DATA, "faces", n)
                                                for n in ("gt", "imm", "umist", "yale", "yaleb")}}


def list_rows(path):
    """``[(relative path, label)]`` of a label list, read here without the reader."""
    return [(p, int(label)) for p, label in (line.rstrip("\n").split("\t") for line in open(path)
                                             if line.strip() and not line.startswith("#"))]


def person(path):
    """Label of the person of ``sN/K.png`` from its folder name: N - 1."""
    return int(path.split("/")[0][1:]) - 1


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_list_file_holds_every_image_exactly_once(name):
    folder = FOLDERS[name]
    on_disk = sorted(os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
                     for d, _, files in os.walk(folder) for f in files if f.endswith(".png"))
    rows = list_rows(os.path.join(folder, f"{name}.txt"))
    paths = [p for p, _ in rows]
    assert len(paths) == len(set(paths)) and sorted(paths) == on_disk
    assert all(label == person(p) for p, label in rows)


def test_task_files_hold_out_a_quarter_of_each_datasets_people():
    cfg = load_job(SIX)
    assert [t["name"] for t in cfg["tasks"]] == ["orl", "gt", "imm", "umist", "yale", "yaleb"]
    for task in cfg["tasks"]:
        held = task["reader"]["holdout_classes"]
        people = sorted({label for _, label in list_rows(task["reader"]["list"])})
        assert isinstance(held, list) and set(held) <= set(people)
        assert len(held) == round(len(people) / 4)


def test_the_test_variant_differs_only_in_other_held_out_people_drawn_as_documented():
    """faces_six_test.yaml: the recipe unchanged but for the held-out people, as many as the validation people, drawn
    by numpy's RandomState(2026) from the others; nothing else of the job or its tasks differs."""
    recipe, test = load_job(SIX), load_job(os.path.join(ROOT, "examples", "configs", "faces_six_test.yaml"))
    for mine, theirs in zip(recipe["tasks"], test["tasks"]):
        people = sorted({label for _, label in list_rows(mine["reader"]["list"])})
        validation = mine["reader"]["holdout_classes"]
        rest = [p for p in people if p not in validation]
        drawn = sorted(np.random.RandomState(2026).choice(rest, len(validation), replace=False).tolist())
        assert theirs["reader"]["holdout_classes"] == drawn, mine["name"]
        assert {**theirs["reader"], "holdout_classes": None} == {**mine["reader"], "holdout_classes": None}
        assert {k: v for k, v in theirs.items() if k not in ("reader", "source")} == \
            {k: v for k, v in mine.items() if k not in ("reader", "source")}
    where = ("tasks", "output_dir", "config_path", "source")
    assert {k: v for k, v in test.items() if k not in where} == {k: v for k, v in recipe.items() if k not in where}


def test_held_out_people_never_reach_a_training_batch():
    """Every sample of the first 60 steps (more than an epoch of every dataset) belongs to a training person, and
    every training person shows up."""
    from mtl.data.scheduler import build_schedule
    from mtl.train.job import build_reader

    cfg = load_job(SIX, ["schedule.steps=60"])
    readers = {t["name"]: build_reader(t, None, {"image_size": 8, "channels": 3}) for t in cfg["tasks"]}
    schedule = build_schedule(cfg["schedule"], cfg["tasks"], [len(r) for r in readers.values()], cfg["seed"])
    steps = StepDataset(schedule, readers, cfg["seed"], 0, 60)
    for task in cfg["tasks"]:
        reader, held = readers[task["name"]], set(task["reader"]["holdout_classes"])
        drawn = np.concatenate([step_samples(steps, s)[task["name"]] for s in range(60)])
        files = reader.sample_files()
        people = {person(os.path.relpath(files[i], reader.root)) for i in drawn}
        listed = {label for _, label in list_rows(task["reader"]["list"])}
        assert people == listed - held, task["name"]


# ----------------------------------------------------------------------------------------------- preprocessing
def test_equalize_matches_opencv_and_the_formula():
    import cv2

    rng = np.random.default_rng(0)
    for _ in range(50):
        low, high = sorted(rng.integers(0, 256, 2))
        grey = rng.integers(low, high + 1, tuple(rng.integers(1, 40, 2))).astype(np.uint8)
        ours = equalize_grey(grey)
        assert np.abs(ours.astype(int) - cv2.equalizeHist(grey)).max() <= 1  # OpenCV rounds in float32
        counts = [int((grey <= v).sum()) for v in range(256)]
        first = counts[int(grey.min())]
        expected = [max(0, round(255 * (counts[v] - first) / (grey.size - first))) if grey.size > first else v
                    for v in range(256)]
        assert np.array_equal(ours, np.array(expected, dtype=np.uint8)[grey])
    flat = np.full((5, 4), 77, np.uint8)
    assert np.array_equal(equalize_grey(flat), flat)


def test_equalize_colour_keeps_chroma_and_grey_stays_grey():
    rng = np.random.default_rng(1)
    grey = rng.integers(40, 120, (12, 9)).astype(np.uint8)
    rgb = np.repeat(grey[..., None], 3, axis=2)
    assert np.array_equal(equalize_pixels(rgb)[..., 1], equalize_grey(grey))
    base = rng.integers(60, 180, (10, 10)).astype(np.int64)  # a skin-like image: grey plus a mild tint
    colour = np.clip(np.stack([base + 20, base, base - 15], axis=2), 0, 255).astype(np.uint8)
    before = np.asarray(Image.fromarray(colour).convert("YCbCr")).astype(int)
    after = np.asarray(Image.fromarray(equalize_pixels(colour)).convert("YCbCr")).astype(int)
    luma_error = np.abs(after[..., 0] - equalize_grey(before[..., 0].astype(np.uint8)))
    assert np.median(luma_error) <= 1 and luma_error.max() <= 8  # RGB clips the tinted extremes
    assert np.median(np.abs(after[..., 1:] - before[..., 1:])) <= 1


def test_crop_and_standardize_against_numpy():
    rgb = np.arange(48 * 64 * 3, dtype=np.int64).reshape(48, 64, 3).astype(np.uint8)
    assert np.array_equal(crop_pixels(rgb, (0.3, 0.06, 0.7, 0.72)), rgb[3:35, 19:45])
    x = np.random.default_rng(2).normal(3.0, 2.0, (3, 8, 8)).astype(np.float32)
    y = standardize_image(x.copy())
    assert abs(y.mean()) < 1e-6 and abs(y.std() - 1.0) < 1e-5
    assert np.allclose(y, (x - x.mean(dtype=np.float64)) / x.std(dtype=np.float64), atol=1e-5)
    assert np.array_equal(standardize_image(np.zeros((3, 2, 2), np.float32)), np.zeros((3, 2, 2)))


def test_reader_prepares_both_splits_alike_with_either_decoder():
    common = dict(list=os.path.join(FOLDERS["imm"], "imm.txt"), image_size=16, holdout_classes=[2, 10],
                  preprocess={"crop": [0.3, 0.06, 0.7, 0.72], "equalize": True, "standardize": True})
    train = ImageListReader(**common, decoder="pillow")
    train.set_augmentation(False)
    other = ImageListReader(**common, decoder="opencv")
    other.set_augmentation(False)
    path = train.sample_files()[0]
    pixels = np.asarray(Image.open(path).convert("RGB"))
    pixels = equalize_pixels(crop_pixels(pixels, (0.3, 0.06, 0.7, 0.72)))
    pixels = np.asarray(Image.fromarray(pixels).resize((16, 16), Image.BILINEAR)).transpose(2, 0, 1)
    expected = (pixels.astype(np.float64) / 255 - 0.5) / 0.5
    expected = (expected - expected.mean()) / expected.std()
    for reader in (train, other):
        assert np.allclose(reader[0]["image"], expected, atol=1e-5)
    held = ImageListReader(**common, split="eval")
    assert abs(float(held[0]["image"].mean())) < 1e-5 and abs(float(held[0]["image"].std()) - 1) < 1e-4


@pytest.mark.parametrize("bad, words", [({"crop": [0.5, 0, 0.4, 1]}, "left < right"), ({"equalise": True},
                                        "unknown key"), ({"standardize": "yes"}, "true or false"),
                                        ("equalize", "mapping")])
def test_bad_preprocess_options_are_one_sentence(bad, words):
    with pytest.raises(ConfigError, match=words) as err:
        ImageListReader(os.path.join(FOLDERS["yale"], "yale.txt"), image_size=8, preprocess=bad)
    assert "preprocess" in str(err.value)
    assert Preprocess.from_config({}) is None


# ----------------------------------------------------------------------------------------------- merged reader
def test_concat_reader_offsets_labels_and_keeps_each_sources_samples():
    sources = [{"type": "image_list", "list": os.path.join(FOLDERS[n], f"{n}.txt"), "holdout_classes": h}
               for n, h in (("yale", [0, 1, 11]), ("umist", [1, 10, 11, 13]))]
    merged = ConcatReader(sources, image_size=8)
    yale, umist = (ImageListReader(s["list"], image_size=8, holdout_classes=s["holdout_classes"]) for s in sources)
    assert merged.num_classes == yale.num_classes + umist.num_classes == 9 + 12
    assert len(merged) == len(yale) + len(umist)
    assert np.array_equal(merged.labels(), np.concatenate([yale.labels(), umist.labels() + 9]))
    assert np.array_equal(merged[len(yale) + 3]["image"], umist[3]["image"])
    assert int(merged[len(yale) + 3]["label"]) == int(umist[3]["label"]) + 9
    held = ConcatReader(sources, image_size=8, split="eval")
    assert held.open_set and held.num_classes == 3 + 4
    with pytest.raises(ConfigError, match="concat"):
        ConcatReader([{"type": "concat", "readers": sources}], image_size=8)


# ----------------------------------------------------------------------------------------------- light targets
def test_yaleb_light_targets_come_from_the_index():
    index = os.path.join(FOLDERS["yaleb"], "index.tsv")
    with open(index) as f:
        rows = {r[0]: (float(r[4]), float(r[5])) for r in csv.reader(f, delimiter="\t") if not r[0].startswith("#")}
    reader = ImageListReader(os.path.join(FOLDERS["yaleb"], "yaleb.txt"), image_size=8, holdout_classes=[8, 16],
                             split="eval", target_list=index, target_scale=0.01,
                             target_columns=["light azimuth (deg)", "light elevation (deg)"])
    assert not reader.open_set and reader.num_outputs == 2
    for i in (0, 7, len(reader) - 1):
        path = os.path.relpath(reader.sample_files()[i], reader.root)
        assert np.allclose(reader[i]["target"], np.array(rows[path]) * 0.01)
        assert person(path) in (8, 16)
    with pytest.raises(DataError, match="no column 'azimuth'"):
        ImageListReader(os.path.join(FOLDERS["yaleb"], "yaleb.txt"), image_size=8, target_list=index,
                        target_columns=["azimuth"])
    with pytest.raises(ConfigError, match="target_columns needs target_list"):
        ImageListReader(os.path.join(FOLDERS["yaleb"], "yaleb.txt"), image_size=8, target_columns=[4])


def test_a_target_table_without_a_row_names_the_image(tmp_path):
    table = tmp_path / "t.tsv"
    table.write_text("path\tx\ns1/1.png\t3\n")
    listed = tmp_path / "l.txt"
    listed.write_text("s1/1.png\t0\ns1/2.png\t0\n")
    with pytest.raises(DataError, match="no row for image 's1/2.png'"):
        ImageListReader(str(listed), root=FOLDERS["yale"], image_size=8, target_list=str(table), target_columns=["x"])
    assert yaml.safe_load(open(SIX))["backbone"]["type"] == "cnn"


# ----------------------------------------------------------------------------------------------- baselines
@pytest.mark.parametrize("variance", [None, 0.9])
def test_fisherfaces_against_a_direct_numpy_computation(variance):
    """PCA by SVD, scatter matrices by their definitions, generalised eigenvectors S_b w = l S_w w (scipy): the
    embeddings agree with the baseline's up to a global scale and each direction's sign."""
    from scipy.linalg import eigh

    from mtl.evaluation.baselines import FisherfacesBaseline

    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(5), 6)
    x = rng.normal(size=(30, 20)) + 2.0 * rng.normal(size=(5, 20))[labels]
    probe = rng.normal(size=(7, 20))
    ours = FisherfacesBaseline(variance).fit(x, labels).transform(probe)
    mu = x.mean(axis=0)
    _, singular, vt = np.linalg.svd(x - mu, full_matrices=False)
    kept = 30 - 5
    if variance is not None:
        kept = min(int(np.searchsorted(np.cumsum(singular**2) / np.sum(singular**2), variance)) + 1, kept)
    v = vt[:kept].T
    y = (x - mu) @ v
    means = np.stack([y[labels == k].mean(axis=0) for k in range(5)])
    within = sum((y[labels == k] - means[k]).T @ (y[labels == k] - means[k]) for k in range(5))
    between = sum(6 * np.outer(means[k] - y.mean(axis=0), means[k] - y.mean(axis=0)) for k in range(5))
    values, vectors = eigh(between, within)
    reference = (probe - mu) @ v @ vectors[:, ::-1][:, :4]
    assert ours.shape == reference.shape == (7, 4)
    signs = np.sign(np.sum(ours * reference, axis=0))
    scale = np.linalg.norm(ours) / np.linalg.norm(reference)
    assert np.allclose(ours, reference * signs * scale, rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------------------------- the report
def run_report(tmp_path, *args):
    """``examples/faces_report.py`` in a subprocess; the completed process."""
    import sys

    return warm_python.run([sys.executable, os.path.join(ROOT, "examples", "faces_report.py"), *args],
                           capture_output=True, text=True, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT),
                           timeout=900)


def two_dataset_variant(tmp_path):
    """A variant config (``base:``) with two of the datasets, a few steps, a tiny backbone."""
    tasks = os.path.join(ROOT, "examples", "configs", "faces_six")
    variant = tmp_path / "variant.yaml"
    variant.write_text(yaml.safe_dump({
        "base": SIX, "tasks": [os.path.join(tasks, "yale.yaml"), os.path.join(tasks, "umist.yaml")],
        "schedule": {"steps": 4, "batch_size": 16}, "backbone": {"input_size": 16, "channels": [8, 16]},
        "data": {"num_workers": 0}}))
    return variant


@pytest.mark.slow
@pytest.mark.subprocess
def test_report_script_on_a_shortened_two_dataset_variant(tmp_path):
    """The pipeline, not the targets: the former report's kinds (--only joint alone merged: the arms separate, alone,
    merged), the classic baselines and the overlap count, in the JSON layout of the docs; every run trained with the
    variant's settings and the --set/--task-set overrides."""
    variant = two_dataset_variant(tmp_path)
    out = tmp_path / "report"
    proc = run_report(tmp_path, "--config", str(variant), "--seeds", "0", "--out", str(out), "--json",
                      str(tmp_path / "r.json"), "--overlap", "--set", "averaging.min_average_window=2",
                      "--task-set", "head.scale=12", "--only", "joint", "alone", "merged")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.load(open(tmp_path / "r.json"))
    assert report["seeds"] == [0] and set(report["arms"]) == {"separate", "alone", "merged"}
    for arm, info in report["arms"].items():
        assert set(info["datasets"]) == {"yale", "umist"}
        assert all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in info["datasets"].values())
        assert all(len(v) == (0 if arm == "alone" else 1) for v in info["all"].values())
    for info in report["baselines"].values():
        assert set(info) == {"pixels", "pca", "fisherfaces"} and all(0.0 <= v <= 1.0 for v in info.values())
    assert report["duplicates"]["arm"] == "separate" and len(report["duplicates"]["pairs"]) == 1
    assert report["duplicates"]["precision"] == [None]  # no true pairs known without --shared-labels
    runs = {"separate": [12, 12], "alone_yale": [12], "alone_umist": [12], "merged": None}
    for run, scales in runs.items():
        job = json.load(open(out / "seed0" / run / "job.json"))
        assert job["averaging"]["min_average_window"] == 2 and job["schedule"]["steps"] == 4
        assert job["backbone"]["input_size"] == 16
        assert job["threads"] == 1  # --threads' default whatever --jobs is (the cores were divided by --jobs)
        if scales:
            assert [t["head"]["scale"] for t in job["tasks"]] == scales
    merged = json.load(open(out / "seed0" / "merged" / "job.json"))["tasks"][0]
    assert merged["reader"]["type"] == "concat" and len(merged["reader"]["readers"]) == 2
    assert merged["head"]["scale"] == 12 and merged["reader"]["readers"][0]["holdout_classes"] == [0, 1, 11]
    subs = {r: json.load(open(out / "seed0" / r / "job.json"))["schedule"]["batch_size"] for r in runs}
    assert subs == {"separate": 16, "alone_yale": 8, "alone_umist": 8, "merged": 16}
    assert "separate - alone" in proc.stdout and "[train 4/4]" in proc.stdout
    # a progress line for every step of the report (issue 30): the baselines, the runs, the scores, the duplicates
    assert "[baselines 2/2] umist: pixels, pca, fisherfaces (" in proc.stdout, proc.stdout
    assert "[score 4/4]" in proc.stdout and "[duplicates 1/1] seed 0 separate: " in proc.stdout, proc.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_report_on_a_shortened_overlap_benchmark(tmp_path):
    """The overlap benchmark of the two-dataset variant, arms naive, oracle, separate and two_stage, one seed, four
    steps: the report's JSON layout, the sampling difference reported, a progress line per run, the duplicates of
    `mtl overlap` on the separate run scored against duplicates.json (and given to the two_stage run as its mask),
    the ROC plot; --score-only scores the same runs again without training."""
    from tools import make_overlap_benchmark

    make_overlap_benchmark.build(str(two_dataset_variant(tmp_path)), 0.5, 0, str(tmp_path / "bench"))
    out = tmp_path / "report"
    proc = run_report(tmp_path, "--config", str(tmp_path / "bench" / "faces_overlap.yaml"), "--arms",
                      "naive,oracle,separate,two_stage", "--seeds", "0", "--out", str(out), "--json",
                      str(tmp_path / "r.json"), "--no-baselines", "--set", "averaging.min_average_window=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.load(open(tmp_path / "r.json"))
    assert set(report) == {"config", "seeds", "arms", "duplicates", "sampling"} and report["seeds"] == [0]
    for info in report["arms"].values():
        assert set(info) == {"all", "cross_condition", "datasets"} and set(info["datasets"]) == {"yale", "umist"}
        assert set(info["all"]) == {"accuracy", "tar_far_1e-2", "tar_far_1e-3"}
        assert all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in [*info["all"].values(), info["cross_condition"]])
    true = len(json.load(open(tmp_path / "bench" / "duplicates.json")))
    found = report["duplicates"]
    assert found["arm"] == "separate" and found["true"] == true and found["from"][0].startswith("mtl overlap")
    assert all(len(found[k]) == 1 for k in ("precision", "recall"))
    assert found["recall"][0] == found["correct"][0] / true
    assert report["sampling"]["naive"] == report["sampling"]["oracle"] != report["sampling"]["separate"]
    assert report["sampling"]["separate"] == {"yale": 8.0, "umist": 8.0}
    assert all(f"[train {k}/3]" in proc.stdout for k in (1, 2, 3)) and "[train 1/1] seed 0 two_stage" in proc.stdout
    assert all(f"[score {k}/4]" in proc.stdout for k in (1, 2, 3, 4))
    mask = json.load(open(out / "seed0" / "two_stage" / "job.json"))["cross_negatives"]
    assert mask["mask"] == "pairs" and mask["pairs"] == str(out / "seed0" / "separate" / "overlap.json")
    assert len(json.load(open(mask["pairs"]))) == found["pairs"][0]  # the decision scored above is the mask
    again = run_report(tmp_path, "--config", str(tmp_path / "bench" / "faces_overlap.yaml"), "--arms",
                       "naive,oracle,separate,two_stage", "--seeds", "0", "--out", str(out), "--json",
                       str(tmp_path / "again.json"), "--no-baselines", "--score-only")
    assert again.returncode == 0 and "[train" not in again.stdout, again.stderr[-3000:]
    assert json.load(open(tmp_path / "again.json"))["arms"] == report["arms"]
    unfinished = run_report(tmp_path, "--config", str(tmp_path / "bench" / "faces_overlap.yaml"), "--arms",
                            "naive,separate,dropout", "--seeds", "0", "--out", str(out), "--no-baselines",
                            "--score-only")
    assert unfinished.returncode == 2 and "error: --score-only, but 1 run(s) are not finished, e.g. " \
        f"{out / 'seed0' / 'dropout'}" in unfinished.stderr and "Traceback" not in unfinished.stderr, unfinished.stderr
    assert os.path.getsize(out / "roc_all_people.png") > 0
    naive, oracle = (json.load(open(out / "seed0" / arm / "job.json"))["tasks"][0] for arm in ("naive", "oracle"))
    assert naive["name"] == oracle["name"] == "merged" and oracle["reader"]["shared_labels"] is True
    assert [r["root"] for r in naive["reader"]["readers"]] == [r["root"] for r in oracle["reader"]["readers"]]


def test_report_script_refuses_a_bad_task_override_in_one_line(tmp_path):
    proc = run_report(tmp_path, "--seeds", "0", "--out", str(tmp_path / "r"), "--task-set", "head.scal=3")
    assert proc.returncode == 2  # a user error, as the mtl commands exit
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "head.scal" in errors[0] and "did you mean 'scale'" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()  # refused before any training
