"""Files of new text for ``mtl predict``: read into sentences or texts, written back in their own format with the
predictions filled in (:mod:`mtl.serving.prediction_text` makes the predictions).

Formats (by the file's extension, or named with ``--input-format``):

* ``conllu`` (``.conllu``): a word task of a column target fills that column (UPOS, XPOS, FEATS, DEPREL, LEMMA),
  a tree fills HEAD and DEPREL, another word task goes into MISC as ``task=value``; a sentence task adds the
  comments ``# task = label`` and ``# task_probability = p``. Multiword tokens, empty nodes and comments stay.
* ``iob2`` (``.iob2``, ``.bio``, ``.iob``, ``.conll``): the training file's columns (the tag column may hold anything,
  e.g. ``O``) or one word per line; the IOB2 task's tags fill the tag column (appended to a line of one word), other
  word tasks add a column each, sentence tasks a ``# task = label`` comment line; ``-DOCSTART-`` lines stay.
* ``tsv`` (``.tsv``): a header naming ``text_a`` (and ``text_b``, ``text_c`` for pairs); each task fills a column
  named after it (a class, or a score) and ``task_probability``.
* ``squad`` (``.json``): SQuAD v1.1 questions (answers not needed); written as SQuAD's prediction file,
  ``{question id: answer}``.
* ``text`` (any other name): one text per line. Written as CoNLL-U (``# text = line``, the words as the tokenizer's
  pre-tokeniser splits the line) when a task predicts per word, else as TSV (``text_a`` and the task columns).
"""
import csv
import json
import os
import re
from typing import Dict, List, Optional, Sequence

from mtl.core.errors import ConfigError, DataError
from mtl.core.utf8 import open_utf8
from mtl.text.conllu import COLUMNS, read_conllu
from mtl.text.iob2 import DOCUMENT_MARKER

FORMATS = ("conllu", "iob2", "tsv", "squad", "text")
EXTENSIONS = {".conllu": "conllu", ".iob2": "iob2", ".bio": "iob2", ".iob": "iob2", ".conll": "iob2", ".tsv": "tsv",
              ".json": "squad"}
_WORD_ID = re.compile(r"^[1-9][0-9]*$")


def input_format(path: str, named: Optional[str] = None) -> str:
    """The format of input ``path``: ``named`` when given (checked), else by its extension (``text`` for others)."""
    if named is not None:
        if named not in FORMATS:
            raise ConfigError(f"--input-format must be one of {', '.join(FORMATS)}, got {named!r}")
        return named
    return EXTENSIONS.get(os.path.splitext(path)[1].lower(), "text")


def _read_lines(path: str) -> List[str]:
    with open_utf8(path, "input") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


class Document:
    """An input file's units (sentences, records or texts) and the predictions written into it."""

    format = ""
    extension = ""

    def __init__(self, path: str):
        self.path = path

    def _refuse(self, what: str):
        raise DataError(f"input '{self.path}' ({self.format}) holds no {what}; give "
                        f"{'a CoNLL-U, IOB2 or text file' if what == 'sentences of words' else 'a TSV file'}")

    def words(self) -> List[List[str]]:
        """The words of every sentence."""
        self._refuse("sentences of words")

    def texts(self) -> List[str]:
        """Every unit as one text."""
        return [" ".join(words) for words in self.words()]

    def pairs(self, columns: Sequence[str]) -> List[List[str]]:
        """Every record's texts of ``columns`` (``text_a``, ``text_b``, ...)."""
        self._refuse(f"records of {', '.join(columns)}")

    def set_words(self, task: str, spec: dict, fields: Dict[str, List[List[str]]]):
        """Write per-word predictions: ``{field: per unit, per word, a name}``."""
        self._refuse("sentences of words")

    def set_units(self, task: str, values: List[str], probabilities: Optional[List[float]] = None):
        """Write one prediction per unit (a class or a score) and its probability."""
        raise NotImplementedError

    def render(self) -> str:
        """The file with the predictions filled in."""
        raise NotImplementedError


