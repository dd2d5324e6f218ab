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

from mtl.core.errors import ConfigError, DataError
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
    from mtl.core import registry

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

    from mtl.core import registry
    from mtl.serving.export import fields_adapter

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


# --- item 6: every text head predicts with mtl predict --------------------------------------------------------------

TEXT = os.path.join(HERE, "fixtures", "text")
WORD_TASKS = {  # task -> (reader, head config)
    "upos": (lambda tok: __import__("mtl.readers.conllu_reader", fromlist=["x"]).ConlluReader(
        os.path.join(TEXT, "tiny.conllu"), "upos", tokenizer=tok), {"type": "tagger", "dropout": 0.0}),
    "deps": (lambda tok: __import__("mtl.readers.conllu_reader", fromlist=["x"]).ConlluReader(
        os.path.join(TEXT, "tiny.conllu"), "tree", tokenizer=tok),
        {"type": "biaffine", "arc_size": 6, "relation_size": 5, "dropout": 0.0}),
    "ner": (lambda tok: Iob2Reader(os.path.join(TEXT, "tiny.ner.iob2"), tokenizer=tok),
            {"type": "crf_tagger", "dropout": 0.0}),
    "genre": (lambda tok: __import__("mtl.readers.conllu_reader", fromlist=["x"]).ConlluReader(
        os.path.join(TEXT, "tiny.conllu"), {"comment": "sent_id", "pattern": "^([a-z]+)-"}, tokenizer=tok),
        {"type": "text_classify", "dropout": 0.0}),
    "pairs": (lambda tok: __import__("mtl.readers.text_pairs", fromlist=["x"]).MatchingReader(
        os.path.join(TEXT, "ewt_pairs.tsv"), mode="pairwise", tokenizer=tok), {"type": "matching", "mode": "pairwise"}),
    "squad": (lambda tok: __import__("mtl.readers.squad_reader", fromlist=["x"]).SquadReader(
        os.path.join(TEXT, "tiny_squad.json"), tokenizer=tok, max_length=24, doc_stride=6, max_query_length=8),
        {"type": "span", "max_answer_length": 6}),
}


@pytest.fixture(scope="module")
def random_model():
    """What a run gives mtl predict, with random weights: a small BiLSTM, one head per text head type (the CRF's
    transitions drawn too), the readers' input specs and label names as a run records them in data.json."""
    from mtl.core import registry
    from mtl.serving.inference import LoadedModel, PredictionModel

    registry.load_builtin()
    paddle.seed(3)
    backbone = registry.build("backbone", {"type": "text_bilstm", "tokenizer": EWT_TOKENIZER, "embedding_size": 16,
                                           "hidden_size": 8, "num_layers": 1, "dropout": 0.0,
                                           "embedding_dropout": 0.0}, "<test>", "backbone")
    backbone.eval()
    tok = backbone.tokenizer
    readers = {name: make(tok) for name, (make, _) in WORD_TASKS.items()}
    configs = {name: cfg for name, (_, cfg) in WORD_TASKS.items()}
    states = {}
    for name, cfg in configs.items():
        sizes = {k: v for k, v in readers[name].sizes().items() if v is not None and k == "num_classes"}
        head = registry.build("head", cfg, "<test>", name, feature_size=backbone.feature_size, **sizes)
        state = {k: v.numpy() for k, v in head.state_dict().items()}
        rng = np.random.default_rng(7)
        for key in ("transitions", "start", "end", "arc_weight", "rel_weight"):
            if key in state:  # zeros at construction: drawn, so that the CRF's path and the tree are not trivial
                state[key] = rng.normal(0, 1.0, state[key].shape).astype("float32")
        states[name] = state
    data = {"inputs": {n: r.input_spec() for n, r in readers.items()},
            "label_names": {n: r.label_names() for n, r in readers.items() if r.label_names()}}
    loaded = LoadedModel(backbone, "token_ids", [None], 0, "random weights")
    return PredictionModel(loaded, configs, data, lambda task: states[task]), states, readers


def _sequence(backbone, words):
    """The encoder's sequence [T, D] and pooled [D] of one sentence, and each word's first piece (numpy)."""
    tok = backbone.tokenizer
    pieces, starts = tok.encode_words(words)
    ids = np.concatenate([[tok.cls_id], pieces, [tok.sep_id]]).astype(np.int64)
    with paddle.no_grad():
        out = backbone({"token_ids": paddle.to_tensor(ids[None]), "segment_ids": paddle.zeros([1, len(ids)], "int64")})
    return out["sequence"].numpy()[0].astype(np.float64), out["pooled"].numpy()[0].astype(np.float64), starts + 1


