"""``mtl overlap`` on a synthetic finished run whose shared identities are known.

The run is written by hand (job.json, a checkpoint with the backbone and two heads' class centres): head B's
centres 0-3 are noisy copies of head A's centres 5, 2, 7, 0 (the shared people); the others are unrelated random
directions. The reference is that construction, not the tool's own output.
"""
import json
import os

import numpy as np
import paddle
import pytest
import yaml

from mtl.cli import build_parser
from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.studies.overlap import calibrated_threshold, chosen_images, match_classes, overlaps, templates
from mtl.train.job import build_job

SHARED = {5: 0, 2: 1, 7: 2, 0: 3}  # class of A -> class of B


def centres(dim=32, seed=0):
    """(A [10, dim], B [8, dim]): B rows 0-3 copy A rows 5, 2, 7, 0 plus noise; B rows 4-7 are unrelated."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((10, dim))
    b = rng.standard_normal((8, dim))
    for class_a, class_b in SHARED.items():
        b[class_b] = a[class_a] + 0.3 * rng.standard_normal(dim)
    return a.astype(np.float32), b.astype(np.float32)


def test_match_classes_finds_the_shared_identities():
    a, b = centres()
    found = match_classes(a, b, threshold=0.5)
    assert {(m["class_a"], m["class_b"]) for m in found} == set(SHARED.items())
    assert all(m["mutual"] and m["similarity"] > 0.5 for m in found)
    # the similarity is the cosine of the two centres, computed here with numpy
    m = found[0]
    expected = a[m["class_a"]] @ b[m["class_b"]] / np.linalg.norm(a[m["class_a"]]) / np.linalg.norm(b[m["class_b"]])
    assert m["similarity"] == pytest.approx(float(expected), abs=1e-6)
    assert match_classes(a, b, threshold=0.99) == []


def write_run(tmp_path):
    """A finished two-task run folder with hand-set class centres; returns its path."""
    def task(name, classes):
        return {"name": name, "reader": {"type": "synthetic", "num_samples": 40, "num_classes": classes,
                                         "shape": [4]}, "head": {"type": "arcface", "scale": 16.0}}

    job_yaml = {"output_dir": str(tmp_path / "run"), "tasks": [task("a", 10), task("b", 8)],
                "backbone": {"type": "mlp", "input_shape": [4], "hidden": [], "embedding_size": 32}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_yaml))
    cfg = load_job(str(path))
    job = build_job(cfg)
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    os.makedirs(ckpt / "heads")
    (tmp_path / "run" / "job.json").write_text(json.dumps(cfg, default=str))
    (ckpt / "state.json").write_text(json.dumps({"step": 1}))
    paddle.save(job.backbone.state_dict(), str(ckpt / "backbone.pdparams"))
    for name, weight in zip("ab", centres()):
        paddle.save({"weight": paddle.to_tensor(weight)}, str(ckpt / "heads" / f"{name}.shard0of1.pdparams"))
    return tmp_path / "run"


def test_overlap_cli_on_a_synthetic_run(tmp_path, capsys):
    run = write_run(tmp_path)
    args = build_parser().parse_args(["overlap", str(run), "--centres", "--json", str(tmp_path / "o.json")])
    args.func(args)
    found = json.load(open(tmp_path / "o.json"))
    # people by the dataset's labels (no one held out: the head's classes)
    assert {(m["task_a"], m["label_a"], m["task_b"], m["label_b"]) for m in found} == \
        {("a", ca, "b", cb) for ca, cb in SHARED.items()}
    assert all(set(m) == {"task_a", "label_a", "name_a", "task_b", "label_b", "name_b", "similarity"} for m in found)
    assert all(m["name_a"] is None and m["name_b"] is None for m in found)  # synthetic data: no names
    assert "4 likely-same identities" in capsys.readouterr().out
    args = build_parser().parse_args(["overlap", str(run), "--centres", "--threshold", "1.5"])
    with pytest.raises(ConfigError, match="threshold"):
        args.func(args)
    with pytest.raises(ConfigError, match="no job.json"):
        args = build_parser().parse_args(["overlap", str(tmp_path)])
        args.func(args)


# ----------------------------------------------------------------------------------------------- templates
def people_images(rng, people, per_person, dim=24, noise=0.6):
    """Embeddings of ``per_person`` images of each of ``people`` (rows of a fixed identity matrix plus noise)."""
    identity = np.random.default_rng(99).standard_normal((40, dim))
    feats = np.concatenate([identity[p] + noise * rng.standard_normal((per_person, dim)) for p in people])
    return feats, np.repeat(np.arange(len(people)), per_person)


def test_templates_and_half_cosines_against_numpy():
    rng = np.random.default_rng(1)
    feats, labels = people_images(rng, [3, 4, 5], 5)
    out, halves = templates(feats, labels, num_classes=4)  # class 3 has no image
    unit = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    for c in range(3):
        rows = unit[labels == c]
        mean = rows.mean(axis=0)
        assert np.allclose(out[c], mean / np.linalg.norm(mean))
        even, odd = rows[0::2].mean(axis=0), rows[1::2].mean(axis=0)
        assert halves[c] == pytest.approx(even @ odd / np.linalg.norm(even) / np.linalg.norm(odd))
    assert not out[3].any() and np.isnan(halves[3])
    assert chosen_images(np.array([2, 0, 2, 2, 0, 1]), 2).tolist() == [0, 1, 2, 4, 5]


def test_calibrated_decision_finds_the_shared_people_and_nothing_else():
    """Dataset B holds people 5, 2, 7, 0 of dataset A (other images) and four people of its own: the calibrated
    rule finds exactly the four; two datasets without a shared person give no pair."""
    rng = np.random.default_rng(2)
    a = templates(*people_images(rng, list(range(10)), 8), 10)
    b = templates(*people_images(rng, [5, 2, 7, 0, 20, 21, 22, 23], 8), 8)
    c = templates(*people_images(rng, [30, 31, 32, 33, 34], 8), 5)
    limit = calibrated_threshold([a[1], b[1], c[1]])
    halves = np.concatenate([a[1], b[1], c[1]])
    assert limit == pytest.approx(np.percentile(halves, 5))
    found = overlaps({"a": a[0], "b": b[0]}, limit)
    assert {(m["class_a"], m["class_b"]) for m in found} == set(SHARED.items())
    assert overlaps({"a": a[0], "c": c[0]}, limit) == []
    assert len(overlaps({"a": a[0], "c": c[0]}, limit, all_mutual=True)) >= 1  # mutual NN alone would say more
    with pytest.raises(ConfigError, match="cannot be calibrated"):
        calibrated_threshold([np.full(3, np.nan)])
