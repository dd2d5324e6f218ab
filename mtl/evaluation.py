"""Evaluation of every task on its evaluation split: embeddings from the backbone, metrics from the head.

Every rank embeds the whole evaluation split (it is small) so that model-parallel heads can score it with their own
collectives; the head's ``evaluate(features, labels)`` returns a dict of floats.
"""
import numpy as np
import paddle

from .data import iterate_eval
from .job import eval_reader


@paddle.no_grad()
def embed(backbone, reader, batch_size: int, max_samples=None):
    """(features [N, D] tensor, batch of every other field as numpy) of a reader's whole split, in order."""
    was_training = backbone.training
    backbone.eval()
    names = [f.name for f in backbone.input_fields()]
    feats, rest = [], {}
    try:
        for batch in iterate_eval(reader, batch_size, max_samples):
            feats.append(backbone({n: paddle.to_tensor(batch[n]) for n in names}))
            for k, v in batch.items():
                if k not in names:
                    rest.setdefault(k, []).append(v)
    finally:
        if was_training:
            backbone.train()
    return paddle.concat(feats, axis=0), {k: np.concatenate(v) for k, v in rest.items()}


class Evaluator:
    """Evaluates the tasks of a job; eval readers are built once and reused."""

    def __init__(self, job):
        self.job = job
        self._readers = {}

    def reader(self, task):
        """The task's evaluation reader (built on first use)."""
        if task.name not in self._readers:
            self._readers[task.name] = eval_reader(self.job, task)
        return self._readers[task.name]

    @paddle.no_grad()
    def evaluate(self):
        """``{task: {metric: float}}`` for every task whose evaluation is enabled."""
        results = {}
        batch_size = self.job.cfg["eval"]["batch_size"]
        for task in self.job.tasks:
            if not task.cfg["eval"]["enabled"]:
                continue
            reader = self.reader(task)
            feats, rest = embed(self.job.model.backbone, reader, batch_size, task.cfg["eval"]["max_samples"])
            head = task.head
            labels = paddle.to_tensor(rest[head.label_field])
            was_training = head.training
            head.eval()
            try:
                metrics = head.evaluate(feats, labels)
            finally:
                if was_training:
                    head.train()
            results[task.name] = {k: float(v) for k, v in metrics.items()}
        return results
