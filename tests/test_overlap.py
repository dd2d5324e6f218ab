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
from mtl.commands.overlap import match_classes
from mtl.config.loading import load_job
from mtl.errors import ConfigError
from mtl.job import build_job

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
    args = build_parser().parse_args(["overlap", str(run), "--json", str(tmp_path / "o.json")])
    args.func(args)
    found = json.load(open(tmp_path / "o.json"))
    assert {(m["task_a"], m["class_a"], m["task_b"], m["class_b"]) for m in found} == \
        {("a", ca, "b", cb) for ca, cb in SHARED.items()}
    assert all(set(m) == {"task_a", "class_a", "task_b", "class_b", "similarity"} for m in found)
    assert "4 likely-same identities" in capsys.readouterr().out
    args = build_parser().parse_args(["overlap", str(run), "--threshold", "1.5"])
    with pytest.raises(ConfigError, match="threshold"):
        args.func(args)
    with pytest.raises(ConfigError, match="no job.json"):
        args = build_parser().parse_args(["overlap", str(tmp_path)])
        args.func(args)
