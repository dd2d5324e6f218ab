"""Every head kind trains on bundled real data with only the task's head changed; task lookup; --flip refusal."""
import json
import os

import numpy as np
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError, ContractError
from mtl.serving.export import embed
from mtl.train.job import build_job
from mtl.train.trainer import Trainer

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "configs")
HEADS = {
    "arcface": {"type": "arcface", "scale": 16.0, "margin": [1.0, 0.2, 0.0]},
    "softmax": {"type": "softmax", "topk": 1},
    "multilabel": {"type": "multilabel", "num_classes": 7},
    "regression": {"type": "regression", "num_outputs": 4},
}


def run(tmp_path, tasks, backbone, steps=40, lr=0.05):
    data = {"seed": 0, "output_dir": str(tmp_path / "run"), "tasks": tasks, "backbone": backbone,
            "schedule": {"batch_size": 32, "steps": steps},
            "optimizer": {"type": "momentum", "lr": lr, "warmup_steps": 0, "decay": "none"},
            "log": {"every": 1, "progress": False, "plot": False}, "data": {"num_workers": 0}}
    job = build_job(load_job(data=data))
    Trainer(job, console=lambda *a: None).run()
    return [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in line]


def falls(records, key="loss"):
    """Mean of the last 5 logged losses below 0.7 x the mean of the first 5."""
    losses = [r[key] for r in records if key in r]
    return np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses


@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_kind_learns_the_bundled_digits_with_only_the_head_changed(tmp_path, head):
    # five classes: the core still compares a multilabel head's num_classes (7 attributes) with the reader's classes
    task = {"name": "digits", "reader": {"type": "digits", "classes": [0, 1, 2, 3, 4]},
            "head": HEADS[head], "eval": {"enabled": False}}
    ok, losses = falls(run(tmp_path, [task], {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [64],
                                              "embedding_size": 32}))
    assert ok, losses


@pytest.mark.parametrize("dataset,head", [("iris", "softmax"), ("breast_cancer", "multilabel"),
                                          ("diabetes", "regression"), ("linnerud", "regression")])
def test_bundled_tables_train_on_the_mlp_backbone(tmp_path, dataset, head):
    cfg = {"type": head} if dataset != "linnerud" else {"type": head, "num_outputs": 3}
    task = {"name": dataset, "reader": {"type": "table", "dataset": dataset}, "head": cfg}
    width = {"iris": 4, "breast_cancer": 30, "diabetes": 10, "linnerud": 3}[dataset]
    records = run(tmp_path, [task], {"type": "mlp", "input_shape": [width], "input_field": "features",
                                     "hidden": [32], "embedding_size": 16}, steps=30, lr=0.02)
    ok, losses = falls(records)
    assert ok, losses


def test_tabular_example_loads_and_its_tasks_fit_one_backbone():
    job = build_job(load_job(os.path.join(CONFIGS, "tabular_mtl.yaml")))
    assert [t.name for t in job.tasks] == ["iris", "wine", "breast_cancer", "diabetes"]
    assert {t.reader.fields()[0].shape for t in job.tasks} == {(30,)}


def test_head_swap_on_the_demo_reaches_real_targets():
    """The demo's softmax task swapped for a regression head finds its field in the digits reader; a wrong size is
    one sentence naming both sides."""
    job = build_job(load_job(os.path.join(CONFIGS, "demo.yaml"), ["tasks.2.head={type: regression, num_outputs: 4}"]))
    assert job.tasks[2].head.fields()[0].shape == (4,)
    with pytest.raises(ContractError, match=r"needs field labels\[10\] float32 but reader 'digits' provides "
                                            r"labels\[7\] float32"):
        build_job(load_job(os.path.join(CONFIGS, "demo.yaml"), ["tasks.2.head={type: multilabel, num_classes: 10}"]))


@pytest.mark.parametrize("head", ["{type: multilabel}", "{type: regression}"])
def test_bare_head_swap_on_the_demo(head):
    job = build_job(load_job(os.path.join(CONFIGS, "demo.yaml"), [f"tasks.2.head={head}"]))
    size = {"multilabel": 7, "regression": 4}[job.tasks[2].head.registered_name]
    assert job.tasks[2].head.fields()[0].shape == (size,)


PY_TASK = """
TASK = {{"name": "{name}", "reader": {{"type": "digits"}}, "head": {{"type": "softmax"}}}}
"""


def test_python_tasks_are_found_by_their_declared_name(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "file_name.py").write_text(PY_TASK.format(name="mine"))
    data = {"plugins": [str(plugins)], "tasks": ["mine"], "backbone": "mlp"}
    job = load_job(data=data)
    assert job["tasks"][0]["name"] == "mine" and job["tasks"][0]["source"].endswith("file_name.py")
    other = tmp_path / "plugins2"
    other.mkdir()
    (other / "clash.py").write_text(PY_TASK.format(name="theirs"))
    (other / "clash_too.py").write_text(PY_TASK.format(name="theirs"))
    with pytest.raises(ConfigError, match=r"task name 'theirs' is declared by more than one Python task file: "
                                          r".*clash.py, .*clash_too.py"):
        load_job(data={"plugins": [str(other)], "tasks": ["theirs"], "backbone": "mlp"})


def test_missing_task_names_the_tried_path_and_the_folders(tmp_path):
    with pytest.raises(ConfigError, match=r"task 'nowhere' does not exist: no file /\S+/nowhere, and no task of that "
                                          r"name .* in /\S+/tasks"):
        load_job(data={"tasks": ["nowhere"], "backbone": "mlp"})


def test_embed_refuses_flip_for_feature_vectors(tmp_path):
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    (export_dir / "export.json").write_text(json.dumps({"input_field": "features", "input_shape": [30]}))
    np.save(tmp_path / "x.npy", np.zeros((2, 30), dtype=np.float32))
    with pytest.raises(ConfigError, match=r"--flip mirrors images, but this model's input 'features' has shape "
                                          r"\[30\]"):
        embed(str(export_dir), [str(tmp_path / "x.npy")], flip=True)
