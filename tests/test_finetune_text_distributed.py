"""A MiniLM-shaped joint job (random small BERT in all-MiniLM-L6-v2's layout, tests/minilm_shaped.py; UPOS,
dependencies, NER and genre; AdamW with the encoder's lower rate, layer-wise decay, warm-up and linear decay,
clipping: tests/dist_scripts/text_minilm_job.yaml) at 1 and 2 processes: the same losses and gradient norms per step
within 1e-4; stopped after step 5 and resumed, with dropout on, it ends bit for bit where an uninterrupted run ends."""
import json
import os

import numpy as np
import pytest

from mtl.core.safe_pickle import load_paddle_file
from tests.dist_util import ROOT
from tests.minilm_shaped import write_checkpoint
from tests.shared_runs import train_here, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "text_minilm_job.yaml")
DROPOUT = ["backbone.dropout=0.1", "backbone.attention_dropout=0.1", "tasks.0.head.dropout=0.2"]


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def weights(out, step=8):
    folder = os.path.join(out, "checkpoints", f"step_{step}")
    state = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".pdparams") and not name.startswith(("rng", "averager")):
                path = os.path.join(root, name)
                for key, value in load_paddle_file(path).items():
                    state[f"{os.path.relpath(path, folder)}:{key}"] = np.asarray(value)
    return state


@two_process_run("text_minilm_job")
def _two(folder):
    checkpoint = write_checkpoint(str(folder / "ckpt"))
    return {"train": [JOB, "--set", f"output_dir={folder / 'run'}", f"backbone.pretrained={checkpoint}"]}, \
        str(folder / "run")


@pytest.mark.distributed
@pytest.mark.two_process_runs("text_minilm_job")
def test_minilm_shaped_job_one_and_two_processes_agree(two_process, tmp_path):
    one = str(tmp_path / "one")
    train_here(JOB, "--set", f"output_dir={one}", f"backbone.pretrained={write_checkpoint(str(tmp_path / 'ckpt'))}")
    two = two_process["text_minilm_job"]
    a, b = losses(one), losses(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 9))
    worst = 0.0
    for ra, rb in zip(a, b):
        keys = {k for k in ra if k.startswith("loss")}
        assert keys == {k for k in rb if k.startswith("loss")} and len(keys) == 5
        for k in keys | {"grad_norm"}:
            worst = max(worst, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8))
    assert worst <= 1e-4, f"largest relative difference {worst:.3g}"
    summary = json.load(open(os.path.join(two, "summary.json")))
    assert set(summary["tasks"]) == {"upos", "deps", "ner", "genre"}


@pytest.mark.slow
def test_minilm_shaped_job_resumes_bit_for_bit(tmp_path):
    checkpoint = write_checkpoint(str(tmp_path / "ckpt"))
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    common = [f"backbone.pretrained={checkpoint}", *DROPOUT]
    train_here(JOB, "--set", f"output_dir={full}", *common)
    train_here(JOB, "--until", "5", "--set", f"output_dir={cut}", *common)
    assert not os.path.isdir(os.path.join(cut, "checkpoints", "step_8"))
    train_here(JOB, "--resume", "--set", f"output_dir={cut}", *common)
    wa, wb = weights(full), weights(cut)
    assert sorted(wa) == sorted(wb) and any(k.startswith("backbone") for k in wa)
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)
    assert [r["loss"] for r in losses(full)] == [r["loss"] for r in losses(cut)]
