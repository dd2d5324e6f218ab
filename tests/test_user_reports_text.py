"""What text users hit after the README (issue 53, items 2, 6, 7, 8, 9, 10 and 22), each reproduced first and
checked against an independent reference: a hand-written CoNLL-2003 file, predictions computed again from the head's
own logits (a brute-force Viterbi over every tag path, argmax), hand-counted metrics."""
import importlib.util
import json
import os

import numpy as np
import paddle
import pytest

from mtl.errors import ConfigError, DataError
from mtl.readers.iob2_reader import Iob2Reader
from mtl.text.iob2 import read_iob2
from mtl.text.tokenizer import TextTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(HERE, "fixtures", "text_reports")
CONLL2003 = os.path.join(FIXTURES, "conll2003_sample.txt")
# conll2003_sample.txt read by hand: 3 sentences (2 documents), word column 0, NER column 3
CONLL2003_WORDS = [["Anna", "Berg", "visited", "Oslo", "today", "."], ["Nordic", "Bank", "opened", "."],
                   ["Paris", "won", "."]]
CONLL2003_TAGS = [["B-PER", "I-PER", "O", "B-LOC", "O", "O"], ["B-ORG", "I-ORG", "O", "O"], ["B-LOC", "O", "O"]]
WORDS = sorted({w for s in CONLL2003_WORDS for w in s})


@pytest.fixture(scope="module")
def word_tokenizer():
    """One piece per word of the hand-written files."""
    return TextTokenizer.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)


# --- item 2: CoNLL-2003 read from the right columns --------------------------------------------------------------

def test_conll2003_format_reads_words_and_ner_tags_and_drops_document_markers(word_tokenizer):
    sentences = read_iob2(CONLL2003, format="conll2003")
    assert [s.words for s in sentences] == CONLL2003_WORDS
    assert [s.tags for s in sentences] == CONLL2003_TAGS
    reader = Iob2Reader(CONLL2003, tokenizer=word_tokenizer, format="conll2003")
    assert len(reader) == 3
    assert reader.class_names == ["O", "B-LOC", "B-ORG", "B-PER", "I-ORG", "I-PER"]
    for sample, words, tags in zip(reader, CONLL2003_WORDS, CONLL2003_TAGS):
        assert list(sample["tags"]) == [reader.class_names.index(t) for t in tags]
        # one piece per word: [CLS] w1 ... wn [SEP], and each word's own piece id
        assert list(sample["token_ids"][1:-1]) == [word_tokenizer.vocabulary().index(w) for w in words]


def test_the_iob2_default_on_a_conll2003_file_is_refused_naming_the_column_and_the_format():
    """The iob2 default (second-to-last cell) is CoNLL-2003's chunk column: the 'words' are B-NP, I-NP, O."""
    with pytest.raises(DataError) as caught:
        read_iob2(CONLL2003)
    message = str(caught.value)
    assert CONLL2003 in message and "column -2" in message and "format: conll2003" in message
    assert "13 of 13 words" in message  # the chunk column holds nothing but chunk tags


def test_document_markers_are_dropped_in_the_iob2_format_too(tmp_path):
    path = tmp_path / "two_columns.iob2"
    path.write_text("-DOCSTART-\tO\n\nJohn\tB-PER\nran\tO\n\n-DOCSTART-\tO\n\nMary\tB-PER\n")
    sentences = read_iob2(str(path))
    assert [s.words for s in sentences] == [["John", "ran"], ["Mary"]]


def test_an_unknown_format_is_refused_by_key():
    with pytest.raises(ConfigError, match="format must be one of iob2, conll2003"):
        read_iob2(CONLL2003, format="conll")


# --- item 8: one convention for metrics: fractions, said in the header ------------------------------------------

