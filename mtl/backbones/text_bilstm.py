"""A small text encoder that trains well from scratch on a CPU: piece embeddings (optionally character-aware) and a
bidirectional LSTM (Hochreiter & Schmidhuber, 1997; the tagger of Plank et al., 2016, and the parser encoder of
Kiperwasser & Goldberg, 2016 and Dozat & Manning, 2017).

``e_t = E[x_t] (+ S[s_t]) (+ CharCNN(chars of piece x_t))``, dropout, then ``num_layers`` BiLSTM layers (dropout
between them); ``sequence = [h_fwd; h_bwd]`` [B, T, 2H], ``pooled`` = the masked maximum over positions (``pooling:
max``), the masked mean (``mean``) or position 0 (``first``, [CLS]). Padding never reaches a state: the LSTM runs over
each text's own length (``sequence_length``). ``word_dropout``: in training a piece is replaced by ``[UNK]`` with this
probability (Kiperwasser & Goldberg's word dropout, so the model learns a use for ``[UNK]``).
The character-aware part (``char_size`` > 0) embeds the characters of each vocabulary piece (``##`` dropped), a width-3
convolution and a maximum over characters: pieces that share spelling share evidence.
``word_vectors`` (``backbone.pretrained: glove``) starts the piece embeddings from pretrained word vectors
(:mod:`mtl.text.word_vectors`), frozen or tuned (``freeze_vectors``); without a ``tokenizer`` the vocabulary is the
vectors' words, one piece a word (:meth:`mtl.text.tokenizer.TextTokenizer.from_words`).
"""
import json
import os

import numpy as np
import paddle
from paddle import nn

from mtl.backbones.text import TextBackbone, fill_where, masked_max, masked_mean
from mtl.core.arrays import tensor_from
from mtl.core.errors import ConfigError
from mtl.core.registry import register_backbone
from mtl.text.tokenizer import TextTokenizer
from mtl.text.word_vectors import initial_embeddings, read_word_vectors

ENCODER_FILE = "encoder.json"  # the embedding width a run keeps (word vectors may have set it)

POOLING = ("max", "mean", "first")


def character_table(vocabulary, max_chars: int):
    """([V, max_chars] int64 character ids of every piece, 0 = padding; number of character ids)."""
    alphabet = {}
    table = np.zeros((len(vocabulary), max_chars), np.int64)
    for i, piece in enumerate(vocabulary):
        text = piece[2:] if piece.startswith("##") else piece
        for j, ch in enumerate(text[:max_chars]):
            table[i, j] = alphabet.setdefault(ch, len(alphabet) + 1)
    return table, len(alphabet) + 1


class CharPieces(nn.Layer):
    """Character CNN embedding of vocabulary pieces: computed for the distinct pieces of a batch only."""

    def __init__(self, vocabulary, size: int, max_chars: int = 16):
        super().__init__()
        table, count = character_table(vocabulary, max_chars)
        self.register_buffer("table", paddle.to_tensor(table), persistable=False)
        self.embed = nn.Embedding(count, size, padding_idx=0)
        self.conv = nn.Conv1D(size, size, 3, padding=1)

    def forward(self, token_ids):
        unique, inverse = paddle.unique(token_ids.reshape([-1]), return_inverse=True)
        chars = paddle.gather(self.table, unique)  # [U, L]
        x = self.embed(chars).transpose([0, 2, 1])  # [U, C, L]
        y = paddle.tanh(self.conv(x))
        y = fill_where((chars > 0).unsqueeze(1), y, -1e4).max(axis=2)  # [U, C]
        return paddle.gather(y, inverse.reshape([-1])).reshape(list(token_ids.shape) + [y.shape[-1]])


