"""The joint step and the loop: against a hand-written Paddle loop, exact resume, absent tasks, outputs, contracts."""
import copy
import json
import os

import numpy as np
import paddle
import pytest

from mtl.core.errors import ContractError
from mtl.core.safe_pickle import load_paddle_file
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests.small_runs import TASKS, job_cfg


def weights(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_grouped_backbone_pass_equals_separate_passes(tmp_path):
    job = build_job(job_cfg(tmp_path))
    rng = np.random.RandomState(0)
    batch = {t: {"image": paddle.to_tensor(rng.randn(n, 1, 8, 8).astype("float32"))} for t, n in
             (("reg", 3), ("ml", 5))}
    grouped = job.model.features(batch)
    for t in batch:
        np.testing.assert_allclose(grouped[t].numpy(), job.model.backbone(batch[t]).numpy(), rtol=1e-6, atol=1e-6)


def test_toolkit_step_equals_hand_written_loop(tmp_path):
    cfg = job_cfg(tmp_path, optimizer={"warmup_steps": 0, "decay": "none", "weight_decay": 0.0})
    job = build_job(cfg)
    ref = build_job(job_cfg(tmp_path))
    ref.model.set_state_dict(job.model.state_dict())
    trainer = Trainer(job, console=lambda *a: None)
    from mtl.data.steps import StepDataset

    ds = StepDataset(job.schedule, {t.name: t.reader for t in job.tasks}, 0, 0, 6)
    opt = paddle.optimizer.Momentum(0.05, momentum=0.9, parameters=ref.model.parameters())
    for step in range(6):
        batch = ds[step]
        # reference: per task backbone pass, head loss by hand (MSE; BCE with logits), weighted sum, one backward
        total = 0
        for t, w in (("reg", 1.0), ("ml", 0.5)):
            feats = ref.model.backbone({"image": paddle.to_tensor(batch[t]["image"])})
            head = ref.model.heads[t]
            out = head.linear(feats)  # both heads (regression, multilabel) are one linear layer
            if t == "reg":
                loss = paddle.mean((out - paddle.to_tensor(batch[t]["target"])) ** 2)
            else:
                loss = paddle.nn.functional.binary_cross_entropy_with_logits(out, paddle.to_tensor(batch[t]["labels"]))
            total = total + w * loss
        total.backward()
        opt.step()
        opt.clear_grad()
    trainer.run()
    got, want = weights(job.model), weights(ref.model)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


PFC_TASK = {"name": "pfc", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 30, "seed": 3},
            "head": {"type": "arcface", "scale": 8.0, "sample_ratio": 0.2}}


def test_exact_resume(tmp_path):
    """Stop after step 3, resume: weights, averages and logged losses equal an uninterrupted run, bit for bit.

    Includes a Partial FC head (its class sample depends on the step) and window averaging.
    """
    over = dict(checkpoint={"every": 3}, tasks=copy.deepcopy(TASKS) + [PFC_TASK],
                averaging={"type": "window", "average_window_rate": 0.5, "min_average_window": 2,
                           "max_average_window": 3})
    full = build_job(job_cfg(tmp_path / "a", **over))
    Trainer(full, console=lambda *a: None).run()
    first = build_job(job_cfg(tmp_path / "b", **over))
    # train to step 3 only (a pre-empted job), same schedule and LR horizon
    Trainer(first, console=lambda *a: None).run(until=3)
    assert os.path.isdir(tmp_path / "b" / "run" / "checkpoints" / "step_3")
    resumed = build_job(job_cfg(tmp_path / "b", **over))
    t2 = Trainer(resumed, resume=True, console=lambda *a: None)
    assert t2.start_step == 3
    t2.run()
    a, b = weights(full.model), weights(resumed.model)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for name in ("backbone.averaged.pdparams", "heads/pfc.shard0of1.averaged.pdparams"):
        pa = load_paddle_file(str(tmp_path / "a" / "run" / "checkpoints" / "step_6" / name))
        pb = load_paddle_file(str(tmp_path / "b" / "run" / "checkpoints" / "step_6" / name))
        for k in pa:
            np.testing.assert_array_equal(pa[k], pb[k], err_msg=f"{name} {k}")
    la = [json.loads(x) for x in open(tmp_path / "a" / "run" / "metrics.jsonl")]
    lb = [json.loads(x) for x in open(tmp_path / "b" / "run" / "metrics.jsonl")]
    assert [r.get("loss") for r in la] == [r.get("loss") for r in lb]
    assert sum("loss" in r for r in la) == 6


