"""CoNLL-U treebanks as text tasks: any column as word-level tags, the basic tree, or a sentence label."""
import re

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError
from mtl.core.registry import register_reader
from mtl.readers._text import Vocabulary, WordReader, split_file
from mtl.text.conllu import read_conllu
from mtl.text.words import check_too_long

TAG_COLUMNS = ("upos", "xpos", "feats", "deprel", "lemma")


def _sentence_target(target):
    """``{comment, pattern}`` as (comment key, compiled regex with one group); a ConfigError otherwise."""
    if set(target) != {"comment", "pattern"}:
        raise ConfigError(f"a sentence target is {{comment: KEY, pattern: REGEX}}, got {target!r}", key="target")
    try:
        pattern = re.compile(str(target["pattern"]))
    except re.error as exc:
        raise ConfigError(f"target.pattern {target['pattern']!r} is not a regular expression: {exc}",
                          key="target.pattern") from None
    if pattern.groups != 1:
        raise ConfigError(f"target.pattern {target['pattern']!r} must have exactly one group (the label)",
                          key="target.pattern")
    return str(target["comment"]), pattern


@register_reader("conllu")
class ConlluReader(WordReader):
    """Sentences of a CoNLL-U file (UD's multiword tokens and empty nodes handled as UD says: the words are the
    syntactic words) with one target:

    * a column name (``upos``, ``xpos``, ``feats``, ``deprel``, ``lemma``): word-level ``tags`` [W];
    * ``tree``: the basic tree, ``heads`` [W] (word numbers, 0 = root) and ``relations`` [W] (DEPREL ids);
    * ``{comment: KEY, pattern: REGEX}``: a sentence label ``label`` from a comment, e.g. the genre
      ``{comment: sent_id, pattern: "^([a-z]+)-"}`` of the English Web Treebank.

    ``path``: the training file (it also fixes the label vocabulary); ``eval_path``: the evaluation file
    (``split: eval``). ``max_length``: pieces per sentence with ``[CLS]`` and ``[SEP]``; ``too_long``: error, split
    (tags only) or skip (training only), :mod:`mtl.text.words`.

    Parameters:
        path (str): the training CoNLL-U file: the sentences of split: train, and for either split the label
            vocabulary (tags, DEPRELs of target tree, or sentence labels; sorted)
        target (str or mapping): what is learned: a column, upos, xpos, feats, deprel or lemma (word-level tags),
            tree (the basic dependency tree: each word's head and DEPREL), or {comment: KEY, pattern: REGEX} (a
            sentence label: the one group of REGEX matched in the sentence's comment KEY)
    """

    def __init__(self, path, target="upos", eval_path=None, split="train", tokenizer=None, max_length=256,
                 too_long="error"):
        self._setup(tokenizer, max_length)
        self.kind = "tree" if target == "tree" else "sentence" if isinstance(target, dict) else "tags"
        if self.kind == "tags" and target not in TAG_COLUMNS:
            raise ConfigError(f"target must be one of {', '.join(TAG_COLUMNS)}, tree, or {{comment, pattern}}, got "
                              f"{target!r}", key="target")
        check_too_long(too_long, split, can_split=self.kind == "tags")
        self.target, self.path = target, str(path)
        chosen = split_file(path, eval_path, split)
        train = read_conllu(self.path)
        sentences = train if chosen == self.path else read_conllu(chosen)
        self.vocabulary = Vocabulary(label for s in train for label in self._labels(s, self.path))
        self.class_names = self.vocabulary.names
        self.num_classes = len(self.vocabulary)
        for s in sentences:
            self._add(s, chosen, too_long)
        self._report_skipped(chosen)

    def _labels(self, sentence, path):
        """The label names of one sentence for the vocabulary."""
        if self.kind == "tree":
            return sentence.columns["deprel"]
        if self.kind == "tags":
            return sentence.columns[self.target]
        return [self._sentence_label(sentence, path)]

    def _sentence_label(self, sentence, path):
        key, pattern = _sentence_target(self.target)
        value = sentence.comments.get(key)
        found = pattern.search(value) if value is not None else None
        if found is None:
            raise DataError(f"CoNLL-U file '{path}': sentence at line {sentence.line} has no comment '{key}' "
                            f"matching {pattern.pattern!r} (got {value!r})")
        return found.group(1)

    def _add(self, sentence, path, policy):
        where = f"CoNLL-U file '{path}': sentence at line {sentence.line} ({sentence.sent_id or 'no id'})"
        if self.kind == "sentence":
            label = self.vocabulary.ids([self._sentence_label(sentence, path)])[0]
            return self._add_words(sentence.words, {}, {"label": np.int64(label)}, where, policy)
        if self.kind == "tags":
            return self._add_words(sentence.words, {"tags": self.vocabulary.ids(sentence.columns[self.target])}, {},
                                   where, policy)
        heads = np.asarray(sentence.columns["head"], np.int64)
        if (heads < 0).any():
            raise DataError(f"{where}: word {int(np.argmax(heads < 0)) + 1} has no HEAD ('_'); target tree needs "
                            "the basic tree of every sentence")
        labels = {"heads": heads, "relations": self.vocabulary.ids(sentence.columns["deprel"])}
        return self._add_words(sentence.words, labels, {}, where, policy)

    def fields(self):
        """Text fields, then ``word_index`` + ``tags`` / ``heads`` + ``relations``, or the sentence ``label``."""
        if self.kind == "sentence":
            return self.text_fields() + [Field("label", (), "int64")]
        names = ("tags",) if self.kind == "tags" else ("heads", "relations")
        return self.text_fields() + self.word_fields(*names)

    def input_spec(self):
        """New sentences are words; the predictions of a column target fill that CoNLL-U column (``tree``: HEAD and
        DEPREL)."""
        return self.text_spec("words", labels={"tags": "words"}.get(self.kind, self.kind),
                              conllu_column=None if self.kind == "sentence" else self.target)

    def label_names(self):
        """The names of the tags, the relations (target ``tree``) or the sentence labels, in id order."""
        field = {"tags": "tags", "tree": "relations", "sentence": "label"}[self.kind]
        return {field: list(self.class_names)}

    def labels(self):
        """Sentence labels of the split (target ``{comment, pattern}``)."""
        if self.kind != "sentence":
            raise ConfigError(f"reader 'conllu' with target {self.target!r} has word-level labels, not one label "
                              "per sentence")
        return np.array([s["label"] for s in self._samples], np.int64)
