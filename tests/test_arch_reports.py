"""The benchmark reports on shortened runs (the pipelines, not the targets): examples/mmoe_synthetic_report.py,
examples/multimnist_report.py, examples/faces_report.py with an architecture, examples/architectures_report.py, and
the recipes loading as they are."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from mtl.config.loading import load_job
from mtl.core.errors import DataError
from tests import warm_python
from tests.dist_util import ROOT

EXAMPLES = os.path.join(ROOT, "examples")


def run(tmp_path, script, *args, fresh=False):
    """Run an example script; ``fresh``: in a new interpreter (the tests of its console: Paddle's import warning)."""
    runner = subprocess.run if fresh else warm_python.run
    proc = runner([sys.executable, os.path.join(EXAMPLES, script), *map(str, args)], capture_output=True, text=True,
                  cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_recipes_load_with_their_architectures():
    mnist = load_job(os.path.join(EXAMPLES, "configs", "multimnist.yaml"))
    assert mnist["architecture"] == {"type": "hard", "tower": [50], "tower_dropout": 0.5}
    assert [t["reader"]["mnist_dir"] for t in mnist["tasks"]] == [os.path.join(EXAMPLES, "data", "mnist")] * 2
    assert [t["reader"]["eval_split"] for t in mnist["tasks"]] == ["val", "val"]  # never the kept-back test digits
    sys.path.insert(0, EXAMPLES)

    from multimnist_report import configurations

    for file, name, kind in (("multimnist_adapters.yaml", "adapters", "adapters"),  # the report's, as files
                             ("multimnist_stitched.yaml", "cross_stitch_backbone_same_rows", "cross_stitch_backbone")):
        best = load_job(os.path.join(EXAMPLES, "configs", file))
        report = load_job(os.path.join(EXAMPLES, "configs", "multimnist.yaml"), configurations()[name])
        assert best["architecture"]["type"] == kind
        assert {k: v for k, v in best.items() if k not in ("output_dir", "source", "config_path", "set_keys")} == \
            {k: v for k, v in report.items() if k not in ("output_dir", "source", "config_path", "set_keys")}
    synthetic = load_job(os.path.join(EXAMPLES, "configs", "mmoe_synthetic.yaml"))
    assert synthetic["architecture"]["type"] == "mmoe" and synthetic["backbone"]["type"] == "identity"


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_synthetic_report_on_a_shortened_run(tmp_path):
    out = tmp_path / "synthetic"
    proc = run(tmp_path, "mmoe_synthetic_report.py", "--runs", 2, "--steps", 20, "--correlations", 0.5, 1.0,
               "--out", out, "--json", tmp_path / "s.json", "--plot", tmp_path / "s.png", fresh=True)
    report = json.load(open(tmp_path / "s.json"))
    assert set(report["cells"]) == {"0.5", "1.0"} and report["runs"] == 2
    for models in report["cells"].values():
        assert set(models) == {"shared_bottom", "omoe", "mmoe"}
        for cell in models.values():
            assert len(cell["final"]) == 2 and all(len(c) == len(report["steps"]) for c in cell["curves"])
            assert cell["final"] == [c[-1] for c in cell["curves"]]
    assert report["steps"][-1] == 20 and (tmp_path / "s.png").stat().st_size > 10000
    assert "minus shared-bottom" in proc.stdout
    # a progress line per run: which of how many, times so far and left (issue 30); Paddle's start-up warning gone
    assert "[train 1/12] correlation 0.5 shared_bottom run 0: final loss " in proc.stdout, proc.stdout
    assert "[train 12/12] correlation 1.0 mmoe run 1: final loss " in proc.stdout and " left" in proc.stdout
    assert "No ccache found" not in proc.stderr, proc.stderr
    job = json.load(open(out / "p0.5" / "mmoe" / "run1" / "job.json"))
    assert job["seed"] == 1 and [t["reader"]["seed"] for t in job["tasks"]] == [1, 1]
    assert [t["reader"]["correlation"] for t in job["tasks"]] == [0.5, 0.5]
    again = run(tmp_path, "mmoe_synthetic_report.py", "--runs", 2, "--steps", 20, "--correlations", 0.5, 1.0,
                "--out", out)  # every run is read, none trained again
    assert "correlation 0.5 mmoe run" not in again.stdout and "[train" not in again.stdout


def small_mnist(folder, count=1000, test=0):
    """The first ``count`` MNIST training digits as IDX files in ``folder`` (what every run of a shortened report
    reads: composing the 60,000 digits' MultiMNIST images costs seconds a run, 2 steps need a few); ``test`` more of
    them as a stand-in for the kept-back test files (t10k-*)."""
    from mtl.readers.multimnist import read_digits

    images, labels = read_digits(os.path.join(EXAMPLES, "data", "mnist"), "train")
    os.makedirs(folder)
    files = [("train-images-idx3-ubyte", 2051, images[:count]), ("train-labels-idx1-ubyte", 2049, labels[:count])]
    if test:
        files += [("t10k-images-idx3-ubyte", 2051, images[count:count + test]),
                  ("t10k-labels-idx1-ubyte", 2049, labels[count:count + test])]
    for stem, magic, array in files:
        header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
        with open(os.path.join(folder, stem), "wb") as f:
            f.write(header + array.tobytes())
    return str(folder)


def shortened_multimnist(tmp_path, test=0):
    """The recipe with task files that read 1000 digits, hold 300 of them for validation and evaluate 200 (``test``:
    test digits, see :func:`small_mnist`)."""
    mnist = small_mnist(tmp_path / "mnist", test=test)
    for digit in ("left", "right"):
        task = yaml.safe_load(open(os.path.join(EXAMPLES, "configs", "multimnist", f"{digit}.yaml")))
        task["reader"].update(mnist_dir=mnist, val_size=300)
        task["eval"] = {"max_samples": 200}
        (tmp_path / f"{digit}.yaml").write_text(yaml.safe_dump(task))
    variant = tmp_path / "variant.yaml"
    variant.write_text(yaml.safe_dump({"base": os.path.join(EXAMPLES, "configs", "multimnist.yaml"),
                                       "tasks": ["left.yaml", "right.yaml"], "data": {"num_workers": 0},
                                       "schedule": {"batch_size": 16}}))
    return variant


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_multimnist_report_on_a_shortened_run(tmp_path):
    config = shortened_multimnist(tmp_path)
    proc = run(tmp_path, "multimnist_report.py", "--config", config, "--configurations",
               "single,static,mgda_ub,mmoe,task_norm,mgda_ub_same_rows", "--seeds", 0, 1, "--steps", 2, "--out",
               tmp_path / "r",
               "--json", tmp_path / "m.json")
    report = json.load(open(tmp_path / "m.json"))
    assert report["seeds"] == [0, 1] and report["steps"] == 2  # the runs' steps, --steps over the recipe's
    assert set(report["configurations"]) == {"single", "static", "mgda_ub", "mmoe", "task_norm", "mgda_ub_same_rows"}
    for cell in report["configurations"].values():
        assert set(cell) == {"left", "right"} and all(len(v) == 2 and 0 <= min(v) <= max(v) <= 100
                                                      for v in cell.values())
    single = json.load(open(tmp_path / "r" / "seed1" / "single_right" / "job.json"))
    assert [t["name"] for t in single["tasks"]] == ["right"] and single["schedule"]["batch_size"] == 8
    norm = json.load(open(tmp_path / "r" / "seed0" / "task_norm" / "job.json"))
    assert norm["architecture"]["type"] == "task_norm" and norm["backbone"]["batch_norm"] is True
    paired = json.load(open(tmp_path / "r" / "seed0" / "mgda_ub_same_rows" / "job.json"))
    assert paired["schedule"]["same_rows"] is True and paired["weighting"]["representation"] is True
    assert norm["schedule"]["same_rows"] is False
    assert "MGDA-UB (their Table 3)" in proc.stdout and "Δm vs single" in proc.stdout
    assert "[train 1/14] seed 0: single left (" in proc.stdout, proc.stdout  # which run of how many (issue 30)
    assert "[train 14/14] seed 1: mgda_ub_same_rows left right (" in proc.stdout and " left" in proc.stdout
    # the same folder at another budget: its runs are not read into a table of two budgets
    again = warm_python.run([sys.executable, os.path.join(EXAMPLES, "multimnist_report.py"), "--config",
                             config, "--configurations", "single", "--seeds", "0", "--steps",
                             "3", "--out", str(tmp_path / "r")], capture_output=True, text=True, cwd=str(tmp_path),
                            env=dict(os.environ, PYTHONPATH=ROOT), timeout=900)
    assert again.returncode == 2 and "single_left was trained for 2 steps and evaluated on eval_split val, this " \
        "report's runs take 3 steps on val: remove it or give another --out" in again.stderr, again.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_multimnist_test_look_trains_on_every_training_digit_and_scores_the_test_digits(tmp_path):
    config = shortened_multimnist(tmp_path, test=150)
    # the recipe's budget in epochs (100; here 0.05 of the 1000 training digits, 8 a step): the runs of the test
    # look train on every training digit, so the same epochs make more steps than on the 700 left by validation
    run(tmp_path, "multimnist_report.py", "--config", config, "--configurations", "single,adapters", "--seeds", 0,
        "--set", "schedule.epochs=0.05", "--eval-split", "test", "--out", tmp_path / "t", "--json", tmp_path / "t.json")
    report = json.load(open(tmp_path / "t.json"))
    assert report["eval_split"] == "test" and set(report["configurations"]) == {"single", "adapters"}
    assert (report["steps"], report["epochs"]) == (7, 0.05)  # ceil(0.05 * 1000 / 8)
    for folder in ("single_left", "single_right", "adapters"):
        job = json.load(open(tmp_path / "t" / "seed0" / folder / "job.json"))
        assert [(t["reader"]["eval_split"], t["reader"]["val_size"]) for t in job["tasks"]] == \
            [("test", 0)] * len(job["tasks"])
        assert json.load(open(tmp_path / "t" / "seed0" / folder / "summary.json"))["steps"] == 7
        # (the reader's tests: eval_split test reads the t10k files, val_size 0 trains on every training digit)
    # the test runs are not read into a validation table
    again = warm_python.run([sys.executable, os.path.join(EXAMPLES, "multimnist_report.py"), "--config", config,
                             "--configurations", "adapters", "--seeds", "0", "--steps", "2", "--out",
                             str(tmp_path / "t")], capture_output=True, text=True, cwd=str(tmp_path),
                            env=dict(os.environ, PYTHONPATH=ROOT), timeout=900)
    assert again.returncode == 2 and "was trained for 7 steps and evaluated on eval_split test, this report's " \
        "runs take 2 steps on val" in again.stderr, again.stderr[-3000:]


def two_faces(tmp_path, **more):
    """A 4-step variant of the six-face recipe on Yale and UMIST with a small CNN (``more``: further keys)."""
    tasks = os.path.join(EXAMPLES, "configs", "faces_six")
    variant = tmp_path / "variant.yaml"
    variant.write_text(yaml.safe_dump({
        "base": os.path.join(EXAMPLES, "configs", "faces_six.yaml"),
        "tasks": [os.path.join(tasks, "yale.yaml"), os.path.join(tasks, "umist.yaml")],
        "schedule": {"steps": 4, "batch_size": 16}, "backbone": {"input_size": 16, "channels": [8, 16]},
        "averaging": {"min_average_window": 2}, "data": {"num_workers": 0}, **more}))
    return variant


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_faces_report_scores_each_dataset_through_its_tasks_embedding(tmp_path):
    variant = two_faces(tmp_path)
    proc = run(tmp_path, "faces_report.py", "--config", variant, "--seeds", 0, "--out", tmp_path / "f", "--json",
               tmp_path / "f.json", "--only", "joint", "--no-baselines", "--set",
               "architecture={type: mmoe, experts: 2, expert_layers: [16], last_relu: false}", fresh=True)
    # make demo-faces's console (issue 30, item 7): a line per run and score, one seed said, no Paddle warning;
    # the tables and the plot in the output folder
    assert "[train 1/1] seed 0 separate (" in proc.stdout and "[score 1/1] seed 0 separate (" in proc.stdout
    assert "(seed 0: one seed, no spread)" in proc.stdout and "(one seed)" in proc.stdout
    assert "± 0.0000" not in proc.stdout and "No ccache found" not in proc.stderr, proc.stdout + proc.stderr
    report = (tmp_path / "f" / "report.md").read_text()
    assert report.startswith("Open-set verification on held-out people") and report.strip() in proc.stdout
    assert (tmp_path / "f" / "roc_all_people.png").stat().st_size > 10000
    report = json.load(open(tmp_path / "f.json"))
    datasets = report["arms"]["separate"]["datasets"]
    assert set(datasets) == {"yale", "umist"}
    assert all(len(per_seed) == 1 and 0 <= per_seed[0] <= 1 for per_seed in datasets.values())
    job = json.load(open(tmp_path / "f" / "seed0" / "separate" / "job.json"))
    assert job["architecture"]["type"] == "mmoe"


@pytest.mark.slow
@pytest.mark.subprocess
def test_source_free_scoring_sends_every_image_through_one_tasks_norms(tmp_path):
    """task_norm with cross-head negatives on two datasets (4 steps): examples/faces_source_free.py's ``own`` way is
    the faces report's all-people figure of the same run (each dataset through its own BatchNorms); through one
    task's norms every image gets that task's embedding, which differs for the other task's images."""
    variant = two_faces(tmp_path, cross_negatives={"warmup": 1})
    norm = "architecture={type: task_norm}"
    run(tmp_path, "faces_report.py", "--config", variant, "--seeds", 0, "--arms", "cross", "--out", tmp_path / "f",
        "--json", tmp_path / "f.json", "--no-baselines", "--set", norm)
    folder = tmp_path / "f" / "seed0" / "cross"
    proc = run(tmp_path, "faces_source_free.py", folder, "--config", variant, "--set", norm, "--json",
               tmp_path / "s.json")
    report, scores = json.load(open(tmp_path / "f.json")), json.load(open(tmp_path / "s.json"))["scores"]
    assert set(scores) == {"yale", "umist", "own"} and "through yale" in proc.stdout
    assert scores["own"][0][0] == pytest.approx(report["arms"]["cross"]["all"]["accuracy"][0], abs=1e-12)
    assert scores["yale"][0] != scores["umist"][0]  # the norms differ: so does what every image becomes
    bad = warm_python.run([sys.executable, os.path.join(EXAMPLES, "faces_source_free.py"), str(tmp_path)],
                          capture_output=True, text=True, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT))
    assert bad.returncode == 2 and "is not a training run: it has no job.json" in bad.stderr, bad.stderr[-2000:]


def test_the_architectures_report_verdicts_on_made_up_runs(tmp_path):
    """Paired differences against twice their standard error, the widest interquartile range, faces' wins and mean
    gap: on numbers made up so that each verdict is known."""
    sys.path.insert(0, EXAMPLES)
    import architectures_report

    runs = np.arange(20)
    base = 1.0 + 0.1 * np.sin(runs)  # the same data in every run: the pair differences are what counts
    cells = {"0.5": {"shared_bottom": base * 1.5, "omoe": base * 1.2, "mmoe": base},
             "1.0": {"shared_bottom": base + 0.3 * np.cos(runs), "omoe": base + 0.001 * (-1) ** runs, "mmoe": base}}
    synthetic = {"runs": 20, "steps": [1], "cells": {p: {m: {"final": list(v), "curves": [[x] for x in v]}
                                                         for m, v in c.items()} for p, c in cells.items()}}
    (tmp_path / "s.json").write_text(json.dumps(synthetic))
    alone = {"a": [0.8, 0.82], "b": [0.7, 0.7], "c": [0.9, 0.9]}
    faces_hard = {"datasets": {d: {"joint": [v[0] - 0.01] * 2, "alone": v} for d, v in alone.items()}}
    faces_norm = {"datasets": {"a": {"joint": [0.83, 0.83]}, "b": {"joint": [0.69, 0.71]},
                               "c": {"joint": [0.89, 0.89]}}}
    # one seed (seed 1): compared with alone at seed 1 only (a: 0.82 >= 0.82, b: 0.69 < 0.70, c: 0.91 >= 0.90)
    faces_one = {"seeds": [1], "datasets": {"a": {"joint": [0.82]}, "b": {"joint": [0.69]}, "c": {"joint": [0.91]}}}
    (tmp_path / "h.json").write_text(json.dumps(faces_hard))
    (tmp_path / "n.json").write_text(json.dumps(faces_norm))
    (tmp_path / "o.json").write_text(json.dumps(faces_one))
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- architectures-tables -->\nold\n<!-- /architectures-tables -->\nafter\n")
    content = architectures_report.main(["--synthetic", str(tmp_path / "s.json"), "--faces",
                                         f"hard={tmp_path / 'h.json'}", f"task_norm={tmp_path / 'n.json'}",
                                         f"mmoe={tmp_path / 'o.json'}", "--write", str(doc)])
    low, high = content["synthetic"]["0.5"], content["synthetic"]["1.0"]
    assert low["mmoe_below_shared_bottom"] and not low["mmoe_equals_omoe"] and low["widest"] == "shared_bottom"
    assert high["mmoe_equals_omoe"] and high["widest"] == "shared_bottom"
    from scipy.stats import binomtest  # here: scipy.stats costs every test process 1.4 s of collection

    k, n = int((np.cos(runs) > 0).sum()), len(runs)  # at 1.0 MMoE is lower where the cosine is positive
    assert 0 < k < n and tuple(high["mmoe_lower_sign_test"]) == (k, n, pytest.approx(binomtest(k, n).pvalue))
    assert tuple(low["mmoe_lower_sign_test"]) == (20, 20, pytest.approx(binomtest(20, 20).pvalue))
    assert content["faces"]["hard"]["wins"] == 0  # every joint 0.01 below the first seed's alone
    assert content["faces"]["task_norm"]["wins"] == 2  # a: 0.83 >= 0.81, b: 0.70 >= 0.70
    assert abs(content["faces"]["task_norm"]["mean_gap"] - np.mean([0.02, 0.0, -0.01])) < 1e-12
    assert content["faces"]["mmoe"]["wins"] == 2 and content["faces"]["mmoe"]["seeds"] == [1]
    assert abs(content["faces"]["mmoe"]["mean_gap"] - np.mean([0.0, -0.01, 0.01])) < 1e-12
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "| mean" in text and "joint, task_norm" in text and "0.8200 (seed 1)" in text
    bad = {"seeds": [5], "datasets": {"a": {"joint": [0.8]}, "b": {"joint": [0.7]}, "c": {"joint": [0.9]}}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(DataError, match="seeds \\[5\\] that the alone runs lack"):
        architectures_report.main(["--faces", f"hard={tmp_path / 'h.json'}", f"x={tmp_path / 'bad.json'}"])
    with pytest.raises(DataError, match="none of the --faces files .* has the datasets' alone runs"):
        architectures_report.main(["--faces", f"x={tmp_path / 'n.json'}"])


def test_the_cost_benchmark_counts_each_models_parameters_and_the_report_shows_them(tmp_path):
    """bench/bench_architectures.py on the synthetic setting (1 timed step): parameter counts against the layers'
    own arithmetic (an MLP layer of n inputs and m units has n*m + m), shared ones as each architecture declares
    them, the baseline's ratio 1; examples/architectures_report.py --costs puts the table in the doc."""
    sys.path[:0] = [EXAMPLES, os.path.join(ROOT, "bench")]
    import architectures_report
    import bench_architectures

    def layer(n, m):
        return n * m + m

    results = bench_architectures.run(["synthetic"], 1, str(tmp_path / "out"))
    rows = results["synthetic"]
    # shared-bottom: one shared ReLU layer of 113 on the 100 inputs, a tower of 8 per task
    bottom = layer(100, 113) + 2 * layer(113, 8)
    assert (rows["shared_bottom"]["parameters"], rows["shared_bottom"]["shared"]) == \
        (bottom, layer(100, 113))
    experts, gate, towers = 8 * layer(100, 16), layer(100, 8), 2 * layer(16, 8)  # 8 experts of 16, towers of 8
    assert (rows["omoe"]["parameters"], rows["omoe"]["shared"]) == (experts + gate + towers, experts + gate)
    assert (rows["mmoe"]["parameters"], rows["mmoe"]["shared"]) == (experts + 2 * gate + towers, experts)
    assert all(r["median_s"] > 0 for r in rows.values())
    (tmp_path / "costs.json").write_text(json.dumps(results))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- architectures-tables -->\n<!-- /architectures-tables -->\n")
    architectures_report.main(["--costs", str(tmp_path / "costs.json"), "--write", str(doc)])
    text = doc.read_text()
    assert "### Costs\n\nsynthetic:\n\n| architecture" in text
    table = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    shown = {cells[0]: cells[1:] for cells in table if cells[0] in rows}
    base = rows["shared_bottom"]["median_s"]
    assert shown == {name: [f"{r['parameters']:,}", f"{r['shared']:,}", f"{r['median_s'] * 1000:.1f}",
                            f"{r['median_s'] / base:.2f}"] for name, r in rows.items()}


def test_the_multimnist_screen_merges_files_of_one_budget_at_their_common_seed(tmp_path):
    """Every configuration at seed 0 from a file of three seeds and one of seed 0, best Delta_m first; the noise is
    the std over the three seeds of static's per-seed Delta_m, worked out here by hand; files of two budgets or a
    configuration in two files are refused."""
    sys.path.insert(0, EXAMPLES)
    import architectures_report

    three = {"steps": 975, "seeds": [0, 1, 2], "configurations": {
        "single": {"left": [96.0, 96.0, 96.0], "right": [95.0, 95.0, 95.0]},
        "static": {"left": [95.04, 96.0, 94.08], "right": [95.0, 95.0, 95.0]}}}  # per seed: -0.5, 0, -1.0 %
    one = {"steps": 975, "seeds": [0], "configurations": {"pcgrad": {"left": [96.96], "right": [95.0]}}}  # +0.5 %
    for name, report in (("three", three), ("one", one)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- architectures-tables -->\n<!-- /architectures-tables -->\n")
    content = architectures_report.main(["--multimnist-screen", str(tmp_path / "three.json"),
                                         str(tmp_path / "one.json"), "--write", str(doc)])
    screen = content["multimnist_screen"]
    assert screen["seeds"] == [0] and screen["steps"] == 975
    assert screen["configurations"]["static"] == {"left": [95.04], "right": [95.0]}
    assert abs(screen["noise"] - np.std([-0.5, 0.0, -1.0])) < 1e-9
    text = doc.read_text()
    assert "every configuration at 975 steps (seed 0)" in text
    assert text.index("| single") < text.index("| pcgrad") < text.index("| static")  # single, then best first
    assert "+0.50" in text and "-0.50" in text and f"up to {np.std([-0.5, 0.0, -1.0]):.2f}" in text
    (tmp_path / "other.json").write_text(json.dumps({**one, "steps": 5850}))
    with pytest.raises(DataError, match="different budgets"):
        architectures_report.main(["--multimnist-screen", str(tmp_path / "three.json"), str(tmp_path / "other.json")])
    with pytest.raises(DataError, match="'pcgrad' is in two"):
        architectures_report.main(["--multimnist-screen", str(tmp_path / "one.json"), str(tmp_path / "one.json")])
    # a configuration of several seeds in a file without single: its spread against single's file counts too
    (tmp_path / "more.json").write_text(json.dumps({"steps": 975, "seeds": [2, 0], "configurations": {
        "dwa": {"left": [96.0, 93.12], "right": [95.0, 95.0]}}}))  # per seed (2, 0): 0, -1.5 %
    both = architectures_report.merge_screen([str(tmp_path / "three.json"), str(tmp_path / "more.json")])
    assert both[0]["seeds"] == [0, 2] and abs(both[1] - np.std([0.0, -1.5])) < 1e-9
    # one configuration from two files at other seeds (single's seed 0 measured before seeds 1 and 2), tabled long
    (tmp_path / "s0.json").write_text(json.dumps({"steps": 975, "seeds": [0], "configurations": {
        "single": {"left": [96.0], "right": [95.0]}}}))
    (tmp_path / "s12.json").write_text(json.dumps({"steps": 975, "seeds": [1, 2], "configurations": {
        "single": {"left": [96.0, 96.0], "right": [95.0, 95.0]},
        "static": {"left": [96.0, 94.08], "right": [95.0, 95.0]}}}))
    (tmp_path / "s0_static.json").write_text(json.dumps({"steps": 975, "seeds": [0], "configurations": {
        "static": {"left": [95.04], "right": [95.0]}}}))
    files = [str(tmp_path / f) for f in ("s0.json", "s12.json", "s0_static.json")]
    long = architectures_report.main(["--multimnist-long", *files])["multimnist_long"]
    assert long["seeds"] == [0, 1, 2] and long == {**three, "seeds": [0, 1, 2]}
    assert abs(architectures_report.merge_screen(files)[1] - np.std([-0.5, 0.0, -1.0])) < 1e-9
    with pytest.raises(DataError, match="cannot read the report .*absent.json"):
        architectures_report.main(["--multimnist-screen", str(tmp_path / "absent.json")])
    (tmp_path / "old.json").write_text(json.dumps({"seeds": [0], "configurations": {}}))  # before "steps" was kept
    with pytest.raises(DataError, match="old.json lacks steps"):
        architectures_report.main(["--multimnist-screen", str(tmp_path / "old.json")])


def test_the_synthetic_heading_says_the_runs_of_each_cell_when_they_differ():
    sys.path.insert(0, EXAMPLES)
    from architectures_report import runs_per_cell

    def cell(n):
        return {"shared_bottom": {"final": [0.1] * n}, "mmoe": {"final": [0.1] * n}}

    assert runs_per_cell({"cells": {"0.5": cell(40), "0.9": cell(40)}}) == "40 runs per cell"
    assert runs_per_cell({"cells": {"0.5": cell(200), "0.9": cell(40)}}) == \
        "runs per cell: 200 at correlation 0.5, 40 at correlation 0.9"
