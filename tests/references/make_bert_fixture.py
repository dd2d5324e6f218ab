"""Make the fixture that checks the ``bert`` backbone against Hugging Face ``transformers`` (BertModel, ErnieModel).

Run from the repository root in a separate environment with torch and transformers (never a project dependency;
here beside the checkout)::

    python3 -m venv ../.torch-text && ../.torch-text/bin/pip install torch==2.13.0 numpy transformers
    ../.torch-text/bin/python tests/references/make_bert_fixture.py

It builds a tiny BertModel (2 layers, hidden 32, 4 heads, vocabulary 100) and a tiny ErnieModel with ERNIE 3.0's task
embedding (use_task_id, 3 task types) with random weights (seed 0), runs both in eval mode on a padded batch, and
writes into tests/fixtures/bert_tiny/:

* ``vocab.txt``: the 100 pieces (special tokens first), so the tokenizer loads as a BERT vocabulary;
* ``model.safetensors`` and ``pytorch_model.bin``: the BertModel's state_dict as transformers saves it;
* ``ernie.pdparams``: the ErnieModel's tensors under PaddleNLP's ErnieModel names (``encoder.layers.N.self_attn.
  q_proj``, ``linear1``, ``norm1``, ...), Linear weights as [in, out], pickled as ``paddle.save`` pickles a dict of
  numpy arrays (no PaddleNLP here: the names follow paddlenlp/transformers/ernie/modeling.py);
* ``outputs.npz``: the inputs (token ids, segment ids, attention mask, task id) and both models' last hidden states
  and pooled outputs.
"""
import os
import pickle
import re

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel, ErnieConfig, ErnieModel

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "bert_tiny")
SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=0)


def vocabulary():
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "play", "##ing", "##ed", "un", "##believ",
             "##able", ".", ",", "!", "?", "'", "-"]
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + letters + ["##" + c for c in letters]
    pieces += [f"w{i}" for i in range(100 - len(pieces))]
    assert len(pieces) == 100 and len(set(pieces)) == 100
    return pieces


def randomise(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator) if name.endswith("weight")
                        else 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))
    return model.eval()


def inputs():
    rng = np.random.RandomState(0)
    lengths = [12, 9, 5]
    ids = np.zeros((3, 12), np.int64)
    segments = np.zeros((3, 12), np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.randint(5, 100, n)
        ids[i, 0], ids[i, n - 1] = 2, 3
        segments[i, n // 2:n] = 1
    return ids, segments, (ids != 0).astype(np.int64)


def paddlenlp_names(state):
    """transformers ErnieModel names -> PaddleNLP ErnieModel names, Linear weights transposed to [in, out]."""
    rules = [(r"embeddings\.LayerNorm\.", "embeddings.layer_norm."),
             (r"encoder\.layer\.(\d+)\.attention\.self\.query\.", r"encoder.layers.\1.self_attn.q_proj."),
             (r"encoder\.layer\.(\d+)\.attention\.self\.key\.", r"encoder.layers.\1.self_attn.k_proj."),
             (r"encoder\.layer\.(\d+)\.attention\.self\.value\.", r"encoder.layers.\1.self_attn.v_proj."),
             (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"encoder.layers.\1.self_attn.out_proj."),
             (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"encoder.layers.\1.norm1."),
             (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"encoder.layers.\1.linear1."),
             (r"encoder\.layer\.(\d+)\.output\.dense\.", r"encoder.layers.\1.linear2."),
             (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"encoder.layers.\1.norm2.")]
    out = {}
    for name, value in state.items():
        array = value.detach().numpy().astype(np.float32)
        linear = name.endswith(".weight") and array.ndim == 2 and "embeddings" not in name
        for pattern, target in rules:
            name = re.sub(pattern, target, name)
        out["ernie." + name] = np.ascontiguousarray(array.T if linear else array)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "vocab.txt"), "w") as f:
        f.write("\n".join(vocabulary()) + "\n")
    ids, segments, mask = inputs()
    bert = randomise(BertModel(BertConfig(**SIZES), add_pooling_layer=True), 0)
    ernie = randomise(ErnieModel(ErnieConfig(**SIZES, use_task_id=True, task_type_vocab_size=3)), 1)
    task_id = 2
    with torch.no_grad():
        b = bert(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments),
                 attention_mask=torch.tensor(mask))
        e = ernie(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments),
                  attention_mask=torch.tensor(mask), task_type_ids=torch.full(ids.shape, task_id))
    state = {k: v.contiguous() for k, v in bert.state_dict().items()}
    save_file(state, os.path.join(OUT, "model.safetensors"))
    torch.save(state, os.path.join(OUT, "pytorch_model.bin"))
    with open(os.path.join(OUT, "ernie.pdparams"), "wb") as f:
        pickle.dump(paddlenlp_names(ernie.state_dict()), f, protocol=4)
    np.savez(os.path.join(OUT, "outputs.npz"), token_ids=ids, segment_ids=segments, attention_mask=mask,
             task_id=task_id, bert_sequence=b.last_hidden_state.numpy(), bert_pooled=b.pooler_output.numpy(),
             ernie_sequence=e.last_hidden_state.numpy(), ernie_pooled=e.pooler_output.numpy())
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
