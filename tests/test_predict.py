"""``mtl predict``: what a run's or an export's heads predict, checked against the heads themselves.

The reference is the run's own evaluation: every head scored its task's evaluation split with Paddle at the end of
training (``summary.json``). ``mtl predict`` on the same images (as ``.npy``) recomputes the heads from their
weights in float64 numpy, so its accuracy, micro-F1 and RMSE must be the ones the heads reported, and a run and
its export must predict the same numbers. Class, label and output names come from the data (the digits, their
attributes and properties; scikit-learn's iris species).
"""
import argparse
import json
import os
import sys

import numpy as np
import pytest

from mtl.core.errors import ConfigError
from mtl.serving.prediction import predict, prediction_table
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, "examples", "data", "digits")


def train_cli(*argv):
    """``mtl train ARGV`` in this process (the command's own path: the run's data.json is written)."""
    from mtl.commands.train import add_train_args, train

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    return train(parser.parse_args([str(a) for a in argv]))


@pytest.fixture(scope="module")
def four_heads(tmp_path_factory):
    """The four-head digits job (arcface, softmax, multilabel, regression) for 40 steps, and its export."""
    from mtl.serving.export import export

    tmp = tmp_path_factory.mktemp("predict")
    run = str(tmp / "run")
    train_cli(os.path.join(ROOT, "examples", "configs", "digits_four_heads.yaml"), "--set", f"output_dir={run}",
              "schedule.steps=40", "log.progress=false", "log.plot=false", "data.num_workers=0",
              "backbone.channels=[8, 16]")
    export(run, str(tmp / "export"))
    return tmp, run, str(tmp / "export")


def eval_split(run, task, tmp):
    """The evaluation split of ``task`` as the run's evaluator read it: (images.npy path, its samples)."""
    from mtl.serving.inference import open_run
    from mtl.train.job import build_job

    job = build_job(open_run(run).cfg, announce_plan=False)
    reader = job.eval_reader(job.task(task))
    samples = [reader[i] for i in range(len(reader))]
    path = os.path.join(str(tmp), f"{task}_eval.npy")
    np.save(path, np.stack([s["image"] for s in samples]))
    return path, samples


def test_predictions_score_the_evaluation_split_as_the_heads_did(four_heads):
    """Each task's own evaluation split: accuracy (softmax, and the arcface head's nearest centre), micro-F1
    (multilabel, threshold 0.5) and RMSE (regression) of the predictions are the heads' own figures."""
    tmp, run, _ = four_heads
    summary = json.load(open(os.path.join(run, "summary.json")))["tasks"]

    def split(task):
        path, samples = eval_split(run, task, tmp)
        (result,) = predict(run, [path], task=task)
        return result.values, samples

    for task in ("digits_classify", "digits_low"):
        values, samples = split(task)
        accuracy = np.mean(np.argmax(values, axis=1) == np.array([s["label"] for s in samples]))
        assert accuracy == pytest.approx(summary[task]["eval"]["accuracy"], abs=1e-12), task
    values, samples = split("digits_classify")
    assert np.allclose(values.sum(axis=1), 1.0) and values.min() >= 0  # probabilities
    values, samples = split("digits_attributes")
    targets, predicted = np.array([s["labels"] for s in samples]) > 0.5, values >= 0.5
    tp, fp, fn = (predicted & targets).sum(), (predicted & ~targets).sum(), (~predicted & targets).sum()
    assert 2 * tp / (2 * tp + fp + fn) == pytest.approx(summary["digits_attributes"]["eval"]["micro_f1"], abs=1e-6)
    values, samples = split("digits_properties")
    rmse = np.sqrt(np.mean((values - np.array([s["target"] for s in samples])) ** 2))
    assert rmse == pytest.approx(summary["digits_properties"]["eval"]["rmse"], rel=1e-5)


