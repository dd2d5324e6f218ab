"""The subword tokenizer of a text backbone: Hugging Face ``tokenizers`` WordPiece, trained offline or read from a
BERT/ERNIE ``vocab.txt``.

One :class:`TextTokenizer` belongs to the backbone (``backbone.tokenizer``); readers receive it from the job
(``mtl.train.job.reader_context``) so that every task of a job tokenises alike, and the run folder and every export
keep a copy (``tokenizer.json``), so that a run read back later tokenises exactly as training did.

Normalisation and pre-tokenisation are BERT's (``BertNormalizer``: clean control characters, separate CJK characters,
lowercase only when asked; ``BertPreTokenizer``: split at whitespace and punctuation), then greedy longest-match-first
WordPiece with ``##`` continuation pieces; a word of more than ``max_input_chars_per_word`` characters becomes
``[UNK]``. Special tokens: ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (the first five ids of a trained vocabulary).
"""
import json
import os
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from mtl.core.errors import ConfigError, DataError
from mtl.core.utf8 import open_utf8

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - a pinned requirement
        raise ConfigError("text tasks need the 'tokenizers' package (pip install -r requirements.txt)") from None
    return tokenizers


def _bert_pipeline(model, lowercase: bool):
    """A ``tokenizers.Tokenizer`` around ``model`` with BERT's normaliser, pre-tokeniser and decoder."""
    tk = _tokenizers()
    tokenizer = tk.Tokenizer(model)
    tokenizer.normalizer = tk.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                         strip_accents=None, lowercase=bool(lowercase))
    tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = tk.decoders.WordPiece(prefix="##")
    return tokenizer


