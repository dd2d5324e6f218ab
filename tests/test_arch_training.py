"""Architectures in training: ``hard`` bit-identical to the model before architectures existed, every architecture
equal at 1 and 2 processes (per step, 1e-4), a stopped and resumed run equal to an uninterrupted one bit for bit,
the memory plan counting the architecture, and an export that embeds for a named task.

The 2-process runs are in the session's one launch of 2-process runs (tests/shared_runs.py); the 1-process runs and
the resumed runs train in this process (tests/dist_scripts/architectures_all.py).
"""
import json
import os

import numpy as np
import paddle
import pytest
import yaml

from tests import hard_reference
from tests.dist_scripts import architectures_all
from tests.dist_scripts.architectures_all import RUNS
from tests.dist_util import ROOT
from tests.shared_runs import two_process_run

SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "architectures_all.py")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "hard_reference.npz")
STEPS = 12
TWO_STEPS = 6  # the 2-process runs: the first 6 steps of the 1-process runs (constant lr)
RESUMED = ["mmoe", "ple_cagrad", "cross_stitch_graddrop", "task_norm", "adapters_gradnorm", "task_norm_cross",
           "adapters_same_rows", "mgda_ub_same_rows", "cross_stitch_backbone_imtl", "cross_stitch_backbone_same_rows"]


def records(out, name):
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r and "lr" in r]


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("architectures") / "one")
    architectures_all.main(out, STEPS)
    return out


@two_process_run("architectures_all")
def _two_processes(folder):
    return {"call": [SCRIPT, "main", str(folder), str(TWO_STEPS)]}, str(folder)


BEFORE = "26a3f02"  # main's last commit before the architecture layer
# c141f27 (issue 55: no Paddle tensor built per chunk, which leaked) moved the host chunk pass's exponential from
# Paddle's to numpy's, a deliberate change of the last bits; the code before is compared with that one line changed
PADDLE_EXP = "paddle.utils.dlpack.from_dlpack(z).exp_()"
NUMPY_EXP = "np.exp(z, out=z)"


def reference_before(tmp_path):
    """The jobs trained by commit 26a3f02's code on this machine (git archive of it with the host chunk pass's
    exponential of c141f27, :data:`NUMPY_EXP`; tests/hard_reference.py in a fresh process), or the committed fixture
    (made by that code) when this checkout lacks the commit. The fixture alone binds the test to the CPU that made
    it, an AVX-512 AMD EPYC (the fixture before, made on another CPU, differed there in the last bits of 86 of its 90
    arrays from what the same old code gives there, while the new code equals the old there bit for bit)."""
    import subprocess
    import sys
    import tarfile

    archive = subprocess.run(["git", "-C", ROOT, "archive", BEFORE], capture_output=True)
    if archive.returncode != 0:  # a checkout without history: the fixture, made by that code on another machine
        return np.load(FIXTURE)
    old, out = tmp_path / "before", tmp_path / "before.npz"
    old.mkdir()
    (tmp_path / "before.tar").write_bytes(archive.stdout)
    with tarfile.open(tmp_path / "before.tar") as tar:
        tar.extractall(old, filter="data")
    chunks = old / "mtl" / "heads" / "host_chunks.py"
    text = chunks.read_text()
    assert PADDLE_EXP in text
    chunks.write_text(text.replace(PADDLE_EXP, NUMPY_EXP))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "hard_reference.py"), str(out)], check=True,
                          env=dict(os.environ, PYTHONPATH=str(old), OMP_NUM_THREADS="1"), capture_output=True,
                          text=True)
    assert f"mtl from {old / 'mtl'}" in done.stdout, done.stdout  # the old code trained, not this checkout
    assert not (old / "mtl" / "architectures").exists()  # and it is the code before the architecture layer
    return np.load(out)