class ConlluDocument(Document):
    """A CoNLL-U file: its lines kept, the syntactic word lines of every sentence located."""

    format, extension = "conllu", ".conllu"

    def __init__(self, path: str, lines: Optional[List[str]] = None):
        super().__init__(path)
        if lines is None:
            read_conllu(path)  # every line checked as UD defines it (a DataError names the line)
            lines = _read_lines(path)
        self.lines = list(lines)
        self.sentences: List[dict] = []  # {"words": [line index], "comments": [line index], "extra": {key: value}}
        current = None
        for index, text in enumerate(self.lines):
            if not text.strip():
                current = None
                continue
            if current is None:
                current = {"words": [], "comments": [], "extra": {}}
                self.sentences.append(current)
            if text.startswith("#"):
                current["comments"].append(index)
            elif _WORD_ID.match(text.split("\t", 1)[0]):
                current["words"].append(index)
        self.sentences = [s for s in self.sentences if s["words"]]

    @classmethod
    def from_texts(cls, path: str, texts: List[str], split_words) -> "ConlluDocument":
        """Raw texts as CoNLL-U sentences: ``# text = ...`` and one line per word (``split_words(text)``), every other
        column ``_``."""
        lines = []
        for text in texts:
            lines.append(f"# text = {text}")
            words = split_words(text) or [text]
            lines += [f"{k}\t{word}\t" + "\t".join(["_"] * 8) for k, word in enumerate(words, start=1)]
            lines.append("")
        return cls(path, lines)

    def _cells(self, index: int) -> List[str]:
        return self.lines[index].split("\t")

    def words(self):
        """The FORM of every syntactic word of every sentence."""
        return [[self._cells(i)[1] for i in s["words"]] for s in self.sentences]

    def texts(self):
        """The ``# text`` comment of every sentence, else its words joined by spaces."""
        out = []
        for s, words in zip(self.sentences, self.words()):
            found = [self.lines[i].split("=", 1)[1].strip() for i in s["comments"]
                     if re.match(r"#\s*text\s*=", self.lines[i])]
            out.append(found[0] if found else " ".join(words))
        return out

    def _set_cell(self, index: int, column: int, value: str):
        cells = self._cells(index)
        cells[column] = value
        self.lines[index] = "\t".join(cells)

    def set_words(self, task, spec, fields):
        """A column target fills its column, ``tree`` fills HEAD and DEPREL, anything else goes into MISC."""
        column = spec.get("conllu_column")
        if column == "tree":
            places = dict(zip(fields, (COLUMNS.index("head"), COLUMNS.index("deprel"))))
        elif column in COLUMNS:
            places = {next(iter(fields)): COLUMNS.index(column)}
        else:
            places = {}
        for s, unit in enumerate(self.sentences):
            for k, index in enumerate(unit["words"]):
                for field, values in fields.items():
                    if field in places:
                        self._set_cell(index, places[field], values[s][k])
                    else:
                        self._add_misc(index, task if len(fields) == 1 else f"{task}_{field}", values[s][k])

    def _add_misc(self, index: int, key: str, value: str):
        misc = self._cells(index)[9]
        items = [item for item in misc.split("|") if item != "_" and not item.startswith(f"{key}=")]
        self._set_cell(index, 9, "|".join(items + [f"{key}={value}"]))

    def set_units(self, task, values, probabilities=None):
        """``# task = value`` (and ``# task_probability = p``) comments, replacing earlier ones of those keys."""
        for s, value in enumerate(values):
            extra = self.sentences[s]["extra"]
            extra[task] = value
            if probabilities is not None:
                extra[f"{task}_probability"] = f"{probabilities[s]:.4f}"

    def render(self):
        """The lines, each sentence's new comments after its own (its older comments of the same keys dropped)."""
        starts = {s["words"][0] if not s["comments"] else s["comments"][-1] + 1: s for s in self.sentences}
        dropped = {i for s in self.sentences for i in s["comments"] if _names_key(self.lines[i], s["extra"])}
        out = []
        for index, text in enumerate(self.lines):
            if index in starts:
                out += [f"# {key} = {value}" for key, value in starts[index]["extra"].items()]
            if index not in dropped:
                out.append(text)
        return "\n".join(out).rstrip("\n") + "\n\n"


def _names_key(line: str, keys) -> bool:
    """Whether ``line`` is a comment ``# key = ...`` of one of ``keys``."""
    found = re.match(r"#\s*([^=]+?)\s*=", line)
    return bool(found) and found.group(1) in keys


class Iob2Document(Document):
    """An IOB2 file (or CoNLL-2003's columns): its lines kept; words read from ``word_column``, or from the one cell
    of a line of one word."""

    format, extension = "iob2", ".iob2"

    def __init__(self, path: str, word_column: int = -2, tag_column: int = -1):
        super().__init__(path)
        self.lines = _read_lines(path)
        self.separator = "\t" if any("\t" in line for line in self.lines) else " "
        self.sentences: List[dict] = []
        current = None
        for index, text in enumerate(self.lines):
            cells = text.split(self.separator) if self.separator == "\t" else text.split()
            if not text.strip():
                current = None
            elif not text.startswith("#") and cells[0] != DOCUMENT_MARKER:
                if current is None:
                    current = {"words": [], "start": index, "extra": {}}
                    self.sentences.append(current)
                current["words"].append(index)
        self.width = {i: len(self._cells(i)) for s in self.sentences for i in s["words"]}  # cells as read
        self.one_word = all(width == 1 for width in self.width.values())
        self.word_column, self.tag_column = (0, None) if self.one_word else (word_column, tag_column)
        self.tag_filled = False
        if not self.sentences:
            raise DataError(f"input '{path}' holds no sentence (IOB2: one word per line, a blank line between "
                            "sentences)")

    def _cells(self, index: int) -> List[str]:
        text = self.lines[index]
        return text.split("\t") if self.separator == "\t" else text.split()

    def words(self):
        """The word cell of every word line."""
        try:
            return [[self._cells(i)[self.word_column] for i in s["words"]] for s in self.sentences]
        except IndexError:
            raise DataError(f"input '{self.path}': a line has no column {self.word_column} (the task's word column); "
                            "give the training file's columns or one word per line") from None

    def set_words(self, task, spec, fields):
        """The first IOB2 task's tags replace the tag column (when the lines have one); every other field is a new
        last column."""
        replace = "iob2" in spec and self.tag_column is not None and not self.tag_filled and len(fields) == 1
        self.tag_filled = self.tag_filled or replace
        for s, unit in enumerate(self.sentences):
            for k, index in enumerate(unit["words"]):
                cells = self._cells(index)
                for values in fields.values():
                    if replace:  # the tag column as read (a negative one counts from the end of the line as read)
                        cells[self.tag_column % self.width[index]] = values[s][k]
                    else:
                        cells.append(values[s][k])
                self.lines[index] = self.separator.join(cells)

    def set_units(self, task, values, probabilities=None):
        """A comment line ``# task = value`` (and ``# task_probability = p``) before each sentence."""
        for s, value in enumerate(values):
            self.sentences[s]["extra"][task] = value
            if probabilities is not None:
                self.sentences[s]["extra"][f"{task}_probability"] = f"{probabilities[s]:.4f}"

    def render(self):
        """The lines, with each sentence's comment lines before its first word."""
        starts = {s["start"]: s for s in self.sentences}
        out = []
        for index, text in enumerate(self.lines):
            if index in starts:
                out += [f"# {key} = {value}" for key, value in starts[index]["extra"].items()]
            out.append(text)
        return "\n".join(out).rstrip("\n") + "\n"


