"""IOB2 tag files and entity chunks.

File: one word per line, cells separated by tabs (or by runs of spaces when a line has no tab), a blank line
between sentences, ``#`` comment lines (``# sent_id = ...``) kept. The word and the tag are columns ``word_column``
and ``tag_column`` (negative: counted from the end; default the second-to-last and the last, which reads both
``index<TAB>word<TAB>tag`` and ``word<TAB>tag``). Tags are ``O``, ``B-TYPE`` or ``I-TYPE``.

Chunks follow seqeval's default (conlleval) rules, which the field reports: an entity starts at ``B-X``, or at an
``I-X`` that does not continue an entity of type X; it ends before ``O``, ``B-*`` or an ``I-Y`` of another type.
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence, Set, Tuple

from mtl.errors import DataError
from mtl.utf8 import open_utf8


@dataclass
class TaggedSentence:
    """One sentence: its words, their tags, its comments and the line it starts at."""

    words: List[str]
    tags: List[str]
    comments: Dict[str, str]
    line: int


def _cells(text: str) -> List[str]:
    return text.split("\t") if "\t" in text else text.split()


def _check_tag(path, number, tag):
    if tag != "O" and not (len(tag) > 2 and tag[:2] in ("B-", "I-")):
        raise DataError(f"IOB2 file '{path}' line {number}: tag {tag!r} is not O, B-TYPE or I-TYPE")


def read_iob2(path: str, word_column: int = -2, tag_column: int = -1) -> List[TaggedSentence]:
    """Every sentence of an IOB2 file; a DataError naming the line for a short line or a malformed tag."""
    sentences, current = [], None
    with open_utf8(path, "IOB2 file") as f:
        for number, raw in enumerate(f, start=1):
            text = raw.rstrip("\n").rstrip("\r")
            if not text.strip():
                if current is not None and current.words:
                    sentences.append(current)
                current = None
                continue
            if current is None:
                current = TaggedSentence([], [], {}, number)
            if text.startswith("#"):
                body = text[1:].strip()
                if "=" in body:
                    key, value = body.split("=", 1)
                    current.comments.setdefault(key.strip(), value.strip())
                continue
            cells = _cells(text)
            need = max(word_column if word_column >= 0 else -word_column - 1,
                       tag_column if tag_column >= 0 else -tag_column - 1) + 1
            if len(cells) < max(need, 2):
                raise DataError(f"IOB2 file '{path}' line {number}: {len(cells)} column(s), expected a word and a tag")
            tag = cells[tag_column].strip()
            _check_tag(path, number, tag)
            current.words.append(cells[word_column])
            current.tags.append(tag)
    if current is not None and current.words:
        sentences.append(current)
    if not sentences:
        raise DataError(f"IOB2 file '{path}' holds no sentence")
    return sentences


def entities(tags: Sequence[str]) -> Set[Tuple[str, int, int]]:
    """The chunks ``(type, first, last)`` of one tag sequence, by seqeval's default (conlleval) rules."""
    found, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, label = tag.partition("-") if tag != "O" else ("O", "", "")
        continues = prefix == "I" and kind == label
        if start is not None and not continues:
            found.add((kind, start, i - 1))
            start, kind = None, None
        if prefix in ("B", "I") and not continues:
            start, kind = i, label
    return found
