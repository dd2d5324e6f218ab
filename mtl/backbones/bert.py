"""A BERT/ERNIE-compatible transformer encoder (Devlin et al., 2019; ERNIE: Sun et al., 2019-2021).

Embeddings: ``LN(E_word[x] + E_pos[t] + E_segment[s] (+ E_task[task_id], ERNIE 3.0's task embedding))``, dropout.
Each layer, post-LayerNorm (BERT, ERNIE; ``pre_norm: false``)::

    h = LN1(x + Dropout(Attention(x)));   y = LN2(h + Dropout(W2 act(W1 h)))

or pre-LayerNorm (``pre_norm: true``; Xiong et al., 2020): ``h = x + Attention(LN1(x))``, ``y = h + FFN(LN2(h))``,
and a final LayerNorm. Attention: ``softmax(Q K^T / sqrt(d_head) + m) V`` per head, ``m`` = -1e4 at padded keys
(exp underflows to 0 as with transformers' dtype minimum). ``act``: exact (erf) GELU, or ReLU for ERNIE 1.0.
``pooled = tanh(W_p sequence[:, 0])`` (BERT's pooler over ``[CLS]``). Weights: ``weights`` names a Hugging Face
checkpoint (``model.safetensors`` / ``pytorch_model.bin``) or a PaddleNLP ERNIE ``.pdparams``, loaded by name
(:mod:`mtl.convert.bert`); every encoder weight must be there.
"""
import json
import math
import os

import paddle
import paddle.nn.functional as F
from paddle import nn

from mtl.backbones.text import TextBackbone, constant_ids
from mtl.core.errors import ConfigError
from mtl.core.registry import register_backbone

ACTIVATIONS = {"gelu": lambda x: F.gelu(x, approximate=False), "relu": F.relu}


class Embeddings(nn.Layer):
    """Word, position, segment (and task-type) embeddings, LayerNorm, dropout."""

    def __init__(self, vocab, hidden, positions, segments, tasks, eps, dropout, pad_id):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=pad_id)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(segments, hidden)
        self.task_type_embeddings = nn.Embedding(tasks, hidden) if tasks else None
        self.layer_norm = nn.LayerNorm(hidden, epsilon=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, token_ids, segment_ids, task_id):
        positions = paddle.arange(token_ids.shape[1], dtype="int64").unsqueeze(0)
        x = self.word_embeddings(token_ids) + self.position_embeddings(positions) + \
            self.token_type_embeddings(segment_ids)
        if self.task_type_embeddings is not None:
            x = x + self.task_type_embeddings(constant_ids(token_ids, task_id))
        return self.dropout(self.layer_norm(x))


