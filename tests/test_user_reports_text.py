"""What text users hit after the README (issue 53, items 2, 6, 7, 8, 9, 10 and 22), each reproduced first and
checked against an independent reference: a hand-written CoNLL-2003 file, predictions computed again from the head's
own logits (a brute-force Viterbi over every tag path, argmax), hand-counted metrics."""
import os

import pytest

from mtl.errors import ConfigError, DataError
from mtl.readers.iob2_reader import Iob2Reader
from mtl.text.iob2 import read_iob2
from mtl.text.tokenizer import TextTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "text_reports")
CONLL2003 = os.path.join(FIXTURES, "conll2003_sample.txt")
# conll2003_sample.txt read by hand: 3 sentences (2 documents), word column 0, NER column 3
CONLL2003_WORDS = [["Anna", "Berg", "visited", "Oslo", "today", "."], ["Nordic", "Bank", "opened", "."],
                   ["Paris", "won", "."]]
CONLL2003_TAGS = [["B-PER", "I-PER", "O", "B-LOC", "O", "O"], ["B-ORG", "I-ORG", "O", "O"], ["B-LOC", "O", "O"]]
WORDS = sorted({w for s in CONLL2003_WORDS for w in s})


@pytest.fixture(scope="module")
def word_tokenizer():
    """One piece per word of the hand-written files."""
    return TextTokenizer.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)


# --- item 2: CoNLL-2003 read from the right columns --------------------------------------------------------------

def test_conll2003_format_reads_words_and_ner_tags_and_drops_document_markers(word_tokenizer):
    sentences = read_iob2(CONLL2003, format="conll2003")
    assert [s.words for s in sentences] == CONLL2003_WORDS
    assert [s.tags for s in sentences] == CONLL2003_TAGS
    reader = Iob2Reader(CONLL2003, tokenizer=word_tokenizer, format="conll2003")
    assert len(reader) == 3
    assert reader.class_names == ["O", "B-LOC", "B-ORG", "B-PER", "I-ORG", "I-PER"]
    for sample, words, tags in zip(reader, CONLL2003_WORDS, CONLL2003_TAGS):
        assert list(sample["tags"]) == [reader.class_names.index(t) for t in tags]
        # one piece per word: [CLS] w1 ... wn [SEP], and each word's own piece id
        assert list(sample["token_ids"][1:-1]) == [word_tokenizer.vocabulary().index(w) for w in words]


def test_the_iob2_default_on_a_conll2003_file_is_refused_naming_the_column_and_the_format():
    """The iob2 default (second-to-last cell) is CoNLL-2003's chunk column: the 'words' are B-NP, I-NP, O."""
    with pytest.raises(DataError) as caught:
        read_iob2(CONLL2003)
    message = str(caught.value)
    assert CONLL2003 in message and "column -2" in message and "format: conll2003" in message
    assert "13 of 13 words" in message  # the chunk column holds nothing but chunk tags


def test_document_markers_are_dropped_in_the_iob2_format_too(tmp_path):
    path = tmp_path / "two_columns.iob2"
    path.write_text("-DOCSTART-\tO\n\nJohn\tB-PER\nran\tO\n\n-DOCSTART-\tO\n\nMary\tB-PER\n")
    sentences = read_iob2(str(path))
    assert [s.words for s in sentences] == [["John", "ran"], ["Mary"]]


def test_an_unknown_format_is_refused_by_key():
    with pytest.raises(ConfigError, match="format must be one of iob2, conll2003"):
        read_iob2(CONLL2003, format="conll")
