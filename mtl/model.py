"""The joint model: one backbone, one head per task, one forward for a whole multi-task step.

Sub-batches whose backbone inputs have the same signature (field names, per-sample shapes, dtypes) are concatenated
and go through the backbone in one pass; the features are split back per task and each head scores its own rows.
Total loss = sum_t loss_weight_t * loss_t over the tasks present in the step; absent tasks cost nothing.
"""
from collections import OrderedDict
from typing import Dict

import paddle

from .head import HeadOutput


class JointModel(paddle.nn.Layer):
    """Backbone + ``{task: head}``; ``forward(batch)`` returns (total loss, ``{task: HeadOutput}``)."""

    def __init__(self, backbone, heads: Dict[str, paddle.nn.Layer], loss_weights: Dict[str, float]):
        super().__init__()
        self.backbone = backbone
        self.heads = paddle.nn.LayerDict(heads)
        self.loss_weights = dict(loss_weights)
        self._input_names = [f.name for f in backbone.input_fields()]

    def signature(self, sub_batch) -> tuple:
        """(name, per-sample shape, dtype) of every backbone input of a sub-batch."""
        return tuple((n, tuple(sub_batch[n].shape[1:]), str(sub_batch[n].dtype)) for n in self._input_names)

    def features(self, batch) -> Dict[str, paddle.Tensor]:
        """Backbone features per task, one backbone pass per input signature."""
        groups = OrderedDict()
        for task, sub in batch.items():
            groups.setdefault(self.signature(sub), []).append(task)
        out = {}
        for tasks in groups.values():
            if len(tasks) == 1:
                out[tasks[0]] = self.backbone({n: batch[tasks[0]][n] for n in self._input_names})
                continue
            inputs = {n: paddle.concat([batch[t][n] for t in tasks], axis=0) for n in self._input_names}
            feats = self.backbone(inputs)
            sizes = [int(batch[t][self._input_names[0]].shape[0]) for t in tasks]
            for t, f in zip(tasks, paddle.split(feats, sizes, axis=0)):
                out[t] = f
        return out

    def forward(self, batch):
        feats = self.features(batch)
        outputs: Dict[str, HeadOutput] = {}
        total = None
        for task, f in feats.items():
            head = self.heads[task]
            out = head(f, batch[task][head.label_field])
            outputs[task] = out
            term = out.loss * self.loss_weights[task]
            total = term if total is None else total + term
        return total, outputs
