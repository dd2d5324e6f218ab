"""Words to subword pieces and back: the documented label rule, and what happens to a sentence that is too long.

A sentence of words becomes ``[CLS] pieces(w_1) ... pieces(w_n) [SEP]``; ``word_index[k]`` is the position of word
k's first piece (position 0, ``[CLS]``, stands for the root of a dependency tree).

Label rule (``first``, as jiant does): a word's label sits on its first piece; the other pieces carry no label
(ignored by the loss), and the prediction of a word is read at its first piece. The ``all`` rule (PaddlePALM's) gives
every piece of a word its label (a ``B-X`` word's later pieces get ``I-X``, so the pieces form one entity); reading
back takes the first piece, so word -> pieces -> word returns the labels under either rule.

Too long (more than ``max_length`` pieces with the two special tokens), per reader parameter ``too_long``:
``error`` (the default: a DataError naming the sentence and both lengths), ``split`` (the sentence is cut between
words into consecutive parts that each fit, every word keeping its label; not for trees, whose arcs would cross the
cut), or ``skip`` (left out of the training split, counted and reported once; refused for an evaluation split, whose
scores would silently lose words). Labels are never cut.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtl.core.errors import ConfigError, DataError

IGNORE = -1  # label of a position that has no label (padding, a word's later pieces, an unmasked piece)
TOO_LONG = ("error", "split", "skip")


def encode_words(tokenizer, words: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """(``[CLS] pieces [SEP]`` ids, first-piece position of every word) of one sentence."""
    pieces, starts = tokenizer.encode_words(words)
    ids = np.concatenate([[tokenizer.cls_id], pieces, [tokenizer.sep_id]]).astype(np.int64)
    return ids, (starts + 1).astype(np.int64)


def word_labels_to_pieces(labels, word_index, length: int, rule: str = "first",
                          continuation: Optional[Dict[int, int]] = None) -> np.ndarray:
    """Piece labels [length] from word labels [W] (``IGNORE`` where a piece has none).

    ``first``: only each word's first piece; ``all``: every piece of the word, where ``continuation`` maps a label
    to the one its later pieces take (``B-X`` -> ``I-X`` for IOB2 tags; missing: the same label)."""
    labels, word_index = np.asarray(labels, np.int64), np.asarray(word_index, np.int64)
    out = np.full(length, IGNORE, np.int64)
    if rule == "first":
        out[word_index] = labels
        return out
    if rule != "all":
        raise ValueError(f"label rule must be 'first' or 'all', got {rule!r}")
    ends = np.append(word_index[1:], length - 1)  # the last word ends before [SEP]
    for label, start, end in zip(labels, word_index, ends):
        out[start] = label
        later = (continuation or {}).get(int(label), int(label))
        out[start + 1:end] = later
    return out


def piece_labels_to_words(piece_labels, word_index) -> np.ndarray:
    """Word labels [W]: each word's label (or prediction) read at its first piece (either rule)."""
    return np.asarray(piece_labels)[np.asarray(word_index, np.int64)]


def check_too_long(policy: str, split: str, can_split: bool, key="too_long"):
    """A ConfigError for a ``too_long`` policy the reader cannot apply to this split."""
    if policy not in TOO_LONG:
        raise ConfigError(f"too_long must be one of {', '.join(TOO_LONG)}, got {policy!r}", key=key)
    if policy == "split" and not can_split:
        raise ConfigError("too_long: split cuts sentences between words, which a dependency tree does not survive "
                          "(arcs would cross the cut); use error or skip, or a larger max_length", key=key)
    if policy == "skip" and split != "train":
        raise ConfigError("too_long: skip applies to a training split only: an evaluation split would lose words "
                          "from its scores; raise max_length for evaluation instead", key=key)


def word_parts(tokenizer, words: Sequence[str], max_length: int) -> List[Tuple[int, int]]:
    """Consecutive word ranges ``[a, b)`` that each fit in ``max_length`` pieces (with ``[CLS]`` and ``[SEP]``),
    cut greedily between words; a DataError when one word alone does not fit."""
    pieces, starts = tokenizer.encode_words(words)
    ends = np.append(starts[1:], len(pieces))
    parts, begin, used = [], 0, 0
    for k, (s, e) in enumerate(zip(starts, ends)):
        size = int(e - s)
        if size + 2 > max_length:
            raise DataError(f"word {k + 1} ({words[k]!r}) alone has {size} pieces, more than max_length "
                            f"{max_length} allows with [CLS] and [SEP]")
        if used + size + 2 > max_length:
            parts.append((begin, k))
            begin, used = k, 0
        used += size
    parts.append((begin, len(words)))
    return parts
