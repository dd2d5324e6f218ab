"""Text heads against independent references: the CRF's log-likelihood and Viterbi path against brute-force
enumeration, the biaffine head's loss against a float64 numpy implementation and its gradients against finite
differences of it, trees well formed at prediction, metrics against their formulas on fixed inputs (seqeval's
entity conventions, SQuAD v1.1's EM/F1, CoNLL 2018's attachment scores), and the span head end to end on a
hand-made SQuAD file."""
import itertools
import os

import numpy as np
import paddle
import pytest

from mtl.core import registry
from mtl.headkit.crf import log_partition, path_scores, viterbi
from mtl.readers.squad_reader import SquadReader
from mtl.text.metrics import attachment_scores, entity_scores
from mtl.text.squad import exact_match, f1_score, normalize_answer, squad_scores
from mtl.text.tokenizer import TextTokenizer
from mtl.text.trees import is_tree

HERE = os.path.dirname(os.path.abspath(__file__))
registry.load_builtin()


def head(name, **options):
    return registry.build("head", dict(type=name, **options))


def _brute_force(emissions, transitions, start, end):
    """Every tag path of one sentence: (log Z, best path) by enumeration."""
    w, c = emissions.shape
    scores = {}
    for path in itertools.product(range(c), repeat=w):
        s = start[path[0]] + end[path[-1]] + sum(emissions[t, path[t]] for t in range(w))
        s += sum(transitions[path[t - 1], path[t]] for t in range(1, w))
        scores[path] = s
    values = np.array(list(scores.values()))
    log_z = values.max() + np.log(np.exp(values - values.max()).sum())
    return log_z, max(scores, key=scores.get), scores


def test_crf_likelihood_and_viterbi_against_enumeration():
    rng = np.random.RandomState(0)
    c, lengths = 3, [4, 2, 1]
    emissions = rng.randn(3, 4, c)
    transitions, start, end = rng.randn(c, c), rng.randn(c), rng.randn(c)
    tags = rng.randint(0, c, (3, 4))
    mask = np.arange(4)[None] < np.array(lengths)[:, None]
    tags[~mask] = -1
    t = {k: paddle.to_tensor(v) for k, v in dict(e=emissions, a=transitions, s=start, z=end).items()}
    log_z = log_partition(t["e"], paddle.to_tensor(mask), t["a"], t["s"], t["z"]).numpy()
    gold = path_scores(t["e"], paddle.to_tensor(tags), paddle.to_tensor(mask), t["a"], t["s"], t["z"]).numpy()
    for b, n in enumerate(lengths):
        ref_z, ref_best, table = _brute_force(emissions[b, :n], transitions, start, end)
        np.testing.assert_allclose(log_z[b], ref_z, rtol=1e-10)
        np.testing.assert_allclose(gold[b], table[tuple(tags[b, :n])], rtol=1e-10)
        assert tuple(viterbi(emissions[b, :n], transitions, start, end)) == ref_best


def test_crf_head_predicts_the_viterbi_path_not_the_argmax():
    crf = head("crf_tagger", feature_size=2, num_classes=2)
    with paddle.no_grad():
        crf.transitions.set_value(paddle.to_tensor([[5.0, -5.0], [-5.0, 5.0]]))  # staying is cheap
    emissions = np.array([[1.0, 0.0], [0.0, 0.4], [1.0, 0.0]])  # argmax 0 1 0; Viterbi stays: 0 0 0
    assert crf.decode(emissions, 3).tolist() == [0, 0, 0] and emissions.argmax(-1).tolist() == [0, 1, 0]


def _biaffine_reference(nodes, heads, relations, p):
    """The biaffine loss in float64 numpy (sum over words of arc CE + relation CE, divided by the words)."""
    def mlp(x, layers):
        (w1, b1), (w2, b2) = layers
        h = x @ w1 + b1
        return np.where(h > 0, h, 0.01 * h) @ w2 + b2  # LeakyReLU (Paddle's default slope 0.01)

    total, count = 0.0, 0
    for b in range(nodes.shape[0]):
        n = int((heads[b] >= 0).sum())
        x = nodes[b, :n + 1]
        dep = np.concatenate([mlp(x, p["arc_dep"]), np.ones((n + 1, 1))], 1)
        scores = dep @ p["arc_weight"] @ mlp(x, p["arc_head"]).T
        np.fill_diagonal(scores, -1e9)
        rd = np.concatenate([mlp(x, p["rel_dep"]), np.ones((n + 1, 1))], 1)
        rh = np.concatenate([mlp(x, p["rel_head"]), np.ones((n + 1, 1))], 1)
        r = p["rel_weight"].shape[0]
        weight = p["rel_weight"].reshape(r, -1, r)  # [L+1, R, L+1]
        for i in range(1, n + 1):
            row = scores[i]
            total += np.log(np.exp(row - row.max()).sum()) + row.max() - row[heads[b, i - 1]]
            rel = np.einsum("i,irj,j->r", rd[i], weight, rh[heads[b, i - 1]])
            total += np.log(np.exp(rel - rel.max()).sum()) + rel.max() - rel[relations[b, i - 1]]
            count += 1
    return total / count