@pytest.mark.slow
def test_hard_is_bit_identical_to_the_model_before_architectures(tmp_path):
    """Six jobs (MLP and CNN with BatchNorm; static, PCGrad, MGDA-UB) trained with ``architecture: hard``: every
    step's losses, the final evaluation and every final weight equal, bit for bit, those of commit 26a3f02 (main's
    code before the architecture layer) on the same machine (:func:`reference_before`)."""
    from mtl.core.runtime import select_device

    select_device("cpu")
    got = hard_reference.train_all(str(tmp_path / "now"), {"architecture": "hard"})
    expected = reference_before(tmp_path)
    assert sorted(got) == sorted(expected.files)
    for key in expected.files:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.mark.distributed
@pytest.mark.two_process_runs("architectures_all")
def test_every_architecture_agrees_between_one_and_two_processes(single_runs, two_process):
    two = two_process["architectures_all"]
    for name in RUNS:
        a, b = records(single_runs, name)[:TWO_STEPS], records(two, name)
        assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, TWO_STEPS + 1)), name
        keys = [k for k in a[0] if k.startswith(("loss/", "weight/", "alpha/"))]
        assert len([k for k in keys if k.startswith("loss/")]) == 3, name
        worst = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-6) for ra, rb in zip(a, b) for k in keys)
        assert worst <= 1e-4, (name, worst)
        for folder, size in ((single_runs, 1), (two, 2)):  # two processes trained, not one twice
            with open(os.path.join(folder, name, "summary.json")) as f:
                assert json.load(f)["world_size"] == size, (name, folder)


def checkpoint_arrays(folder):
    from mtl.core.safe_pickle import load_paddle_file

    ckpt = os.path.join(folder, "checkpoints", f"step_{STEPS}")
    files = [os.path.join(ckpt, f) for f in sorted(os.listdir(ckpt)) if f.endswith((".pdparams", ".pdopt"))]
    files += [os.path.join(ckpt, "heads", f) for f in sorted(os.listdir(os.path.join(ckpt, "heads")))]
    return {f"{os.path.basename(f)}:{k}": np.asarray(v) for f in files if "rng" not in f
            for k, v in load_paddle_file(f).items() if isinstance(v, np.ndarray)}


@pytest.mark.slow
def test_stopped_and_resumed_runs_are_bit_identical(single_runs, tmp_path):
    """Stopped after step 6 (a checkpoint, a fresh Trainer) and resumed to step 12: every step's losses and every
    weight of the final checkpoint (backbone, architecture, heads, optimizer state) equal the uninterrupted run's."""
    out = str(tmp_path / "resumed")
    architectures_all.main(out, STEPS, 6, ",".join(RESUMED))
    for name in RESUMED:
        a, b = records(single_runs, name), records(out, name)
        assert [r["step"] for r in b] == list(range(1, STEPS + 1)), name
        for ra, rb in zip(a, b):
            assert {k: v for k, v in ra.items() if k.startswith(("loss", "weight", "alpha"))} == \
                   {k: v for k, v in rb.items() if k.startswith(("loss", "weight", "alpha"))}, name
        first, second = checkpoint_arrays(os.path.join(single_runs, name)), checkpoint_arrays(os.path.join(out, name))
        assert sorted(first) == sorted(second)
        # the task layers of task BatchNorms and adapters are in the backbone
        own_weights = name not in ("adapters_gradnorm", "task_norm_cross", "adapters_same_rows",
                                   "mgda_ub_same_rows")
        assert any(k.startswith("architecture.pdparams") for k in first) == own_weights, name
        for key in first:
            np.testing.assert_array_equal(first[key], second[key], err_msg=f"{name} {key}")


def test_the_memory_plan_counts_the_architecture():
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.memory_plan import plan_job

    cfg = load_job(data=architectures_all.job("unused", "mmoe", 2))
    job = build_job(cfg, announce_plan=False)
    plan = {e.key: e for e in plan_job(cfg, job.backbone, lambda t: job.task(t["name"]).reader.sizes(), 1,
                                       architecture=job.model.architecture)}
    count = sum(int(np.prod(p.shape)) for p in job.model.architecture.parameters())
    assert plan["architecture"].parts == {"parameters": 4 * count, "gradients": 4 * count,
                                          "optimizer state": 4 * count}  # momentum: one slot
    assert plan["tasks.2.head"].parts["weight"] == 4 * (8 * 3)  # the softmax head reads the tower's 8 features


