"""Evaluation of every task on its evaluation split: embeddings from the backbone, metrics from the head.

Every rank embeds the whole evaluation split (it is small) so that model-parallel heads can score it with their own
collectives; the head's ``evaluate(features, labels)`` returns a dict of floats. The ranks leave each task's
evaluation together (:func:`mtl.parallel.distributed.wait_for_all`: no collective, so rank 0's verification sets may
take longer than gloo's 30 s, and the ranks done early wait inside the evaluation, not in their next step).
"""
import os

import numpy as np
import paddle

from mtl.core.arrays import to_numpy
from mtl.core.low_precision import float32, inference_autocast
from mtl.data.steps import check_labels, iterate_eval
from mtl.parallel import distributed


@paddle.no_grad()
def embed(backbone, reader, batch_size: int, max_samples=None):
    """(features [N, D] float32 tensor, batch of every other field as numpy) of a reader's whole split, in order
    (a backbone with low-precision weights runs under ``auto_cast`` O2, as in training)."""
    was_training = backbone.training
    backbone.eval()
    names = [f.name for f in backbone.input_fields()]
    feats, rest = [], {}
    try:
        for batch in iterate_eval(reader, batch_size, max_samples):
            with inference_autocast(backbone):  # O2: the backbone's weights are bfloat16/float16
                out = backbone({n: paddle.to_tensor(batch[n]) for n in names})
            feats.append(float32(out[backbone.default_output] if isinstance(out, dict) else out))  # text: pooled
            for k, v in batch.items():
                if k not in names:
                    rest.setdefault(k, []).append(v)
    finally:
        if was_training:
            backbone.train()
    return paddle.concat(feats, axis=0), {k: np.concatenate(v) for k, v in rest.items()}


class Evaluator:
    """Evaluates the tasks of a job; eval readers and verification sets are loaded once and reused.

    Per task: the head's metrics on the reader's eval split (``eval.split``; a split of held-out people: 1:1
    verification on pairs of them and 1:N identification, :mod:`mtl.evaluation.identification`), and 1:1
    verification on every set of
    ``eval.sets`` (rank 0 only: it needs the backbone alone), reported as ``<set>/accuracy``, ``<set>/std``,
    ``<set>/val_at_far``; ROC curves go to ``output_dir/roc_<task>.png``.
    """

    def __init__(self, job, output_dir=None):
        self.job = job
        self.output_dir = output_dir
        self._readers = {}
        self._sets = {}

    def sets(self, task):
        """The task's verification sets, decoded at the backbone's input size (loaded on first use)."""
        if task.name not in self._sets:
            from mtl.data.preprocess import Preprocess
            from mtl.data.verification_sets import load_verification_set

            field = self.job.backbone.input_fields()[0]
            size = field.shape[-1] if field.shape and field.shape[-1] else 112
            prepare = Preprocess.from_config(task.cfg["reader"].get("preprocess"))  # as the task's images
            self._sets[task.name] = [load_verification_set(s["path"], s["root"], size, s["name"], preprocess=prepare)
                                     for s in task.cfg["eval"]["sets"]]
        return self._sets[task.name]

    def reader(self, task):
        """The task's evaluation reader (built on first use)."""
        if task.name not in self._readers:
            self._readers[task.name] = self.job.eval_reader(task)
        return self._readers[task.name]

    @paddle.no_grad()
    def evaluate(self):
        """``{task: {metric: float}}`` for every task whose evaluation is enabled."""
        results = {}
        batch_size = self.job.cfg["eval"]["batch_size"]
        for task in self.job.tasks:
            if not task.cfg["eval"]["enabled"]:
                continue
            metrics = self._evaluate_split(task, batch_size) if task.cfg["eval"]["split"] else {}
            if task.cfg["eval"]["sets"] and distributed.rank() == 0:
                from mtl.evaluation.verify import evaluate_sets

                roc = os.path.join(self.output_dir, f"roc_{task.name}.png") if self.output_dir else None
                metrics.update(evaluate_sets(self.job.model.embedder(task.name), self.sets(task), batch_size,
                                             self.job.backbone.input_fields()[0].name, roc, f"{task.name}: ROC"))
            results[task.name] = metrics
            # every rank leaves the task together, however long rank 0 takes with its sets (gloo's 30 s, the watchdog)
            distributed.wait_for_all(f"the wait for every rank at the end of task '{task.name}''s evaluation")
        return results

    def _evaluate_split(self, task, batch_size):
        """The head's own metrics on the task's evaluation split."""
        reader = self.reader(task)
        if task.head.evaluates_batches:  # variable-length text: predictions batch by batch
            from mtl.evaluation.batches import evaluate_batches

            return evaluate_batches(self.job.model.backbone, task.head, reader, batch_size,
                                    task.cfg["eval"]["max_samples"])
        feats, rest = embed(self.job.model.embedder(task.name), reader, batch_size, task.cfg["eval"]["max_samples"])
        head = task.head
        if reader.open_set:  # identities no head trained on: verification on pairs of them, and 1:N identification
            from mtl.evaluation.identification import identification_metrics
            from mtl.evaluation.pairs import open_set_verification

            features = to_numpy(feats)
            metrics = open_set_verification(features, rest[head.label_field], reader.max_positive_pairs, seed=0)
            metrics.update(identification_metrics(features, rest[head.label_field]))
            return metrics
        if head.class_count() is not None and rest[head.label_field].dtype.kind in "iu":
            check_labels(task.name, rest, head.label_field, head.class_count(), split="evaluation")
        labels = paddle.to_tensor(rest[head.label_field])
        was_training = head.training
        head.eval()
        try:
            metrics = head.evaluate(feats, labels)
        finally:
            if was_training:
                head.train()
        return {k: float(v) for k, v in metrics.items()}
