"""Word tagging: word scores from the encoder's sequence features, a loss and a decoding per sentence (the
``tagger`` and ``crf_tagger`` heads)."""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.contracts import Field
from mtl.headkit.text import TextHead, gather_words, global_mean, mlp, softmax_rows, to_numpy, word_counts
from mtl.text.metrics import entity_scores

METRICS = ("accuracy", "f1")


class WordTagger(TextHead):
    """Per-word logits ``MLP(words)`` [B, W, C] from the encoder's ``sequence`` at each word's first piece, softmax
    cross-entropy averaged over all labelled words; prediction = argmax per word. ``metric``: ``accuracy`` (words)
    or ``f1`` (entities of IOB2 tags, seqeval's conventions: :mod:`mtl.text.metrics`).

    Parameters:
        hidden (list): widths of the word MLP's hidden layers (each Linear, LeakyReLU, Dropout); empty: one Linear
        dropout (float): dropout after each hidden layer of the word MLP
        metric (str): accuracy (of the words) or f1 (entity F1 of IOB2 tags); the head's primary metric
    """

    reads = "sequence"
    primary_metric = "accuracy"
    higher_is_better = True
    predicts_text = True
    word_probabilities = True  # the softmax probability of each predicted tag (not for a CRF's path)

    def __init__(self, feature_size, num_classes=None, hidden=(), dropout=0.33, metric="accuracy",
                 label_field="tags"):
        super().__init__(feature_size, label_field)
        if num_classes is None or int(num_classes) < 1:
            raise ValueError(f"num_classes must be a positive integer (the reader gives it), got {num_classes!r}")
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        self.num_classes, self.metric = int(num_classes), metric
        self.primary_metric = metric
        self.scorer = mlp(self.feature_size, hidden, self.num_classes, float(dropout))

    def fields(self):
        """``word_index`` and the word labels [W] (padded with -1)."""
        return [Field("word_index", (None,), "int64", pad=0), Field(self.label_field, (None,), "int64", pad=-1)]

    def emissions(self, features, labels):
        """[B, W, C] word scores."""
        return self.scorer(gather_words(features, labels["word_index"]))

    def forward(self, features, labels):
        """Mean cross-entropy over the labelled words of the global sub-batch, and word accuracy."""
        logits = self.emissions(features, labels)
        tags = labels[self.label_field]
        valid = tags >= 0
        total = F.cross_entropy(logits.reshape([-1, self.num_classes]), tags.reshape([-1, 1]), ignore_index=-1,
                                reduction="sum")
        correct = paddle.logical_and(logits.argmax(axis=-1) == tags, valid)
        return global_mean(total, valid.sum(), {"accuracy": correct.sum()})

    def decode(self, logits: np.ndarray, count: int) -> np.ndarray:
        """The tags of one sentence's ``count`` words (argmax here; Viterbi for the CRF)."""
        return logits[:count].argmax(axis=-1)

    def predict(self, features, labels):
        """Per sentence: (predicted tags, gold tags) of its words."""
        logits = to_numpy(self.emissions(features, labels))
        gold = to_numpy(labels[self.label_field])
        out = []
        for row, tags in zip(logits, gold):
            count = int((tags >= 0).sum())
            out.append((self.decode(row, count), tags[:count]))
        return out

    def predict_text(self, features, inputs):
        """Per sentence: ``{tags: the decoded tag of every word}`` (argmax, or the CRF's Viterbi path), with each
        tag's softmax probability when the head has one per word."""
        logits = to_numpy(self.emissions(features, inputs))
        out = []
        for row, count in zip(logits, word_counts(inputs)):
            tags = self.decode(row, int(count))
            record = {self.label_field: [int(t) for t in tags]}
            if self.word_probabilities:
                record["probability"] = softmax_rows(row[:count])[np.arange(count), tags].tolist()
            out.append(record)
        return out

    def score(self, predictions, reader):
        """Word accuracy (a fraction); with ``metric: f1`` also entity precision, recall and F1 (tag names from the
        reader's ``class_names``)."""
        pred = np.concatenate([p for p, _ in predictions]) if predictions else np.zeros(0)
        gold = np.concatenate([g for _, g in predictions]) if predictions else np.zeros(0)
        result = {"accuracy": float((pred == gold).mean()) if len(gold) else 0.0}
        if self.metric == "f1":
            names = list(reader.class_names) + ["?"]  # "?": a gold tag the training file never had
            result.update(entity_scores([[names[t] for t in g] for _, g in predictions],
                                        [[names[t] for t in p] for p, _ in predictions]))
        return result
