"""Gradient accumulation (``schedule.accumulate`` K): an optimizer step read as K micro-batches equals the same step
read at once (K = 1), per task loss within 1e-4 relative (float32), at 1 and 2 processes: Partial FC's one class
sample per step, task weighting on each task's gradient summed over the micro-batches (loss-based, Gram-based,
representation-based, matrix-based), the logged step loss, the non-finite guard and the fp16 loss scaler deciding per
step, averaging and the learning-rate schedule counting optimizer steps. The reference of every test is the same
job with K = 1 (or the head run on the whole batch); the 2-process runs are in the session's one launch."""
import json
import os

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.core.registry import plugin_class
from mtl.core.safe_pickle import load_paddle_file
from mtl.data.scheduler import JointSchedule
from mtl.data.steps import check_divisible
from mtl.headkit.sharded import sample_classes_globally
from tests.dist_util import ROOT
from tests.shared_runs import train_here, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "accumulate_job.yaml")
COMPARED = ("loss", "grad_norm", "lr", "weight/", "alpha/", "accuracy/")
MEASURED = {}


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def run(folder, name, accumulate, *overrides):
    out = str(folder / f"{name}_k{accumulate}")
    train_here(JOB, "--set", f"output_dir={out}", f"schedule.accumulate={accumulate}", *overrides)
    return out


def worst_difference(reference, other, what):
    """Largest relative difference of every compared number of two runs' step records (same keys, same steps)."""
    a, b = records(reference), records(other)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, len(a) + 1))
    worst = 0.0
    for ra, rb in zip(a, b):
        keys = [k for k in ra if k.startswith(COMPARED)]
        assert keys and set(keys) == {k for k in rb if k.startswith(COMPARED)}
        assert [k for k in keys if ra[k] is None] == [k for k in keys if rb[k] is None]  # non-finite: null in both
        keys = [k for k in keys if ra[k] is not None]
        worst = max([worst] + [abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8) for k in keys])
    MEASURED[what] = worst
    return worst


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\nlargest relative difference of losses, norms, rates and weights, K > 1 vs K = 1:")
    for what, worst in sorted(MEASURED.items()):
        print(f"  {what}: {worst:.2e}")


def test_two_and_four_micro_batches_equal_one(tmp_path):
    """Static weights: Partial FC (arc13), a full margin head, a replicated regression head, momentum, clipping,
    poly decay with warm-up, EMA averaging."""
    one = run(tmp_path, "static", 1)
    for k in (2, 4):
        assert worst_difference(one, run(tmp_path, "static", k), f"static K={k}") <= 1e-4
    averaged = [load_paddle_file(os.path.join(tmp_path / f"static_k{k}", "checkpoints", "step_8",
                                              "backbone.averaged.pdparams")) for k in (1, 4)]
    for name, value in averaged[0].items():  # the averager updated once per optimizer step
        np.testing.assert_allclose(averaged[1][name], value, rtol=1e-4, atol=1e-6, err_msg=name)


WEIGHTINGS = {
    "famo": ["weighting=famo"],  # loss-based: this step's losses decide its weights
    "uncertainty_sample": ["weighting=uncertainty", "schedule.mode=sample"],  # one task per step
    "rlw": ["weighting=rlw"],  # weights known before the step: applied per micro-batch
    "pcgrad": ["weighting=pcgrad"],  # Gram matrix of the summed per-task gradients
    "mgda_ub": ["weighting={type: mgda, representation: true}"],  # representation Gram
    # and its alpha on an architecture's task layers (towers: below the point the Gram is taken at)
    "mgda_ub_towers": ["weighting={type: mgda, representation: true}", "architecture={type: hard, tower: [8]}"],
    "imtl_g_representation": ["weighting={type: imtl_g, representation: true}"],
    "db_mtl": ["weighting=db_mtl"],  # the [T, P] matrix itself
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_task_weighting_sees_the_whole_step(tmp_path, name):
    one = run(tmp_path, name, 1, *WEIGHTINGS[name])
    assert worst_difference(one, run(tmp_path, name, 2, *WEIGHTINGS[name]), f"{name} K=2") <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("weighting", ["pcgrad", "uncertainty"])  # static weights: the 1 vs 2 processes test
def test_cross_head_negatives_see_the_whole_step(tmp_path, weighting):
    """Cross-head negatives between the two margin heads (a sampled half of the other head's classes, one draw per
    optimizer step; one same-person pair masked; on from step 2): two micro-batches equal one, with static weights
    with a gradient-based strategy (the other head's rows enter the task's loss, not the shared set) and with one
    that rescales each task's head gradients (and what its loss gave the other head's rows: update both)."""
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([{"task_a": "arc13", "class_a": 2, "task_b": "cos5", "class_b": 1}]))
    cross = ["cross_negatives.rate=0.5", "cross_negatives.mask=pairs", f"cross_negatives.pairs={pairs}",
             "cross_negatives.warmup=2", f"weighting={weighting}"]
    one = run(tmp_path, f"cross_{weighting}", 1, *cross)
    separate = records(run(tmp_path, f"separate_{weighting}", 1, f"weighting={weighting}"))
    assert any(abs(a["loss/arc13"] - b["loss/arc13"]) > 1e-4 for a, b in zip(records(one)[2:], separate[2:]))
    assert worst_difference(one, run(tmp_path, f"cross_{weighting}", 2, *cross), f"cross {weighting} K=2") <= 1e-4