def test_text_heads_report_rates_as_fractions_like_the_image_heads():
    """Hand-counted: 3 of 4 words right, 1 of 2 sentences right; before, the text heads said 75.0 and 50.0."""
    from mtl import registry

    registry.load_builtin()
    tagger = registry.get("head", "tagger").cls(feature_size=4, num_classes=3)
    words = tagger.score([(np.array([0, 1, 2]), np.array([0, 1, 1])), (np.array([2]), np.array([2]))], None)
    assert words == {"accuracy": 0.75}
    classify = registry.get("head", "text_classify").cls(feature_size=4, num_classes=2)
    assert classify.score([(1, 1), (0, 1)], None) == {"accuracy": 0.5}
    image = registry.get("head", "softmax").cls(feature_size=4, num_classes=2)
    x, y = np.eye(4, dtype="float32")[:2], np.array([0, 1])
    assert 0.0 <= image.evaluate(paddle.to_tensor(x), paddle.to_tensor(y))["accuracy"] <= 1.0


def test_the_end_of_run_table_says_that_rates_are_fractions():
    from mtl.train.reporting import metrics_table

    table = metrics_table({"upos": {"head": "tagger", "eval": {"accuracy": 0.258}, "primary_metric": "accuracy",
                                    "higher_is_better": True},
                           "digits": {"head": "softmax", "eval": {"accuracy": 0.987}, "primary_metric": "accuracy",
                                      "higher_is_better": True}})
    assert "rates as fractions" in table.splitlines()[0]
    assert "0.2580" in table and "0.9870" in table


# --- item 9: make demo-text says that it is a smoke run, and shows no empty column ------------------------------

def _text_report():
    spec = importlib.util.spec_from_file_location("text_report", os.path.join(ROOT, "examples", "text_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_text_report_leaves_out_a_column_no_run_filled_and_says_percent():
    report = {"seeds": [0], "delta_m": [1.0], "tasks": {
        "upos": {"metric": "accuracy", "joint": [21.13], "alone": [20.0], "noaux": []},
        "deps": {"metric": "las", "joint": [4.38], "alone": [5.0], "noaux": []}}}
    table = _text_report().table(report)
    header = table.splitlines()[0]
    assert "without the auxiliary task" not in header and "metric (%)" in header
    rows = [line for line in table.splitlines() if line.startswith("| upos") or line.startswith("| deps")]
    assert all(" - |" not in row for row in rows), table
    assert "| upos | accuracy | 21.13 (one seed) | 20.00 (one seed) | 1.13 (one seed) |" in table
    full = dict(report, tasks={k: dict(v, noaux=[1.0]) for k, v in report["tasks"].items()})
    assert "without the auxiliary task" in _text_report().table(full)


def test_a_shortened_text_report_and_make_demo_text_say_it_is_a_smoke_run():
    note = _text_report().smoke_note(100, 4800)
    assert "100 of the recipe's 4800 steps" in note and "smoke run" in note and "docs/text.md" in note
    with open(os.path.join(ROOT, "Makefile")) as f:
        target = f.read().split("demo-text: ", 1)[1].split("\n\n", 1)[0]
    assert "smoke run" in target and "docs/text.md" in target


def test_the_text_report_refuses_a_run_that_holds_percentages(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"tasks": {"upos": {
        "eval": {"accuracy": 93.28}, "eval_averaged": None, "primary_metric": "accuracy"}}}))
    with pytest.raises(SystemExit, match="percentage"):
        _text_report().scores(str(tmp_path))
    (tmp_path / "summary.json").write_text(json.dumps({"tasks": {"upos": {
        "eval": {"accuracy": 0.9328}, "eval_averaged": None, "primary_metric": "accuracy"}}}))
    assert _text_report().scores(str(tmp_path)) == {"upos": ("accuracy", pytest.approx(93.28))}


# --- item 10: mtl tokenizer train reads the readers' formats -----------------------------------------------------

