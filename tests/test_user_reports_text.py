"""What text users hit after the README (issue 53, items 2, 6, 7, 8, 9, 10 and 22), each reproduced first and
checked against an independent reference: a hand-written CoNLL-2003 file, predictions computed again from the head's
own logits (a brute-force Viterbi over every tag path, argmax), hand-counted metrics."""
import importlib.util
import json
import os
import re

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


# --- item 7: the bert backbone reads the checkpoint's own config --------------------------------------------------

BERT_FIXTURE = os.path.join(HERE, "fixtures", "bert_tiny")
# the sizes tests/references/make_bert_fixture.py gave transformers' BertConfig and ErnieConfig, as they save them
HF_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 100, "hidden_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
             "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
             "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "pad_token_id": 0,
             "position_embedding_type": "absolute"}


def _checkpoint(folder, weights, config_name, config):
    """A checkpoint folder: the fixture's weights and vocabulary, and ``config`` written as ``config_name``."""
    folder.mkdir()
    for name in (weights, "vocab.txt"):
        os.symlink(os.path.join(BERT_FIXTURE, name), folder / name)
    (folder / config_name).write_text(json.dumps(config))
    return str(folder / weights)


def _outputs(model):
    data = np.load(os.path.join(BERT_FIXTURE, "outputs.npz"))
    model.eval()
    with paddle.no_grad():
        out = model({"token_ids": paddle.to_tensor(data["token_ids"]),
                     "segment_ids": paddle.to_tensor(data["segment_ids"])})
    return data, data["attention_mask"].astype(bool), out["sequence"].numpy(), out["pooled"].numpy()