def test_partial_fc_draws_one_sample_over_all_micro_batches_and_sums_the_rows_gradient():
    """A head given the step's labels (prepare_step) scores the sample of all of them in each micro-batch; the rows'
    gradient the optimizer sums over two micro-batches (each loss halved; ``StepRows.add(..., summed=True)``) is
    the gradient of the head run on the whole batch."""
    from mtl.headkit.row_gradients import dense_gradient
    from mtl.optimizer.sparse import StepRows

    rng = np.random.RandomState(0)
    x, y = rng.randn(8, 6).astype("float32"), rng.randint(0, 50, size=8)
    heads = [plugin_class("head", "arcface")(num_classes=50, feature_size=6, sample_ratio=0.2, seed=3)
             for _ in range(2)]
    whole = heads[0](paddle.to_tensor(x, stop_gradient=False), paddle.to_tensor(y), 4)
    whole.loss.backward()
    heads[1].prepare_step(4, paddle.to_tensor(y), 2)
    losses, rows = [], StepRows()
    for part in (slice(0, 4), slice(4, 8)):
        out = heads[1](paddle.to_tensor(x[part], stop_gradient=False), paddle.to_tensor(y[part]), 4)
        (out.loss * 0.5).backward()
        rows.add(out.rows, summed=True)
        losses.append(float(out.loss))
        sampled = heads[1].last_sampled_classes.numpy()
        assert np.array_equal(sampled, sample_classes_globally(y, 50, 10, 3, 4))  # positives of both halves
    assert abs(np.mean(losses) - float(whole.loss)) <= 1e-6 * float(whole.loss)
    expected = heads[0].weight_gradient(whole)
    (merged,) = rows.merged()  # the two micro-batches' rows, summed in place: one declaration
    np.testing.assert_allclose(dense_gradient(heads[1].weight, [merged]), expected, rtol=1e-5, atol=1e-7)


def test_micro_batches_that_do_not_split_are_caught_with_their_sizes():
    base = {"tasks": [{"name": n, "reader": {"type": "synthetic"}, "head": "softmax", "ratio": r}
                      for n, r in (("a", 2), ("b", 1))], "backbone": "mlp"}
    with pytest.raises(ConfigError, match=r"schedule.batch_size: task 'b' gets a sub-batch of 4 samples per step, "
                                          r"read as 8 micro-batches \(schedule.accumulate\) of 0.5 samples.*"
                                          r"'a' 8 / 8 / 1 = 1, 'b' 4 / 8 / 1 = 0.5"):
        load_job(data=dict(base, schedule={"batch_size": 12, "accumulate": 8}))
    load_job(data=dict(base, schedule={"batch_size": 12, "accumulate": 4}))  # 8 and 4: fine at 1 process
    with pytest.raises(ConfigError, match=r"task 'b' .* over 2 process\(es\).*'a' 8 / 4 / 2 = 1, 'b' 4 / 4 / 2 = "
                                          r"0.5; e.g. schedule.batch_size one of \[.*24"):
        check_divisible(JointSchedule(["a", "b"], [2, 1], 12), 2, "job.yaml", accumulate=4)


def test_a_non_finite_micro_batch_skips_the_whole_step(tmp_path):
    """A NaN target in one sample: with K = 2 its step is left out whole (the other micro-batch's gradient too),
    the same steps as with K = 1, and the runs agree on every other step."""
    rng = np.random.RandomState(0)
    x = rng.randn(40, 8).astype("float32")
    target = (x[:, :2] * 0.5).astype("float32")
    target[13] = np.nan
    np.savez(tmp_path / "data.npz", features=x, target=target)
    outs = []
    for k in (1, 2):
        outs.append(str(tmp_path / f"k{k}"))
        train_here(JOB, "--set", f"output_dir={outs[-1]}", f"schedule.accumulate={k}", "on_nonfinite=skip",
                   "schedule.batch_size=8", "schedule.steps=12", "averaging.type=none",
                   f"tasks=[{{name: reg, reader: {{type: numpy, path: {tmp_path / 'data.npz'}}}, head: {{type: "
                   "regression, num_outputs: 2}, eval: null}]", "backbone.input_shape=[8]",
                   "backbone.input_field=features")
    a, b = records(outs[0]), records(outs[1])
    bad = [r["step"] for r in a if r.get("nonfinite")]
    assert bad and bad == [r["step"] for r in b if r.get("nonfinite")]
    for ra, rb in zip(a, b):
        if not ra.get("nonfinite"):
            assert abs(ra["loss/reg"] - rb["loss/reg"]) <= 1e-4 * abs(ra["loss/reg"]), ra["step"]