class TextTokenizer:
    """A WordPiece tokenizer with the ids of its special tokens; picklable (DataLoader workers get a copy).

    ``encode_words(words)``: the pieces of pre-split words (a treebank's) and where each word starts;
    ``encode_text(text)``: the pieces of raw text; ``to_json()`` / :meth:`from_file`: the saved form.
    """

    def __init__(self, tokenizer, source: str = "<tokenizer>"):
        # a checkpoint's tokenizer.json may fix a truncation and a padding (sentence-transformers' MiniLM: 128 of
        # each): pieces past it would be cut silently and their words' labels lost; the readers cut and pad instead
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.source = source
        vocab = tokenizer.get_vocab()
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise ConfigError(f"tokenizer '{source}' lacks the special token(s) {missing}; its vocabulary must hold "
                              f"{' '.join(SPECIAL_TOKENS)}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (vocab[t] for t in SPECIAL_TOKENS)
        self.vocab_size = tokenizer.get_vocab_size()
        self.special_ids = frozenset(vocab[t] for t in SPECIAL_TOKENS)

    # ---- building --------------------------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str, lowercase: Optional[bool] = None) -> "TextTokenizer":
        """A ``tokenizer.json`` (saved by :meth:`save` or by ``tokenizers``) or a BERT/ERNIE ``vocab.txt`` (one piece
        per line, ids in line order; ``lowercase`` as the model was trained, default False)."""
        if not os.path.isfile(path):
            raise ConfigError(f"tokenizer file '{path}' does not exist (train one with `mtl tokenizer train`, or give "
                              "a BERT/ERNIE vocab.txt)", key="tokenizer")
        try:  # the file is the config's value: its faults name the key
            if path.endswith(".txt"):
                return cls.from_vocab(read_vocab(path), bool(lowercase), source=path)
            with open_utf8(path, "tokenizer file") as f:
                text = f.read()
        except DataError as exc:
            raise ConfigError(str(exc), key="tokenizer") from None
        if lowercase is not None:
            raise ConfigError(f"tokenizer '{path}': 'lowercase' applies to a vocab.txt only (a tokenizer.json keeps "
                              "its own normaliser)", key="lowercase")
        try:
            return cls(_tokenizers().Tokenizer.from_str(text), source=path)
        except Exception as exc:  # noqa: BLE001 - the Rust side raises assorted exceptions for a bad file
            raise ConfigError(f"tokenizer file '{path}' is not a tokenizers JSON file: {exc}", key="tokenizer") \
                from None

    @classmethod
    def from_vocab(cls, vocab: Sequence[str], lowercase: bool = False, source="<vocab>") -> "TextTokenizer":
        """WordPiece over the pieces ``vocab`` (id = position), with BERT's pipeline."""
        tk = _tokenizers()
        table = {piece: i for i, piece in enumerate(vocab)}
        model = tk.models.WordPiece(table, unk_token="[UNK]", continuing_subword_prefix="##",
                                    max_input_chars_per_word=100)
        return cls(_bert_pipeline(model, lowercase), source=source)

    @classmethod
    def from_words(cls, words: Sequence[str], source="<words>") -> "TextTokenizer":
        """A word-level tokenizer over ``words`` (word vectors' vocabulary, e.g. GloVe's lowercased words): the
        special tokens first, then each word one id; text is lowercased (accents kept) and split at whitespace
        only, so that a treebank's words (``n't``, ``u.s.``) are looked up whole; any other word is ``[UNK]``."""
        tk = _tokenizers()
        table = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
        for word in words:
            table.setdefault(word, len(table))
        tokenizer = tk.Tokenizer(tk.models.WordLevel(table, unk_token="[UNK]"))
        tokenizer.normalizer = tk.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                                             strip_accents=False, lowercase=True)
        tokenizer.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
        return cls(tokenizer, source=source)

    @classmethod
    def from_json(cls, text: str, source="<json>") -> "TextTokenizer":
        """A tokenizer from the text :meth:`to_json` wrote."""
        return cls(_tokenizers().Tokenizer.from_str(text), source=source)

    def to_json(self) -> str:
        """The whole tokenizer (vocabulary, normaliser, pre-tokeniser) as ``tokenizers`` JSON."""
        return self._tokenizer.to_str()

    def save(self, path: str):
        """Write :meth:`to_json` to ``path`` (``tokenizer.json``)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    def __getstate__(self):
        return {"json": self.to_json(), "source": self.source}

    def __setstate__(self, state):
        self.__init__(_tokenizers().Tokenizer.from_str(state["json"]), state["source"])

    # ---- encoding --------------------------------------------------------------------------------------------------
    def vocabulary(self) -> List[str]:
        """Every piece, in id order."""
        table = self._tokenizer.get_vocab()
        out = [""] * self.vocab_size
        for piece, i in table.items():
            out[i] = piece
        return out

    def encode_words(self, words: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """(piece ids [P], first piece of each word [W]) of pre-split ``words``, without special tokens.

        A word that normalises to nothing (only control or zero-width characters) becomes one ``[UNK]``, so that
        every word has a first piece and keeps its label.
        """
        if not words:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        enc = self._tokenizer.encode(list(words), is_pretokenized=True, add_special_tokens=False)
        ids, owners = enc.ids, enc.word_ids
        pieces, starts, k = [], [], 0
        for w in range(len(words)):
            starts.append(len(pieces))
            begin = k
            while k < len(ids) and owners[k] == w:
                pieces.append(ids[k])
                k += 1
            if k == begin:
                pieces.append(self.unk_id)
        return np.asarray(pieces, np.int64), np.asarray(starts, np.int64)

    def split_words(self, text: str) -> List[str]:
        """The words of raw text as the tokenizer's pre-tokeniser splits it (BERT's: at whitespace and around
        punctuation), in their own spelling: how ``mtl predict`` makes a sentence of words of a line of text."""
        pre = self._tokenizer.pre_tokenizer
        if pre is None:
            return text.split()
        return [word for word, _ in pre.pre_tokenize_str(text)]

    def encode_text(self, text: str) -> Tuple[np.ndarray, List[Tuple[int, int]]]:
        """(piece ids [P], character span ``(start, end)`` of each piece in ``text``) of raw text."""
        enc = self._tokenizer.encode(text, add_special_tokens=False)
        return np.asarray(enc.ids, np.int64), [tuple(o) for o in enc.offsets]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of piece ids (``##`` pieces joined to their word), special tokens left out."""
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def read_vocab(path: str) -> List[str]:
    """The pieces of a BERT/ERNIE ``vocab.txt`` (one per line; a line may be ``piece<TAB>count`` as in ERNIE's)."""
    with open_utf8(path, "vocabulary file") as f:
        pieces = [line.rstrip("\n").split("\t")[0] for line in f]
    while pieces and pieces[-1] == "":
        pieces.pop()
    if not pieces:
        raise DataError(f"vocabulary file '{path}' is empty")
    seen = {}
    for number, piece in enumerate(pieces, start=1):
        if piece in seen:
            raise DataError(f"vocabulary file '{path}' line {number}: piece {piece!r} repeats line {seen[piece]}")
        seen[piece] = number
    return pieces


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool = False, min_frequency: int = 2,
                    limit_alphabet: int = 1000) -> TextTokenizer:
    """Train WordPiece on ``texts`` (sentences; words are split as BERT does) with ``tokenizers``' trainer.

    The special tokens come first (ids 0-4); ``min_frequency``: a pair must occur this often to be merged;
    ``limit_alphabet``: at most this many initial characters (the rarest fall back to ``[UNK]``).
    """
    tk = _tokenizers()
    model = tk.models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100)
    tokenizer = _bert_pipeline(model, lowercase)
    trainer = tk.trainers.WordPieceTrainer(vocab_size=int(vocab_size), min_frequency=int(min_frequency),
                                           special_tokens=list(SPECIAL_TOKENS), limit_alphabet=int(limit_alphabet),
                                           continuing_subword_prefix="##", show_progress=False)
    tokenizer.train_from_iterator(list(texts), trainer)
    return TextTokenizer(tokenizer, source="<trained>")


def tokenizer_summary(tokenizer: TextTokenizer) -> str:
    """One line: vocabulary size and the special ids (for the CLI and logs)."""
    return json.dumps({"vocab_size": tokenizer.vocab_size, "pad": tokenizer.pad_id, "unk": tokenizer.unk_id,
                       "cls": tokenizer.cls_id, "sep": tokenizer.sep_id, "mask": tokenizer.mask_id})
