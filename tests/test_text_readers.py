"""Text readers against hand-checked data: CoNLL-U (multiword tokens, empty nodes, a non-projective tree, any
column), IOB2, the word/subword label rule and its round trip, too-long sentences, masked-LM statistics, SQuAD
windows against hand-computed spans, TSV classification and matching, padded batches and length buckets."""
import json
import os

import numpy as np
import pytest

from mtl.core.errors import ConfigError, DataError
from mtl.data.buckets import BucketedOrder
from mtl.data.padding import collate_padded, pad_stack
from mtl.data.steps import SampleOrder
from mtl.readers.conllu_reader import ConlluReader
from mtl.readers.iob2_reader import Iob2Reader
from mtl.readers.masked_lm import MaskedLmReader
from mtl.readers.squad_reader import SquadReader
from mtl.readers.text_pairs import MatchingReader, TextClassificationReader
from mtl.text.conllu import is_projective, read_conllu
from mtl.text.iob2 import entities, read_iob2
from mtl.text.masking import mask_pieces
from mtl.text.tokenizer import TextTokenizer
from mtl.text.words import encode_words, piece_labels_to_words, word_labels_to_pieces, word_parts

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "fixtures", "text")
TINY = os.path.join(TEXT, "tiny.conllu")
EWT_TOKENIZER = os.path.join(os.path.dirname(HERE), "examples", "data", "text", "ewt_wordpiece_8k.json")
WORDS = ["the", "cat", "sat", "on", "mat", ".", "dog", "ran", "to", "park", "and", "bird", "flew", "over", "tree",
         "a", "where", "did", "sit", "?", "fly", "who"]


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer.from_file(EWT_TOKENIZER)


@pytest.fixture(scope="module")
def word_tokenizer():
    """One piece per word of the hand-made files: positions can be counted by hand."""
    return TextTokenizer.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)


def test_conllu_words_are_the_syntactic_words():
    s = read_conllu(TINY)
    assert len(s) == 3
    assert s[0].words == ["I", "ca", "n't", "go", "."] and s[0].multiword == [(2, 3, "can't")]
    assert s[0].columns["head"] == [4, 4, 4, 0, 4] and s[0].sent_id == "email-test-0001"
    assert s[1].words == ["Sue", "likes", "coffee", "and", "Bill", "tea"]  # the empty node 5.1 is no word
    assert len(s[1].empty_nodes) == 1 and s[1].empty_nodes[0][0] == "5.1"
    assert s[1].columns["head"] == [2, 0, 2, 5, 2, 5]
    assert is_projective(s[0].columns["head"]) and not is_projective(s[2].columns["head"])


@pytest.mark.parametrize("line,words", [
    ("1\tA\ta\tDET\tDT\t_\t2\tdet\t_\n", "expected 10"),
    ("1\tA\ta\tDET\tDT\t_\t9\tdet\t_\t_\n", "HEAD '9' is not a word number in 0..1"),
    ("2\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n", "word ID 2, expected 1"),
    ("x\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n", "neither a word number"),
])
def test_conllu_errors_name_the_line(tmp_path, line, words):
    path = tmp_path / "bad.conllu"
    path.write_text("# sent_id = x\n" + line + "\n")
    with pytest.raises(DataError, match=words):
        read_conllu(str(path))


def test_conllu_reader_any_column_tree_and_sentence_label(tokenizer):
    upos = ConlluReader(TINY, "upos", tokenizer=tokenizer)
    assert upos.class_names == sorted({"PRON", "AUX", "PART", "VERB", "PUNCT", "PROPN", "NOUN", "CCONJ", "DET",
                                       "ADP"})
    sample = upos[0]
    assert [upos.class_names[t] for t in sample["tags"]] == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
    assert sample["token_ids"][0] == tokenizer.cls_id and sample["token_ids"][-1] == tokenizer.sep_id
    feats = ConlluReader(TINY, "feats", tokenizer=tokenizer)
    assert feats.class_names[feats[0]["tags"][1]] == "VerbForm=Fin"
    tree = ConlluReader(TINY, "tree", tokenizer=tokenizer)
    assert tree[2]["heads"].tolist() == [2, 4, 4, 0, 7, 7, 2, 4, 4]
    assert [tree.class_names[r] for r in tree[2]["relations"]][:3] == ["det", "nsubj:pass", "aux:pass"]
    genre = ConlluReader(TINY, {"comment": "sent_id", "pattern": "^([a-z]+)-"}, tokenizer=tokenizer)
    assert genre.class_names == ["email", "newsgroup", "reviews"] and genre.labels().tolist() == [0, 2, 1]
    assert {f.name for f in genre.fields()} == {"token_ids", "segment_ids", "label"}


