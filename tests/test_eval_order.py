"""Text evaluation reads a split shortest first (mtl.data.steps.length_order) and scores it in sample order: every
head's metrics on the split equal those of each sample evaluated alone, without any padding, in sample order (the
reference, written out here); the order is the stable sort of the reader's lengths; a head whose ``predict`` does not
return one prediction per sample is named in one sentence."""
import os

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import PluginError
from mtl.data.steps import collate, iterate_eval, length_order
from mtl.evaluation.batches import backbone_output, evaluate_batches
from mtl.train.job import build_job
from tests.dist_util import ROOT

JOB = os.path.join(ROOT, "tests", "dist_scripts", "text_job.yaml")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The text job of every text head (untrained: its predictions are those of its initial weights)."""
    from mtl.core.runtime import select_device

    select_device("cpu")
    built = build_job(load_job(JOB, overrides=[f"output_dir={tmp_path_factory.mktemp('eval_order')}"]))
    built.model.backbone.eval()
    return built


def one_at_a_time(backbone, head, reader):
    """The reference: each sample of the split alone (a batch of one, nothing padded), in sample order."""
    fields = {f.name: f for f in reader.fields()}
    predictions = []
    with paddle.no_grad():
        head.eval()
        for i in range(len(reader)):
            tensors = {k: paddle.to_tensor(v) for k, v in collate([reader[i]], fields).items()}
            predictions.extend(head.predict(backbone_output(backbone, tensors, head.reads), head.labels_of(tensors)))
    return head.score(predictions, reader)


def test_every_text_heads_metrics_equal_those_of_each_sample_alone(job):
    checked = []
    for task in job.tasks:
        reader = job.eval_reader(task)
        order = length_order(reader)
        assert order is not None and sorted(order) == list(range(len(reader)))
        batched = evaluate_batches(job.model.backbone, task.head, reader, 16)
        alone = one_at_a_time(job.model.backbone, task.head, reader)
        assert set(batched) == set(alone) and batched, task.name
        for metric, value in alone.items():
            assert batched[metric] == pytest.approx(value, abs=1e-9), (task.name, metric, batched, alone)
        checked.append(task.head.registered_name)
    assert sorted(checked) == ["biaffine", "crf_tagger", "masked_lm", "matching", "tagger", "text_classify"]


def test_the_head_scores_the_predictions_in_sample_order(job, monkeypatch):
    """What ``score`` receives: sample i's prediction at position i, as in the reference."""
    for name in ("text_classify", "tagger"):
        task = next(t for t in job.tasks if t.head.registered_name == name)
        reader, seen = job.eval_reader(task), []
        score = type(task.head).score
        monkeypatch.setattr(type(task.head), "score",
                            lambda self, p, r, seen=seen, score=score: seen.append(p) or score(self, p, r))
        evaluate_batches(job.model.backbone, task.head, reader, 16)
        one_at_a_time(job.model.backbone, task.head, reader)
        batched, alone = seen
        assert len(batched) == len(alone) == len(reader) and list(length_order(reader)) != list(range(len(reader)))
        for i, (a, b) in enumerate(zip(batched, alone)):
            assert [np.asarray(x).tolist() for x in a] == [np.asarray(x).tolist() for x in b], (name, i)


def test_the_order_is_the_stable_sort_of_the_lengths_and_keeps_max_samples(job):
    reader = job.eval_reader(job.tasks[0])
    lengths = np.asarray(reader.lengths())
    order = length_order(reader)
    assert list(lengths[order]) == sorted(lengths)
    for a, b in zip(order, order[1:]):  # ties stay in sample order
        assert lengths[a] < lengths[b] or a < b
    first = length_order(reader, max_samples=10)
    assert sorted(first) == list(range(10))
    padded = sum(len(b["token_ids"]) * b["token_ids"].shape[1] for b in iterate_eval(reader, 16, order=order))
    in_order = sum(len(b["token_ids"]) * b["token_ids"].shape[1] for b in iterate_eval(reader, 16))
    assert padded < in_order  # less padding: what the order is for


def test_a_head_that_returns_the_wrong_number_of_predictions_is_named(job, monkeypatch):
    task = next(t for t in job.tasks if t.head.registered_name == "text_classify")
    monkeypatch.setattr(type(task.head), "predict", lambda self, features, labels: [0])
    with pytest.raises(PluginError, match=r"head 'text_classify': predict returned 1 predictions for an evaluation "
                                          r"batch of \d+ samples; Head.predict returns one per sample"):
        evaluate_batches(job.model.backbone, task.head, job.eval_reader(task), 16)