def _parameters(h):
    def pair(seq):
        return [(seq[0].weight.numpy().astype(np.float64), seq[0].bias.numpy().astype(np.float64)),
                (seq[3].weight.numpy().astype(np.float64), seq[3].bias.numpy().astype(np.float64))]

    return {"arc_dep": pair(h.arc_dep), "arc_head": pair(h.arc_head), "rel_dep": pair(h.rel_dep),
            "rel_head": pair(h.rel_head), "arc_weight": h.arc_weight.numpy().astype(np.float64),
            "rel_weight": h.rel_weight.numpy().astype(np.float64)}


def test_biaffine_loss_and_gradients_against_numpy():
    paddle.seed(0)
    h = head("biaffine", feature_size=6, num_classes=3, arc_size=5, relation_size=4, dropout=0.0)
    rng = np.random.RandomState(1)
    with paddle.no_grad():  # non-zero biaffine weights (they start at zero, as Dozat & Manning's)
        h.arc_weight.set_value(paddle.to_tensor(rng.randn(6, 5).astype("float32")))
        h.rel_weight.set_value(paddle.to_tensor(rng.randn(5, 15).astype("float32")))
    seq = rng.randn(2, 6, 6).astype("float32")  # positions 0..5; words start at positions 1..
    word_index = np.array([[1, 2, 4, 5], [1, 3, 0, 0]])
    heads = np.array([[2, 0, 2, 3], [0, 1, -1, -1]])
    relations = np.array([[1, 0, 2, 1], [0, 2, -1, -1]])
    labels = {"word_index": paddle.to_tensor(word_index), "heads": paddle.to_tensor(heads),
              "relations": paddle.to_tensor(relations)}
    features = paddle.to_tensor(seq, stop_gradient=False)
    out = h(features, labels)
    out.loss.backward()
    nodes = np.concatenate([seq[:, :1], np.take_along_axis(seq, word_index[:, :, None], 1)], 1).astype(np.float64)
    p = _parameters(h)
    reference = _biaffine_reference(nodes, heads, relations, p)
    np.testing.assert_allclose(float(out.loss), reference, rtol=1e-5)
    # gradients: the features (through the gather) and the arc weight, against central differences in float64
    eps, grad = 1e-6, features.grad.numpy()
    for b, t, d in [(0, 0, 1), (0, 2, 3), (0, 5, 0), (1, 3, 4), (1, 4, 2)]:
        up, down = seq.astype(np.float64).copy(), seq.astype(np.float64).copy()
        up[b, t, d] += eps
        down[b, t, d] -= eps
        def ref(s):
            n = np.concatenate([s[:, :1], np.take_along_axis(s, word_index[:, :, None], 1)], 1)
            return _biaffine_reference(n, heads, relations, p)
        np.testing.assert_allclose(grad[b, t, d], (ref(up) - ref(down)) / (2 * eps), rtol=2e-3, atol=1e-5)
    assert grad[1, 2].tolist() == [0.0] * 6 and grad[1, 5].tolist() == [0.0] * 6  # positions no word reads
    for i, j in [(0, 0), (3, 2), (5, 4)]:
        q = dict(p, arc_weight=p["arc_weight"].copy())
        q["arc_weight"][i, j] += eps
        hi = _biaffine_reference(nodes, heads, relations, q)
        q["arc_weight"][i, j] -= 2 * eps
        lo = _biaffine_reference(nodes, heads, relations, q)
        np.testing.assert_allclose(h.arc_weight.grad.numpy()[i, j], (hi - lo) / (2 * eps), rtol=2e-3, atol=1e-5)