def test_bert_sizes_come_from_the_hugging_face_config_beside_the_weights(tmp_path):
    """No size in the job: the encoder built from config.json gives transformers' BertModel outputs (the fixture's
    reference); before, it was BERT-base's 768 x 12 and the weights did not fit."""
    from mtl.backbones.bert import Bert

    weights = _checkpoint(tmp_path / "ckpt", "model.safetensors", "config.json", HF_CONFIG)
    model = Bert(tokenizer=str(tmp_path / "ckpt" / "vocab.txt"), weights=weights)
    data, real, sequence, pooled = _outputs(model)
    np.testing.assert_allclose(sequence[real], data["bert_sequence"][real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(pooled, data["bert_pooled"], atol=1e-5, rtol=0)
    assert model.origins["num_layers"] == "config.json's num_hidden_layers"
    assert model.origins["num_heads"] == "config.json's num_attention_heads"


def test_ernie_sizes_and_task_embedding_come_from_paddlenlp_model_config(tmp_path):
    """PaddleNLP's older model_config.json nests the sizes in init_args; ERNIE 3.0's task embedding comes from
    use_task_id, task_type_vocab_size and task_id; the outputs are transformers' ErnieModel's."""
    from mtl.backbones.bert import Bert

    data = np.load(os.path.join(BERT_FIXTURE, "outputs.npz"))
    sizes = {k: v for k, v in HF_CONFIG.items() if k not in ("architectures", "model_type")}
    config = {"init_args": [dict(sizes, use_task_id=True, task_type_vocab_size=3, task_id=int(data["task_id"]))],
              "init_class": "ErnieModel"}
    weights = _checkpoint(tmp_path / "ernie", "ernie.pdparams", "model_config.json", config)
    model = Bert(tokenizer=str(tmp_path / "ernie" / "vocab.txt"), weights=weights)
    data, real, sequence, pooled = _outputs(model)
    np.testing.assert_allclose(sequence[real], data["ernie_sequence"][real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(pooled, data["ernie_pooled"], atol=1e-5, rtol=0)


def test_a_size_that_disagrees_with_the_checkpoint_config_names_both(tmp_path):
    from mtl.backbones.bert import Bert

    weights = _checkpoint(tmp_path / "ckpt", "model.safetensors", "config.json", HF_CONFIG)
    with pytest.raises(ConfigError, match="num_layers 3 disagrees with the checkpoint's config.json's "
                                          r"num_hidden_layers \(2\)") as caught:
        Bert(tokenizer=str(tmp_path / "ckpt" / "vocab.txt"), weights=weights, num_layers=3)
    assert caught.value.key == "num_layers"


def test_a_shape_mismatch_names_the_option_and_where_its_value_came_from(tmp_path):
    """A config.json that says intermediate_size 48 beside weights of 64: the error names the option, the value the
    weights need and the config key that gave the wrong one."""
    from mtl.backbones.bert import Bert

    weights = _checkpoint(tmp_path / "ckpt", "model.safetensors", "config.json", dict(HF_CONFIG, intermediate_size=48))
    with pytest.raises(ConfigError) as caught:
        Bert(tokenizer=str(tmp_path / "ckpt" / "vocab.txt"), weights=weights)
    message = str(caught.value)
    assert re.search(r"'layers\.0\.intermediate\.(bias|weight)' has shape \[(32, )?64\], this encoder expects "
                     r"\[(32, )?48\]", message), message
    assert "set backbone.intermediate_size: 64 (48 here, from config.json's intermediate_size" in message
    # without any config BERT-base's defaults (12 layers) are named as the source
    with pytest.raises(ConfigError, match=r"hold 2 encoder layer\(s\), this encoder has 12: set "
                                          r"backbone.num_layers: 2 \(12 here, from the default\)"):
        Bert(tokenizer=os.path.join(BERT_FIXTURE, "vocab.txt"), weights=os.path.join(BERT_FIXTURE, "model.safetensors"))


@pytest.mark.parametrize("name, expected", [("random.safetensors", "is not a safetensors file"),
                                            ("random.dat", "neither a safetensors file, a torch zip file nor"),
                                            ("random.bin", "is not a zip-format torch file")])
def test_a_random_file_is_said_not_to_be_weights(tmp_path, name, expected):
    from mtl.convert.bert import read_checkpoint

    path = tmp_path / name
    path.write_bytes(np.random.default_rng(0).bytes(3000))
    with pytest.raises(DataError, match=expected):
        read_checkpoint(str(path))


def test_a_safetensors_file_under_another_name_is_read_as_one(tmp_path):
    from mtl.convert.bert import read_checkpoint
    from mtl.convert.safetensors_file import read_safetensors

    os.symlink(os.path.join(BERT_FIXTURE, "model.safetensors"), tmp_path / "weights.bin")
    got, expected = read_checkpoint(str(tmp_path / "weights.bin")), read_safetensors(os.path.join(
        BERT_FIXTURE, "model.safetensors"))
    assert sorted(got) == sorted(expected)


def test_the_example_config_takes_its_sizes_from_the_bundled_checkpoint_folder():
    from mtl.backbones.base import build_backbone
    from mtl.config.loading import load_job

    job = load_job(os.path.join(ROOT, "examples", "configs", "bert_classify.yaml"))
    assert not {"hidden_size", "num_layers", "num_heads"} & set(job["backbone"])
    backbone = build_backbone(job["backbone"], job["source"])
    with open(os.path.join(ROOT, "examples", "data", "text", "bert_tiny", "config.json")) as f:
        config = json.load(f)
    assert backbone.feature_size == config["hidden_size"] and len(backbone.layers) == config["num_hidden_layers"]
    assert backbone.layers[0].heads == config["num_attention_heads"]


def test_a_bert_run_reads_back_without_the_checkpoint_files(tmp_path):
    """The run keeps the sizes it trained with (encoder.json): read back, the encoder needs neither the weights nor
    their config (both may be gone), and has the same shapes."""
    from mtl.backbones.bert import Bert

    weights = _checkpoint(tmp_path / "ckpt", "model.safetensors", "config.json", HF_CONFIG)
    model = Bert(tokenizer=str(tmp_path / "ckpt" / "vocab.txt"), weights=weights)
    run = tmp_path / "run"
    run.mkdir()
    model.save_assets(str(run))
    config = Bert.run_config({"tokenizer": str(tmp_path / "ckpt" / "vocab.txt"), "weights": weights}, str(run))
    assert "weights" not in config and config["hidden_size"] == 32 and config["num_layers"] == 2
    again = Bert(**config)
    assert {k: tuple(v.shape) for k, v in again.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in model.state_dict().items()}
