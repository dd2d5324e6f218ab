"""Masked language model (Devlin et al., 2019) as an auxiliary task, its output layer tied to the input embeddings."""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.contracts import Field
from mtl.core.registry import register_head
from mtl.headkit.text import TextHead, global_mean, to_numpy


@register_head("masked_lm")
class MaskedLmHead(TextHead):
    """At each masked piece: ``logits = LN(gelu(W x + b)) E^T + c`` [V], ``E`` the encoder's input embeddings
    (tied: the same parameter, trained by both), cross-entropy averaged over the masked pieces of the global
    sub-batch (the ``masked_lm`` reader's ``mlm_labels``); accuracy of the masked pieces."""

    reads = "sequence"
    ties_input_embeddings = True
    primary_metric = "accuracy"
    higher_is_better = True

    def __init__(self, feature_size, label_field="mlm_labels"):
        super().__init__(feature_size, label_field)
        self._tied = []  # the backbone's embedding: held outside the head's parameters (it is the backbone's)

    def tie_input_embeddings(self, weight):
        """Build the transform to the embedding width and keep the embedding matrix ``weight`` [V, E]."""
        vocab, width = weight.shape
        self._tied = [weight]
        self.transform = paddle.nn.Linear(self.feature_size, width)
        self.norm = paddle.nn.LayerNorm(width)
        self.output_bias = self.create_parameter([vocab], is_bias=True,
                                                 default_initializer=paddle.nn.initializer.Constant(0.0))

    def fields(self):
        """``mlm_labels`` [T]: the original id of a masked piece, -1 elsewhere."""
        return [Field(self.label_field, (None,), "int64", pad=-1)]

    def _masked(self, features, labels):
        """(logits [M, V] of the masked pieces, their labels [M])."""
        if not self._tied:
            raise RuntimeError("masked_lm head used before tie_input_embeddings")
        y = labels[self.label_field]
        where = paddle.nonzero(y >= 0)
        x = paddle.gather_nd(features, where)
        x = self.norm(F.gelu(self.transform(x)))
        logits = paddle.matmul(x, self._tied[0], transpose_y=True) + self.output_bias
        return logits, paddle.gather_nd(y, where)

    def forward(self, features, labels):
        """Mean cross-entropy over the masked pieces of the global sub-batch, and their accuracy."""
        logits, y = self._masked(features, labels)
        if y.shape[0] == 0:  # no masked piece in this rank's rows (the other ranks may have some)
            zero = (features * 0).sum()
            return global_mean(zero, paddle.full([], 0, "int64"), {"accuracy": paddle.zeros([])})
        total = F.cross_entropy(logits, y.reshape([-1, 1]), reduction="sum")
        return global_mean(total, paddle.full([], y.shape[0], "int64"), {"accuracy": (logits.argmax(-1) == y).sum()})

    def predict(self, features, labels):
        """Per sample: right (1) or wrong (0) for each of its masked pieces, in position order."""
        logits, y = self._masked(features, labels)
        rows = labels[self.label_field].shape[0]
        if y.shape[0] == 0:
            return [[] for _ in range(rows)]
        right = (to_numpy(logits.argmax(-1)) == to_numpy(y)).astype(int)
        sample = to_numpy(paddle.nonzero(labels[self.label_field] >= 0))[:, 0]  # the row of each masked piece
        return [right[sample == r].tolist() for r in range(rows)]

    def score(self, predictions, reader):
        """Accuracy (a fraction) over the masked pieces of the split."""
        pieces = [p for sample in predictions for p in sample]
        return {"accuracy": float(np.mean(pieces)) if pieces else 0.0}
