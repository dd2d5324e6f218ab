"""A text job (every text head, BiLSTM, length-bucketed batches, pairwise groups, masked LM tied to the embeddings)
trained at 1 and 2 processes: the same losses per step within 1e-4 and the same final weights; stopped after step
4 and resumed, it ends bit for bit where an uninterrupted run ends (dropout, word dropout and the masked-LM draws
included; also under schedule.same_rows with masked LM on rows of its own). The run folder and the export keep the
tokenizer; a run read back tokenises with that copy."""
import json
import os

import numpy as np
import pytest

from mtl.core.safe_pickle import load_paddle_file
from tests.dist_util import ROOT
from tests.shared_runs import train_here, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "text_job.yaml")
SAME_ROWS = os.path.join(ROOT, "tests", "dist_scripts", "text_same_rows.yaml")
DROPOUT = ["backbone.dropout=0.2", "backbone.embedding_dropout=0.2", "backbone.word_dropout=0.1"]


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def weights(out, step=8):
    folder = os.path.join(out, "checkpoints", f"step_{step}")
    state = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".pdparams") and not name.startswith(("rng", "averager", "optimizer")):
                path = os.path.join(root, name)
                for key, value in load_paddle_file(path).items():
                    state[f"{os.path.relpath(path, folder)}:{key}"] = np.asarray(value)
    return state


@two_process_run("text_job")
def _two(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}"]}, str(folder)


@two_process_run("text_same_rows")
def _two_same_rows(folder):
    return {"train": [SAME_ROWS, "--set", f"output_dir={folder}"]}, str(folder)


def assert_one_and_two_processes_agree(one, two, tasks):
    """The 8 steps' losses and gradient norms within 1e-4 (relative), and the final weights."""
    a, b = losses(one), losses(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 9))
    worst = 0.0
    for ra, rb in zip(a, b):
        keys = {k for k in ra if k.startswith("loss")}
        assert keys == {k for k in rb if k.startswith("loss")} and len(keys) == len(tasks) + 1
        for k in keys | {"grad_norm"}:
            worst = max(worst, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8))
    assert worst <= 1e-4, f"largest relative difference {worst:.3g}"
    wa, wb = weights(one), weights(two)
    assert sorted(wa) == sorted(wb) and any("masked" not in k and "mlm" in k for k in wa)
    for k in wa:
        np.testing.assert_allclose(wb[k], wa[k], rtol=1e-4, atol=2e-5, err_msg=k)
    summary = json.load(open(os.path.join(two, "summary.json")))
    assert set(summary["tasks"]) == set(tasks)


@pytest.mark.distributed
@pytest.mark.two_process_runs("text_job")
def test_text_job_one_and_two_processes_agree(two_process, tmp_path):
    one = str(tmp_path / "one")
    train_here(JOB, "--set", f"output_dir={one}")
    assert_one_and_two_processes_agree(one, two_process["text_job"], ["upos", "deps", "ner", "genre", "pairs", "mlm"])


@pytest.mark.distributed
@pytest.mark.two_process_runs("text_same_rows")
def test_same_rows_with_masked_lm_on_its_own_rows_one_and_two_processes_agree(two_process, tmp_path):
    """schedule.same_rows: three tasks on one encoder pass a step, masked LM on its own sub-batch and pass."""
    one = str(tmp_path / "one")
    train_here(SAME_ROWS, "--set", f"output_dir={one}")
    assert_one_and_two_processes_agree(one, two_process["text_same_rows"], ["upos", "deps", "genre", "mlm"])


@pytest.mark.slow
@pytest.mark.parametrize("job", [JOB, SAME_ROWS], ids=["text_job", "same_rows_with_masked_lm"])
def test_text_job_resumes_bit_for_bit(tmp_path, job):
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    train_here(job, "--set", f"output_dir={full}", *DROPOUT)
    train_here(job, "--until", "5", "--set", f"output_dir={cut}", *DROPOUT)
    assert not os.path.isdir(os.path.join(cut, "checkpoints", "step_8"))
    train_here(job, "--resume", "--set", f"output_dir={cut}", *DROPOUT)
    wa, wb = weights(full), weights(cut)
    assert sorted(wa) == sorted(wb) and len(wa) > 20
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)
    ra, rb = losses(full), losses(cut)
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb]
    assert os.path.isfile(os.path.join(full, "tokenizer.json"))


@two_process_run("missing_gradients")
def _missing(folder):
    return {"call": [os.path.join(ROOT, "tests", "dist_scripts", "missing_gradients.py"), "main", str(folder)]}, \
        str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("missing_gradients")
def test_a_parameter_one_rank_used_gets_the_same_gradient_on_both(two_process):
    folder = two_process["missing_gradients"]
    a, b = (np.load(os.path.join(folder, f"rank{k}.npz")) for k in (0, 1))
    assert sorted(a.files) == sorted(b.files)
    assert "extra.weight" in a.files and not any(name.startswith("unused") for name in a.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    # the extra layer's gradient is rank 1's alone: d/dW sum(W^T h) = h summed over rank 1's two rows
    np.testing.assert_allclose(a["extra.bias"], np.full(5, 2.0))