@pytest.mark.parametrize("name", ["cross_stitch_backbone_imtl", "task_norm", "adapters_gradnorm"])
def test_the_memory_plan_counts_backbone_copies_and_task_layers_inside_the_backbone(name):
    """A copy of the backbone per task counts in the architecture's line (the columns and the stitch units, by
    their shapes); task BatchNorms and adapters, which live inside the backbone, in the backbone's line."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.memory_plan import plan_job

    cfg = load_job(data=architectures_all.job("unused", name, 2))
    job = build_job(cfg, announce_plan=False)
    plan = {e.key: e for e in plan_job(cfg, job.backbone, lambda t: job.task(t["name"]).reader.sizes(), 1,
                                       architecture=job.model.architecture)}
    architecture, backbone = job.model.architecture, job.backbone
    size = lambda params: sum(4 * int(np.prod(p.shape)) for p in params)  # noqa: E731
    assert plan["backbone"].parts["parameters"] == size(backbone.parameters())
    if name.startswith("cross_stitch_backbone"):
        columns = [p for column in architecture.backbone_copies() for p in column.parameters()]
        assert len(architecture.backbone_copies()) == 2 and size(columns) == 2 * size(backbone.parameters())
        stitches = [p for stage in architecture.stitches for p in stage]
        assert all(tuple(p.shape) == (3,) for p in stitches)  # a row of three columns per task and stage
        counted = {id(p) for p in columns + stitches}
        assert plan["architecture"].parts["parameters"] == size(columns) + size(stitches) + size(
            [p for p in architecture.parameters() if id(p) not in counted])
    else:
        plain = build_job(load_job(data={**architectures_all.job("unused", name, 2), "architecture": {"type": "hard"}}),
                          announce_plan=False).backbone
        assert size(backbone.parameters()) > size(plain.parameters())  # the task layers are the backbone's
        assert "architecture" not in plan or plan["architecture"].parts["parameters"] == size(
            architecture.parameters())


def _train(tmp_path, name, architecture):
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    raw = architectures_all.job(str(tmp_path / name), "mmoe", 4)
    raw.update(architecture=architecture, backbone=architectures_all.CNN,
               averaging={"type": "ema", "decay": 0.5})
    job = build_job(load_job(data=raw), announce_plan=False)
    Trainer(job, console=lambda *a: None, overwrite=True).run()
    return job, str(tmp_path / name)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", [{"type": "mmoe", "experts": 2, "expert_layers": [8]},
                                          {"type": "ple", "levels": 2, "expert_layers": [8]},
                                          {"type": "cross_stitch", "layers": [8]},
                                          {"type": "task_norm"}, {"type": "adapters", "tower": [6]},
                                          {"type": "cross_stitch_backbone"}])
def test_an_export_embeds_for_the_named_task(tmp_path, architecture):
    """``mtl export --task T``: the inference model's embeddings equal backbone + the architecture's layers for T
    with the run's averaged weights (in this process); naming no task, or another one, is one sentence."""
    from mtl.core.errors import ConfigError
    from mtl.serving.export import export
    from mtl.serving.inference import open_run

    job, run = _train(tmp_path, architecture["type"], architecture)
    images = np.random.RandomState(0).randn(5, 1, 8, 8).astype(np.float32)
    for task in ("arc5", "soft3"):
        meta = export(run, str(tmp_path / f"export_{task}"), task=task)
        assert meta["task"] == task and meta["architecture"]["type"] == architecture["type"]
        exported = paddle.jit.load(str(tmp_path / f"export_{task}" / "backbone"))
        exported.eval()
        embedder = open_run(run).backbone(task)
        expected = embedder({"image": paddle.to_tensor(images)}).numpy()
        np.testing.assert_allclose(exported(paddle.to_tensor(images)).numpy(), expected, rtol=1e-5, atol=1e-6)
        assert meta["feature_size"] == expected.shape[1] == job.model.architecture.output_size
        # the live weights' export against the training path (JointModel.features: the task's rows in the joint
        # step's pass), not the inference loader that made the export
        live = export(run, str(tmp_path / f"live_{task}"), task=task, weights="live")
        assert meta["averaged"] and not live["averaged"]
        traced = paddle.jit.load(str(tmp_path / f"live_{task}" / "backbone"))
        traced.eval()
        job.model.eval()
        with paddle.no_grad():
            trained = job.model.features({task: {"image": paddle.to_tensor(images)}})[task].numpy()
        np.testing.assert_allclose(traced(paddle.to_tensor(images)).numpy(), trained, rtol=1e-5, atol=1e-6)
    others = open_run(run).backbone("arc7")({"image": paddle.to_tensor(images)}).numpy()
    assert not np.allclose(others, expected)  # each task its own embedding
    for task, words in ((None, "name the task to embed for (mtl export RUN OUT --task NAME"),
                        ("nope", "task 'nope' is not one of them")):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            export(run, str(tmp_path / "bad"), task=task)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hard_tower", "mmoe", "omoe_uncertainty", "cgc_mgda_ub", "ple_cagrad",
                                  "cross_stitch_graddrop", "task_norm", "adapters_gradnorm",
                                  "cross_stitch_backbone_imtl"])
