"""A small random BERT checkpoint folder laid out as all-MiniLM-L6-v2's (Hugging Face ``BertModel`` names in a
``model.safetensors`` written here byte by byte, ``config.json``, an uncased ``vocab.txt`` with
``tokenizer_config.json``'s do_lower_case): what ``backbone.pretrained: FOLDER`` reads, at a size the tests train in
seconds. The vocabulary is tests/fixtures/bert_tiny's (100 uncased pieces: letters and ``##`` letters, a few words)."""
import json
import os
import shutil
import struct

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "fixtures", "bert_tiny", "vocab.txt")


def write_safetensors(path, tensors):
    """``tensors`` {name: float32 array} as a safetensors file (8-byte header length, JSON header, raw bytes)."""
    header, offset, blobs = {}, 0, []
    for name, value in tensors.items():
        data = np.ascontiguousarray(value, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def huggingface_tensors(vocab, hidden, layers, intermediate, positions, seed):
    """Random BertModel tensors by Hugging Face's names (Linear weights [out, in]; BERT's 0.02 normal; LayerNorm
    1 and 0)."""
    rng = np.random.RandomState(seed)

    def normal(*shape):
        return (0.02 * rng.randn(*shape)).astype(np.float32)

    def norm(prefix):
        return {f"{prefix}.weight": np.ones(hidden, np.float32), f"{prefix}.bias": np.zeros(hidden, np.float32)}

    out = {"embeddings.word_embeddings.weight": normal(vocab, hidden),
           "embeddings.position_embeddings.weight": normal(positions, hidden),
           "embeddings.token_type_embeddings.weight": normal(2, hidden), **norm("embeddings.LayerNorm")}
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            out[f"{p}.attention.self.{part}.weight"] = normal(hidden, hidden)
            out[f"{p}.attention.self.{part}.bias"] = normal(hidden)
        out.update({f"{p}.attention.output.dense.weight": normal(hidden, hidden),
                    f"{p}.attention.output.dense.bias": normal(hidden), **norm(f"{p}.attention.output.LayerNorm"),
                    f"{p}.intermediate.dense.weight": normal(intermediate, hidden),
                    f"{p}.intermediate.dense.bias": normal(intermediate),
                    f"{p}.output.dense.weight": normal(hidden, intermediate), f"{p}.output.dense.bias": normal(hidden),
                    **norm(f"{p}.output.LayerNorm")})
    out.update({"pooler.dense.weight": normal(hidden, hidden), "pooler.dense.bias": normal(hidden)})
    return out


def write_checkpoint(folder, hidden=32, layers=2, heads=4, intermediate=64, positions=512, seed=0):
    """Write the checkpoint folder; return its path."""
    os.makedirs(folder, exist_ok=True)
    shutil.copy(VOCAB, os.path.join(folder, "vocab.txt"))
    with open(VOCAB) as f:
        vocab = sum(1 for line in f if line.strip())
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": intermediate,
              "max_position_embeddings": positions, "vocab_size": vocab, "type_vocab_size": 2, "hidden_act": "gelu",
              "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "pad_token_id": 0, "position_embedding_type": "absolute"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
    write_safetensors(os.path.join(folder, "model.safetensors"),
                      huggingface_tensors(vocab, hidden, layers, intermediate, positions, seed))
    return str(folder)