def _leaky_mlp(x, state, prefix):
    """``Linear -> LeakyReLU(0.01) -> Linear`` of a head's MLP (dropout off), in numpy."""
    h = x @ state[f"{prefix}.0.weight"] + state[f"{prefix}.0.bias"]
    h = np.where(h > 0, h, 0.01 * h)
    return h @ state[f"{prefix}.3.weight"] + state[f"{prefix}.3.bias"]


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _best_tree(logp):
    """Brute force: every head assignment of n words (heads 0..n, not itself) that is a tree with one root child;
    the one of the highest summed log-probability."""
    import itertools

    n = logp.shape[0] - 1
    best, best_score = None, -np.inf
    for heads in itertools.product(range(n + 1), repeat=n):
        if any(h == d for d, h in enumerate(heads, start=1)) or sum(h == 0 for h in heads) != 1:
            continue
        reaches_root = True
        for d in range(1, n + 1):
            seen, node = set(), d
            while node != 0 and node not in seen:
                seen.add(node)
                node = heads[node - 1]
            reaches_root &= node == 0
        score = sum(logp[d, h] for d, h in enumerate(heads, start=1))
        if reaches_root and score > best_score:
            best, best_score = heads, score
    return list(best)


def _best_path(emissions, transitions, start, end):
    """Brute force: the tag path of the highest CRF score over every path."""
    import itertools

    best, best_score = None, -np.inf
    for path in itertools.product(range(emissions.shape[1]), repeat=len(emissions)):
        score = start[path[0]] + end[path[-1]] + sum(emissions[t, y] for t, y in enumerate(path)) + \
            sum(transitions[a, b] for a, b in zip(path, path[1:]))
        if score > best_score:
            best, best_score = list(path), score
    return best


def _conllu_sentences(text):
    """[(comments {key: value}, word rows [10 cells])] of a CoNLL-U text."""
    out = []
    for block in text.strip().split("\n\n"):
        comments = dict(line[1:].strip().split(" = ", 1) for line in block.splitlines() if line.startswith("#"))
        rows = [line.split("\t") for line in block.splitlines() if line and line.split("\t")[0].isdigit()]
        out.append((comments, rows))
    return out


def test_raw_text_predictions_of_every_word_head_against_their_own_logits(random_model, tmp_path):
    """Raw text in, CoNLL-U out: UPOS = the argmax of the tagger's logits (numpy), NER = the best CRF path over every
    path, HEAD/DEPREL = the best single-root tree over every head assignment and the best relation at its head, the
    genre comment = the argmax of the classifier's softmax, with its probability. Before: mtl predict refused
    text_classify and crf_tagger."""
    from mtl.serving.prediction_text import predict_text

    model, states, readers = random_model
    lines = ["Sue likes green tea .", "Mary ran home"]
    (tmp_path / "new.txt").write_text("\n".join(lines) + "\n\n")
    out, report = tmp_path / "new.conllu", tmp_path / "new.json"
    records = predict_text(model, "<random>", [str(tmp_path / "new.txt")], output=str(out), json_path=str(report))
    sentences = _conllu_sentences(out.read_text())
    backbone = model.loaded.model
    names = model.data["label_names"]
    for (comments, rows), line in zip(sentences, lines):
        words = line.split()
        assert [r[1] for r in rows] == words and comments["text"] == line
        sequence, pooled, starts = _sequence(backbone, words)
        x = sequence[starts]
        upos = x @ states["upos"]["scorer.0.weight"] + states["upos"]["scorer.0.bias"]
        assert [r[3] for r in rows] == [names["upos"]["tags"][k] for k in upos.argmax(axis=1)]
        ner = states["ner"]
        path = _best_path(x @ ner["scorer.0.weight"] + ner["scorer.0.bias"], ner["transitions"], ner["start"],
                          ner["end"])
        assert [r[9] for r in rows] == [f"ner={names['ner']['tags'][k]}" for k in path]
        deps = states["deps"]
        nodes = np.concatenate([sequence[:1], x])
        dep = np.concatenate([_leaky_mlp(nodes, deps, "arc_dep"), np.ones((len(nodes), 1))], axis=1)
        scores = dep @ deps["arc_weight"] @ _leaky_mlp(nodes, deps, "arc_head").T
        np.fill_diagonal(scores, -1e9)
        heads = _best_tree(_log_softmax(scores))
        assert [int(r[6]) for r in rows] == heads
        rel_dep = np.concatenate([_leaky_mlp(nodes[1:], deps, "rel_dep"), np.ones((len(words), 1))], axis=1)
        rel_head = np.concatenate([_leaky_mlp(nodes, deps, "rel_head")[heads], np.ones((len(words), 1))], axis=1)
        product = (rel_dep @ deps["rel_weight"]).reshape(len(words), -1, rel_dep.shape[1])
        relations = (product * rel_head[:, None, :]).sum(axis=-1).argmax(axis=1)
        assert [r[7] for r in rows] == [names["deps"]["relations"][k] for k in relations]
        genre = pooled @ states["genre"]["scorer.0.weight"] + states["genre"]["scorer.0.bias"]
        p = np.exp(genre - genre.max()) / np.exp(genre - genre.max()).sum()
        assert comments["genre"] == names["genre"]["label"][p.argmax()]
        assert comments["genre_probability"] == f"{p.max():.4f}"
    genre = json.loads(report.read_text())[0]["tasks"]["genre"][0]
    assert genre["probability"] == pytest.approx(max(genre["probabilities"]), abs=1e-12)
    assert records[0]["written_as"] == "conllu" and set(records[0]["tasks"]) == {"upos", "deps", "ner", "genre"}