def test_evaluation_split_uses_the_training_vocabulary(tmp_path, tokenizer):
    dev = tmp_path / "dev.conllu"
    dev.write_text("# sent_id = x\n1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n")
    reader = ConlluReader(TINY, "upos", eval_path=str(dev), split="eval", tokenizer=tokenizer)
    assert reader[0]["tags"].tolist() == [reader.num_classes]  # INTJ never seen in training: no head predicts it
    assert reader.num_classes == 10


def test_first_piece_rule_and_round_trip(tokenizer):
    words = ["Unbelievably", "jurists", "go", "."]
    ids, starts = encode_words(tokenizer, words)
    pieces, firsts = tokenizer.encode_words(words)
    assert ids.tolist() == [tokenizer.cls_id] + pieces.tolist() + [tokenizer.sep_id]
    assert starts.tolist() == (firsts + 1).tolist() and starts[0] == 1
    labels = np.array([3, 1, 2, 0])
    first = word_labels_to_pieces(labels, starts, len(ids), "first")
    assert (first >= 0).sum() == 4 and first[0] == -1 and first[-1] == -1
    every = word_labels_to_pieces(labels, starts, len(ids), "all", continuation={3: 5})
    assert every[starts[0]] == 3 and (every[starts[0] + 1:starts[1]] == 5).all() and every[-1] == -1
    for rule_labels in (first, every):
        assert piece_labels_to_words(rule_labels, starts).tolist() == labels.tolist()


def test_a_word_that_normalises_to_nothing_keeps_its_label(tokenizer):
    pieces, starts = tokenizer.encode_words(["a", "\u200b", "b"])
    assert len(starts) == 3 and pieces[starts[1]] == tokenizer.unk_id


def test_too_long_sentences(tmp_path, tokenizer):
    with pytest.raises(DataError, match="more than max_length 6"):
        ConlluReader(TINY, "upos", tokenizer=tokenizer, max_length=6)
    split = ConlluReader(TINY, "upos", tokenizer=tokenizer, max_length=6, too_long="split")
    whole = ConlluReader(TINY, "upos", tokenizer=tokenizer)
    tags = np.concatenate([s["tags"] for s in split._samples])
    assert tags.tolist() == np.concatenate([s["tags"] for s in whole._samples]).tolist()  # no label is cut
    assert max(len(s["token_ids"]) for s in split._samples) <= 6
    skipped = ConlluReader(TINY, "upos", tokenizer=tokenizer, max_length=10, too_long="skip")  # pieces: 9, 9, 11
    assert skipped.bad_samples == 1 and len(skipped) == 2
    with pytest.raises(ConfigError, match="dependency tree"):
        ConlluReader(TINY, "tree", tokenizer=tokenizer, too_long="split")
    with pytest.raises(ConfigError, match="training split only"):
        ConlluReader(TINY, "upos", eval_path=TINY, split="eval", tokenizer=tokenizer, too_long="skip")
    assert word_parts(tokenizer, ["a"] * 10, 6) == [(0, 4), (4, 8), (8, 10)]


def test_iob2_reader_and_chunks(tokenizer):
    s = read_iob2(os.path.join(TEXT, "tiny.ner.iob2"))
    assert s[0].words == ["John", "Smith", "visited", "New", "York"] and s[1].comments["sent_id"] == "a-2"
    reader = Iob2Reader(os.path.join(TEXT, "tiny.ner.iob2"), tokenizer=tokenizer)
    assert reader.class_names == ["O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-PER"]
    assert entities(s[0].tags) == {("PER", 0, 1), ("LOC", 3, 4)}
    # conlleval / seqeval default: an I- after O or after another type starts an entity
    assert entities(["O", "I-PER", "I-PER", "B-LOC", "I-ORG"]) == {("PER", 1, 2), ("LOC", 3, 3), ("ORG", 4, 4)}


