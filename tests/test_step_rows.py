"""The optimizer's rows of a step (``mtl.optimizer.sparse.StepRows``) against numpy sums: micro-batches that declare
the same rows are summed in place, other rows are kept apart and merged as a union, a declaration whose gradient
is missing is filled, a task's rows are rescaled even after a merge, and a step lets its gradients go (a
declaration's gradient can be a view of a head's reused buffer, and the step's result keeps the heads' outputs)."""
import numpy as np
import paddle
import pytest

from mtl.core.registry import plugin_class
from mtl.headkit.row_gradients import RowGradient, dense_gradient
from mtl.optimizer.sparse import StepRows

WEIGHT = paddle.zeros([6, 2])


def declared(ids, grad, source="a", parameter=WEIGHT):
    ids = np.asarray(ids, np.int64)
    return RowGradient(parameter, paddle.to_tensor(ids), None if grad is None else paddle.to_tensor(
        np.asarray(grad, np.float32)), source, ids)


def dense(rows):
    return dense_gradient(WEIGHT, rows.merged())


def test_micro_batches_of_the_same_rows_are_summed_in_place():
    rows = StepRows()
    first = declared([1, 4], [[1, 2], [3, 4]])
    rows.add([first], summed=True)
    rows.add([declared([1, 4], [[10, 20], [30, 40]])], summed=True)
    assert len(rows.merged()) == 1
    expected = np.zeros((6, 2), np.float32)
    expected[[1, 4]] = [[11, 22], [33, 44]]
    np.testing.assert_array_equal(dense(rows), expected)


@pytest.mark.parametrize("second", [[0, 1], [2, 3, 5]])  # same count, other rows; another count
def test_micro_batches_of_other_rows_are_merged_as_a_union(second):
    rows = StepRows()
    rows.add([declared([1, 4], [[1, 2], [3, 4]])], summed=True)
    rows.add([declared(second, np.ones((len(second), 2)))], summed=True)
    expected = np.zeros((6, 2), np.float32)
    expected[[1, 4]] = [[1, 2], [3, 4]]
    expected[second] += 1
    np.testing.assert_array_equal(dense(rows), expected)


def test_a_first_declaration_without_gradient_takes_the_next_ones():
    rows = StepRows()
    rows.add([declared([2, 3], None)], summed=True)
    rows.add([declared([2, 3], [[1, 1], [2, 2]])], summed=True)
    expected = np.zeros((6, 2), np.float32)
    expected[[2, 3]] = [[1, 1], [2, 2]]
    np.testing.assert_array_equal(dense(rows), expected)


def test_a_tasks_rows_are_rescaled_after_a_merge_too():
    rows = StepRows()
    rows.add([declared([0], [[1, 1]], "a"), declared([0], [[2, 2]], "b")])
    assert dense(rows)[0].tolist() == [3.0, 3.0]  # merged before the weighting's rescale: the cache is redone
    rows.scale("a", 0.5)
    assert dense(rows)[0].tolist() == [2.5, 2.5]
    assert dense(rows)[1:].sum() == 0


def test_clearing_lets_the_gradients_go():
    rows = StepRows()
    kept = declared([1], [[1, 1]])
    rows.add([kept])
    rows.merged()
    rows.clear()
    assert kept.grad is None and rows.merged() == []


def test_a_training_step_keeps_no_view_of_a_heads_buffer(tmp_path):
    """After a Partial FC step, the step's result holds the heads' outputs but no row gradient: the head's work
    buffer (which the declared gradient is a view of) is not held past the step."""
    from mtl.config.loading import load_job
    from mtl.data.steps import StepDataset
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    cfg = {"seed": 0, "output_dir": str(tmp_path), "device": "cpu",
           "tasks": [{"name": "pfc", "reader": {"type": "synthetic", "num_samples": 32, "num_classes": 40, "seed": 1},
                      "head": {"type": "arcface", "scale": 8.0, "sample_ratio": 0.2}, "eval": None}],
           "backbone": {"type": "mlp", "hidden": [8], "embedding_size": 4},
           "schedule": {"batch_size": 8, "steps": 2}, "optimizer": {"type": "momentum", "lr": 0.1, "decay": "none"},
           "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}}
    job = build_job(load_job(data=cfg), announce_plan=False)
    trainer = Trainer(job, console=lambda *a: None)
    result = trainer.train_step(StepDataset(job.schedule, {"pfc": job.task("pfc").reader}, 0, 0, 1)[0], 0)
    trainer.release()
    (row,) = result.outputs["pfc"].rows
    assert row.source == "pfc" and row.grad is None


def test_a_partial_fc_head_in_training_needs_the_step():
    head = plugin_class("head", "arcface")(num_classes=20, feature_size=4, sample_ratio=0.3)
    head.train()
    with pytest.raises(ValueError, match="forward\\(features, labels, step\\)"):
        head(paddle.randn([3, 4]), paddle.to_tensor([1, 2, 3]))