def test_every_weighting_strategy_trains_with_an_architecture(tmp_path, name):
    """The 20 strategies of the weighting benchmarks, 3 steps each, on every architecture (the run's own weighting
    replaced): among them one whose shared and task parameters interleave (cross-stitch), ones with task layers
    inside the backbone (task BatchNorms, adapters) and one with a copy of the backbone per task (every task's rows
    in one pass: the per-task backward): finite losses, and every shared and task parameter updated."""
    import sys

    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_weighting import STRATEGIES

    for strategy, spec in STRATEGIES.items():
        raw = architectures_all.job(str(tmp_path / strategy), name, 3)
        raw["weighting"] = yaml.safe_load(spec)  # "{type: mgda, representation: true}"
        raw["optimizer"]["weight_decay"] = 0.0  # a parameter moves only if its gradient did
        job = build_job(load_job(data=raw), announce_plan=False)
        before = {id(p): p.numpy().copy() for p in job.model.parameters()}
        Trainer(job, console=lambda *a: None, overwrite=True).run()
        losses = [r["loss"] for r in records(str(tmp_path), strategy)]
        assert len(losses) == 3 and all(np.isfinite(losses)), strategy
        model = job.model
        moved = [p for p in model.shared_parameters() + model.architecture.task_parameters("soft3", model.backbone)
                 if not np.array_equal(before[id(p)], p.numpy())]
        assert len(moved) == len(model.shared_parameters()) + len(
            model.architecture.task_parameters("soft3", model.backbone)), strategy


def test_overlap_refuses_a_run_whose_tasks_embed_apart(tmp_path):
    """mtl overlap compares class centres of several tasks in one embedding: a run with per-task embeddings is one
    sentence, not a comparison across spaces."""
    from mtl.core.errors import ConfigError
    from mtl.studies.overlap import load_run

    _, run = _train(tmp_path, "mmoe", {"type": "mmoe", "experts": 2, "expert_layers": [8]})
    with pytest.raises(ConfigError, match="gives each task its own"):
        load_run(run)


