"""Model-parallel softmax classifier: weight and bias sharded by class
(:class:`mtl.headkit.sharded.ShardedClassHead`)."""
import numpy as np
import paddle

from mtl.core.arrays import to_numpy
from mtl.core.registry import register_head
from mtl.headkit.base import HeadOutput
from mtl.headkit.sharded import ShardedClassHead, positive_int
from mtl.headkit.sharded_loss import sharded_softmax_cross_entropy


@register_head("softmax")
class SoftmaxHead(ShardedClassHead):
    """Linear classifier with softmax cross-entropy; weight [C_k, D] and bias [C_k] sharded by class.

    Parameters:
        topk (int): k of the top-k accuracy reported beside the accuracy (only while k is below the class count)
    """

    primary_metric = "accuracy"
    higher_is_better = True

    def __init__(self, num_classes=None, feature_size=None, topk=5, label_field="label", seed=0):
        super().__init__(num_classes, feature_size, label_field, seed)
        # top-k accuracy is reported only for k < C (with k >= C it is 1 by definition)
        self.topk = min(positive_int(topk, "topk"), self.num_classes)
        self.bias = self.create_parameter([self.shard_size], dtype=paddle.get_default_dtype(), is_bias=True,
                                          default_initializer=paddle.nn.initializer.Constant(0.0))
        self.bias.is_distributed = True

    def shard_logits(self, features):
        """``z = x W_k^T + b_k`` for this shard's classes."""
        return paddle.matmul(features, self.weight, transpose_y=True) + self.bias

    def forward(self, features, labels) -> HeadOutput:
        """Mean cross-entropy of the gathered batch over all classes, plus top-1/top-k accuracy."""
        x, y = self.gather_batch(features, labels)
        logits = self.shard_logits(x)
        loss = sharded_softmax_cross_entropy(logits, y, self.shard_start)
        return HeadOutput(loss=loss, metrics=self.topk_metrics(logits, y, self.topk))

    def evaluate(self, features, labels):
        """Accuracy and top-k accuracy on the evaluation split (same rows on every rank)."""
        labels = to_numpy(labels).reshape(-1).astype(np.int64)
        ids = self.predict_topk(features, self.topk)
        hits = ids == labels[:, None]
        result = {"accuracy": float(hits[:, 0].mean()) if len(labels) else float("nan")}
        if 1 < self.topk < self.num_classes:
            result[f"top{self.topk}_accuracy"] = float(hits.any(axis=1).mean()) if len(labels) else float("nan")
        return result
