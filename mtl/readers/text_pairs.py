"""Text classification and matching from TSV files (PaddlePALM's task shapes).

A TSV file has a header row naming its columns (tab-separated, one record per line, ``\\t`` never inside a text).
``text_classification``: ``text_a`` [, ``text_b``], ``label`` -> one text or a pair, and a class.
``matching``: pointwise (``text_a``, ``text_b``, ``label``: 1 = the texts match, 0 = not) or pairwise
(``text_a``, ``text_b`` = a matching text, ``text_c`` = one that does not): a pairwise sample is a group of two
rows, ``[CLS] a [SEP] b [SEP]`` and ``[CLS] a [SEP] c [SEP]`` (``token_ids`` [2, T]), the backbone encodes both.
"""
import csv

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError
from mtl.core.registry import register_reader
from mtl.core.utf8 import open_utf8
from mtl.data.padding import pad_stack
from mtl.readers._text import TextReader, Vocabulary, split_file
from mtl.text.pairs import check_policy, encode_pair


def read_tsv(path, columns):
    """``[(line number, {column: cell})]`` of a TSV file with a header; the named columns must be there."""
    with open_utf8(path, "TSV file", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise DataError(f"TSV file '{path}' is empty: expected a header row naming its columns")
    header = [c.strip() for c in rows[0]]
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"TSV file '{path}' has no column {missing[0]!r}; its header names: {', '.join(header)}")
    out = []
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(f"TSV file '{path}' line {number}: {len(row)} cells, the header names {len(header)}")
        out.append((number, dict(zip(header, row))))
    if not out:
        raise DataError(f"TSV file '{path}' has a header but no records")
    return out


class TsvTextReader(TextReader):
    """Shared set-up of the TSV readers: the split's file, its records, the too-long policy.

    Parameters:
        path (str): the training TSV file (a header row names the columns): the records of split: train
        eval_path (str): the evaluation TSV file, read for split: eval (required then)
        max_length (int): most pieces of a text or pair with its special tokens ([CLS] a [SEP] b [SEP]); at least 3
        too_long (str): what a longer record does: error (a data error naming its line) or truncate (pieces dropped
            from the end of the longer text until the record fits; no label is lost)
    """

    def _records(self, path, eval_path, split, tokenizer, max_length, too_long, columns):
        self._setup(tokenizer, max_length)
        check_policy(too_long)
        self.path, self.too_long = str(path), too_long
        chosen = split_file(path, eval_path, split)
        train = read_tsv(self.path, columns)
        return train, (train if chosen == self.path else read_tsv(chosen, columns)), chosen

    def _encode(self, a, b, where):
        return encode_pair(self.tokenizer, a, b, self.max_length, self.too_long, where)


@register_reader("text_classification")
class TextClassificationReader(TsvTextReader):
    """One text or a pair of texts and a class, from a TSV file with columns ``text_a`` [, ``text_b``], ``label``;
    classes sorted (vocabulary of the training file ``path``), the evaluation file ``eval_path``.

    Parameters:
        path (str): the training TSV file (a header row names the columns): the records of split: train, and for
            either split the sorted class vocabulary of its label column
        pair (bool): each record is a pair of texts (columns text_a, text_b: [CLS] a [SEP] b [SEP], segments 0 then
            1); false: one text (text_a)
    """

    def __init__(self, path, eval_path=None, split="train", tokenizer=None, pair=False, max_length=128,
                 too_long="error"):
        columns = ["text_a", "text_b", "label"] if pair else ["text_a", "label"]
        self.pair = bool(pair)
        train, records, chosen = self._records(path, eval_path, split, tokenizer, max_length, too_long, columns)
        self.vocabulary = Vocabulary(r["label"] for _, r in train)
        self.class_names, self.num_classes = self.vocabulary.names, len(self.vocabulary)
        for number, r in records:
            ids, segments = self._encode(r["text_a"], r["text_b"] if pair else None, f"TSV file '{chosen}' line "
                                                                                    f"{number}")
            label = self.vocabulary.ids([r["label"]])[0]
            self._samples.append({"token_ids": ids, "segment_ids": segments, "label": np.int64(label)})

    def fields(self):
        """Text fields and the class ``label``."""
        return self.text_fields() + [Field("label", (), "int64")]

    def input_spec(self):
        """New records are one text (``text_a``) or a pair (``text_a``, ``text_b``)."""
        return self.text_spec("pair" if self.pair else "text")

    def label_names(self):
        """The class names, in id order (sorted)."""
        return {"label": list(self.class_names)}

    def labels(self):
        """Classes of the split, in record order."""
        return np.array([s["label"] for s in self._samples], np.int64)


@register_reader("matching")
class MatchingReader(TsvTextReader):
    """Text matching from a TSV file: ``mode: pointwise`` (``text_a``, ``text_b``, ``label`` 0/1) or
    ``mode: pairwise`` (``text_a``, ``text_b`` matching, ``text_c`` not matching; a group of two rows per sample).

    Parameters:
        mode (str): pointwise (columns text_a, text_b, label: 1 = the texts match, 0 = not; one pair per sample) or
            pairwise (text_a, text_b that matches it, text_c that does not; a sample is the two pairs a-b and a-c,
            token_ids [2, T], the matching one first)
    """

    def __init__(self, path, mode="pointwise", eval_path=None, split="train", tokenizer=None, max_length=128,
                 too_long="error"):
        if mode not in ("pointwise", "pairwise"):
            raise ConfigError(f"mode must be pointwise or pairwise, got {mode!r}", key="mode")
        self.mode = mode
        columns = ["text_a", "text_b", "label"] if mode == "pointwise" else ["text_a", "text_b", "text_c"]
        _, records, chosen = self._records(path, eval_path, split, tokenizer, max_length, too_long, columns)
        self.num_classes = 2 if mode == "pointwise" else None
        for number, r in records:
            where = f"TSV file '{chosen}' line {number}"
            if mode == "pointwise":
                if r["label"].strip() not in ("0", "1"):
                    raise DataError(f"{where}: label {r['label']!r} must be 1 (the texts match) or 0")
                ids, segments = self._encode(r["text_a"], r["text_b"], where)
                self._samples.append({"token_ids": ids, "segment_ids": segments,
                                      "label": np.int64(int(r["label"]))})
                continue
            pos, neg = self._encode(r["text_a"], r["text_b"], where), self._encode(r["text_a"], r["text_c"], where)
            self._samples.append({"token_ids": pad_stack([pos[0], neg[0]], self.tokenizer.pad_id),
                                  "segment_ids": pad_stack([pos[1], neg[1]], 0), "label": np.int64(0)})

    def fields(self):
        """Text fields (pairwise: of two rows ``[2, T]``) and ``label``: 1 = the texts match (pointwise), or the row
        of the group that matches (pairwise: always 0, the positive comes first)."""
        return self.text_fields(grouped=0 if self.mode == "pointwise" else 2) + [Field("label", (), "int64")]

    def input_spec(self):
        """New records are pairs of texts (``text_a``, ``text_b``; pairwise also ``text_c``)."""
        return self.text_spec("pair" if self.mode == "pointwise" else "pairwise")

    def label_names(self):
        """Pointwise: ``0`` (no match) and ``1`` (match)."""
        return {"label": ["0", "1"]} if self.mode == "pointwise" else {}

    def labels(self):
        """The labels of the split (pointwise: 1 = match; pairwise: 0, the matching row)."""
        return np.array([s["label"] for s in self._samples], np.int64)


