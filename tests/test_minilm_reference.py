"""Opt-in: the real all-MiniLM-L6-v2 (``mtl pretrained fetch minilm``; skipped when the cache does not hold it)
against the peer's own code on committed sentences (tests/fixtures/minilm_reference.npz, made once by
tests/references/make_minilm_fixture.py with transformers and sentence-transformers in a torch environment): the
checkpoint's tokenizer (tokenizer.json, and vocab.txt with do_lower_case) gives the same piece ids as transformers'
AutoTokenizer, the ``bert`` backbone the same last hidden states at every real token, and its mean-pooled, normalised
output the same sentence embeddings as ``SentenceTransformer.encode``."""
import os

import numpy as np
import paddle
import pytest

from mtl.pretrained.cache import model_dir, read_manifest

pytestmark = pytest.mark.slow

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "minilm_reference.npz")
FOLDER = model_dir("minilm")
needs_weights = pytest.mark.skipif(read_manifest(FOLDER) is None if os.path.isdir(FOLDER) else True,
                                   reason="the cache holds no minilm (mtl pretrained fetch minilm)")


def ours(tokenizer, sentence):
    pieces, _ = tokenizer.encode_words(tokenizer.split_words(sentence))
    return [tokenizer.cls_id, *pieces.tolist(), tokenizer.sep_id]


@needs_weights
@pytest.mark.parametrize("source", ["tokenizer.json", "vocab.txt"])
def test_the_checkpoints_tokenizer_gives_transformers_ids(source):
    import json

    from mtl.text.tokenizer import TextTokenizer

    with open(os.path.join(FOLDER, "tokenizer_config.json")) as f:
        lowercase = json.load(f)["do_lower_case"] if source == "vocab.txt" else None
    tokenizer = TextTokenizer.from_file(os.path.join(FOLDER, source), lowercase)
    data = np.load(FIXTURE)
    for sentence, ids, mask in zip(data["sentences"], data["token_ids"], data["attention_mask"]):
        assert ours(tokenizer, str(sentence)) == ids[mask.astype(bool)].tolist(), sentence


@needs_weights
def test_minilm_equals_transformers_and_sentence_transformers():
    from mtl.backbones.base import build_backbone

    data = np.load(FIXTURE)
    model = build_backbone({"type": "bert", "pretrained": "minilm"}).eval()
    ids = paddle.to_tensor(data["token_ids"])
    with paddle.no_grad():
        sequence = model({"token_ids": ids, "segment_ids": paddle.zeros_like(ids)})["sequence"].numpy()
    real = data["attention_mask"].astype(bool)
    np.testing.assert_allclose(sequence[real], data["sequence"][real], atol=1e-4, rtol=0)
    weights = real[..., None].astype(np.float32)
    pooled = (sequence * weights).sum(1) / weights.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(pooled, data["embeddings"], atol=1e-5, rtol=0)