def test_overlap_embeds_each_task_through_its_own_batchnorms(tmp_path):
    """Task BatchNorms keep one embedding (``Architecture.one_embedding``): mtl overlap accepts the run and takes
    each task's templates through that task's BatchNorms, as the run's export path embeds that task's images
    (``RunWeights.backbone(task)``, its averaged weights); another task's BatchNorms give other embeddings."""
    import paddle

    from mtl.data.steps import collate
    from mtl.serving.inference import open_run
    from mtl.studies.overlap import IMAGES_PER_CLASS, chosen_images, class_templates, decide, load_run

    _, run_dir = _train(tmp_path, "task_norm", {"type": "task_norm"})
    job, _ = load_run(run_dir)
    found, _ = class_templates(job)
    weights, field = open_run(run_dir), job.backbone.input_fields()[0].name
    for task in job.tasks:
        task.reader.set_augmentation(False)
        batch = collate([task.reader[int(i)] for i in chosen_images(task.reader.labels(), IMAGES_PER_CLASS)])

        def embed(name, batch=batch):
            with paddle.no_grad():
                return weights.backbone(name)({field: paddle.to_tensor(batch[field])}).numpy()

        own = embed(task.name)
        unit = own / np.linalg.norm(own, axis=1, keepdims=True)
        labels = np.asarray(batch[task.head.label_field]).reshape(-1)
        for c in np.unique(labels):
            mean = unit[labels == c].mean(axis=0)
            np.testing.assert_allclose(found[task.name][c], mean / np.linalg.norm(mean), atol=1e-5)
        other = embed(next(t.name for t in job.tasks if t.name != task.name))
        assert np.abs(own - other).max() > 1e-3, task.name
    _, bank, _, decision = decide(run_dir)
    assert set(bank) == {t.name for t in job.tasks} and decision["how"].startswith("calibrated")


@pytest.mark.slow
def test_overlap_sets_embed_each_tasks_verification_images_through_its_own_batchnorms(tmp_path):
    """``mtl overlap --sets`` with task BatchNorms: every verification image is compared with the training identities
    as embedded through the BatchNorms of the task whose set it is, with the run's averaged weights (as ``mtl export
    --task`` embeds it: ``RunWeights.backbone(task)``). The same ``.bin`` set under two tasks gives two sets of
    similarities, each equal to a numpy reference (normalize(f(x) + f(flipped x)), nearest class)."""
    from mtl.data.verification_sets import load_verification_set
    from mtl.serving.inference import open_run
    from mtl.studies.overlap import decide, leaks
    from tests.face_data import SIZE, make_face_data
    from tests.shared_runs import train_here

    data = make_face_data(tmp_path / "data")
    names = {"faces_a": "a_rec", "faces_b": "b_rec"}
    tasks = [{"name": name, "reader": {"type": "recordio", "path": str(data / folder)},
              "head": {"type": "arcface", "scale": 16.0, "margin": [1.0, 0.3, 0.0]},
              "eval": {"split": False, "sets": [{"path": str(data / "pairs.bin"), "name": f"pairs_{name}"}]}}
             for name, folder in names.items()]
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"), "tasks": tasks,
           "architecture": {"type": "task_norm"},
           "backbone": {"type": "cnn", "in_channels": 3, "input_size": SIZE, "embedding_size": 32},
           "schedule": {"batch_size": 8, "steps": 6}, "optimizer": {"lr": 0.01},
           "averaging": {"type": "ema", "decay": 0.5}, "log": {"every": 1, "progress": False, "plot": False},
           "data": {"num_workers": 0}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    train_here(tmp_path / "job.yaml")
    run_dir = str(tmp_path / "run")
    loaded, bank, _, _ = decide(run_dir)
    flagged, checked = leaks(loaded, bank, -2.0)  # every image is above a cosine of -2: each one's nearest class
    vset = load_verification_set(str(data / "pairs.bin"), image_size=SIZE)
    assert checked == 2 * len(vset) == len(flagged)
    units = {n: c / np.linalg.norm(c, axis=1, keepdims=True) for n, c in bank.items()}
    all_classes = np.concatenate([units[n] for n in bank])
    weights, field = open_run(run_dir), loaded.backbone.input_fields()[0].name
    images = np.concatenate(list(vset.batches(len(vset))))
    nearest = {}
    for name in names:
        with paddle.no_grad():
            embed = weights.backbone(name)
            f = embed({field: paddle.to_tensor(images)}).numpy().astype(np.float64)
            f = f + embed({field: paddle.to_tensor(np.ascontiguousarray(images[..., ::-1]))}).numpy()
        f /= np.linalg.norm(f, axis=1, keepdims=True)
        nearest[name] = (f @ all_classes.T).max(axis=1)
        got = [m["similarity"] for m in sorted(flagged, key=lambda m: m["image"]) if m["set"] == f"pairs_{name}"]
        np.testing.assert_allclose(got, nearest[name], atol=1e-5, err_msg=name)
    # the other task's BatchNorms give other similarities, ten times the tolerance above: a comparison through the
    # wrong task's norms fails it (the embeddings of a 6-step run are close together: cosines of 0.99 and more)
    assert np.abs(nearest["faces_a"] - nearest["faces_b"]).max() > 1e-4


