"""AdamW with Partial FC: the sampled class centres follow a dense numpy AdamW over the steps that sampled them (their
own step count), the others do not move; checkpointed, resumed bit for bit, re-sharded, and the same at 1 and 2
processes (the 2-process run is in the session's one launch, tests/shared_runs.py)."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core import arrays
from mtl.core.safe_pickle import load_paddle_file
from mtl.data.steps import StepDataset
from mtl.optimizer.sparse import row_sparse_adamw_
from mtl.store import layout
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests.dist_util import ROOT
from tests.row_updates import recorded_updates
from tests.shared_runs import train_here, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "partial_fc_job.yaml")
ADAMW = ["optimizer.type=adamw", "optimizer.lr=0.01", "optimizer.weight_decay=0.05", "optimizer.decay=poly",
         "optimizer.warmup_steps=2", "checkpoint.every=6", "checkpoint.keep=3"]
BETAS, EPS = (0.9, 0.999), 1e-8


def numpy_adamw(w, m, v, g, t, lr, wd):
    """One dense AdamW step of Paddle's formula (decoupled decay first) at step count t, float64."""
    w = w - lr * wd * w
    m = BETAS[0] * m + (1 - BETAS[0]) * g
    v = BETAS[1] * v + (1 - BETAS[1]) * g * g
    m_hat, v_hat = m / (1 - BETAS[0] ** t), v / (1 - BETAS[1] ** t)
    return w - lr * m_hat / (np.sqrt(v_hat) + EPS), m, v


def test_dense_numpy_adamw_is_paddles_adamw():
    """The reference itself: Paddle's dense AdamW on a parameter, step by step."""
    rng = np.random.RandomState(0)
    w = rng.randn(3, 4)
    param = paddle.create_parameter([3, 4], "float32")
    param.set_value(w.astype("float32"))
    opt = paddle.optimizer.AdamW(0.01, beta1=BETAS[0], beta2=BETAS[1], parameters=[param], weight_decay=0.05)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, 6):
        g = rng.randn(3, 4).astype("float32")
        param.grad = paddle.to_tensor(g)
        opt.step()
        w, m, v = numpy_adamw(w, m, v, g.astype(np.float64), t, 0.01, 0.05)
        np.testing.assert_allclose(param.numpy(), w, rtol=1e-5, atol=1e-6)


