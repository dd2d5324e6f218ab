"""Face pipeline end to end: two generated RecordIO datasets with overlapping identities, 2 processes, a .bin set,
export, and re-embedding with the exported model. The 2-process run is in the session's one launch of 2-process
runs (tests/shared_runs.py)."""
import json
import os
import shutil

import numpy as np
import pytest
import yaml

from mtl.config.loading import load_job
from mtl.evaluation.metrics import verification
from mtl.serving.export import embed, export
from tests.dist_util import ROOT
from tests.face_data import SIZE, make_face_data
from tests.shared_runs import two_process_run


@pytest.fixture(scope="module")
def face_data(tmp_path_factory):
    return make_face_data(tmp_path_factory.mktemp("faces"))


def write_tasks(root, folder):
    folder.mkdir(exist_ok=True)
    for name, data in (("faces_a", "a_rec"), ("faces_b", "b_rec")):
        task = {"name": name, "reader": {"type": "recordio", "path": str(root / data)},
                "head": {"type": "arcface", "scale": 16.0, "margin": [1.0, 0.3, 0.0]},
                "eval": {"split": False, "sets": [str(root / "pairs.bin")] if name == "faces_a" else []}}
        if name == "faces_b":
            task["eval"] = None
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(task))


@two_process_run("face_pipeline")
def _two_processes(folder):
    """The data, the task files and the job, written in ``folder``; the run in ``folder/run``."""
    data = make_face_data(folder / "data")
    write_tasks(data, folder / "tasks")
    job = {"seed": 0, "device": "cpu", "output_dir": str(folder / "run"), "tasks": ["faces_a", "faces_b"],
           "backbone": {"type": "cnn", "in_channels": 3, "input_size": SIZE, "embedding_size": 32},
           "schedule": {"batch_size": 8, "steps": 6}, "optimizer": {"lr": 0.05},
           "averaging": {"type": "window", "average_window_rate": 0.5, "min_average_window": 2,
                         "max_average_window": 4},
           "log": {"every": 1, "progress": False}, "data": {"num_workers": 1}}
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    return {"train": [str(folder / "job.yaml")]}, folder


@pytest.mark.distributed
@pytest.mark.two_process_runs("face_pipeline")
def test_two_processes_two_recordio_datasets_eval_export(two_process, tmp_path):
    folder = two_process["face_pipeline"]
    face_data, run = folder / "data", folder / "run"
    summary = json.load(open(run / "summary.json"))
    assert summary["world_size"] == 2
    averaged = summary["tasks"]["faces_a"]["eval_averaged"]
    assert set(averaged) >= {"pairs/accuracy", "pairs/std", "pairs/val_at_far"}
    assert os.path.getsize(run / "roc_faces_a.png") > 1000
    records = [r for r in map(json.loads, open(run / "metrics.jsonl")) if "loss" in r]
    assert all(np.isfinite(r["loss/faces_a"]) and np.isfinite(r["loss/faces_b"]) for r in records)
    meta = export(str(run), str(tmp_path / "export"))
    assert meta["averaged"] and meta["heads"]["faces_a"]["weight"] == [6, 32]
    # re-embed the .bin pairs with the exported model: the protocol must give the summary's averaged accuracy
    from mtl.data.verification_sets import load_verification_set

    vset = load_verification_set(str(face_data / "pairs.bin"), image_size=SIZE)
    np.save(tmp_path / "pairs.npy", vset.images())
    emb = embed(str(tmp_path / "export"), [str(tmp_path / "pairs.npy")], flip=True, normalize_output=True)
    result = verification(emb, vset.issame, folds=10)
    assert result["accuracy"] == pytest.approx(averaged["pairs/accuracy"], abs=1e-9)


def test_face_example_config_loads(face_data, tmp_path):
    """The shipped face recipe validates once its data paths point at real files."""
    (tmp_path / "tasks").mkdir()
    for name, data in (("webface", "a_rec"), ("vggface2", "b_rec")):
        task = yaml.safe_load(open(os.path.join(ROOT, "tasks", f"{name}.yaml")))
        task["reader"]["path"] = str(face_data / data)
        task["eval"]["sets"] = [str(face_data / "pairs.bin")]
        (tmp_path / "tasks" / f"{name}.yaml").write_text(yaml.safe_dump(task))
    shutil.copy(os.path.join(ROOT, "examples", "configs", "faces_two_datasets.yaml"), tmp_path / "job.yaml")
    job = load_job(str(tmp_path / "job.yaml"))
    heads = {t["name"]: t["head"] for t in job["tasks"]}
    assert heads["webface"]["num_classes"] == 10572 and heads["vggface2"]["num_classes"] == 8631
    assert job["backbone"]["type"] == "iresnet50"
