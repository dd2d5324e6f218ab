"""Shared part of the text readers: the tokenizer, the split's file, label vocabularies, too-long sentences.

Every text sample holds ``token_ids`` ``[T]`` (``[CLS] ... [SEP]``, padded with ``[PAD]``) and ``segment_ids`` ``[T]``
(0 for the first text, 1 for a second one; padded with 0). Word-level samples add ``word_index`` ``[W]`` (the first
piece of every word, :mod:`mtl.text.words`; padded with 0) and their labels ``[W]`` (padded with -1: no label).
A reader's label vocabulary comes from its training file ``path`` whatever the split, so the evaluation split
(``eval_path``) numbers its labels alike; an evaluation label never seen in training gets the id ``num_classes``,
which no head predicts: it counts as an error, as it would for any system trained on that file.
"""
import os
import sys
from typing import Dict, List, Sequence

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError
from mtl.readers.base import MissingFile, Reader
from mtl.text.tokenizer import TextTokenizer
from mtl.text.words import IGNORE, encode_words, word_parts


def text_tokenizer(tokenizer) -> TextTokenizer:
    """The reader's tokenizer: the backbone's (given by the job), or a file path (tests, tools)."""
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if isinstance(tokenizer, str):
        return TextTokenizer.from_file(tokenizer)
    raise ConfigError("a text reader needs a tokenizer: use a text backbone (its tokenizer is given to every reader) "
                      "or set the reader's 'tokenizer' to a tokenizer.json / vocab.txt", key="tokenizer")


def split_file(path, eval_path, split) -> str:
    """The file a split reads: ``path`` for training, ``eval_path`` for ``split: eval``; checked to exist."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split must be 'train' or 'eval', got {split!r}", key="split")
    if split == "eval" and not eval_path:
        raise ConfigError("split 'eval' needs 'eval_path' (the evaluation file)", key="eval_path")
    chosen = eval_path if split == "eval" else path
    if not os.path.isfile(str(chosen)):
        raise MissingFile(chosen, "text file", key="eval_path" if split == "eval" else "path")
    return str(chosen)


class Vocabulary:
    """Label names -> ids, in a fixed order (sorted, ``first`` names ahead); unseen names get ``len(names)``."""

    def __init__(self, names, first=()):
        names = set(names)
        ordered = [n for n in first if n in names] + sorted(names - set(first))
        self.names = ordered
        self._ids = {n: i for i, n in enumerate(ordered)}
        self.unseen = 0

    def __len__(self):
        return len(self.names)

    def ids(self, labels: Sequence[str]) -> np.ndarray:
        """The ids of ``labels`` (``len(self)`` for a label the training file never had, counted in ``unseen``)."""
        out = np.array([self._ids.get(label, len(self.names)) for label in labels], np.int64)
        self.unseen += int((out == len(self.names)).sum())
        return out


class TextReader(Reader):
    """Base of the text readers: samples precomputed as dicts of arrays, their lengths, the text fields.

    Parameters:
        path (str): the training file: the samples of split: train (a reader with label classes also takes its
            label vocabulary from it for either split, so that both splits number their labels alike)
        eval_path (str): the evaluation file, read for split: eval (required then)
        max_length (int): most pieces of one sample (of each row of token_ids), [CLS] and [SEP] included; at least
            3
    """

    num_classes = None

    def _setup(self, tokenizer, max_length):
        self.tokenizer = text_tokenizer(tokenizer)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
            raise ConfigError(f"max_length must be an integer >= 3 (pieces with [CLS] and [SEP]), got "
                              f"{max_length!r}", key="max_length")
        self.max_length = int(max_length)
        self._samples: List[Dict[str, np.ndarray]] = []
        self.skipped = 0

    def text_fields(self, grouped: int = 0) -> List[Field]:
        """``token_ids`` and ``segment_ids`` (``[K, T]`` for groups of K texts)."""
        shape = (grouped, None) if grouped else (None,)
        return [Field("token_ids", shape, "int64", pad=self.tokenizer.pad_id),
                Field("segment_ids", shape, "int64", pad=0)]

    @staticmethod
    def word_fields(*label_names) -> List[Field]:
        """``word_index`` and word-level label fields (padded with -1)."""
        return [Field("word_index", (None,), "int64", pad=0)] + \
            [Field(name, (None,), "int64", pad=IGNORE) for name in label_names]

    def __len__(self):
        return len(self._samples)

    def __getitem__(self, index):
        return self._samples[int(index)]

    def lengths(self):
        """Pieces per sample (the last axis of ``token_ids``)."""
        return np.array([s["token_ids"].shape[-1] for s in self._samples], np.int64)

    @property
    def bad_samples(self) -> int:
        """Sentences left out of the training split because they were too long (``too_long: skip``)."""
        return self.skipped

    def text_spec(self, units: str, **extra) -> dict:
        """The ``input_spec`` of a text reader (what ``mtl predict`` makes of new text,
        :mod:`mtl.serving.prediction_text`):
        ``units`` is what one sample is made of (``words``: a sentence of words; ``text``: one text; ``pair``: two
        texts; ``pairwise``: a text and two candidates; ``question``: a question and its context), with the reader's
        ``max_length``, its sizes (the head's class count) and ``extra``: ``labels`` (for words: one per ``words``,
        a ``tree``, or one per ``sentence``) and where the labels sit in a file (``conllu_column``, ``iob2``)."""
        return {"kind": "text", "units": units, "max_length": self.max_length,
                "sizes": {k: v for k, v in self.sizes().items() if v is not None}, **extra}


class WordReader(TextReader):
    """Base of readers of sentences of words with word-level (or sentence-level) labels.

    Parameters:
        max_length (int): most pieces of a sentence (a sample), [CLS] and [SEP] included; at least 3
        too_long (str): what a sentence of more than max_length pieces does: error (a data error naming it), split
            (cut between words into consecutive parts that each fit, every word keeping its tag; word-level tags
            only) or skip (left out, counted and reported; training split only)
    """

    counts_skipped = True

    def _add_words(self, words, labels: Dict[str, np.ndarray], extra: Dict[str, np.ndarray], where: str,
                   policy: str):
        """Encode one sentence and add it as a sample (or as parts, or skip it) by the ``too_long`` policy."""
        ids, starts = encode_words(self.tokenizer, words)
        if len(ids) <= self.max_length:
            self._samples.append(self._sample(ids, starts, labels, extra))
            return
        if policy == "error":
            raise DataError(f"{where} has {len(ids)} pieces with [CLS] and [SEP], more than max_length "
                            f"{self.max_length}; raise max_length, or set too_long: split (tags) or skip (training)")
        if policy == "skip":
            self.skipped += 1
            return
        try:
            parts = word_parts(self.tokenizer, words, self.max_length)
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
        for a, b in parts:
            ids, starts = encode_words(self.tokenizer, words[a:b])
            self._samples.append(self._sample(ids, starts, {k: v[a:b] for k, v in labels.items()}, extra))

    @staticmethod
    def _sample(ids, starts, labels, extra):
        sample = {"token_ids": ids, "segment_ids": np.zeros_like(ids)}
        if labels:  # word-level labels: where each word starts
            sample["word_index"] = starts
        sample.update(labels)
        sample.update(extra)
        return sample

    def _report_skipped(self, path):
        if self.skipped:
            print(f"warning: reader '{self.registered_name}': {self.skipped} sentence(s) of '{path}' are longer than "
                  f"max_length {self.max_length} and were left out of training (too_long: skip)", file=sys.stderr,
                  flush=True)