def test_sample_mode_absent_task_is_untouched(tmp_path):
    job = build_job(job_cfg(tmp_path, schedule={"mode": "sample", "batch_size": 8, "steps": 8},
                            optimizer={"warmup_steps": 0}))
    trainer = Trainer(job, console=lambda *a: None)
    from mtl.data.steps import StepDataset

    ds = StepDataset(job.schedule, {t.name: t.reader for t in job.tasks}, 0, 0, 8)
    job.model.train()
    for step in range(8):
        batch = ds[step]
        before = {t: weights(job.model.heads[t]) for t in ("reg", "ml")}
        trainer.train_step(batch)
        for t in ("reg", "ml"):
            after = weights(job.model.heads[t])
            changed = any(not np.array_equal(before[t][k], after[k]) for k in after)
            assert changed == (t in batch), (step, t, list(batch))


def test_run_outputs(tmp_path):
    job = build_job(job_cfg(tmp_path))
    summary = Trainer(job, console=lambda *a: None).run()
    run = tmp_path / "run"
    lines = [json.loads(x) for x in open(run / "metrics.jsonl")]
    records = [r for r in lines if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 7))
    final = [r for r in lines if "loss" not in r]
    assert len(final) == 1 and final[0]["step"] == 6 and "eval/reg/rmse" in final[0]
    for r in records:
        assert {"step", "lr", "loss", "loss/reg", "loss/ml", "samples_per_s"} <= set(r)
        assert abs(r["loss"] - (r["loss/reg"] + 0.5 * r["loss/ml"])) < 1e-5
    assert records[0]["lr"] == 0.0 and records[2]["lr"] == pytest.approx(0.05)
    saved = json.load(open(run / "summary.json"))
    assert saved["tasks"].keys() == {"reg", "ml"} and "rmse" in saved["tasks"]["reg"]["eval"]
    assert summary["tasks"]["ml"]["eval"]["mAP"] == saved["tasks"]["ml"]["eval"]["mAP"]
    assert (run / "loss_curves.png").stat().st_size > 1000
    assert os.path.isfile(run / "checkpoints" / "step_6" / "state.json")


def test_contract_mismatch_names_task_components_and_field(tmp_path):
    tasks = copy.deepcopy(TASKS)
    tasks[0]["head"] = {"type": "multilabel", "num_classes": 3}
    with pytest.raises(ContractError) as err:
        build_job(job_cfg(tmp_path, tasks=tasks))
    msg = str(err.value)
    assert "task 'reg'" in msg and "head 'multilabel'" in msg and "reader 'synthetic'" in msg and "'labels'" in msg


def test_half_written_checkpoints_are_ignored(tmp_path):
    from mtl.store.layout import latest_checkpoint, list_checkpoints

    job = build_job(job_cfg(tmp_path, checkpoint={"every": 3}))
    Trainer(job, console=lambda *a: None).run()
    root = tmp_path / "run" / "checkpoints"
    (root / ".step_9.tmp").mkdir()            # a crash while writing step 9
    (root / "step_12").mkdir()                # a folder without state.json is not a checkpoint
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run"))] == [3, 6]
    assert latest_checkpoint(str(tmp_path / "run")).endswith("step_6")


def test_device_selection():
    from mtl.core.errors import ConfigError
    from mtl.core.runtime import select_device

    if paddle.device.is_compiled_with_cuda():
        pytest.skip("CPU-build behaviour")
    assert select_device("auto") == "cpu" and select_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="device: device 'gpu' was asked for"):
        select_device("gpu")


def test_a_new_run_does_not_overwrite_an_earlier_runs_checkpoints(tmp_path):
    from mtl.core.errors import ConfigError
    from mtl.store.layout import list_checkpoints

    Trainer(build_job(job_cfg(tmp_path, checkpoint={"every": 3})), console=lambda *a: None).run()
    with pytest.raises(ConfigError, match="already holds checkpoints.*--resume.*--overwrite"):
        Trainer(build_job(job_cfg(tmp_path, schedule={"steps": 4})), console=lambda *a: None)
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run"))] == [3, 6]
    Trainer(build_job(job_cfg(tmp_path, schedule={"steps": 4}, checkpoint={"every": 2})), console=lambda *a: None,
            overwrite=True).run()
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run"))] == [2, 4]
