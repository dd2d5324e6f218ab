"""examples/text_report.py --arms on a shortened run (the pipeline, not the targets): the four arms (BiLSTM from
scratch, BiLSTM on word vectors, MiniLM-shaped encoder per task alone and joint) each train from their own config,
the JSON holds every arm's score of every main task, MiniLM joint - alone and Δm by their formula, and each run's
wall time; the table is printed."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.dist_util import ROOT
from tests.minilm_shaped import write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]
FIX = os.path.join(ROOT, "tests", "fixtures", "text")
CONLLU = os.path.join(FIX, "ewt_sample.conllu")
TASKS = [{"name": "upos", "reader": {"type": "conllu", "target": "upos", "path": CONLLU, "eval_path": CONLLU},
          "head": "tagger"},
         {"name": "genre", "reader": {"type": "conllu", "target": {"comment": "sent_id", "pattern": "^([a-z]+)-"},
                                      "path": CONLLU, "eval_path": CONLLU}, "head": "text_classify"}]


def config(folder, name, backbone, **extra):
    tasks = []
    for task in TASKS:  # task files: an alone run names its task's file
        tasks.append(str(folder / f"{task['name']}.yaml"))
        (folder / f"{task['name']}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    data = {"seed": 0, "device": "cpu", "tasks": tasks, "backbone": backbone,
            "schedule": {"mode": "joint", "batch_size": 8, "steps": 3, **extra},
            "optimizer": {"type": "adamw", "lr": 0.01, "decay": "linear", "warmup_steps": 1},
            "data": {"num_workers": 0}, "checkpoint": {"keep": 1}, "log": {"plot": False}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return f"{name}={path}"


def test_the_arms_report(tmp_path):
    vectors = tmp_path / "vectors"
    vectors.mkdir()
    words = ["the", ",", ".", "a", "of", "to", "and", "i", "is", "in"]
    np.save(vectors / "vectors.npy", np.random.RandomState(0).randn(len(words), 8).astype(np.float32))
    (vectors / "words.txt").write_text("\n".join(words) + "\n")
    checkpoint = write_checkpoint(str(tmp_path / "ckpt"))
    tokenizer = os.path.join(ROOT, "examples", "data", "text", "ewt_wordpiece_8k.json")
    arms = [config(tmp_path, "scratch", {"type": "text_bilstm", "tokenizer": tokenizer, "embedding_size": 8,
                                         "hidden_size": 8, "num_layers": 1}),
            config(tmp_path, "glove", {"type": "text_bilstm", "pretrained": str(vectors), "hidden_size": 8,
                                       "num_layers": 1}),
            config(tmp_path, "minilm", {"type": "bert", "pretrained": checkpoint}, same_rows=True)]
    arms.append(arms[-1].replace("minilm=", "minilm_alone="))
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "text_report.py"), "--arms", "scratch",
                           "glove", "minilm_alone", "minilm", "--arm-config", *arms, "--seeds", "1", "--steps", "2",
                           "--json", str(out), "--out", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["seeds"] == [1] and list(report["arms"]) == ["scratch", "glove", "minilm_alone", "minilm"]
    for arm, tasks in report["arms"].items():
        assert set(tasks) == {"upos", "genre"}, arm
        for entry in tasks.values():
            assert entry["metric"] == "accuracy" and len(entry["values"]) == 1 and 0 <= entry["values"][0] <= 100
    for task in ("upos", "genre"):
        assert report["tasks"][task]["joint"] == report["arms"]["minilm"][task]["values"]
        assert report["tasks"][task]["alone"] == report["arms"]["minilm_alone"][task]["values"]
    expect = np.mean([100 * (e["joint"][0] - e["alone"][0]) / e["alone"][0] for e in report["tasks"].values()])
    assert report["delta_m"] == [pytest.approx(expect)]
    assert set(report["seconds"]) == {"scratch", "glove", "minilm_alone_upos", "minilm_alone_genre", "minilm"}
    alone = json.load(open(tmp_path / "runs" / "seed1" / "minilm_alone_upos" / "job.json"))
    assert alone["schedule"]["batch_size"] == 4 and [t["name"] for t in alone["tasks"]] == ["upos"]
    assert json.load(open(tmp_path / "runs" / "seed1" / "minilm" / "summary.json"))["steps"] == 2
    assert "| upos | accuracy | " in done.stdout and "joint - alone" in done.stdout and "Δm" in done.stdout
