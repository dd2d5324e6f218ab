"""GloVe-initialised BiLSTM (issue 54 item 4) on planted word vectors (a folder of vectors.npy and words.txt, as
``mtl pretrained fetch glove`` writes): a word-level vocabulary of the vectors' words (lowercased, split at whitespace
only, so a treebank's ``n't`` and ``u.s.`` are found whole), each word's embedding row its vector, ``[PAD]`` zeros,
frozen or tuned; a run read back needs neither the vectors nor their width."""
import os

import numpy as np
import paddle
import pytest

from mtl.backbones.base import build_backbone
from mtl.core.errors import ConfigError

WORDS = ["the", ",", "n't", "u.s.", "cat", "café", "sat"]


@pytest.fixture
def vectors(tmp_path):
    folder = tmp_path / "vec"
    folder.mkdir()
    table = np.random.RandomState(1).randn(len(WORDS), 6).astype(np.float32)
    np.save(folder / "vectors.npy", table)
    (folder / "words.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return str(folder), table


def test_the_vocabulary_is_the_words_and_each_row_its_vector(vectors):
    folder, table = vectors
    model = build_backbone({"type": "text_bilstm", "pretrained": folder, "hidden_size": 4})
    tok = model.tokenizer
    assert tok.vocabulary() == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    ids, starts = tok.encode_words(["The", "cat", "n't", "U.S.", "Café", "dog", "sat", ","])
    expected = [5 + WORDS.index(w) if w in WORDS else tok.unk_id for w in
                ["the", "cat", "n't", "u.s.", "café", "dog", "sat", ","]]
    assert ids.tolist() == expected and starts.tolist() == list(range(8))
    weights = model.word_embeddings.weight.numpy()
    np.testing.assert_array_equal(weights[5:], table)
    np.testing.assert_array_equal(weights[tok.pad_id], np.zeros(6))
    assert model.embedding_size == 6 and model.vectors_found == len(WORDS)
    assert not model.word_embeddings.weight.stop_gradient


def test_max_words_keeps_the_first_words_and_a_wordpiece_vocabulary_finds_its_words(vectors):
    folder, table = vectors
    model = build_backbone({"type": "text_bilstm", "pretrained": folder, "max_words": 3, "hidden_size": 4})
    assert model.tokenizer.vocabulary()[5:] == WORDS[:3]
    bert_vocab = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bert_tiny", "vocab.txt")
    model = build_backbone({"type": "text_bilstm", "pretrained": folder, "tokenizer": bert_vocab, "hidden_size": 4})
    vocab = model.tokenizer.vocabulary()
    found = [w for w in WORDS if w in vocab]
    assert found == ["the", ",", "cat", "sat"] and model.vectors_found == 4
    for word in found:
        np.testing.assert_array_equal(model.word_embeddings.weight.numpy()[vocab.index(word)], table[WORDS.index(word)])


def test_frozen_vectors_do_not_move_and_tuned_ones_do(vectors):
    folder, table = vectors
    for freeze in (True, False):
        paddle.seed(0)
        model = build_backbone({"type": "text_bilstm", "pretrained": folder, "hidden_size": 4,
                                "freeze_vectors": freeze})
        opt = paddle.optimizer.SGD(0.5, parameters=[p for p in model.parameters() if not p.stop_gradient])
        ids = paddle.to_tensor([[2, 5, 9, 3]])
        model({"token_ids": ids, "segment_ids": paddle.zeros_like(ids)})["pooled"].sum().backward()
        opt.step()
        moved = not np.array_equal(model.word_embeddings.weight.numpy()[5:], table)
        assert moved is not freeze


def test_a_width_other_than_the_vectors_is_refused(vectors):
    with pytest.raises(ConfigError, match="embedding_size 128 differs from the width 6 of the word vectors"):
        build_backbone({"type": "text_bilstm", "pretrained": vectors[0], "embedding_size": 128})


def test_a_run_reads_back_without_the_vectors(vectors, tmp_path):
    from mtl.backbones.text_bilstm import TextBiLSTM

    folder, _ = vectors
    config = {"type": "text_bilstm", "pretrained": folder, "hidden_size": 4}
    model = build_backbone(config)
    run = tmp_path / "run"
    run.mkdir()
    model.save_assets(str(run))
    again = TextBiLSTM.run_config({k: v for k, v in config.items() if k != "pretrained"} | {"word_vectors": folder},
                                  str(run))
    assert "word_vectors" not in again and again["embedding_size"] == 6
    copy = build_backbone(again)
    assert copy.tokenizer.vocabulary() == model.tokenizer.vocabulary()
    assert copy.word_embeddings.weight.shape == model.word_embeddings.weight.shape