def job_cfg(tmp_path, steps=6):
    return load_job(data={
        "seed": 0, "output_dir": str(tmp_path / "run"),
        "tasks": [{"name": "pfc", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 40, "seed": 1},
                   "head": {"type": "arcface", "scale": 8.0, "sample_ratio": 0.2}}],
        "backbone": {"type": "mlp", "hidden": [16], "embedding_size": 8},
        "schedule": {"batch_size": 6, "steps": steps},
        "optimizer": {"type": "adamw", "lr": 0.05, "weight_decay": 0.1, "decay": "poly", "warmup_steps": 2},
        "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}})


def test_sampled_rows_follow_dense_adamw_on_their_own_steps_and_the_others_stay(tmp_path):
    """Per row: numpy AdamW over the steps that sampled it (count c, the step's own rate); unsampled rows, their
    moments and counts bit for bit unchanged."""
    job = build_job(job_cfg(tmp_path))
    trainer = Trainer(job, console=lambda *a: None)
    head = job.model.heads["pfc"]
    ds = StepDataset(job.schedule, {"pfc": job.task("pfc").reader}, 0, 0, 6)
    w = head.weight.numpy().astype(np.float64)
    m, v, count = np.zeros_like(w), np.zeros_like(w), np.zeros(40, dtype=np.int64)
    worst = 0.0
    updates = recorded_updates(trainer)
    for step in range(6):
        lr = trainer.optimizer.get_lr()
        state = trainer.optimizer.sparse.state(head.weight)
        before = [head.weight.numpy().copy()] + [state[k].numpy().copy() for k in ("moment1", "moment2") if state]
        trainer.train_step(ds[step], step)
        sampled = head.last_sampled_classes.numpy()
        grad = updates[-1][head.weight.name].astype(np.float64)
        rest = np.setdiff1d(np.arange(40), sampled)
        state = trainer.optimizer.sparse.state(head.weight)
        after = [head.weight.numpy()] + [state[k].numpy() for k in ("moment1", "moment2")]
        for old, new in zip(before, after):  # unsampled rows: weight and moments bit for bit
            np.testing.assert_array_equal(new[rest], old[rest])
        count[sampled] += 1
        assert np.array_equal(state["steps"].numpy(), count)
        for row in sampled:
            w[row], m[row], v[row] = numpy_adamw(w[row], m[row], v[row], grad[row], count[row], lr, 0.1)
        new = head.weight.numpy()
        np.testing.assert_allclose(new[sampled], w[sampled], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(state["moment2"].numpy()[sampled], v[sampled], rtol=1e-5, atol=1e-12)
        worst = max(worst, float(np.max(np.abs(new[sampled] - w[sampled]))))
        w = new.astype(np.float64)  # continue from the run's float32 rows (their rounding is not under test)
    assert count.max() >= 2 and (count == 1).any()  # rows at different counts: the own-count correction is exercised
    print(f"\nlargest |w - numpy AdamW| over 6 steps: {worst:.2e}")


def test_host_and_device_adamw_updates_agree(monkeypatch):
    rng = np.random.RandomState(2)
    start, index = rng.randn(9, 5).astype("float32"), paddle.to_tensor(np.array([0, 4, 8]))
    results = []
    for host in (True, False):
        monkeypatch.setattr(arrays, "HOST_PATHS", host)
        weight = paddle.to_tensor(start.copy())
        moments = (paddle.zeros_like(weight), paddle.zeros_like(weight), paddle.zeros([9], dtype="int32"))
        for k in range(3):
            grad = paddle.to_tensor(np.random.RandomState(k).randn(3, 5).astype("float32"))
            row_sparse_adamw_(weight, moments, index, grad, 0.01, BETAS, EPS, 0.1)
        results.append([weight.numpy()] + [t.numpy() for t in moments])
    for host_value, device_value in zip(*results):
        np.testing.assert_allclose(host_value, device_value, rtol=2e-7, atol=1e-9)
    assert results[0][3].tolist() == [3, 0, 0, 0, 3, 0, 0, 0, 3]


def _records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def _row_state(ckpt, task="arc11"):
    """Weights and row-sparse optimizer state of a head, merged over the checkpoint's ranks."""
    with open(os.path.join(ckpt, "state.json")) as f:
        world = json.load(f)["world_size"]
    state = {"weight": layout.merged_head_state(ckpt, task)["weight"]}
    optimizers = [load_paddle_file(os.path.join(ckpt, f"optimizer.rank{k}.pdopt")) for k in range(world)]
    for slot in ("moment1", "moment2", "steps"):
        key = f"heads.{task}.weight::sparse_{slot}"
        state[slot] = np.concatenate([np.asarray(o[key]) for o in optimizers if key in o])
    return state


@two_process_run("pfc_adamw")
def _two_processes(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}", *ADAMW]}, str(folder)


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("adamw") / "one")
    train_here(JOB, "--set", f"output_dir={out}", *ADAMW)
    return out


@pytest.mark.slow
def test_resume_is_bit_identical(one_process_run, tmp_path):
    """Stopped after step 6 and resumed (a new Trainer reading the checkpoint): every logged number and the final
    rows, moments and step counts equal the uninterrupted run's bit for bit."""
    out = str(tmp_path / "cut")
    train_here(JOB, "--set", f"output_dir={out}", *ADAMW, "--until", "6")
    train_here(JOB, "--set", f"output_dir={out}", *ADAMW, "--resume")
    a, b = _records(one_process_run), _records(out)
    assert [{k: v for k, v in r.items() if k != "samples_per_s"} for r in a] == \
        [{k: v for k, v in r.items() if k != "samples_per_s"} for r in b]
    full, resumed = (_row_state(os.path.join(o, "checkpoints", "step_12")) for o in (one_process_run, out))
    for key in full:
        np.testing.assert_array_equal(full[key], resumed[key], err_msg=key)


@pytest.mark.distributed
@pytest.mark.two_process_runs("pfc_adamw")
def test_two_processes_equal_one_and_resume_resharded(one_process_run, two_process, tmp_path):
    """1 vs 2 processes: per-step losses within 1e-4, the merged rows' step counts equal and moments close; the
    2-process checkpoint of step 6 resumed at 1 process continues like the uninterrupted 1-process run."""
    two = two_process["pfc_adamw"]
    a, b = _records(one_process_run), _records(two)
    keys = ("loss", "loss/arc11", "loss/cos3", "grad_norm")
    worst = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8) for ra, rb in zip(a, b) for k in keys)
    assert len(a) == len(b) == 12 and worst <= 1e-4, worst
    one_state, two_state = (_row_state(os.path.join(o, "checkpoints", "step_12")) for o in (one_process_run, two))
    assert np.array_equal(one_state["steps"], two_state["steps"]) and one_state["steps"].max() > 1
    for key in ("weight", "moment1", "moment2"):
        np.testing.assert_allclose(two_state[key], one_state[key], rtol=1e-3, atol=1e-6, err_msg=key)
    resumed = str(tmp_path / "resumed")
    shutil.copytree(two, resumed, ignore=shutil.ignore_patterns("step_12"))
    train_here(JOB, "--set", f"output_dir={resumed}", *ADAMW, "--resume")
    c = _records(resumed)
    worst_resumed = max(abs(ra[k] - rc[k]) / max(abs(ra[k]), 1e-8) for ra, rc in zip(a, c) for k in keys)
    assert [r["step"] for r in c] == list(range(1, 13)) and worst_resumed <= 1e-4, worst_resumed
    print(f"\n1 vs 2 processes: {worst:.2e}; 2 -> 1 resumed: {worst_resumed:.2e} (largest relative loss difference)")