def test_iob2_bad_tag(tmp_path):
    path = tmp_path / "bad.iob2"
    path.write_text("1\tJohn\tPER\n")
    with pytest.raises(DataError, match="line 1: tag 'PER'"):
        read_iob2(str(path))


def test_masked_lm_statistics(tokenizer):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, tokenizer.vocab_size, 200000)
    ids[::50] = tokenizer.sep_id
    corrupted, labels = mask_pieces(ids, rng, tokenizer.special_ids, tokenizer.mask_id, tokenizer.vocab_size)
    chosen = labels >= 0
    maskable = ~np.isin(ids, list(tokenizer.special_ids))
    assert chosen.sum() == round(0.15 * maskable.sum()) and not chosen[ids == tokenizer.sep_id].any()
    assert (labels[chosen] == ids[chosen]).all() and (corrupted[~chosen] == ids[~chosen]).all()
    masked = (corrupted[chosen] == tokenizer.mask_id).mean()
    kept = (corrupted[chosen] == ids[chosen]).mean()
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(1 - masked - kept - 0.1) < 0.01


def test_masked_lm_reader_is_fixed_per_epoch_and_new_across_epochs(tokenizer):
    reader = MaskedLmReader({"type": "conllu", "path": TINY, "target": "upos"}, tokenizer=tokenizer)
    a, b, c = reader[(2, 0)], reader[(2, 0)], reader[(2, 1)]
    assert (a["token_ids"] == b["token_ids"]).all() and (a["mlm_labels"] == b["mlm_labels"]).all()
    assert (a["mlm_labels"] >= 0).sum() >= 1 and reader.lengths().tolist() == [7, 8, 11][:0] + \
        [len(reader.inner[i]["token_ids"]) for i in range(3)]
    assert reader.epoch_aware and not ((a["mlm_labels"] == c["mlm_labels"]).all() and
                                       (a["token_ids"] == c["token_ids"]).all() and
                                       (reader[(1, 0)]["mlm_labels"] == reader[(1, 1)]["mlm_labels"]).all())


def test_squad_windows_against_hand_computed_spans(word_tokenizer):
    path = os.path.join(TEXT, "tiny_squad.json")
    reader = SquadReader(path, tokenizer=word_tokenizer, max_length=16, doc_stride=4, max_query_length=8)
    # q1: question 6 pieces -> window of 16 - 6 - 3 = 7 context pieces, every 4: starts 0, 4, 8, 12, 16
    q1 = [s for s in reader._samples if s["example_index"] == 0]
    assert len(q1) == 5
    head = 1 + 6 + 1  # [CLS] question [SEP]
    # "on the mat" = context pieces 3..5: wholly inside window 0 only (window 1 covers pieces 4..10)
    assert (int(q1[0]["start"]), int(q1[0]["end"])) == (head + 3, head + 5)
    assert all((int(s["start"]), int(s["end"])) == (0, 0) for s in q1[1:])
    vocab = word_tokenizer.vocabulary()
    assert [vocab[i] for i in q1[1]["token_ids"][head:head + 7]] == "the mat . the dog ran to".split()
    assert q1[0]["piece_chars"][head + 3].tolist() == [12, 14] and q1[0]["piece_chars"][0].tolist() == [-1, -1]
    assert q1[0]["context_mask"].sum() == 7 and q1[0]["segment_ids"][head:].min() == 1
    # q2: "over the tree" = context pieces 17..19 (of 21): in the window starting at 16 (16..20) only
    q2 = [s for s in reader._samples if s["example_index"] == 1]
    inside = [(w, int(s["start"]), int(s["end"])) for w, s in enumerate(q2) if s["start"] > 0]
    assert inside == [(4, head + 1, head + 3)]
    assert reader.example_answers(1) == ["over the tree", "the tree"]


