"""Text matching: pointwise (does the pair match? softmax cross-entropy) or pairwise (rank the matching text above
the other: hinge loss), PaddlePALM's two matching strategies."""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.contracts import Field
from mtl.core.registry import register_head
from mtl.headkit.text import TextHead, class_records, global_mean, mlp, to_numpy


@register_head("matching")
class MatchingHead(TextHead):
    """``mode: pointwise``: the pair's pooled vector -> 2 logits, cross-entropy with ``label`` (1 = match);
    ``mode: pairwise``: each sample is a group of two rows (query + positive, query + negative), a score
    ``s = MLP(pooled)`` per row and the hinge ``max(0, margin - s_pos + s_neg)``. Accuracy: the right class
    (pointwise), or ``s_pos > s_neg`` (pairwise).

    Parameters:
        mode (str): pointwise (one pair: match or not) or pairwise (a group of a positive and a negative row: hinge)
        margin (float): the pairwise hinge's margin (pointwise does not use it)
        hidden (list): widths of the scoring MLP's hidden layers (each Linear, LeakyReLU, Dropout); empty: one Linear
        dropout (float): dropout after each hidden layer of the scoring MLP
    """

    primary_metric = "accuracy"
    higher_is_better = True
    reads = "pooled"
    predicts_text = True

    def __init__(self, feature_size, mode="pointwise", margin=0.5, hidden=(), dropout=0.1, label_field="label"):
        super().__init__(feature_size, label_field)
        if mode not in ("pointwise", "pairwise"):
            raise ValueError(f"mode must be pointwise or pairwise, got {mode!r}")
        if not float(margin) > 0:
            raise ValueError(f"margin must be positive, got {margin!r}")
        self.mode, self.margin = mode, float(margin)
        self.scorer = mlp(self.feature_size, hidden, 2 if mode == "pointwise" else 1, float(dropout))

    def fields(self):
        """The ``label``: 0/1 (pointwise), the matching row of the group (pairwise: 0, unused by the loss)."""
        return [Field(self.label_field, (), "int64")]

    def forward(self, features, labels):
        """Cross-entropy or hinge, mean over the global sub-batch; accuracy."""
        if self.mode == "pointwise":
            logits = self.scorer(features)
            y = labels[self.label_field].reshape([-1, 1])
            total = F.cross_entropy(logits, y, reduction="sum")
            right = logits.argmax(axis=-1) == y.reshape([-1])
        else:
            scores = self.scorer(features).squeeze(-1)  # [B, 2]
            total = F.relu(self.margin - scores[:, 0] + scores[:, 1]).sum()
            right = scores[:, 0] > scores[:, 1]
        return global_mean(total, paddle.full([], features.shape[0], "int64"), {"accuracy": right.sum()})

    def predict(self, features, labels):
        """Per sample: right (1) or wrong (0)."""
        if self.mode == "pointwise":
            pred = to_numpy(self.scorer(features).argmax(axis=-1))
            return (pred == to_numpy(labels[self.label_field]).reshape(-1)).astype(int).tolist()
        scores = to_numpy(self.scorer(features).squeeze(-1))
        return (scores[:, 0] > scores[:, 1]).astype(int).tolist()

    def predict_text(self, features, inputs):
        """Per pair of texts (one row each, ``[CLS] a [SEP] b [SEP]``): pointwise, whether they match (class 1) with
        the softmax probability; pairwise, the pair's score ``s`` (higher: the better match)."""
        if self.mode == "pointwise":
            return class_records(self.scorer(features), self.label_field)
        return [{"score": float(s)} for s in to_numpy(self.scorer(features)).reshape(-1)]

    def score(self, predictions, reader):
        """Accuracy (a fraction)."""
        return {"accuracy": float(np.mean(predictions)) if predictions else 0.0}