class EncoderLayer(nn.Layer):
    """Multi-head self-attention and a feed-forward block, post- or pre-LayerNorm."""

    def __init__(self, hidden, heads, intermediate, eps, dropout, attention_dropout, activation, pre_norm):
        super().__init__()
        self.heads, self.pre_norm, self.act = heads, pre_norm, ACTIVATIONS[activation]
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, epsilon=eps)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, epsilon=eps)
        self.dropout, self.attention_dropout = nn.Dropout(dropout), nn.Dropout(attention_dropout)

    def _split(self, x):
        b, t, d = x.shape
        return x.reshape([b, t, self.heads, d // self.heads]).transpose([0, 2, 1, 3])

    def attention(self, x, bias):
        """Scaled dot-product attention of every head; ``bias`` [B, 1, 1, T] masks the padded keys."""
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = paddle.matmul(q, k, transpose_y=True) / math.sqrt(q.shape[-1]) + bias
        context = paddle.matmul(self.attention_dropout(F.softmax(scores, axis=-1)), v)
        b, h, t, d = context.shape
        return self.attention_output(context.transpose([0, 2, 1, 3]).reshape([b, t, h * d]))

    def forward(self, x, bias):
        if self.pre_norm:
            x = x + self.dropout(self.attention(self.attention_norm(x), bias))
            return x + self.dropout(self.output(self.act(self.intermediate(self.output_norm(x)))))
        x = self.attention_norm(x + self.dropout(self.attention(x, bias)))
        return self.output_norm(x + self.dropout(self.output(self.act(self.intermediate(x)))))


# BERT-base's sizes: what an option is when neither the job nor the checkpoint's config gives it
DEFAULTS = dict(vocab_size=None, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
                max_position=512, type_vocab_size=2, task_type_vocab_size=0, task_id=0, activation="gelu",
                layer_norm_eps=1e-12, dropout=0.1, attention_dropout=0.1)
ENCODER_FILE = "encoder.json"  # a run's resolved sizes: the run read back needs neither the weights nor their config


@register_backbone("bert")
class Bert(TextBackbone):
    """BERT/ERNIE encoder; outputs ``sequence`` [B, T, hidden] and ``pooled`` [B, hidden] (the tanh pooler).

    The sizes come from the job when it gives them, else from the checkpoint's own config (``model_config``: Hugging
    Face's ``config.json`` or PaddleNLP's ``model_config.json``, found beside ``weights``;
    :mod:`mtl.convert.model_config`), else BERT-base's defaults; a size the job gives that differs from the
    checkpoint's config is refused, naming both.

    Parameters:
        vocab_size (int): rows of the word embedding table (default: the checkpoint config's vocab_size, else the
            tokenizer's number of pieces; may be larger, as a checkpoint's padded table is, never smaller)
        hidden_size (int): width of the embeddings and of every layer's states: the width of the sequence and pooled
            outputs; a multiple of num_heads (default: the checkpoint config's hidden_size, else 768)
        num_layers (int): transformer encoder layers (default: num_hidden_layers, else 12)
        num_heads (int): attention heads of each layer (each of hidden_size / num_heads dimensions; default:
            num_attention_heads, else 12)
        intermediate_size (int): width of the inner layer of each feed-forward block (default: intermediate_size,
            else 3072)
        max_position (int): rows of the position embedding table: the most pieces an input may have (the readers'
            max_length must not exceed it; default: max_position_embeddings, else 512)
        type_vocab_size (int): rows of the segment embedding table (segment ids 0 and 1 of a text pair need 2;
            default: type_vocab_size, else 2)
        task_type_vocab_size (int): rows of ERNIE 3.0's task-type embedding table, whose row task_id is added at
            every position; 0: no task-type embedding (BERT, ERNIE 1.0/2.0; default: task_type_vocab_size of a
            config with use_task_id, else 0)
        task_id (int): the task-type embedding row added at every position (0 to task_type_vocab_size - 1; unused
            when task_type_vocab_size is 0)
        activation (str): the feed-forward activation: gelu (exact, erf; BERT, ERNIE 2.0/3.0) or relu (ERNIE 1.0);
            default: hidden_act, else gelu
        layer_norm_eps (float): epsilon of every LayerNorm (added to the variance; default: layer_norm_eps, else
            1e-12)
        dropout (float): dropout probability of the embeddings and of the attention and feed-forward outputs of each
            layer (before their residual sums; default: hidden_dropout_prob, else 0.1)
        attention_dropout (float): dropout probability of the attention weights (after the softmax; default:
            attention_probs_dropout_prob, else 0.1)
        pre_norm (bool): LayerNorm before each attention and feed-forward block and a final LayerNorm (Xiong et al.,
            2020); false: after the residual sums, as BERT and ERNIE
        weights (str): a checkpoint loaded into the encoder by name at construction: a Hugging Face BERT
            model.safetensors or pytorch_model.bin (.bin, .pt, .pth), or a PaddleNLP ERNIE .pdparams; every tensor
            of the encoder must be there with its shape, tensors of other parts (e.g. a pre-training head) are left
            out (default: none, random initialisation; a relative path is taken from the job config's folder when
            it is there)
        model_config (str): the checkpoint's config giving the sizes: a Hugging Face config.json or a PaddleNLP
            model_config.json (default: the one beside weights, when there is one; a relative path is taken from
            the job config's folder when it is there)
    """

    pretrained_kind = "bert"

    @classmethod
    def pretrained_options(cls, folder):
        """The keys that read a BERT checkpoint folder (``backbone.pretrained: minilm``): ``weights`` (its
        model.safetensors, pytorch_model.bin or model_state.pdparams), ``model_config`` (config.json or
        model_config.json) and ``tokenizer``: the checkpoint's own, its tokenizer.json (which keeps its normaliser:
        lowercasing for an uncased model) or else its vocab.txt, with ``lowercase`` from tokenizer_config.json's
        do_lower_case."""
        from mtl.convert.model_config import find_model_config

        def there(*names):
            return next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)

        weights = there("model.safetensors", "pytorch_model.bin", "model_state.pdparams")
        options = {"weights": weights, "model_config": find_model_config(weights)}
        if there("tokenizer.json"):
            return {**options, "tokenizer": there("tokenizer.json")}
        options["tokenizer"] = there("vocab.txt")
        settings = there("tokenizer_config.json")
        if settings:
            with open(settings) as f:
                options["lowercase"] = bool(json.load(f).get("do_lower_case", False))
        return options

    def __init__(self, tokenizer=None, vocab_size=None, hidden_size=None, num_layers=None, num_heads=None,
                 intermediate_size=None, max_position=None, type_vocab_size=None, task_type_vocab_size=None,
                 task_id=None, activation=None, layer_norm_eps=None, dropout=None, attention_dropout=None,
                 pre_norm=False, weights=None, model_config=None, lowercase=None):
        super().__init__()
        tok = self.set_tokenizer(tokenizer, lowercase)
        given = {k: v for k, v in locals().items() if k in DEFAULTS}
        o, self.origins = self.resolve_options(given, weights, model_config)
        o["vocab_size"] = int(o["vocab_size"] or tok.vocab_size)
        if o["vocab_size"] < tok.vocab_size:
            raise ConfigError(f"vocab_size {o['vocab_size']} ({self.origins['vocab_size']}) is smaller than the "
                              f"tokenizer's {tok.vocab_size} pieces", key="vocab_size")
        if o["activation"] not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {o['activation']!r}",
                              key="activation")
        if int(o["hidden_size"]) % int(o["num_heads"]):
            raise ConfigError(f"hidden_size {o['hidden_size']} is not a multiple of num_heads {o['num_heads']}",
                              key="num_heads")
        self.options = dict(o, pre_norm=bool(pre_norm))
        self.feature_size, self.task_id, self.pre_norm = int(o["hidden_size"]), int(o["task_id"]), bool(pre_norm)
        self.embeddings = Embeddings(o["vocab_size"], self.feature_size, int(o["max_position"]),
                                     int(o["type_vocab_size"]), int(o["task_type_vocab_size"]),
                                     float(o["layer_norm_eps"]), float(o["dropout"]), tok.pad_id)
        self.layers = nn.LayerList([EncoderLayer(self.feature_size, int(o["num_heads"]), int(o["intermediate_size"]),
                                                 float(o["layer_norm_eps"]), float(o["dropout"]),
                                                 float(o["attention_dropout"]), o["activation"], self.pre_norm)
                                    for _ in range(int(o["num_layers"]))])
        self.final_norm = nn.LayerNorm(self.feature_size, epsilon=float(o["layer_norm_eps"])) if self.pre_norm \
            else None
        self.pooler = nn.Linear(self.feature_size, self.feature_size)
        if weights:
            self.load_weights(weights)

    @staticmethod
    def resolve_options(given, weights, model_config):
        """(options, where each came from): the job's, else the checkpoint config's (``model_config``, or the one
        beside ``weights``), else BERT-base's (:func:`mtl.convert.model_config.resolve`)."""
        from mtl.convert.model_config import find_model_config, read_model_config, resolve

        path = model_config or (find_model_config(weights) if weights else None)
        return resolve(given, DEFAULTS, read_model_config(path) if path else None)

    def layer_depths(self):
        """Embeddings 0, encoder layer i (from 0) i + 1, the final LayerNorm and the pooler the top (layers + 1)."""
        top = len(self.layers) + 1
        return {name: 0 if name.startswith("embeddings.") else int(name.split(".")[1]) + 1
                if name.startswith("layers.") else top for name, _ in self.named_parameters()}

    def input_embeddings(self):
        """The word embedding matrix [V, hidden]."""
        return self.embeddings.word_embeddings.weight

    def load_weights(self, path):
        """Load a Hugging Face BERT or PaddleNLP ERNIE checkpoint by name (:mod:`mtl.convert.bert`); a ConfigError
        naming the option to change (and the value the weights need) for a tensor missing, left over or of another
        shape."""
        from mtl.convert.bert import map_bert_tensors, read_checkpoint

        tensors = map_bert_tensors(read_checkpoint(path), path)
        own = self.state_dict()
        self._check_tensor_set(path, tensors, own)
        for name, value in tensors.items():
            if name in own and tuple(value.shape) != tuple(own[name].shape):
                raise ConfigError(f"weights '{path}': '{name}' has shape {list(value.shape)}, this encoder expects "
                                  f"{list(own[name].shape)}{self._size_hint(name, value.shape, own[name].shape)}",
                                  key="weights")
        self.set_state_dict({k: v.astype("float32") for k, v in tensors.items() if k in own})

    def _size_hint(self, name, got, expected) -> str:
        """``: set hidden_size: 128 (768 here, from the default)``: the option that makes the shapes differ."""
        from mtl.convert.bert import differing_size

        found = differing_size(name, got, expected)
        if found is None:
            return ""
        option, value = found
        return (f": set backbone.{option}: {value} ({self.options[option]} here, from {self.origins[option]}; a "
                "checkpoint's config.json or model_config.json beside the weights gives every size)")

    def _check_tensor_set(self, path, tensors, own):
        """A ConfigError naming the option when the weights hold other layers, or another task-type embedding or
        final LayerNorm, than this encoder."""
        from mtl.convert.bert import layer_count

        def refuse(what, option, value):
            raise ConfigError(f"weights '{path}' {what}: set backbone.{option}: {value} ({self.options[option]} "
                              f"here, from {self.origins[option]})", key="weights")

        theirs, ours = layer_count(tensors), layer_count(own)
        if theirs != ours:
            refuse(f"hold {theirs} encoder layer(s), this encoder has {ours}", "num_layers", theirs)
        task = "embeddings.task_type_embeddings.weight"
        if (task in tensors) != (task in own):
            refuse("hold a task-type embedding" if task in tensors else "hold no task-type embedding",
                   "task_type_vocab_size", tensors[task].shape[0] if task in tensors else 0)
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise ConfigError(f"weights '{path}' lack {len(missing)} tensor(s) of this encoder, e.g. {missing[:3]}"
                              + (" (set backbone.pre_norm: false)" if any("final_norm" in k for k in missing)
                                 else ""), key="weights")

    def save_assets(self, folder):
        """``tokenizer.json`` and ``encoder.json`` (the resolved sizes) into ``folder``."""
        super().save_assets(folder)
        with open(os.path.join(folder, ENCODER_FILE), "w") as f:
            json.dump(self.options, f, indent=1)

    @classmethod
    def run_config(cls, config, folder):
        """The config of the encoder a run or an export holds: its tokenizer copy and, when ``encoder.json`` is
        there, the sizes it trained with in place of ``weights`` and ``model_config`` (its weights come from the
        run), so that it reads back when the checkpoint's files are gone."""
        config = super().run_config(config, folder)
        path = os.path.join(folder, ENCODER_FILE)
        if not os.path.isfile(path):
            return config
        with open(path) as f:
            sizes = json.load(f)
        return {**{k: v for k, v in config.items() if k not in ("weights", "model_config")}, **sizes}

    def forward(self, inputs):
        """``{"sequence": [B, T, hidden], "pooled": [B, hidden]}``."""
        token_ids, segment_ids = inputs["token_ids"], inputs["segment_ids"]
        mask = self.padding_mask(token_ids)
        bias = (1.0 - paddle.cast(mask, "float32")).unsqueeze([1, 2]) * -1e4
        x = self.embeddings(token_ids, segment_ids, self.task_id)
        for layer in self.layers:
            x = layer(x, bias)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return {"sequence": x, "pooled": paddle.tanh(self.pooler(x[:, 0]))}
