"""Biaffine dependency parsing (Dozat & Manning, 2017, "Deep Biaffine Attention for Neural Dependency Parsing").

Nodes ``H = [sequence[:, 0]; words]`` [B, W+1, D] (position 0, ``[CLS]``, is the root). Arcs: ``a_dep = MLP(H)``,
``a_head = MLP'(H)`` [B, W+1, A] and ``S[i, j] = [a_dep_i; 1]^T U a_head_j`` (U [A+1, A]: the bilinear term and
D&M's head bias ``a_head_j^T u``); a word never heads itself and padding heads nothing. Relations, at a word's head
h (the gold one in training, the predicted one at prediction): ``s_r = [r_dep_i; 1]^T U_r [r_head_h; 1]`` (U_r
[L+1, L+1]: bilinear, both linear terms and a bias). Loss = the arc cross-entropy over heads plus the relation
cross-entropy, per word of the global sub-batch. Prediction: a well-formed tree with one root child (maximum
spanning arborescence of the log-softmax arc scores, :mod:`mtl.text.trees`), then each word's best relation at its
predicted head. Scores: UAS/LAS as the CoNLL 2018 script computes them, and without punctuation
(:mod:`mtl.text.metrics`).
"""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.contracts import Field
from mtl.core.registry import register_head
from mtl.headkit.text import TextHead, gather_words, global_mean, mlp, to_numpy, word_counts
from mtl.text.metrics import attachment_scores
from mtl.text.trees import decode_tree


def with_ones(x):
    """``[x; 1]`` along the last axis."""
    return paddle.concat([x, paddle.ones(x.shape[:-1] + [1], x.dtype)], axis=-1)