def test_iob2_and_conllu_inputs_come_back_with_their_own_lines(random_model, tmp_path):
    """An IOB2 input keeps its lines and -DOCSTART-; the IOB2 task's tags replace the tag column; a CoNLL-U input
    keeps multiword tokens, empty nodes and every column no task fills."""
    from mtl.serving.prediction_text import predict_text

    model, _, _ = random_model
    iob2 = tmp_path / "new.iob2"
    iob2.write_text("-DOCSTART-\tO\n\n# sent_id = s1\n1\tJohn\tO\n2\tran\tO\n\n1\tMary\tO\n")
    records = predict_text(model, "<random>", [str(iob2)], task="ner", output=str(tmp_path / "out.iob2"))
    written = (tmp_path / "out.iob2").read_text().splitlines()
    tags = [entry["tags"] for entry in records[0]["tasks"]["ner"]]
    assert written == ["-DOCSTART-\tO", "", "# sent_id = s1", f"1\tJohn\t{tags[0][0]}", f"2\tran\t{tags[0][1]}", "",
                       f"1\tMary\t{tags[1][0]}"]
    source = os.path.join(TEXT, "tiny.conllu")
    predict_text(model, "<random>", [source], task="upos", output=str(tmp_path / "out.conllu"))
    before = [line.split("\t") for line in open(source).read().splitlines()]
    after = [line.split("\t") for line in (tmp_path / "out.conllu").read_text().splitlines()]
    assert len(before) == len(after)
    for old, new in zip(before, after):
        if len(old) == 10 and old[0].isdigit():  # a syntactic word: only UPOS changed
            assert old[:3] + old[4:] == new[:3] + new[4:] and new[3] in model.data["label_names"]["upos"]["tags"]
        else:  # comments, multiword tokens, empty nodes, blank lines
            assert old == new


