"""Span extraction (reading comprehension, SQuAD): start and end logits over the pieces of a window."""
from collections import defaultdict

import paddle
import paddle.nn.functional as F

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.core.registry import register_head
from mtl.headkit.text import TextHead, global_mean, to_numpy
from mtl.text.squad import SpanExamples, best_span, squad_scores


@register_head("span")
class SpanHead(TextHead):
    """``[start, end] = W sequence_t + b`` per piece; the logits outside the window's context are masked except
    position 0 (``[CLS]``: "the answer is not in this window"); loss = mean of the start and end cross-entropies
    over the global sub-batch. Prediction: per question, the best span ``start + end`` logit over all its windows
    (first <= last < first + ``max_answer_length``), mapped back to characters of the context; exact match and F1
    as SQuAD v1.1's evaluation script computes them (:mod:`mtl.text.squad`).

    Parameters:
        max_answer_length (int): the most pieces a predicted answer spans
    """

    reads = "sequence"
    primary_metric = "f1"
    higher_is_better = True
    predicts_text = True

    def __init__(self, feature_size, max_answer_length=30, label_field="start"):
        super().__init__(feature_size, label_field)
        self.max_answer_length = int(max_answer_length)
        self.linear = paddle.nn.Linear(self.feature_size, 2)

    def fields(self):
        """``start``, ``end``, ``context_mask``, ``piece_chars`` and ``example_index`` (the ``squad`` reader's)."""
        return [Field("start", (), "int64"), Field("end", (), "int64"), Field("context_mask", (None,), "int64", pad=0),
                Field("piece_chars", (None, 2), "int64", pad=-1), Field("example_index", (), "int64")]

    def logits(self, features, labels):
        """(start, end) logits [B, T], -1e9 outside the context and [CLS]."""
        out = self.linear(features)
        allowed = labels["context_mask"] > 0
        allowed = paddle.concat([paddle.ones_like(allowed[:, :1]), allowed[:, 1:]], axis=1)
        fill = paddle.full_like(out[..., 0], -1e9)
        return paddle.where(allowed, out[..., 0], fill), paddle.where(allowed, out[..., 1], fill)

    def forward(self, features, labels):
        """(CE(start) + CE(end)) / 2, mean over the global sub-batch; accuracy of both ends."""
        start, end = self.logits(features, labels)
        ys, ye = labels["start"].reshape([-1, 1]), labels["end"].reshape([-1, 1])
        total = (F.cross_entropy(start, ys, reduction="sum") + F.cross_entropy(end, ye, reduction="sum")) / 2
        right = paddle.logical_and(start.argmax(-1) == ys.reshape([-1]), end.argmax(-1) == ye.reshape([-1]))
        return global_mean(total, paddle.full([], start.shape[0], "int64"), {"span_accuracy": right.sum()})

    def predict(self, features, labels):
        """Per window: (question, best score, first character, end character) or (question, None, 0, 0)."""
        start, end = (to_numpy(x) for x in self.logits(features, labels))
        mask, chars = to_numpy(labels["context_mask"]), to_numpy(labels["piece_chars"])
        out = []
        for s, e, m, c, q in zip(start, end, mask, chars, to_numpy(labels["example_index"]).reshape(-1)):
            best = best_span(s, e, m, self.max_answer_length)
            out.append((int(q), None, 0, 0) if best is None else (int(q), best[0], int(c[best[1], 0]),
                                                                  int(c[best[2], 1])))
        return out

    def predict_text(self, features, inputs):
        """Per window: ``{question, score, start, end}``, the best span's score and characters in its question's
        context (score None when the window holds no context); a question's answer is its best window's span."""
        return [{"question": q, "score": value, "start": a, "end": b}
                for q, value, a, b in self.predict(features, inputs)]

    def score(self, predictions, reader):
        """SQuAD v1.1 exact match and F1 (fractions) over the reader's questions."""
        if not isinstance(reader, SpanExamples):
            raise ConfigError(f"head 'span' scores windows of a reader of questions (e.g. 'squad'), not "
                              f"'{reader.registered_name}'")
        best = defaultdict(lambda: (None, 0, 0))
        for q, value, a, b in predictions:
            if value is not None and (best[q][0] is None or value > best[q][0]):
                best[q] = (value, a, b)
        texts = [reader.example_context(q)[best[q][1]:best[q][2]] for q in range(reader.example_count())]
        return squad_scores(texts, [reader.example_answers(q) or [""] for q in range(reader.example_count())])
