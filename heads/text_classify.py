"""Sentence (or sentence-pair) classification from a text encoder: the pooled vector or the first token."""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.contracts import Field
from mtl.core.registry import register_head
from mtl.headkit.text import TextHead, class_records, global_mean, mlp, to_numpy


@register_head("text_classify")
class TextClassifyHead(TextHead):
    """``MLP(x)`` [B, C] with softmax cross-entropy (mean over the global sub-batch) and accuracy; ``x`` is the
    encoder's ``pooled`` vector (``pooling: pooled``: BERT's tanh pooler, the BiLSTM's masked maximum) or the
    sequence's first position, ``[CLS]`` (``pooling: first``).

    Parameters:
        pooling (str): pooled (the encoder's pooled vector) or first (the sequence's first position, [CLS])
        hidden (list): widths of the classifier MLP's hidden layers (each Linear, LeakyReLU, Dropout); empty: one
            Linear
        dropout (float): dropout after each hidden layer of the classifier MLP
    """

    primary_metric = "accuracy"
    higher_is_better = True
    predicts_text = True

    def __init__(self, feature_size, num_classes=None, pooling="pooled", hidden=(), dropout=0.1, label_field="label"):
        super().__init__(feature_size, label_field)
        if pooling not in ("pooled", "first"):
            raise ValueError(f"pooling must be 'pooled' or 'first', got {pooling!r}")
        if num_classes is None or int(num_classes) < 2:
            raise ValueError(f"num_classes must be at least 2 (the reader gives it), got {num_classes!r}")
        self.num_classes, self.pooling = int(num_classes), pooling
        self.reads = "pooled" if pooling == "pooled" else "sequence"
        self.scorer = mlp(self.feature_size, hidden, self.num_classes, float(dropout))

    def fields(self):
        """One class id per sample."""
        return [Field(self.label_field, (), "int64")]

    def class_count(self):
        """The number of classes (labels are class ids)."""
        return self.num_classes

    def logits(self, features):
        """[B, C] class scores."""
        x = features if self.pooling == "pooled" else features[:, 0]
        return self.scorer(x)

    def forward(self, features, labels):
        """Mean cross-entropy over the global sub-batch, and accuracy."""
        logits = self.logits(features)
        y = labels[self.label_field].reshape([-1, 1])
        total = F.cross_entropy(logits, y, reduction="sum")
        right = logits.argmax(axis=-1) == y.reshape([-1])
        return global_mean(total, paddle.full([], y.shape[0], "int64"), {"accuracy": right.sum()})

    def predict(self, features, labels):
        """Per sample: (predicted class, gold class)."""
        pred = to_numpy(self.logits(features).argmax(axis=-1))
        return list(zip(pred.tolist(), to_numpy(labels[self.label_field]).reshape(-1).tolist()))

    def predict_text(self, features, inputs):
        """Per text: the best class and its softmax probability (and every class's)."""
        return class_records(self.logits(features), self.label_field)

    def score(self, predictions, reader):
        """Accuracy (a fraction)."""
        right = np.array([p == g for p, g in predictions], bool)
        return {"accuracy": float(right.mean()) if len(right) else 0.0}