def test_each_ranks_own_batchnorm_statistics_come_back_and_reshard_with_backbone_copies(tmp_path, monkeypatch):
    """A checkpoint keeps the backbone files' statistics averaged over ranks and each rank's own in
    statistics.rank<k>. A review found the architecture's (its backbone copies') were not restored on a resume and
    that prefixing the names made reshard fail (KeyError) and the backbone's own silently dropped. Here the
    averaging is replaced by a shift, so that a rank's own statistics and the averaged ones differ at one process:
    the resumed model holds its own (backbone and copies), and a reshard to 2 gives both new ranks the averaged."""
    import contextlib

    from mtl.config.loading import load_job
    from mtl.core.safe_pickle import load_paddle_file
    from mtl.optimizer.joint import JointOptimizer
    from mtl.parallel.strategy import ParallelStrategy
    from mtl.store import checkpoint, reshard
    from mtl.train.job import build_job

    raw = architectures_all.job(str(tmp_path / "run"), "cross_stitch_backbone_imtl", 2)
    cfg = load_job(data=raw)
    job = build_job(cfg, announce_plan=False)
    strategy = ParallelStrategy(job.model)
    names = sorted(strategy.statistics)
    assert any(n.startswith("architecture.columns.") for n in names)
    assert any(not n.startswith("architecture.") for n in names)
    for i, t in enumerate(strategy.statistics.values()):
        t.set_value(paddle.full(t.shape, 1.0 + i, t.dtype))
    own = {n: t.numpy().copy() for n, t in strategy.statistics.items()}

    @contextlib.contextmanager
    def shifted():  # what the mean over ranks would give: other values than this rank's own
        for t in strategy.statistics.values():
            t.set_value(t + 100.0)
        yield
        for t in strategy.statistics.values():
            t.set_value(t - 100.0)

    monkeypatch.setattr(strategy, "agreed_statistics", shifted)
    optimizer = JointOptimizer(cfg["optimizer"], job.model, 2)
    checkpoint.save(str(tmp_path / "run"), 1, job.model, optimizer, job.schedule, strategy)
    path = str(tmp_path / "run" / "checkpoints" / "step_1")
    fresh = build_job(load_job(data=raw), announce_plan=False)
    checkpoint.load(path, fresh.model, JointOptimizer(cfg["optimizer"], fresh.model, 2), fresh.schedule, rank=0,
                    world=1)
    back = ParallelStrategy(fresh.model).statistics
    for name in names:
        np.testing.assert_array_equal(back[name].numpy(), own[name], err_msg=name)
    reshard.reshard(path, 2, str(tmp_path / "two"))
    for rank in (0, 1):
        stats = load_paddle_file(str(tmp_path / "two" / f"statistics.rank{rank}.pdparams"))
        assert sorted(stats) == names
        for name in names:
            np.testing.assert_array_equal(stats[name], own[name] + 100.0, err_msg=name)