@register_head("biaffine")
class BiaffineHead(TextHead):
    """Arcs and relations of a dependency tree from the encoder's ``sequence`` (fields ``word_index``, ``heads``
    [W] word numbers with 0 = root, ``relations`` [W]).

    Parameters:
        arc_size (int): width of the two arc MLPs (a word as dependent, as head): one hidden layer and the output
        relation_size (int): width of the two relation MLPs, likewise
        dropout (float): dropout after the hidden layer of each of the four MLPs
        relation_field (str): the batch field holding each word's relation label (label_field: its head's number)
    """

    reads = "sequence"
    primary_metric = "las"
    higher_is_better = True
    predicts_text = True

    def __init__(self, feature_size, num_classes=None, arc_size=256, relation_size=64, dropout=0.33,
                 label_field="heads", relation_field="relations"):
        super().__init__(feature_size, label_field)
        if num_classes is None or int(num_classes) < 1:
            raise ValueError(f"num_classes (relations, given by the reader) must be positive, got {num_classes!r}")
        self.num_classes, self.relation_field = int(num_classes), relation_field
        a, r, d = int(arc_size), int(relation_size), float(dropout)
        self.arc_dep, self.arc_head = mlp(self.feature_size, [a], a, d), mlp(self.feature_size, [a], a, d)
        self.rel_dep, self.rel_head = mlp(self.feature_size, [r], r, d), mlp(self.feature_size, [r], r, d)
        zeros = paddle.nn.initializer.Constant(0.0)
        self.arc_weight = self.create_parameter([a + 1, a], default_initializer=zeros)
        self.rel_weight = self.create_parameter([r + 1, self.num_classes * (r + 1)], default_initializer=zeros)

    def fields(self):
        """``word_index``, ``heads`` and ``relations`` [W] (padded with -1)."""
        return [Field("word_index", (None,), "int64", pad=0), Field(self.label_field, (None,), "int64", pad=-1),
                Field(self.relation_field, (None,), "int64", pad=-1)]

    def nodes(self, features, labels):
        """[B, W+1, D]: the root (position 0) and every word."""
        return paddle.concat([features[:, :1], gather_words(features, labels["word_index"])], axis=1)

    def arc_scores(self, nodes, valid):
        """[B, W+1 dependents, W+1 heads]; impossible heads (padding, the word itself) get -1e9."""
        dep, head = with_ones(self.arc_dep(nodes)), self.arc_head(nodes)
        scores = paddle.matmul(paddle.matmul(dep, self.arc_weight), head, transpose_y=True)
        allowed = paddle.concat([paddle.ones_like(valid[:, :1]), valid], axis=1).unsqueeze(1)
        eye = (paddle.eye(scores.shape[1], dtype="int32") > 0).unsqueeze(0)
        allowed = paddle.logical_and(allowed.expand(scores.shape), paddle.logical_not(eye))
        return paddle.where(allowed, scores, paddle.full_like(scores, -1e9))

    def relation_scores(self, nodes, heads):
        """[B, W, R] relation scores of every word at the given heads [B, W] (word numbers)."""
        dep = with_ones(self.rel_dep(nodes[:, 1:]))
        head = with_ones(gather_words(self.rel_head(nodes), heads))
        width = dep.shape[-1]
        product = paddle.matmul(dep, self.rel_weight).reshape(dep.shape[:2] + [self.num_classes, width])
        return (product * head.unsqueeze(2)).sum(axis=-1)

    def forward(self, features, labels):
        """Arc plus relation cross-entropy per labelled word of the global sub-batch; greedy UAS as a metric."""
        heads, relations = labels[self.label_field], labels[self.relation_field]
        valid = heads >= 0
        nodes = self.nodes(features, labels)
        arcs = self.arc_scores(nodes, valid)[:, 1:]  # dependents are the words
        width = arcs.shape[-1]
        arc_loss = F.cross_entropy(arcs.reshape([-1, width]), heads.reshape([-1, 1]), ignore_index=-1,
                                   reduction="sum")
        rels = self.relation_scores(nodes, heads)
        rel_loss = F.cross_entropy(rels.reshape([-1, self.num_classes]), relations.reshape([-1, 1]),
                                   ignore_index=-1, reduction="sum")
        right = paddle.logical_and(arcs.argmax(axis=-1) == heads, valid)
        return global_mean(arc_loss + rel_loss, valid.sum(), {"uas": right.sum()})

    def decode(self, features, inputs, valid):
        """(trees, relations): per sentence the heads of its words (a well-formed tree, one root child) and the best
        relation of each word at its predicted head; ``valid`` [B, W] bool marks the words."""
        nodes = self.nodes(features, inputs)
        arcs = to_numpy(F.log_softmax(self.arc_scores(nodes, valid), axis=-1))
        counts = to_numpy(valid).sum(axis=1)
        trees = [decode_tree(a[:n + 1, :n + 1]) for a, n in zip(arcs, counts)]
        padded = np.zeros(tuple(valid.shape), np.int64)
        for row, tree in zip(padded, trees):
            row[:len(tree)] = tree
        rels = to_numpy(self.relation_scores(nodes, paddle.to_tensor(padded))).argmax(axis=-1)
        return trees, [r[:len(tree)] for r, tree in zip(rels, trees)]

    def predict(self, features, labels):
        """Per sentence: (predicted heads, predicted relations, gold heads, gold relations)."""
        heads, relations = to_numpy(labels[self.label_field]), to_numpy(labels[self.relation_field])
        trees, rels = self.decode(features, labels, labels[self.label_field] >= 0)
        return [(tree, r, h[:len(tree)], g[:len(tree)]) for tree, r, h, g in zip(trees, rels, heads, relations)]

    def predict_text(self, features, inputs):
        """Per sentence: ``{heads: each word's head (0 = root), relations: each word's relation id}``."""
        counts = word_counts(inputs)
        valid = paddle.to_tensor(np.arange(inputs["word_index"].shape[1])[None, :] < counts[:, None])
        trees, rels = self.decode(features, inputs, valid)
        return [{self.label_field: [int(h) for h in tree], self.relation_field: [int(r) for r in rel]}
                for tree, rel in zip(trees, rels)]

    def score(self, predictions, reader):
        """UAS, LAS (CoNLL 2018) and their no-punctuation variants, as fractions (relation names from the reader)."""
        names = list(reader.class_names) + ["?"]
        gold_heads = [g for _, _, g, _ in predictions]
        gold_relations = [[names[i] for i in gr] for _, _, _, gr in predictions]
        return attachment_scores(gold_heads, gold_relations, [p for p, _, _, _ in predictions],
                                 [[names[i] for i in r] for _, r, _, _ in predictions])