def test_a_run_and_its_export_predict_the_same_with_the_datas_names(four_heads):
    from mtl.readers.digit_features import ATTRIBUTES, PROPERTIES

    _, run, exported = four_heads
    images = [os.path.join(DIGITS, f"{d}.png") for d in (3, 8)]
    from_run, from_export = predict(run, images), predict(exported, images)
    for a, b in zip(from_run, from_export):
        assert a.task == b.task and a.names == b.names
        assert np.abs(a.values - b.values).max() <= 1e-5
    names = {r.task: r.names for r in from_run}
    assert names["digits_classify"] == [str(d) for d in range(10)] and names["digits_low"] == list("0123456")
    assert names["digits_attributes"] == list(ATTRIBUTES) and names["digits_properties"] == list(PROPERTIES)
    only = predict(exported, images, task="digits_classify")
    table = prediction_table(only, top=2)
    assert len(only) == 1 and f"| {images[0]} | digits_classify (softmax: top 2 classes by probability) | " in table
    best = [only[0].best(row, 1)[0][0] for row in range(2)]
    assert table.count("|") and best == [names["digits_classify"][int(np.argmax(v))] for v in only[0].values]


def test_predict_on_a_table_reads_its_columns_by_name_and_names_the_species(tmp_path):
    """The iris rows of examples/data/tables (raw centimetres, columns in any order) are standardised as the
    task's training split was and predicted with the species' names."""
    import csv

    run = str(tmp_path / "run")
    train_cli(os.path.join(ROOT, "examples", "configs", "tabular_mtl.yaml"), "--set", f"output_dir={run}",
              "schedule.steps=60", "log.progress=false", "log.plot=false")
    rows = list(csv.reader(open(os.path.join(ROOT, "examples", "data", "tables", "iris.csv"))))
    shuffled = tmp_path / "iris.csv"  # the columns in another order: they are matched by name
    with open(shuffled, "w", newline="") as f:
        csv.writer(f).writerows([list(reversed(r)) for r in rows])
    (result,) = predict(run, [str(shuffled)])
    assert result.task == "iris" and result.names == ["setosa", "versicolor", "virginica"]
    assert [result.best(i, 1)[0][0] for i in range(len(rows) - 1)] == [r[-1] for r in rows[1:]]
    assert result.inputs[0] == f"{shuffled} row 1"
    from mtl.serving.inference import read_run_data
    from mtl.serving.prediction import read_table

    spec = read_run_data(run)["inputs"]["iris"]
    x = read_table(str(shuffled), spec)
    raw = np.array([[float(v) for v in r[:4]] for r in rows[1:]])  # the file's own order
    expected = (raw - np.array(spec["mean"])) / np.array(spec["std"])
    assert x.shape == (6, 30) and np.allclose(x[:, :4], expected, atol=1e-6) and not x[:, 4:].any()


def test_predict_errors_are_one_sentence(four_heads, tmp_path):
    _, run, exported = four_heads
    image = os.path.join(DIGITS, "3.png")
    with pytest.raises(ConfigError, match=r"has no task 'digits'.*digits_classify"):
        predict(run, [image], task="digits")
    meta = json.load(open(os.path.join(exported, "export.json")))
    old = tmp_path / "old_export"
    old.mkdir()
    meta.pop("head_configs")
    (old / "export.json").write_text(json.dumps(meta))
    for name in os.listdir(exported):
        if name != "export.json":
            os.symlink(os.path.join(exported, name), old / name)
    with pytest.raises(ConfigError, match="export the run again"):
        predict(str(old), [image])


@pytest.mark.subprocess
def test_mtl_predict_prints_the_names(four_heads):
    _, _, exported = four_heads
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", "predict", exported, os.path.join(DIGITS, "3.png"),
                           "--task", "digits_attributes", "--json", os.path.join(exported, "p.json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "digits_attributes (multilabel: labels with probability >= 0.5)" in proc.stdout, proc.stdout
    written = json.load(open(os.path.join(exported, "p.json")))
    best = [b["name"] for b in written[0]["tasks"]["digits_attributes"]["best"]]
    assert best and all(name in proc.stdout for name in best)