def test_tokenizer_train_reads_iob2_and_tsv_files_as_the_readers_do(tmp_path, capsys):
    from tests.cli_run import cli

    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("text_a\ttext_b\tlabel\nquiet harbour\tbright lantern\tzebrafinch\n")
    out = tmp_path / "tokenizer.json"
    code, err = cli(["tokenizer", "train", "--iob2", CONLL2003, "--iob2-format", "conll2003", "--tsv", tsv,
                     "--vocab-size", 400, "--min-frequency", 1, "-o", out], capsys)
    assert code == 0, err
    vocabulary = set(TextTokenizer.from_file(str(out)).vocabulary())
    # every word of the NER column's sentences and of the TSV's text columns is a piece of its own ...
    assert {w for s in CONLL2003_WORDS for w in s} | {"quiet", "harbour", "bright", "lantern"} <= vocabulary
    # ... and nothing of the other columns: POS tags, chunk tags, NER tags, document markers, the label
    assert not {"NNP", "VBD", "NP", "VP", "PER", "DOCSTART", "zebrafinch"} & vocabulary


def test_tokenizer_train_names_a_tsv_file_without_text_columns(tmp_path, capsys):
    from tests.cli_run import cli

    tsv = tmp_path / "table.tsv"
    tsv.write_text("sentence\tlabel\nsome words\t1\n")
    code, err = cli(["tokenizer", "train", "--tsv", tsv, "-o", tmp_path / "t.json"], capsys)
    assert code == 2 and f"TSV file '{tsv}' has none of the text columns text_a, text_b, text_c" in err, err
    assert "it names: sentence, label" in err


# --- item 22: no PIR 'place' warning when a text encoder is exported --------------------------------------------

BERT_VOCAB = os.path.join(HERE, "fixtures", "bert_tiny", "vocab.txt")
EWT_TOKENIZER = os.path.join(ROOT, "examples", "data", "text", "ewt_wordpiece_8k.json")


@pytest.mark.parametrize("config", [
    {"type": "text_bilstm", "tokenizer": EWT_TOKENIZER, "embedding_size": 8, "hidden_size": 8, "num_layers": 1,
     "char_size": 4, "pooling": "max"},
    {"type": "bert", "tokenizer": BERT_VOCAB, "hidden_size": 8, "num_layers": 1, "num_heads": 2,
     "intermediate_size": 16, "max_position": 32, "task_type_vocab_size": 3, "task_id": 2}])
def test_a_text_export_raises_no_pir_place_warning_and_computes_what_the_layer_does(tmp_path, config):
    """Every text layer that filled a tensor with ``full_like`` (masked max pooling, the character CNN, ERNIE's task
    embedding) warned under ``paddle.jit.to_static``; the saved program gives the dygraph layer's outputs."""
    import warnings

    from mtl import registry
    from mtl.export import fields_adapter

    registry.load_builtin()
    paddle.seed(0)
    backbone = registry.build("backbone", config, "<test>", "backbone")
    backbone.eval()
    model = fields_adapter(backbone)
    specs = [paddle.static.InputSpec([None, -1], "int64", name=n) for n in ("token_ids", "segment_ids")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paddle.jit.save(paddle.jit.to_static(model, input_spec=specs, full_graph=True), str(tmp_path / "m"))
    assert not [w for w in caught if "place" in str(w.message)], [str(w.message) for w in caught]
    ids = np.array([[2, 7, 9, 11, 3], [2, 8, 3, 0, 0]], np.int64)  # the second row padded with [PAD] (id 0)
    segments = np.zeros_like(ids)
    loaded = paddle.jit.load(str(tmp_path / "m"))
    with paddle.no_grad():
        expected = backbone({"token_ids": paddle.to_tensor(ids), "segment_ids": paddle.to_tensor(segments)})
    got = loaded(paddle.to_tensor(ids), paddle.to_tensor(segments))
    np.testing.assert_allclose(got.numpy(), expected["pooled"].numpy(), rtol=1e-5, atol=1e-6)


def test_masked_max_pooling_against_numpy():
    from mtl.backbones.text import masked_max

    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], bool)
    got = masked_max(paddle.to_tensor(values), paddle.to_tensor(mask)).numpy()
    expected = np.stack([values[b][mask[b]].max(axis=0) for b in range(3)])
    np.testing.assert_array_equal(got, expected)
