"""IOB2 tag files (and CoNLL-2003's) and entity chunks.

File: one word per line, cells separated by tabs (or by runs of spaces when a line has no tab), a blank line
between sentences, ``#`` comment lines (``# sent_id = ...``) kept. The word and the tag are columns ``word_column``
and ``tag_column`` (negative: counted from the end), whose defaults come from the file's ``format``:

* ``iob2``: the second-to-last and the last cell, which reads both ``index<TAB>word<TAB>tag`` and ``word<TAB>tag``;
* ``conll2003``: CoNLL-2003's ``word POS chunk NER`` lines, the first cell and the last.

Tags are ``O``, ``B-TYPE`` or ``I-TYPE``. Document markers (a line whose first cell is ``-DOCSTART-``) are dropped in
every format. A file whose "words" are mostly tags was read from the wrong column (the chunk column of a CoNLL-2003
line is the second-to-last): a DataError names the file and the column and says what to set.

Chunks follow seqeval's default (conlleval) rules, which the field reports: an entity starts at ``B-X``, or at an
``I-X`` that does not continue an entity of type X; it ends before ``O``, ``B-*`` or an ``I-Y`` of another type.
"""
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from mtl.core.errors import ConfigError, DataError
from mtl.core.utf8 import open_utf8

FORMATS = {"iob2": (-2, -1), "conll2003": (0, -1)}  # format -> default (word column, tag column)
DOCUMENT_MARKER = "-DOCSTART-"
_TAG_LIKE = re.compile(r"^(O|[BIES]-\S+)$")


@dataclass
class TaggedSentence:
    """One sentence: its words, their tags, its comments and the line it starts at."""

    words: List[str]
    tags: List[str]
    comments: Dict[str, str]
    line: int


def columns_of(format: str = "iob2", word_column: Optional[int] = None,
               tag_column: Optional[int] = None) -> Tuple[int, int]:
    """The (word, tag) columns of a file of ``format`` (``iob2`` or ``conll2003``); a column given explicitly wins.
    A ConfigError naming ``format`` for another format."""
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)} (conll2003: 'word POS chunk NER' lines), "
                          f"got {format!r}", key="format")
    words, tags = FORMATS[format]
    return (words if word_column is None else int(word_column)), (tags if tag_column is None else int(tag_column))


def _cells(text: str) -> List[str]:
    return text.split("\t") if "\t" in text else text.split()


def _check_tag(path, number, tag):
    if tag != "O" and not (len(tag) > 2 and tag[:2] in ("B-", "I-")):
        raise DataError(f"IOB2 file '{path}' line {number}: tag {tag!r} is not O, B-TYPE or I-TYPE")


def _comment(text: str, comments: Dict[str, str]):
    body = text[1:].strip()
    if "=" in body:
        key, value = body.split("=", 1)
        comments.setdefault(key.strip(), value.strip())


def read_iob2(path: str, word_column: Optional[int] = None, tag_column: Optional[int] = None,
              format: str = "iob2") -> List[TaggedSentence]:
    """Every sentence of an IOB2 (or CoNLL-2003) file, document markers dropped; a DataError naming the line for a
    short line or a malformed tag, and naming the column when the words read are mostly tags."""
    word_column, tag_column = columns_of(format, word_column, tag_column)
    need = max(word_column if word_column >= 0 else -word_column - 1,
               tag_column if tag_column >= 0 else -tag_column - 1) + 1
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
                _comment(text, current.comments)
                continue
            cells = _cells(text)
            if cells[0] == DOCUMENT_MARKER:
                continue
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
    _check_words(path, sentences, word_column, format)
    return sentences


def _check_words(path, sentences, word_column, format):
    """A DataError when more than half of the words read look like tags (``O``, ``B-X``, ``I-X``): the words were
    read from a tag column, e.g. the chunk column of CoNLL-2003's ``word POS chunk NER`` lines."""
    words = [w for s in sentences for w in s.words]
    tag_like = [w for w in words if _TAG_LIKE.match(w)]
    if 2 * len(tag_like) <= len(words):
        return
    examples = ", ".join(sorted(set(tag_like))[:3])
    hint = ("set word_column to the column of the words (counted from 0)" if format == "conll2003" else
            "for CoNLL-2003's 'word POS chunk NER' lines set format: conll2003; otherwise set word_column to the "
            "column of the words (counted from 0)")
    raise DataError(f"IOB2 file '{path}': {len(tag_like)} of {len(words)} words read from column {word_column} "
                    f"look like tags ({examples}), not words; {hint}")


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
