"""The ``bert`` backbone against Hugging Face transformers' BertModel and ErnieModel on the same random weights
(fixture made in a torch environment by tests/references/make_bert_fixture.py): sequence and pooled outputs within
1e-5, loaded from model.safetensors, from pytorch_model.bin (the project's torch reader) and, for ERNIE with its task
embedding, from a PaddleNLP-named .pdparams. The sequence is compared at the real pieces: what a padded position
holds is no part of the model (transformers 5 masks padded queries as well as keys, we mask keys only; no head
reads a padded position)."""
import os

import numpy as np
import paddle
import pytest

from mtl.backbones.bert import Bert
from mtl.convert.bert import bert_options, read_checkpoint
from mtl.convert.safetensors_file import read_safetensors
from mtl.convert.torch_file import read_torch_file
from mtl.core.errors import ConfigError

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bert_tiny")
SIZES = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position=64, dropout=0.1,
             attention_dropout=0.1)


def _run(model, data):
    model.eval()
    with paddle.no_grad():
        out = model({"token_ids": paddle.to_tensor(data["token_ids"]),
                     "segment_ids": paddle.to_tensor(data["segment_ids"])})
    return out["sequence"].numpy(), out["pooled"].numpy()


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_bert_equals_transformers_bertmodel(weights):
    data = np.load(os.path.join(FIXTURE, "outputs.npz"))
    model = Bert(tokenizer=os.path.join(FIXTURE, "vocab.txt"), weights=os.path.join(FIXTURE, weights), **SIZES)
    sequence, pooled = _run(model, data)
    real = data["attention_mask"].astype(bool)
    np.testing.assert_allclose(sequence[real], data["bert_sequence"][real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(pooled, data["bert_pooled"], atol=1e-5, rtol=0)


def test_ernie_with_task_embedding_equals_transformers_erniemodel():
    data = np.load(os.path.join(FIXTURE, "outputs.npz"))
    model = Bert(tokenizer=os.path.join(FIXTURE, "vocab.txt"), weights=os.path.join(FIXTURE, "ernie.pdparams"),
                 type_vocab_size=2, task_type_vocab_size=3, task_id=int(data["task_id"]), **SIZES)
    sequence, pooled = _run(model, data)
    real = data["attention_mask"].astype(bool)
    np.testing.assert_allclose(sequence[real], data["ernie_sequence"][real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(pooled, data["ernie_pooled"], atol=1e-5, rtol=0)


def test_safetensors_reader_equals_torch_reader():
    a = read_safetensors(os.path.join(FIXTURE, "model.safetensors"))
    b = read_torch_file(os.path.join(FIXTURE, "pytorch_model.bin"))
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_sizes_are_read_from_the_tensors():
    options = bert_options(read_checkpoint(os.path.join(FIXTURE, "model.safetensors")))
    assert options == {"vocab_size": 100, "hidden_size": 32, "num_layers": 2, "intermediate_size": 64,
                       "max_position": 64, "type_vocab_size": 2}
    assert bert_options(read_checkpoint(os.path.join(FIXTURE, "ernie.pdparams")))["task_type_vocab_size"] == 3


def test_wrong_sizes_are_one_sentence():
    with pytest.raises(ConfigError, match="hold 2 encoder layer.*set backbone.num_layers: 2"):
        Bert(tokenizer=os.path.join(FIXTURE, "vocab.txt"), weights=os.path.join(FIXTURE, "model.safetensors"),
             **dict(SIZES, num_layers=3))
    with pytest.raises(ConfigError, match="has shape .*set backbone.intermediate_size: 64"):
        Bert(tokenizer=os.path.join(FIXTURE, "vocab.txt"), weights=os.path.join(FIXTURE, "model.safetensors"),
             **dict(SIZES, intermediate_size=48))


def test_pre_norm_differs_from_post_norm_and_trains():
    """Pre-LayerNorm is a different function of the same weights (and its final norm is a parameter)."""
    data = np.load(os.path.join(FIXTURE, "outputs.npz"))
    paddle.seed(0)
    pre = Bert(tokenizer=os.path.join(FIXTURE, "vocab.txt"), pre_norm=True, **SIZES)
    names = set(pre.state_dict())
    assert "final_norm.weight" in names
    sequence, _ = _run(pre, data)
    assert np.isfinite(sequence).all() and not np.allclose(sequence, data["bert_sequence"], atol=1e-2)