class TsvDocument(Document):
    """A TSV file with a header: its records kept in order, the predictions in columns named after the tasks."""

    format, extension = "tsv", ".tsv"

    def __init__(self, path: str, header: Optional[List[str]] = None, rows: Optional[List[List[str]]] = None):
        super().__init__(path)
        if header is None:
            with open_utf8(path, "input", newline="") as f:
                table = [row for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if any(row)]
            if len(table) < 2:
                raise DataError(f"input '{path}': a TSV input needs a header row naming its columns (text_a, ...) and "
                                "one record or more")
            header, rows = [c.strip() for c in table[0]], table[1:]
        self.header, self.rows = list(header), [list(r) + [""] * (len(header) - len(r)) for r in rows]

    @classmethod
    def from_texts(cls, path: str, texts: List[str]) -> "TsvDocument":
        """Raw texts as the ``text_a`` column (a tab inside a text becomes a space)."""
        return cls(path, ["text_a"], [[t.replace("\t", " ")] for t in texts])

    def pairs(self, columns):
        """The cells of ``columns`` of every record; a DataError naming a missing column."""
        missing = [c for c in columns if c not in self.header]
        if missing:
            raise DataError(f"input '{self.path}' has no column {missing[0]!r} (its header names: "
                            f"{', '.join(self.header)}); the task reads {', '.join(columns)}")
        return [[row[self.header.index(c)] for c in columns] for row in self.rows]

    def texts(self):
        """The ``text_a`` cell of every record."""
        return [a for a, in self.pairs(["text_a"])]

    def _column(self, name: str, values: List[str]):
        if name not in self.header:
            self.header.append(name)
            for row in self.rows:
                row.append("")
        k = self.header.index(name)
        for row, value in zip(self.rows, values):
            row[k] = value

    def set_units(self, task, values, probabilities=None):
        """Columns ``task`` and ``task_probability`` (replaced when the file has them)."""
        self._column(task, values)
        if probabilities is not None:
            self._column(f"{task}_probability", [f"{p:.4f}" for p in probabilities])

    def render(self):
        """Header and records, tab-separated."""
        return "\n".join("\t".join(row) for row in [self.header] + self.rows) + "\n"


class SquadDocument(Document):
    """A SQuAD v1.1 file of questions; written as SQuAD's prediction file ``{question id: answer}``."""

    format, extension = "squad", ".json"

    def __init__(self, path: str):
        from mtl.text.squad import read_squad

        super().__init__(path)
        self.questions = read_squad(path)
        self.answers = {q.qid: "" for q in self.questions}

    def set_answers(self, answers: List[str]):
        """The answer of every question, in file order."""
        self.answers = {q.qid: a for q, a in zip(self.questions, answers)}

    def render(self):
        """``{question id: answer}`` as JSON."""
        return json.dumps(self.answers, indent=1, ensure_ascii=False) + "\n"


def read_document(path: str, fmt: str, word_level: bool, split_words, iob2_columns=None) -> Document:
    """The input ``path`` as a :class:`Document` of format ``fmt``; raw text becomes CoNLL-U when ``word_level`` (a
    task predicts per word, on the words ``split_words`` gives) and TSV otherwise."""
    if fmt == "conllu":
        return ConlluDocument(path)
    if fmt == "iob2":
        return Iob2Document(path, *(iob2_columns or (-2, -1)))
    if fmt == "tsv":
        return TsvDocument(path)
    if fmt == "squad":
        return SquadDocument(path)
    texts = [line.strip() for line in _read_lines(path) if line.strip()]
    if not texts:
        raise DataError(f"input '{path}' holds no text (one text per line)")
    return ConlluDocument.from_texts(path, texts, split_words) if word_level else TsvDocument.from_texts(path, texts)
