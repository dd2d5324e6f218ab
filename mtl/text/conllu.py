"""CoNLL-U files (https://universaldependencies.org/format.html) read as UD defines them.

Ten tab-separated columns per line: ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC. A sentence is a block of
comment lines (``# key = value``) and word lines ended by a blank line. Only lines whose ID is an integer are the
syntactic words of the basic tree, numbered 1..n with HEAD in 0..n (0: the root). A multiword token line (``3-4``)
gives the surface form of words 3 and 4 and is kept apart (``Sentence.multiword``); an empty node (``8.1``) belongs
to the enhanced graph only (``Sentence.empty_nodes``) and is not a word. Any other ID, a wrong column count, IDs that
do not run 1..n, or a HEAD outside 0..n is a DataError naming the file and the line.
"""
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from mtl.core.errors import DataError
from mtl.core.utf8 import open_utf8

COLUMNS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
_INTEGER = re.compile(r"^[1-9][0-9]*$")
_RANGE = re.compile(r"^([1-9][0-9]*)-([1-9][0-9]*)$")
_EMPTY = re.compile(r"^(0|[1-9][0-9]*)\.([1-9][0-9]*)$")


@dataclass
class Sentence:
    """One sentence: its comments, its syntactic words column by column, its multiword tokens and empty nodes."""

    comments: Dict[str, str]
    columns: Dict[str, list]
    multiword: List[Tuple[int, int, str]] = field(default_factory=list)  # (first word, last word, surface form)
    empty_nodes: List[List[str]] = field(default_factory=list)
    line: int = 0  # line of the sentence's first line in its file

    @property
    def words(self) -> List[str]:
        """The FORM of every syntactic word."""
        return self.columns["form"]

    @property
    def sent_id(self) -> str:
        """The ``# sent_id`` comment (empty when absent)."""
        return self.comments.get("sent_id", "")

    def __len__(self):
        return len(self.columns["form"])


def _comment(text: str, comments: dict):
    body = text[1:].strip()
    if "=" in body:
        key, value = body.split("=", 1)
        comments.setdefault(key.strip(), value.strip())


def _word_line(path, number, cells, sentence):
    """Add one word line (or a multiword token / empty node) to ``sentence``."""
    if len(cells) != 10:
        raise DataError(f"CoNLL-U file '{path}' line {number}: {len(cells)} tab-separated columns, expected 10 "
                        "(ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC)")
    ident = cells[0]
    span = _RANGE.match(ident)
    if span:
        first, last = int(span.group(1)), int(span.group(2))
        if last <= first:
            raise DataError(f"CoNLL-U file '{path}' line {number}: multiword token range '{ident}' must span at "
                            "least two words")
        sentence.multiword.append((first, last, cells[1]))
        return
    if _EMPTY.match(ident):
        sentence.empty_nodes.append(cells)
        return
    if not _INTEGER.match(ident):
        raise DataError(f"CoNLL-U file '{path}' line {number}: ID {ident!r} is neither a word number, a range (3-4) "
                        "nor an empty node (8.1)")
    expected = len(sentence) + 1
    if int(ident) != expected:
        raise DataError(f"CoNLL-U file '{path}' line {number}: word ID {ident}, expected {expected} (IDs run 1..n)")
    for name, value in zip(COLUMNS[1:], cells[1:]):
        sentence.columns[name].append(value)


def _finish(path, sentence) -> Sentence:
    """Check the heads of a complete sentence and turn them into integers."""
    n = len(sentence)
    heads = []
    for k, value in enumerate(sentence.columns["head"], start=1):
        if value == "_":
            heads.append(-1)  # no basic tree annotated
            continue
        if not value.isdigit() or int(value) > n:
            raise DataError(f"CoNLL-U file '{path}': sentence at line {sentence.line} ({sentence.sent_id or 'no id'}"
                            f"), word {k}: HEAD {value!r} is not a word number in 0..{n}")
        heads.append(int(value))
    sentence.columns["head"] = heads
    for first, last, form in sentence.multiword:
        if last > n:
            raise DataError(f"CoNLL-U file '{path}': sentence at line {sentence.line}: multiword token {first}-{last} "
                            f"({form!r}) goes past the last word {n}")
    return sentence


def _new(line):
    return Sentence({}, {name: [] for name in COLUMNS[1:]}, line=line)


def read_conllu(path: str) -> List[Sentence]:
    """Every sentence of a CoNLL-U file, in order; a DataError for a malformed line or tree. A file read before
    (same path, size and modification time) is not parsed again: the tasks of a job share their treebank."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        if len(_CACHE) >= 4:
            _CACHE.clear()
        _CACHE[key] = _parse(path)
    return _CACHE[key]


_CACHE = {}


def _parse(path: str) -> List[Sentence]:
    sentences, current = [], None
    with open_utf8(path, "CoNLL-U file") as f:
        for number, raw in enumerate(f, start=1):
            text = raw.rstrip("\n").rstrip("\r")
            if not text.strip():
                if current is not None and len(current):
                    sentences.append(_finish(path, current))
                elif current is not None and (current.multiword or current.empty_nodes):
                    raise DataError(f"CoNLL-U file '{path}': sentence at line {current.line} has no word lines")
                current = None
                continue
            if current is None:
                current = _new(number)
            if text.startswith("#"):
                _comment(text, current.comments)
            else:
                _word_line(path, number, text.split("\t"), current)
    if current is not None and len(current):
        sentences.append(_finish(path, current))
    if not sentences:
        raise DataError(f"CoNLL-U file '{path}' holds no sentence")
    return sentences


def is_projective(heads: List[int]) -> bool:
    """True when no two arcs of the tree cross (heads[k-1] is the head of word k, 0 the root)."""
    arcs = [(min(h, d), max(h, d)) for d, h in enumerate(heads, start=1)]
    return not any(a < c < b < d for a, b in arcs for c, d in arcs)
