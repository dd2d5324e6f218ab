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
import math

import paddle
import paddle.nn.functional as F
from paddle import nn

from mtl.backbones.text import TextBackbone, constant_ids
from mtl.errors import ConfigError
from mtl.registry import register_backbone

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


@register_backbone("bert")
class Bert(TextBackbone):
    """BERT/ERNIE encoder; outputs ``sequence`` [B, T, hidden] and ``pooled`` [B, hidden] (the tanh pooler).

    Parameters:
        vocab_size (int): rows of the word embedding table (default: the tokenizer's number of pieces; may be larger,
            as a checkpoint's padded table is, never smaller)
        hidden_size (int): width of the embeddings and of every layer's states: the width of the sequence and pooled
            outputs; a multiple of num_heads
        num_layers (int): transformer encoder layers
        num_heads (int): attention heads of each layer (each of hidden_size / num_heads dimensions)
        intermediate_size (int): width of the inner layer of each feed-forward block
        max_position (int): rows of the position embedding table: the most pieces an input may have (the readers'
            max_length must not exceed it)
        type_vocab_size (int): rows of the segment embedding table (segment ids 0 and 1 of a text pair need 2)
        task_type_vocab_size (int): rows of ERNIE 3.0's task-type embedding table, whose row task_id is added at
            every position; 0: no task-type embedding (BERT, ERNIE 1.0/2.0)
        task_id (int): the task-type embedding row added at every position (0 to task_type_vocab_size - 1; unused
            when task_type_vocab_size is 0)
        activation (str): the feed-forward activation: gelu (exact, erf; BERT, ERNIE 2.0/3.0) or relu (ERNIE 1.0)
        layer_norm_eps (float): epsilon of every LayerNorm (added to the variance)
        dropout (float): dropout probability of the embeddings and of the attention and feed-forward outputs of each
            layer (before their residual sums)
        attention_dropout (float): dropout probability of the attention weights (after the softmax)
        pre_norm (bool): LayerNorm before each attention and feed-forward block and a final LayerNorm (Xiong et al.,
            2020); false: after the residual sums, as BERT and ERNIE
        weights (str): a checkpoint loaded into the encoder by name at construction: a Hugging Face BERT
            model.safetensors or pytorch_model.bin (.bin, .pt, .pth), or a PaddleNLP ERNIE .pdparams; every tensor
            of the encoder must be there with its shape, tensors of other parts (e.g. a pre-training head) are left
            out (default: none, random initialisation; a relative path is taken from the job config's folder when
            it is there)
    """

    def __init__(self, tokenizer=None, vocab_size=None, hidden_size=768, num_layers=12, num_heads=12,
                 intermediate_size=3072, max_position=512, type_vocab_size=2, task_type_vocab_size=0, task_id=0,
                 activation="gelu", layer_norm_eps=1e-12, dropout=0.1, attention_dropout=0.1, pre_norm=False,
                 weights=None, lowercase=None):
        super().__init__()
        tok = self.set_tokenizer(tokenizer, lowercase)
        vocab = int(vocab_size or tok.vocab_size)
        if vocab < tok.vocab_size:
            raise ConfigError(f"vocab_size {vocab} is smaller than the tokenizer's {tok.vocab_size} pieces",
                              key="vocab_size")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}",
                              key="activation")
        if int(hidden_size) % int(num_heads):
            raise ConfigError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}",
                              key="num_heads")
        self.feature_size, self.task_id, self.pre_norm = int(hidden_size), int(task_id), bool(pre_norm)
        self.embeddings = Embeddings(vocab, self.feature_size, int(max_position), int(type_vocab_size),
                                     int(task_type_vocab_size), float(layer_norm_eps), float(dropout), tok.pad_id)
        self.layers = nn.LayerList([EncoderLayer(self.feature_size, int(num_heads), int(intermediate_size),
                                                 float(layer_norm_eps), float(dropout), float(attention_dropout),
                                                 activation, self.pre_norm) for _ in range(int(num_layers))])
        self.final_norm = nn.LayerNorm(self.feature_size, epsilon=float(layer_norm_eps)) if self.pre_norm else None
        self.pooler = nn.Linear(self.feature_size, self.feature_size)
        if weights:
            self.load_weights(weights)

    def input_embeddings(self):
        """The word embedding matrix [V, hidden]."""
        return self.embeddings.word_embeddings.weight

    def load_weights(self, path):
        """Load a Hugging Face BERT or PaddleNLP ERNIE checkpoint by name (:mod:`mtl.convert.bert`)."""
        from mtl.convert.bert import map_bert_tensors, read_checkpoint

        tensors = map_bert_tensors(read_checkpoint(path), path)
        own = self.state_dict()
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise ConfigError(f"weights '{path}' lack {len(missing)} tensor(s) of this encoder, e.g. {missing[:3]} "
                              "(check num_layers, task_type_vocab_size, pre_norm)", key="weights")
        for name, value in tensors.items():
            if name in own and tuple(value.shape) != tuple(own[name].shape):
                raise ConfigError(f"weights '{path}': '{name}' has shape {list(value.shape)}, this encoder expects "
                                  f"{list(own[name].shape)}", key="weights")
        self.set_state_dict({k: v.astype("float32") for k, v in tensors.items() if k in own})

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
