"""IOB2 named-entity files as a word-level tagging task."""
from mtl.core.registry import register_reader
from mtl.readers._text import Vocabulary, WordReader, split_file
from mtl.text.iob2 import columns_of, read_iob2
from mtl.text.words import check_too_long


@register_reader("iob2")
class Iob2Reader(WordReader):
    """Sentences of an IOB2 file (one word per line, a blank line between sentences; :mod:`mtl.text.iob2`) with
    word-level ``tags`` [W]; the vocabulary (``O`` first, then sorted) comes from the training file ``path``.

    ``format`` gives the columns of the word and the tag (``iob2``: the last two; ``conll2003``: the first and the
    last of CoNLL-2003's ``word POS chunk NER`` lines), ``word_column``/``tag_column`` override them; ``-DOCSTART-``
    lines are dropped. ``max_length``, ``too_long`` as the ``conllu`` reader's (``split`` keeps every tag).

    Parameters:
        path (str): the training IOB2 file: the sentences of split: train, and for either split the tag vocabulary
            (O first, then sorted)
        format (str): iob2 (word and tag in the last two cells: index word tag, or word tag) or conll2003
            (CoNLL-2003's word POS chunk NER lines: the word first, the tag last); -DOCSTART- lines are dropped in both
        word_column (int): the column of the words, overriding the format's (counted from 0; negative: from the end,
            -2 the second-to-last); cells are separated by tabs, or by runs of spaces on a line without a tab
        tag_column (int): the column of the tags, O, B-TYPE or I-TYPE, overriding the format's (counted from 0;
            negative: from the end, -1 the last)
    """

    def __init__(self, path, eval_path=None, split="train", tokenizer=None, format="iob2", word_column=None,
                 tag_column=None, max_length=256, too_long="error"):
        self._setup(tokenizer, max_length)
        check_too_long(too_long, split, can_split=True)
        self.path = str(path)
        word_column, tag_column = columns_of(format, word_column, tag_column)
        self.columns = {"format": format, "word_column": word_column, "tag_column": tag_column}
        chosen = split_file(path, eval_path, split)
        train = read_iob2(self.path, word_column, tag_column, format)
        sentences = train if chosen == self.path else read_iob2(chosen, word_column, tag_column, format)
        self.vocabulary = Vocabulary((t for s in train for t in s.tags), first=("O",))
        self.class_names = self.vocabulary.names
        self.num_classes = len(self.vocabulary)
        for s in sentences:
            where = f"IOB2 file '{chosen}': sentence at line {s.line}"
            self._add_words(s.words, {"tags": self.vocabulary.ids(s.tags)}, {}, where, too_long)
        self._report_skipped(chosen)

    def fields(self):
        """Text fields, ``word_index`` and ``tags``."""
        return self.text_fields() + self.word_fields("tags")

    def input_spec(self):
        """New sentences are words; in an IOB2 file the predicted tags fill the tag column (``iob2``: the columns)."""
        return self.text_spec("words", labels="words", iob2=dict(self.columns))

    def label_names(self):
        """The tag names (``O`` first, then sorted)."""
        return {"tags": list(self.class_names)}
