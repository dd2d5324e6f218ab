"""BERT and ERNIE weights from other frameworks as the ``bert`` backbone's tensors.

Files: a Hugging Face checkpoint (``model.safetensors``, read by :mod:`mtl.convert.safetensors_file`, or
``pytorch_model.bin``, read by :mod:`mtl.convert.torch_file`; ``BertModel`` or a task model whose encoder is under
``bert.``) or a PaddleNLP ERNIE ``model_state.pdparams`` (read by :func:`mtl.core.safe_pickle.load_paddle_file`; under
``ernie.`` in a task model). Names map as below; torch ``Linear`` weights are ``[out, in]`` and are transposed,
Paddle's are ``[in, out]`` already. Tensors of the task heads (``cls.*``, ``classifier.*``) and buffers
(``position_ids``) are left out; every weight of the backbone must be given.
"""
import os
import re

import numpy as np

from mtl.convert.safetensors_file import looks_like_safetensors, read_safetensors
from mtl.convert.torch_file import read_torch_file
from mtl.core.errors import DataError
from mtl.core.safe_pickle import load_paddle_file

# (pattern of the source name, our name, transpose?) -- Hugging Face BertModel
HUGGINGFACE = [
    (r"embeddings\.(word|position|token_type)_embeddings\.weight", r"embeddings.\1_embeddings.weight", False),
    (r"embeddings\.LayerNorm\.(weight|gamma)", "embeddings.layer_norm.weight", False),
    (r"embeddings\.LayerNorm\.(bias|beta)", "embeddings.layer_norm.bias", False),
    (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.weight", r"layers.\1.\2.weight", True),
    (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.bias", r"layers.\1.\2.bias", False),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.weight", r"layers.\1.attention_output.weight", True),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.bias", r"layers.\1.attention_output.bias", False),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|gamma)", r"layers.\1.attention_norm.weight",
     False),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(bias|beta)", r"layers.\1.attention_norm.bias", False),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.weight", r"layers.\1.intermediate.weight", True),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.bias", r"layers.\1.intermediate.bias", False),
    (r"encoder\.layer\.(\d+)\.output\.dense\.weight", r"layers.\1.output.weight", True),
    (r"encoder\.layer\.(\d+)\.output\.dense\.bias", r"layers.\1.output.bias", False),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|gamma)", r"layers.\1.output_norm.weight", False),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(bias|beta)", r"layers.\1.output_norm.bias", False),
    (r"pooler\.dense\.weight", "pooler.weight", True),
    (r"pooler\.dense\.bias", "pooler.bias", False),
]
# PaddleNLP ErnieModel (paddle.nn.TransformerEncoderLayer names)
PADDLENLP = [
    (r"embeddings\.(word|position|token_type|task_type)_embeddings\.weight", r"embeddings.\1_embeddings.weight",
     False),
    (r"embeddings\.layer_norm\.(weight|bias)", r"embeddings.layer_norm.\1", False),
    (r"encoder\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"layers.\1.query.\2", False),
    (r"encoder\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"layers.\1.key.\2", False),
    (r"encoder\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"layers.\1.value.\2", False),
    (r"encoder\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"layers.\1.attention_output.\2", False),
    (r"encoder\.layers\.(\d+)\.norm1\.(weight|bias)", r"layers.\1.attention_norm.\2", False),
    (r"encoder\.layers\.(\d+)\.linear1\.(weight|bias)", r"layers.\1.intermediate.\2", False),
    (r"encoder\.layers\.(\d+)\.linear2\.(weight|bias)", r"layers.\1.output.\2", False),
    (r"encoder\.layers\.(\d+)\.norm2\.(weight|bias)", r"layers.\1.output_norm.\2", False),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1", False),
]
PREFIXES = ("bert.", "ernie.", "model.")
TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def read_checkpoint(path: str) -> dict:
    """``{name: array}`` of a safetensors file (whatever its name), a torch ``.bin``/``.pt``/``.pth`` or a Paddle
    ``.pdparams`` file; a DataError saying which kind of file it is not."""
    if not os.path.isfile(path):
        raise DataError(f"weights '{path}' do not exist")
    with open(path, "rb") as f:
        head = f.read(16)
    if path.endswith(".safetensors") or looks_like_safetensors(head):
        return read_safetensors(path)
    if path.endswith(".pdparams"):
        return {k: np.asarray(v) for k, v in load_paddle_file(path).items()}
    if not head.startswith(b"PK") and not path.endswith(TORCH_SUFFIXES):
        raise DataError(f"weights '{path}' are neither a safetensors file, a torch zip file nor a Paddle .pdparams "
                        "file; give the checkpoint's model.safetensors, pytorch_model.bin or model_state.pdparams")
    return {k: v for k, v in read_torch_file(path).items() if isinstance(v, np.ndarray)}


def _strip_prefix(state):
    """Names without the ``bert.`` / ``ernie.`` encoder prefix of a task model."""
    for prefix in PREFIXES:
        if any(k.startswith(prefix + "embeddings.") for k in state):
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def layout(state) -> str:
    """``huggingface`` or ``paddlenlp``, from the names."""
    if any(".self_attn.q_proj." in k for k in state):
        return "paddlenlp"
    if any(".attention.self.query." in k for k in state):
        return "huggingface"
    raise DataError("the weights are neither a Hugging Face BERT (encoder.layer.N.attention.self.query) nor a "
                    "PaddleNLP ERNIE (encoder.layers.N.self_attn.q_proj) state_dict")


def map_bert_tensors(state, path="<weights>") -> dict:
    """Our names -> arrays for a BERT/ERNIE state_dict; tensors that map to nothing are left out."""
    state = _strip_prefix(state)
    rules = HUGGINGFACE if layout(state) == "huggingface" else PADDLENLP
    out = {}
    for name, value in state.items():
        for pattern, target, transpose in rules:
            if re.fullmatch(pattern, name):
                out[re.sub(pattern, target, name)] = np.ascontiguousarray(value.T if transpose else value)
                break
    if not out:
        raise DataError(f"'{path}' holds no BERT/ERNIE encoder tensor")
    return out


# our tensor names -> the bert backbone's option that sets each axis of their shape
AXES = [
    (r"embeddings\.word_embeddings\.weight", ("vocab_size", "hidden_size")),
    (r"embeddings\.position_embeddings\.weight", ("max_position", "hidden_size")),
    (r"embeddings\.token_type_embeddings\.weight", ("type_vocab_size", "hidden_size")),
    (r"embeddings\.task_type_embeddings\.weight", ("task_type_vocab_size", "hidden_size")),
    (r"layers\.\d+\.intermediate\.weight", ("hidden_size", "intermediate_size")),
    (r"layers\.\d+\.intermediate\.bias", ("intermediate_size",)),
    (r"layers\.\d+\.output\.weight", ("intermediate_size", "hidden_size")),
    (r".*\.weight", ("hidden_size", "hidden_size")),  # attention, pooler, LayerNorm weights
    (r".*\.bias", ("hidden_size",)),
]


def differing_size(name: str, got, expected):
    """``(option, value in the weights)``: the bert option whose size makes tensor ``name`` of shape ``got`` differ
    from the ``expected`` shape (the first differing axis), or None when no option names that axis."""
    for pattern, axes in AXES:
        if re.fullmatch(pattern, name):
            for option, a, b in zip(axes, got, expected):
                if a != b:
                    return option, int(a)
            return None
    return None


def layer_count(names) -> int:
    """Encoder layers of a state_dict in our names (``layers.N.*``): 1 + the largest N, 0 for none."""
    numbers = [int(k.split(".")[1]) for k in names if k.startswith("layers.")]
    return 1 + max(numbers) if numbers else 0


def bert_options(state) -> dict:
    """The ``bert`` backbone's sizes from the tensors: vocabulary, hidden size, layers, intermediate size, positions,
    segment and task-type vocabularies."""
    ours = map_bert_tensors(state)
    layers = 1 + max(int(k.split(".")[1]) for k in ours if k.startswith("layers."))
    vocab, hidden = ours["embeddings.word_embeddings.weight"].shape
    options = {"vocab_size": int(vocab), "hidden_size": int(hidden), "num_layers": layers,
               "intermediate_size": int(ours["layers.0.intermediate.weight"].shape[1]),
               "max_position": int(ours["embeddings.position_embeddings.weight"].shape[0]),
               "type_vocab_size": int(ours["embeddings.token_type_embeddings.weight"].shape[0])}
    if "embeddings.task_type_embeddings.weight" in ours:
        options["task_type_vocab_size"] = int(ours["embeddings.task_type_embeddings.weight"].shape[0])
    return options
