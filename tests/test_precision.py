"""Mixed precision: bf16 on the CPU runs (in float32, with a notice) and equals the float32 run; the fp16 loss
scaler skips an overflow that only one rank of two met, on both ranks, and lowers the same scale. The 1-process runs
train in this process, the 2-process run is in the session's one launch (tests/shared_runs.py)."""
import json
import os

import pytest
import yaml

from mtl.train.precision import LossScaler
from tests.dist_util import ROOT
from tests.shared_runs import train_here, two_process_run

PLUGIN = os.path.join(ROOT, "tests", "dist_scripts", "inf_plugin")
INF_STEP = 6


def job(out, precision="fp32", inf_rank=1):
    return {"seed": 4, "device": "cpu", "output_dir": str(out), "precision": precision, "plugins": [PLUGIN],
            "loss_scale": {"init": 1024.0, "growth_interval": 4},
            "tasks": [{"name": "arc", "reader": {"type": "synthetic", "num_samples": 64, "num_classes": 5, "seed": 1},
                       "head": {"type": "arcface", "scale": 8.0, "margin": [1.0, 0.3, 0.0]}, "eval": None},
                      {"name": "soft", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 3, "seed": 2},
                       "head": {"type": "inf_softmax", "inf_step": INF_STEP, "inf_rank": inf_rank}, "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [32], "embedding_size": 16},
            "schedule": {"batch_size": 8, "steps": 16}, "optimizer": {"type": "momentum", "lr": 0.05},
            "log": {"every": 1, "progress": False, "plot": False}, "data": {"num_workers": 0}}


def write(tmp_path, name, **kw):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job(tmp_path / name, **kw)))
    return str(path), str(tmp_path / name)


def train(config, capsys=None):
    """Train ``config`` in this process (as ``examples/train_joint.py CONFIG`` would); what it printed."""
    train_here(config)
    if capsys is not None:
        captured = capsys.readouterr()
        return captured.out + captured.err


def rank_records(out, rank):
    with open(os.path.join(out, "logs", f"rank{rank}.log")) as f:
        return [json.loads(line.split(" INFO ", 1)[1]) for line in f if ' INFO {"step"' in line]


def test_loss_scaler_rules():
    scaler = LossScaler(init=8.0, growth=2.0, backoff=0.5, growth_interval=2, minimum=2.0)
    assert scaler.overflow() and scaler.scale == 4.0
    scaler.good_step()
    scaler.good_step()
    assert scaler.scale == 8.0
    assert scaler.overflow() and scaler.overflow() and scaler.scale == 2.0
    assert not scaler.overflow()  # at the minimum a non-finite gradient is real


def test_bf16_on_cpu_runs_in_float32_and_equals_it(tmp_path, capsys):
    bf16, out16 = write(tmp_path, "bf16", precision="bf16", inf_rank=9)
    fp32, out32 = write(tmp_path, "fp32", inf_rank=9)
    capsys.readouterr()
    printed = train(bf16, capsys)
    assert "precision bf16: Paddle's CPU build has no bfloat16 matmul kernel, so this job runs in float32" in printed
    train(fp32)
    a, b = rank_records(out32, 0), rank_records(out16, 0)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


@two_process_run("precision_overflow")
def _two_processes(folder):
    two, out2 = write(folder, "two", precision="fp16", inf_rank=1)
    return {"train": [two]}, out2


@pytest.mark.distributed
@pytest.mark.two_process_runs("precision_overflow")
def test_an_overflow_on_one_rank_is_skipped_by_both(two_process, tmp_path):
    one, out1 = write(tmp_path, "one", precision="fp16", inf_rank=0)
    train(one)
    out2 = two_process["precision_overflow"]
    reference = rank_records(out1, 0)
    ranks = [rank_records(out2, 0), rank_records(out2, 1)]
    for records in ranks:
        assert [r["step"] for r in records if r.get("overflow")] == [INF_STEP + 1]
        scales = [r["loss_scale"] for r in records]
        assert scales[INF_STEP] == scales[INF_STEP - 1] / 2 == [r["loss_scale"] for r in reference][INF_STEP]
        assert scales == [r["loss_scale"] for r in reference]
        for r, ref in zip(records, reference):
            for key in ("loss/arc", "loss/soft"):
                assert abs(r[key] - ref[key]) <= 1e-4 * abs(ref[key]), (r["step"], key)
    assert [r["loss"] for r in ranks[0]] == [r["loss"] for r in ranks[1]]
    assert [r.get("grad_norm") for r in ranks[0]] == [r.get("grad_norm") for r in ranks[1]]
