"""Word tagging with a linear-chain CRF (:mod:`mtl.headkit.crf`): sentence log-likelihood, Viterbi at prediction."""
import paddle

from mtl.core.registry import register_head
from mtl.headkit.crf import log_partition, path_scores, viterbi
from mtl.headkit.tagging import WordTagger
from mtl.headkit.text import global_mean, to_numpy


@register_head("crf_tagger")
class CrfTaggerHead(WordTagger):
    """The ``tagger``'s word scores as CRF emissions with learned transitions [C, C], start and end scores; loss
    ``sum over sentences of (log Z - score(gold path))`` divided by the labelled words of the global sub-batch;
    prediction = the Viterbi path. Default metric: entity ``f1``."""

    word_probabilities = False  # a word's softmax of the emissions is not the path's probability

    def __init__(self, feature_size, num_classes=None, hidden=(), dropout=0.33, metric="f1", label_field="tags"):
        super().__init__(feature_size, num_classes, hidden, dropout, metric, label_field)
        zeros = paddle.nn.initializer.Constant(0.0)
        c = self.num_classes
        self.transitions = self.create_parameter([c, c], default_initializer=zeros)
        self.start = self.create_parameter([c], default_initializer=zeros)
        self.end = self.create_parameter([c], default_initializer=zeros)

    def forward(self, features, labels):
        """Negative log-likelihood of the gold paths, per labelled word of the global sub-batch."""
        emissions = self.emissions(features, labels)
        tags = labels[self.label_field]
        mask = tags >= 0
        nll = log_partition(emissions, mask, self.transitions, self.start, self.end) - \
            path_scores(emissions, tags, mask, self.transitions, self.start, self.end)
        has_words = paddle.cast(mask.any(axis=1), nll.dtype)
        correct = paddle.logical_and(emissions.argmax(axis=-1) == tags, mask)
        return global_mean((nll * has_words).sum(), mask.sum(), {"accuracy": correct.sum()})

    def decode(self, logits, count):
        """The Viterbi path of one sentence."""
        return viterbi(logits[:count], to_numpy(self.transitions), to_numpy(self.start), to_numpy(self.end))
