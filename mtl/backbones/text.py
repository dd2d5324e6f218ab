"""Base of the text encoders: token ids in, sequence features and a pooled vector out.

Inputs: ``token_ids`` [T] (padded with the tokenizer's ``[PAD]``) and ``segment_ids`` [T] (0/1, padded with 0); the
padding mask is ``token_ids != [PAD]``. ``forward`` returns ``{"sequence": [B, T, D], "pooled": [B, D]}``; heads name
the one they read (``Head.reads``), and heads that name none (``softmax``, ``multilabel``, ...) get ``pooled``.
The tokenizer (``tokenizer``: a ``tokenizer.json`` or a BERT/ERNIE ``vocab.txt``) belongs to the encoder: readers get
it from the job, the run folder and every export keep a copy (``tokenizer.json``), and a run read back uses that copy.
"""
import os

import paddle

from mtl.backbones.base import Backbone
from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.text.tokenizer import TextTokenizer

TOKENIZER_FILE = "tokenizer.json"


class TextBackbone(Backbone):
    """A text encoder with its tokenizer; subclasses build ``embed`` layers and ``encode``.

    Parameters:
        tokenizer (str): the encoder's tokenizer (required, but for text_bilstm with word_vectors, whose words
            are then its vocabulary), a tokenizer.json (made by mtl tokenizer train) or a BERT/ERNIE vocab.txt (a
            relative path is taken from the job config's folder when it is there); the readers of every text task
            get it from the job
        lowercase (bool): for a vocab.txt only: lowercase the text (and strip its accents) before WordPiece, as the
            model was trained (true for an uncased model; default false); a tokenizer.json keeps its own
            normaliser, and setting lowercase with one is an error
    """

    default_output = "pooled"

    def set_tokenizer(self, tokenizer, lowercase=None):
        """Load the tokenizer (a path, or a :class:`TextTokenizer`)."""
        if isinstance(tokenizer, TextTokenizer):
            self.tokenizer = tokenizer
        elif isinstance(tokenizer, str):
            self.tokenizer = TextTokenizer.from_file(tokenizer, lowercase)
        else:
            raise ConfigError("a text encoder needs 'tokenizer': a tokenizer.json (mtl tokenizer train) or a "
                              "BERT/ERNIE vocab.txt", key="tokenizer")
        return self.tokenizer

    def input_fields(self):
        """``token_ids`` and ``segment_ids`` [T] int64."""
        return [Field("token_ids", (None,), "int64", pad=self.tokenizer.pad_id),
                Field("segment_ids", (None,), "int64", pad=0)]

    def output_fields(self):
        """``sequence`` [T, D] and ``pooled`` [D]."""
        return {"sequence": Field("sequence", (None, self.feature_size)),
                "pooled": Field("pooled", (self.feature_size,))}

    def padding_mask(self, token_ids):
        """[B, T] bool: True on real pieces."""
        return token_ids != self.tokenizer.pad_id

    def save_assets(self, folder):
        """Write ``tokenizer.json`` into ``folder``."""
        self.tokenizer.save(os.path.join(folder, TOKENIZER_FILE))

    @classmethod
    def run_config(cls, config, folder):
        """The config with ``tokenizer`` pointing at the copy in ``folder`` (when it is there)."""
        path = os.path.join(folder, TOKENIZER_FILE)
        if not os.path.isfile(path):
            return config
        return {k: v for k, v in dict(config, tokenizer=path).items() if k != "lowercase"}


def masked_mean(values, mask):
    """Mean over the True positions of ``mask`` [B, T] of ``values`` [B, T, D]."""
    weights = paddle.cast(mask, values.dtype).unsqueeze(-1)
    return (values * weights).sum(axis=1) / paddle.clip(weights.sum(axis=1), min=1.0)


def fill_where(keep, values, fill: float):
    """``values`` where ``keep`` is True, ``fill`` elsewhere (``keep`` broadcast against ``values``), as
    ``values * keep + fill * (1 - keep)``: exactly ``values`` where kept (``fill * 0`` adds a zero), exactly ``fill``
    elsewhere (the values are finite), and the same gradient as ``where``.

    Not ``paddle.full_like``, nor ``where`` with a broadcast operand (which calls ``zeros_like`` in a static graph):
    under ``paddle.jit.to_static`` (``mtl export``) both read the tensor's ``place``, which Paddle 3.3's PIR graph
    does not have, and warned ("Tensor do not have 'place' interface for pir graph mode") on every text export."""
    keep = paddle.cast(keep, values.dtype)
    return values * keep + fill * (1.0 - keep)


def constant_ids(ids, value: int):
    """An int tensor shaped like ``ids`` holding ``value`` everywhere (``ids * 0 + value``: exact for integers, and
    no ``full_like``, see :func:`fill_where`)."""
    return ids * 0 + int(value)


def masked_max(values, mask):
    """Maximum over the True positions of ``mask`` [B, T] of ``values`` [B, T, D].

    Taken as the values at the argmax positions (``take_along_axis``): Paddle 3.3's CPU backward of ``max(axis=1)``
    took 1.6 s at [88, 60, 256] and 26 s at [88, 200, 256]; the gather's backward (a scatter) takes milliseconds
    and gives the same gradient (all of it to the maximum; ties go to the first position)."""
    with paddle.no_grad():
        where = paddle.argmax(fill_where(mask.unsqueeze(-1), values, -1e4), axis=1, keepdim=True)
    return paddle.take_along_axis(values, where, axis=1).squeeze(1)