def test_squad_file_errors(tmp_path, word_tokenizer):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "a dog", "qas": [
        {"id": "x", "question": "who", "answers": [{"text": "dog", "answer_start": 0}]}]}]}]}))
    with pytest.raises(DataError, match="question 'x': answer 'dog' is not at character 0"):
        SquadReader(str(path), tokenizer=word_tokenizer)


def test_tsv_classification_and_matching(tmp_path, tokenizer):
    path = tmp_path / "pairs.tsv"
    path.write_text("text_a\ttext_b\tlabel\nthe cat sat\ton the mat\t1\na dog\tran away\t0\n")
    cls = TextClassificationReader(str(path), pair=True, tokenizer=tokenizer)
    s = cls[0]
    assert s["token_ids"][0] == tokenizer.cls_id and (s["token_ids"] == tokenizer.sep_id).sum() == 2
    assert s["segment_ids"].tolist() == [0] * (s["segment_ids"].tolist().index(1)) + [1] * \
        (len(s["segment_ids"]) - s["segment_ids"].tolist().index(1))
    assert cls.class_names == ["0", "1"] and cls.labels().tolist() == [1, 0]
    with pytest.raises(DataError, match="more than max_length 5"):
        TextClassificationReader(str(path), pair=True, tokenizer=tokenizer, max_length=5)
    cut = TextClassificationReader(str(path), pair=True, tokenizer=tokenizer, max_length=6, too_long="truncate")
    assert all(len(x["token_ids"]) <= 6 for x in cut._samples)
    ranked = tmp_path / "ranked.tsv"
    ranked.write_text("text_a\ttext_b\ttext_c\nthe cat\tsat on the mat\tflew\n")
    pairwise = MatchingReader(str(ranked), mode="pairwise", tokenizer=tokenizer)
    assert pairwise[0]["token_ids"].shape[0] == 2 and pairwise.fields()[0].shape == (2, None)
    assert pairwise[0]["token_ids"][1, -1] == tokenizer.pad_id  # the shorter text of the group is padded
    with pytest.raises(DataError, match="no column 'text_c'"):
        MatchingReader(str(path), mode="pairwise", tokenizer=tokenizer)


def test_padding_and_buckets():
    batch = collate_padded([{"a": np.array([1, 2, 3])}, {"a": np.array([4])}],
                           {"a": type("F", (), {"pad": -1})()})
    assert batch["a"].tolist() == [[1, 2, 3], [4, -1, -1]]
    with pytest.raises(DataError, match="must declare the value it is padded with"):
        pad_stack([np.zeros(2), np.zeros(3)], None, "x")
    lengths = np.random.RandomState(0).randint(1, 60, 500)
    order = BucketedOrder(SampleOrder(500, 3), lengths, rows=10, batches=5, job_seed=1)
    first = order.indices(0, 1000)
    assert sorted(first[:500].tolist()) == list(range(500)) or len(set(first[:500])) > 400
    spread = [np.ptp(lengths[first[k:k + 10]]) for k in range(0, 1000, 10)]
    plain = [np.ptp(lengths[SampleOrder(500, 3).indices(k, 10)]) for k in range(0, 1000, 10)]
    assert np.mean(spread) < 0.3 * np.mean(plain)  # a step's samples have similar lengths
    again = BucketedOrder(SampleOrder(500, 3), lengths, rows=10, batches=5, job_seed=1)
    assert (again.indices(370, 30) == first[370:400]).all()  # a pure function of the position (resume)
    other_task = BucketedOrder(SampleOrder(500, 9), lengths, rows=20, batches=5, job_seed=1)
    ranks = [np.argsort(np.argsort(lengths))[first[k * 10:(k + 1) * 10]].mean() for k in range(20)]
    ranks_other = [np.argsort(np.argsort(lengths))[other_task.indices(k * 20, 20)].mean() for k in range(20)]
    assert np.corrcoef(ranks, ranks_other)[0, 1] > 0.8  # tasks read the same length quantile at a step