def test_pairs_and_spans_against_their_own_logits(random_model, tmp_path):
    """A TSV of pairs gets each pair's score (the matching head's MLP on the pooled vector, numpy); a SQuAD file gets
    each question's best span over all its windows (start + end logits, numpy, every span of at most
    max_answer_length pieces), written as SQuAD's prediction file."""
    from mtl.serving.prediction_text import predict_text
    from mtl.text.pairs import encode_pair

    model, states, readers = random_model
    backbone = model.loaded.model
    tsv = tmp_path / "pairs.tsv"
    rows = [("the cat sat", "on the mat"), ("a dog ran", "to the park")]
    tsv.write_text("text_a\ttext_b\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
    predict_text(model, "<random>", [str(tsv)], task="pairs", output=str(tmp_path / "scored.tsv"))
    scored = [line.split("\t") for line in (tmp_path / "scored.tsv").read_text().splitlines()]
    assert scored[0] == ["text_a", "text_b", "pairs"]
    for (a, b), row in zip(rows, scored[1:]):
        ids, segments = encode_pair(backbone.tokenizer, a, b, 256, "error", "")
        with paddle.no_grad():
            pooled = backbone({"token_ids": paddle.to_tensor(ids[None]),
                               "segment_ids": paddle.to_tensor(segments[None])})["pooled"].numpy()[0]
        score = pooled @ states["pairs"]["scorer.0.weight"] + states["pairs"]["scorer.0.bias"]
        assert row[:2] == [a, b] and row[2] == f"{float(score[0]):.4f}"
    squad = os.path.join(TEXT, "tiny_squad.json")
    predict_text(model, "<random>", [squad], output=str(tmp_path / "answers.json"))
    answers = json.loads((tmp_path / "answers.json").read_text())
    reader = readers["squad"]
    best = {}
    for sample in reader:
        with paddle.no_grad():
            seq = backbone({"token_ids": paddle.to_tensor(sample["token_ids"][None]),
                            "segment_ids": paddle.to_tensor(sample["segment_ids"][None])})["sequence"].numpy()[0]
        logits = seq @ states["squad"]["linear.weight"] + states["squad"]["linear.bias"]
        allowed = np.flatnonzero(sample["context_mask"])
        for i in allowed:
            for j in allowed[(allowed >= i) & (allowed < i + 6)]:
                q, score = int(sample["example_index"]), logits[i, 0] + logits[j, 1]
                if q not in best or score > best[q][0]:
                    best[q] = (score, sample["piece_chars"][i, 0], sample["piece_chars"][j, 1])
    expected = {question.qid: question.context[best[k][1]:best[k][2]] for k, question in enumerate(reader.questions)}
    assert answers == expected


def test_text_prediction_errors_are_one_sentence(random_model, tmp_path):
    from mtl.serving.prediction_text import predict_text

    model, _, _ = random_model
    with pytest.raises(ConfigError, match="task 'pairs' reads pairs of texts .text_a, text_b., which a conllu input "
                                          "does not hold; give tsv"):
        predict_text(model, "<random>", [os.path.join(TEXT, "tiny.conllu")], task="pairs")
    long = tmp_path / "long.txt"
    long.write_text(" ".join(["word"] * 300) + "\n")
    with pytest.raises(DataError, match="sentence 1 has 302 pieces with .CLS. and .SEP., more than the 256 task "
                                        "'deps' reads .* a tree cannot be cut"):
        predict_text(model, "<random>", [str(long)], task="deps")
    with pytest.raises(ConfigError, match="several text inputs need -o FOLDER"):
        predict_text(model, "<random>", [str(long), str(long)], task="upos")
    # a sentence of tags is cut between words and every word gets a tag
    records = predict_text(model, "<random>", [str(long)], task="upos", output=str(tmp_path / "long.conllu"))
    assert len(records[0]["tasks"]["upos"][0]["tags"]) == 300


@pytest.mark.slow
def test_mtl_predict_of_a_trained_text_run_scores_as_its_evaluation_did(tmp_path, capsys):
    """The issue's command on a run of every text head: ``mtl predict RUN dev.conllu`` (and the IOB2 dev file) fills
    UPOS, HEAD/DEPREL, the genre comment and the NER tags; scored against the gold files with the metrics' own
    functions, the filled files give the figures the run's final evaluation gave (another path: the reader's
    samples, length-sorted batches)."""
    from mtl.text.iob2 import read_iob2
    from mtl.text.metrics import attachment_scores, entity_scores
    from tests.cli_run import cli
    from tests.shared_runs import train_here

    run = tmp_path / "run"
    summary = train_here(os.path.join(ROOT, "tests", "dist_scripts", "text_job.yaml"), "--set", f"output_dir={run}",
                         "schedule.steps=24", "averaging.type=none")
    scores = {task: info["eval"] for task, info in summary["tasks"].items()}
    gold_conllu, gold_ner = os.path.join(TEXT, "ewt_sample.conllu"), os.path.join(TEXT, "ewt_sample.ner.iob2")
    code, err = cli(["predict", run, gold_conllu, "-o", tmp_path / "dev.conllu", "--json", tmp_path / "dev.json"],
                    capsys)
    assert code == 0, err
    gold = _conllu_sentences(open(gold_conllu).read())
    predicted = _conllu_sentences((tmp_path / "dev.conllu").read_text())
    gold_rows = [r for _, rows in gold for r in rows if "." not in r[0]]
    rows = [r for _, rs in predicted for r in rs if "." not in r[0]]
    assert np.mean([g[3] == p[3] for g, p in zip(gold_rows, rows)]) == pytest.approx(scores["upos"]["accuracy"])
    las = attachment_scores([np.array([int(r[6]) for r in rs if "." not in r[0]]) for _, rs in gold],
                            [[r[7] for r in rs if "." not in r[0]] for _, rs in gold],
                            [np.array([int(r[6]) for r in rs if "." not in r[0]]) for _, rs in predicted],
                            [[r[7] for r in rs if "." not in r[0]] for _, rs in predicted])
    assert las["las"] == pytest.approx(scores["deps"]["las"]) and las["uas"] == pytest.approx(scores["deps"]["uas"])
    genres = [re.match("([a-z]+)-", c["sent_id"]).group(1) == p["genre"] for (c, _), (p, _) in zip(gold, predicted)]
    assert np.mean(genres) == pytest.approx(scores["genre"]["accuracy"])
    code, err = cli(["predict", run, gold_ner, "--task", "ner", "-o", tmp_path / "dev.iob2"], capsys)
    assert code == 0, err
    f1 = entity_scores([s.tags for s in read_iob2(gold_ner)], [s.tags for s in read_iob2(str(tmp_path / "dev.iob2"))])
    assert f1["f1"] == pytest.approx(scores["ner"]["f1"])