def test_an_fp16_overflow_lowers_the_loss_scale_once_per_step(tmp_path):
    """An infinite feature gradient at step 3 in both micro-batches: one skipped step, one halving of the scale, as
    with K = 1."""
    plugin = os.path.join(ROOT, "tests", "dist_scripts", "inf_plugin")
    outs = []
    for k in (1, 2):
        outs.append(str(tmp_path / f"k{k}"))
        train_here(JOB, "--set", f"output_dir={outs[-1]}", f"schedule.accumulate={k}", "precision=fp16",
                   f"plugins=[{plugin}]", "tasks.1.head={type: inf_softmax, inf_step: 3, inf_rank: 0}",
                   "loss_scale.init=1024")
    a, b = records(outs[0]), records(outs[1])
    assert [r["step"] for r in b if r.get("overflow")] == [r["step"] for r in a if r.get("overflow")] == [4]
    assert [r["loss_scale"] for r in b] == [r["loss_scale"] for r in a] == [1024.0] * 3 + [512.0] * 5
    assert worst_difference(outs[0], outs[1], "fp16 overflow K=2") <= 1e-4


def test_the_memory_plan_counts_one_micro_batch():
    from mtl.train.memory_plan import plan_job

    vit = "backbone={type: vit, input_size: 18, embed_dim: 16, depth: 2, num_heads: 2, embedding_size: 16}"
    cfg = load_job(JOB, [vit,
                         "schedule.batch_size=128",
                         "tasks.0.reader.shape=[3, 18, 18]", "tasks.1.reader.shape=[3, 18, 18]",
                         "tasks.2.reader.shape=[3, 18, 18]"])
    from mtl.train.job import _build_backbone

    backbone = _build_backbone(cfg)
    plans = {}
    for k in (1, 4):
        cfg["schedule"]["accumulate"] = k
        sizes = lambda t: {"num_classes": t["reader"].get("num_classes"), "num_outputs": 1}  # noqa: E731
        plans[k] = {e.key: e.parts for e in plan_job(cfg, backbone, sizes, world_size=2)}
    assert plans[1]["backbone"]["activations (64 rows, estimate)"] == 4 * plans[4]["backbone"][
        "activations (16 rows, estimate)"]  # 128 / (K x 2 processes) rows
    buffers = [plans[k]["tasks.1.head"]["exp values, then the gradient"] for k in (1, 4)]
    assert buffers[0] == 3 * 128 * 4 and buffers[1] == 3 * 32 * 4  # cos5 at rank 0: 3 classes x max(N, D) floats
    # arc13 (Partial FC 0.3, rank 0 holds 7 classes): the rows' gradient summed over the micro-batches, K = 4 only
    assert "summed rows' gradient" not in plans[1]["tasks.0.head"]
    assert plans[4]["tasks.0.head"]["summed rows' gradient"] == 7 * 16 * 4  # min(7, ceil(0.3 x 7) + 32 x 4) rows


@two_process_run("accumulate_k2")
def _two_static(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}", "schedule.accumulate=2"]}, str(folder)


@two_process_run("accumulate_k2_pcgrad")
def _two_pcgrad(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}", "schedule.accumulate=2", "weighting=pcgrad"]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("accumulate_k2", "accumulate_k2_pcgrad")
@pytest.mark.parametrize("name,overrides", [("accumulate_k2", []), ("accumulate_k2_pcgrad", ["weighting=pcgrad"])])
def test_two_processes_with_two_micro_batches_equal_one_process_one_batch(two_process, tmp_path, name, overrides):
    one = run(tmp_path, name, 1, *overrides)
    assert worst_difference(one, two_process[name], f"{name}, 2 processes vs 1 process K=1") <= 1e-4


def test_each_rank_reads_its_slice_of_every_micro_batch():
    """Rank r of W takes rows [k m + r m / W, k m + (r + 1) m / W) of micro-batch k: concatenated in micro-batch
    then rank order, the ranks' rows are the step's sub-batch read at once at 1 process."""
    from mtl.data.steps import StepDataset
    from mtl.readers.synthetic import SyntheticReader

    readers = {"a": SyntheticReader(num_samples=40, num_classes=7, seed=1)}
    schedule = JointSchedule(["a"], [1], 8, seed=0)
    whole = StepDataset(schedule, readers, 3, 0, 2)[1]["a"]["label"]
    parts = [StepDataset(schedule, readers, 3, 0, 2, world=2, rank=r, accumulate=2)[1]["a"]["label"] for r in (0, 1)]
    assert [len(p) for p in parts] == [4, 4]
    merged = np.concatenate([parts[r][k * 2:(k + 1) * 2] for k in (0, 1) for r in (0, 1)])
    assert np.array_equal(merged, whole)


def test_an_accumulated_run_resumes_bit_identically(tmp_path):
    """Stopped after step 4 and resumed in new Trainers: every logged number equals the uninterrupted run's."""
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    common = ["schedule.accumulate=2", "weighting=famo", "checkpoint.every=4"]
    train_here(JOB, "--set", f"output_dir={full}", *common)
    train_here(JOB, "--set", f"output_dir={cut}", *common, "--until", "4")
    train_here(JOB, "--set", f"output_dir={cut}", *common, "--resume")
    drop = ("samples_per_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in records(full)] == \
        [{k: v for k, v in r.items() if k not in drop} for r in records(cut)]