def test_biaffine_predicts_well_formed_trees():
    paddle.seed(3)
    h = head("biaffine", feature_size=8, num_classes=4, arc_size=6, relation_size=4, dropout=0.0)
    with paddle.no_grad():
        h.arc_weight.set_value(paddle.randn(h.arc_weight.shape))
    h.eval()
    lengths = [7, 3, 1, 5]
    heads = np.full((4, 7), -1)
    for b, n in enumerate(lengths):
        heads[b, :n] = 0
    labels = {"word_index": paddle.to_tensor(np.tile(np.arange(1, 8), (4, 1))), "heads": paddle.to_tensor(heads),
              "relations": paddle.to_tensor(np.where(heads >= 0, 0, -1))}
    predictions = h.predict(paddle.randn([4, 9, 8]), labels)
    for (tree, rels, _, _), n in zip(predictions, lengths):
        assert len(tree) == n and is_tree(tree) and (tree == 0).sum() == 1 and len(rels) == n


def test_entity_f1_follows_seqeval_on_fixed_input():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["I-ORG", "I-ORG", "B-PER"]]
    # entities: gold {PER 0-1, LOC 3}, {ORG 0-1}; predicted {PER 0-1, ORG 3}, {ORG 0-1 (I- starts it), PER 2}
    scores = entity_scores(gold, pred)
    p, r = 2 / 4, 2 / 3
    assert scores["precision"] == pytest.approx(p) and scores["recall"] == pytest.approx(r)  # fractions
    assert scores["f1"] == pytest.approx(2 * p * r / (p + r))


def test_squad_metrics_on_fixed_input():
    assert normalize_answer("The  Cat's, mat!") == "cats mat"
    assert exact_match("the Mat.", "mat") == 1.0
    assert f1_score("on the red mat", "the mat") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    scores = squad_scores(["on the mat", "a tree"], [["on the mat"], ["over the tree", "the tree"]])
    assert scores == {"exact_match": (1 + 1) / 2, "f1": 1.0}


def test_attachment_scores_on_fixed_input():
    gold_heads, gold_rels = [np.array([2, 0, 2, 2])], [["nsubj", "root", "obj", "punct"]]
    pred_heads, pred_rels = [np.array([2, 0, 1, 2])], [["nsubj:pass", "root", "obj", "det"]]
    scores = attachment_scores(gold_heads, gold_rels, pred_heads, pred_rels)
    # heads right: words 1, 2, 4; labels (universal part) right: 1 (nsubj), 2 -> LAS 2/4; without punct: 2/3, 2/3
    assert scores == pytest.approx({"uas": 0.75, "las": 0.5, "uas_nopunct": 2 / 3, "las_nopunct": 2 / 3})


def test_span_head_reads_answers_back_from_the_hand_made_file():
    words = ["the", "cat", "sat", "on", "mat", ".", "dog", "ran", "to", "park", "and", "bird", "flew", "over",
             "tree", "a", "where", "did", "sit", "?", "fly", "who"]
    tok = TextTokenizer.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
    reader = SquadReader(os.path.join(HERE, "fixtures", "text", "tiny_squad.json"), tokenizer=tok, max_length=16,
                         doc_stride=4, max_query_length=8)
    span = head("span", feature_size=2, max_answer_length=5)
    with paddle.no_grad():  # logits = the features themselves
        span.linear.weight.set_value(paddle.eye(2))
        span.linear.bias.set_value(paddle.zeros([2]))
    # one-hot features at the hand-chosen pieces: q1 -> "on the mat" (window 0, pieces 8+3..8+5), q2 -> "the tree"
    # (window 4 of q2, context pieces 18..19), q3 -> "dog" (its one window: [CLS] who ran ? [SEP], context piece 1)
    targets = {(0, 0): (11, 13), (1, 4): (8 + 2, 8 + 3), (2, 0): (6, 6)}
    predictions = []
    windows = {}
    for s in reader._samples:
        q = int(s["example_index"])
        w = windows.setdefault(q, 0)
        windows[q] += 1
        features = np.zeros((1, len(s["token_ids"]), 2), "float32")
        if (q, w) in targets:
            a, b = targets[(q, w)]
            features[0, a, 0], features[0, b, 1] = 10.0, 10.0
        labels = {k: paddle.to_tensor(np.asarray(s[k])[None]) for k in ("start", "end", "context_mask",
                                                                         "piece_chars", "example_index")}
        predictions += span.predict(paddle.to_tensor(features), labels)
    best = {}
    for q, value, a, b in predictions:
        if value is not None and (q not in best or value > best[q][0]):
            best[q] = (value, a, b)
    assert [reader.example_context(q)[best[q][1]:best[q][2]] for q in range(3)] == ["on the mat", "the tree", "dog"]
    scores = span.score(predictions, reader)
    # q1 exact, q2 matches its second gold answer, q3 "dog" vs "a dog": normalised both are "dog"
    assert scores == {"exact_match": 1.0, "f1": 1.0}