@register_backbone("text_bilstm")
class TextBiLSTM(TextBackbone):
    """Piece embeddings (+ segments, + optional character CNN) and a BiLSTM; outputs ``sequence`` [B, T, 2H] and
    ``pooled`` [B, 2H].

    Parameters:
        embedding_size (int): width of the piece (and segment) embeddings, the LSTM's input with the character
            features; not the output width, which is 2 x hidden_size (default: 128, or the width of word_vectors)
        hidden_size (int): LSTM state width of each direction: the sequence and pooled outputs are 2 x hidden_size
            wide
        num_layers (int): stacked BiLSTM layers
        dropout (float): dropout probability between the BiLSTM layers (with num_layers > 1) and on the output
            sequence; in [0, 1)
        embedding_dropout (float): dropout probability of the LSTM's input (piece + segment embeddings and character
            features); in [0, 1)
        word_dropout (float): in training, the probability that a piece (special tokens excepted) is replaced by
            [UNK], so that the model learns a use for [UNK]; in [0, 1)
        char_size (int): width of the character CNN features of each piece's spelling (its first 16 characters,
            ``##`` dropped), concatenated to its embedding; 0: no character part
        segments (bool): add a segment embedding (segment id 0 or 1 of a text pair) to the piece embeddings
        pooling (str): the pooled output: max (masked maximum over the pieces), mean (masked mean) or first
            (position 0, [CLS])
        word_vectors (str): a folder of pretrained word vectors (vectors.npy and words.txt; backbone.pretrained:
            glove gives the cache's) that start the piece embeddings: a piece that is one of its words gets its
            vector; without a tokenizer, the vocabulary is its words (lowercased, split at whitespace), and
            embedding_size is the vectors' width (default: none, random embeddings)
        max_words (int): keep the first max_words words of word_vectors (GloVe's are sorted by frequency; default:
            all)
        freeze_vectors (bool): the piece embeddings from word_vectors do not train (no gradient, no update)
    """

    pretrained_kind = "word_vectors"

    @classmethod
    def pretrained_options(cls, folder):
        """``{"word_vectors": folder}``: the vectors start the piece embeddings (``backbone.pretrained: glove``)."""
        return {"word_vectors": folder}

    def __init__(self, tokenizer=None, embedding_size=None, hidden_size=128, num_layers=2, dropout=0.33,
                 embedding_dropout=0.33, word_dropout=0.0, char_size=0, segments=True, pooling="max",
                 lowercase=None, word_vectors=None, max_words=None, freeze_vectors=False):
        super().__init__()
        vectors = self._read_vectors(word_vectors, max_words, embedding_size)
        if tokenizer is None and vectors is not None:
            tokenizer = TextTokenizer.from_words(vectors[0], source=os.path.join(word_vectors, "words.txt"))
        embedding_size = vectors[1].shape[1] if vectors is not None else int(embedding_size or 128)
        tok = self.set_tokenizer(tokenizer, lowercase)
        if pooling not in POOLING:
            raise ValueError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}")
        for name, value in (("dropout", dropout), ("embedding_dropout", embedding_dropout),
                            ("word_dropout", word_dropout)):
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        self.pooling, self.word_dropout = pooling, float(word_dropout)
        self.feature_size = 2 * int(hidden_size)
        self.word_embeddings = nn.Embedding(tok.vocab_size, int(embedding_size), padding_idx=tok.pad_id)
        self.segment_embeddings = nn.Embedding(2, int(embedding_size)) if segments else None
        self.chars = CharPieces(tok.vocabulary(), int(char_size)) if char_size else None
        width = int(embedding_size) + int(char_size)
        self.embedding_dropout = nn.Dropout(float(embedding_dropout))
        self.lstm = nn.LSTM(width, int(hidden_size), num_layers=int(num_layers), direction="bidirect",
                            dropout=float(dropout) if int(num_layers) > 1 else 0.0)
        self.output_dropout = nn.Dropout(float(dropout))
        self.embedding_size = int(embedding_size)
        if vectors is not None:
            table, self.vectors_found = initial_embeddings(tok.vocabulary(), *vectors, tok.pad_id)
            self.word_embeddings.weight.set_value(table)
            self.word_embeddings.weight.stop_gradient = bool(freeze_vectors)

    @staticmethod
    def _read_vectors(folder, max_words, embedding_size):
        """(words, vectors) of ``word_vectors``, or None; an embedding_size other than the vectors' is refused."""
        if not folder:
            return None
        words, vectors = read_word_vectors(folder, max_words)
        if embedding_size is not None and int(embedding_size) != vectors.shape[1]:
            raise ConfigError(f"embedding_size {embedding_size} differs from the width {vectors.shape[1]} of the "
                              f"word vectors '{folder}': leave embedding_size out", key="embedding_size")
        return words, vectors

    def save_assets(self, folder):
        """``tokenizer.json`` and ``encoder.json`` (the embedding width, which word vectors may have set)."""
        super().save_assets(folder)
        with open(os.path.join(folder, ENCODER_FILE), "w") as f:
            json.dump({"embedding_size": self.embedding_size}, f)

    @classmethod
    def run_config(cls, config, folder):
        """The encoder of a run read back: its tokenizer copy, its embedding width, no word vectors (its weights
        come from the run)."""
        config = {k: v for k, v in super().run_config(config, folder).items()
                  if k not in ("word_vectors", "max_words", "freeze_vectors")}
        path = os.path.join(folder, ENCODER_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                config.update(json.load(f))
        return config

    def input_embeddings(self):
        """The piece embedding matrix [V, embedding_size]."""
        return self.word_embeddings.weight

    def _embed(self, token_ids, segment_ids):
        ids = token_ids
        if self.training and self.word_dropout > 0:
            drop = paddle.rand(ids.shape) < self.word_dropout
            keep = tensor_from(sorted(self.tokenizer.special_ids), dtype="int64").astype(ids.dtype)  # (no leak)
            drop = drop & ~paddle.isin(ids, keep)
            ids = paddle.where(drop, paddle.full_like(ids, self.tokenizer.unk_id), ids)
        x = self.word_embeddings(ids)
        if self.segment_embeddings is not None:
            x = x + self.segment_embeddings(segment_ids)
        if self.chars is not None:
            x = paddle.concat([x, self.chars(ids)], axis=-1)
        return self.embedding_dropout(x)

    def forward(self, inputs):
        """``{"sequence": [B, T, 2H], "pooled": [B, 2H]}``."""
        token_ids, segment_ids = inputs["token_ids"], inputs["segment_ids"]
        mask = self.padding_mask(token_ids)
        lengths = paddle.cast(mask, "int64").sum(axis=1)
        sequence, _ = self.lstm(self._embed(token_ids, segment_ids), sequence_length=lengths)
        sequence = self.output_dropout(sequence)
        if self.pooling == "max":
            pooled = masked_max(sequence, mask)
        elif self.pooling == "mean":
            pooled = masked_mean(sequence, mask)
        else:
            pooled = sequence[:, 0]
        return {"sequence": sequence, "pooled": pooled}
