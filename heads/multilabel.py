"""Multi-label head: one linear layer and an independent sigmoid per label, trained with binary cross-entropy."""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.arrays import to_numpy
from mtl.core.contracts import Field
from mtl.core.errors import ParameterError
from mtl.core.registry import register_head
from mtl.evaluation.metrics import multilabel_scores
from mtl.headkit.base import Head, HeadOutput, label_tensor
from mtl.parallel.distributed import all_reduce_sum, world_size


@register_head("multilabel")
class MultiLabelHead(Head):
    """Linear D -> num_classes with sigmoid binary cross-entropy; replicated on every rank.

    Targets are 0/1 float32 vectors in field ``labels``. ``pos_weight`` (a number or one number per class) scales the
    positive term of the loss, as in ``BCEWithLogits``.

    Parameters:
        pos_weight (float|list): weight of the positive term of the loss: one number, or one per label (none: 1)
        threshold (float): a label is predicted when its sigmoid reaches this (the F1 scores, mtl predict)
    """

    reader_sizes = {"num_classes": "num_labels"}  # one output per multi-hot label of the reader
    primary_metric = "mAP"
    higher_is_better = True

    def __init__(self, feature_size: int, num_classes: int, pos_weight=None, threshold: float = 0.5,
                 label_field: str = "labels"):
        super().__init__(feature_size, label_field)
        if int(num_classes) < 1:
            raise ParameterError(f"num_classes must be a positive integer, got {num_classes!r}")
        if not 0.0 < float(threshold) < 1.0:
            raise ParameterError(f"threshold must lie strictly between 0 and 1, got {threshold!r}")
        self.num_classes = int(num_classes)
        self.threshold = float(threshold)
        self.linear = paddle.nn.Linear(self.feature_size, self.num_classes)
        if pos_weight is None:
            self.pos_weight = None
        else:
            weights = np.asarray(pos_weight, dtype=np.float32).reshape(-1)
            if weights.size not in (1, self.num_classes) or np.any(weights <= 0):
                raise ParameterError(f"pos_weight must be a positive number or {self.num_classes} positive numbers, "
                                     f"got {pos_weight!r}")
            per_class = np.broadcast_to(weights, (self.num_classes,)).copy()
            self.register_buffer("pos_weight", paddle.to_tensor(per_class), persistable=False)

    def fields(self):
        """One 0/1 float32 target vector of length ``num_classes`` per sample."""
        return [Field(self.label_field, (self.num_classes,), "float32")]

    def forward(self, features, labels) -> HeadOutput:
        """Loss of the global sub-batch and its micro-F1.

        Per cell ``l = -[p * y * log(sigmoid(x)) + (1 - y) * log(1 - sigmoid(x))]`` (p = pos_weight, default 1);
        per sample the mean over labels; ``loss = sum(local samples) / (local rows * world size)``, so that summing
        over ranks gives the mean over the global sub-batch (rank slices are equal-sized).
        """
        logits = self.linear(features)
        targets = paddle.cast(label_tensor(labels, self.label_field), logits.dtype).reshape(logits.shape)
        pos_weight = None if self.pos_weight is None else paddle.cast(self.pos_weight, logits.dtype)
        cell = F.binary_cross_entropy_with_logits(logits, targets, reduction="none", pos_weight=pos_weight)
        global_rows = logits.shape[0] * world_size()
        loss = paddle.sum(paddle.mean(cell, axis=1)) / max(global_rows, 1)
        return HeadOutput(loss=loss, metrics={"micro_f1": self._micro_f1(logits, targets)},
                          global_loss=all_reduce_sum(loss))

    def _micro_f1(self, logits, targets):
        """``2TP / (2TP + FP + FN)`` over the global sub-batch (counts summed over ranks); 0 when undefined."""
        with paddle.no_grad():
            predicted = paddle.cast(F.sigmoid(logits) >= self.threshold, "float32")
            positive = paddle.cast(targets > 0.5, "float32")
            tp = paddle.sum(predicted * positive)
            counts = all_reduce_sum(paddle.stack([tp, paddle.sum(predicted) - tp, paddle.sum(positive) - tp]))
            denominator = 2 * counts[0] + counts[1] + counts[2]
            return paddle.where(denominator > 0, 2 * counts[0] / paddle.clip(denominator, min=1.0),
                                paddle.zeros_like(denominator))

    def evaluate(self, features, labels):
        """micro-F1, macro-F1 and mAP of the sigmoid scores on the whole evaluation split."""
        with paddle.no_grad():
            x = features if isinstance(features, paddle.Tensor) else paddle.to_tensor(np.asarray(features))
            scores = F.sigmoid(self.linear(paddle.cast(x, self.linear.weight.dtype))).numpy()
        targets = label_tensor(labels, self.label_field)
        targets = to_numpy(targets)
        return multilabel_scores(scores, targets.reshape(scores.shape), threshold=self.threshold)
