"""Shared part of the text heads: word features from sequence features, MLPs, losses normalised over all ranks.

Word-level heads read the encoder's ``sequence`` [B, T, D] and the reader's ``word_index`` [B, W] (each word's first
piece, :mod:`mtl.text.words`): ``words = sequence[b, word_index[b, k]]`` [B, W, D]; a word whose label is -1 is
padding. Token-level losses are means over every labelled word of the *global* sub-batch: each rank returns
``sum of its words' losses / (words over all ranks)`` (the count is one all-reduce of a number, issued by every
rank in job order), so summed backbone gradients are those of the global mean, for any process count.
"""
import numpy as np
import paddle
from paddle import nn

from mtl.headkit.base import Head, HeadOutput
from mtl.parallel.distributed import all_reduce_sum


def gather_words(sequence, word_index):
    """[B, W, D] features of each word's first piece (padded words read position 0, and are masked by the caller)."""
    index = paddle.clip(word_index, min=0).unsqueeze(-1).expand([-1, -1, sequence.shape[-1]])
    return paddle.take_along_axis(sequence, index, axis=1)


def mlp(width_in: int, hidden, width_out: int, dropout: float, activation=nn.LeakyReLU):
    """``Linear -> activation -> Dropout`` per hidden size, then ``Linear`` to ``width_out`` (none: one Linear)."""
    layers, previous = [], width_in
    for size in hidden or ():
        layers += [nn.Linear(previous, int(size)), activation(), nn.Dropout(dropout)]
        previous = int(size)
    layers.append(nn.Linear(previous, width_out))
    return nn.Sequential(*layers)


def global_mean(total, count, metrics=None):
    """A HeadOutput whose loss is ``total / (count over all ranks)``; ``metrics``: ``{name: local sum}`` reported
    as global sums over the same count."""
    n = paddle.clip(all_reduce_sum(paddle.cast(count, "float32").reshape([1])), min=1.0).reshape([])
    loss = total / n
    reported = {k: all_reduce_sum(paddle.cast(v, "float32").reshape([1])).reshape([]) / n
                for k, v in (metrics or {}).items()}
    return HeadOutput(loss=loss, metrics=reported, global_loss=all_reduce_sum(loss))


def to_numpy(value):
    """A tensor (or array) as numpy."""
    return value.numpy() if isinstance(value, paddle.Tensor) else np.asarray(value)


def softmax_rows(logits) -> np.ndarray:
    """``exp(z - max z) / sum exp(z - max z)`` over the last axis, in float64."""
    z = np.asarray(logits, np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def class_records(logits, field: str) -> list:
    """``{field: best class, "probability": its probability, "probabilities": all}`` per row of ``logits`` [B, C]."""
    probabilities = softmax_rows(to_numpy(logits))
    best = probabilities.argmax(axis=-1)
    return [{field: int(k), "probability": float(p[k]), "probabilities": p.tolist()}
            for k, p in zip(best, probabilities)]


def word_counts(inputs) -> np.ndarray:
    """Words per sentence of a prediction batch: positions of ``word_index`` above 0 (a word's first piece comes after
    ``[CLS]``; padding is 0)."""
    return (to_numpy(inputs["word_index"]) > 0).sum(axis=1)


class TextHead(Head):
    """Base of the text heads: they read named fields of the sub-batch and evaluate batch by batch."""

    evaluates_batches = True
    reader_sizes = {"num_classes": "num_classes"}

    def labels_of(self, sub_batch):
        """Every field the head declares, by name."""
        return {f.name: sub_batch[f.name] for f in self.fields()}

    def evaluate(self, features, labels):
        """Not used: text heads evaluate batch by batch (``predict`` and ``score``)."""
        raise NotImplementedError("text heads are evaluated batch by batch (Head.evaluates_batches)")
