"""SQuAD-format JSON as span extraction, windowed over long contexts (:mod:`mtl.text.squad`)."""
import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError
from mtl.core.registry import register_reader
from mtl.readers._text import TextReader, split_file
from mtl.text.squad import SpanExamples, answer_pieces, read_squad, window_starts


@register_reader("squad")
class SquadReader(TextReader, SpanExamples):
    """Questions of a SQuAD v1.1 file, one sample per window: ``token_ids``, ``segment_ids`` (0 question, 1
    context), ``start`` / ``end`` (answer pieces; 0 = not in this window), ``context_mask`` [T] (1 on the window's
    context pieces), ``piece_chars`` [T, 2] (character span of each context piece, -1 elsewhere) and
    ``example_index`` (the question). Training windows use the first gold answer.

    Parameters:
        path (str): the training SQuAD v1.1 JSON file: the questions of split: train
        eval_path (str): the evaluation SQuAD v1.1 JSON file, read for split: eval (required then); the span head
            scores each of its questions against the best of its gold answers
        max_length (int): most pieces of a window, [CLS] question [SEP] context [SEP]: each window takes up to
            max_length - 3 - (the question's pieces) pieces of the context
        doc_stride (int): pieces from the start of one window's context to the next over a context too long for one
            window (at most the window's context size, so that no piece is skipped); a positive integer
        max_query_length (int): most pieces of a question (a longer one is cut at its end); max_query_length + 4
            must not exceed max_length
    """

    def __init__(self, path, eval_path=None, split="train", tokenizer=None, max_length=384, doc_stride=128,
                 max_query_length=64):
        self._setup(tokenizer, max_length)
        for name, value in (("doc_stride", doc_stride), ("max_query_length", max_query_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}", key=name)
        if max_query_length + 4 > max_length:
            raise ConfigError(f"max_query_length {max_query_length} leaves no room for context in max_length "
                              f"{max_length}", key="max_query_length")
        chosen = split_file(path, eval_path, split)
        self.questions = read_squad(chosen)
        self.doc_stride, self.max_query_length = int(doc_stride), int(max_query_length)
        for index, q in enumerate(self.questions):
            self._windows(index, q, chosen)

    def _windows(self, index, q, path):
        tok = self.tokenizer
        query = tok.encode_text(q.question)[0][:self.max_query_length]
        pieces, offsets = tok.encode_text(q.context)
        size = self.max_length - len(query) - 3
        target = None
        if q.answers:
            text, start = q.answers[0]
            try:
                target = answer_pieces(offsets, start, start + len(text))
            except ValueError:
                raise DataError(f"SQuAD file '{path}' question {q.qid!r}: answer {text!r} covers no piece of the "
                                "tokenised context") from None
        head = [tok.cls_id, *query, tok.sep_id]
        for first in window_starts(len(pieces), size, self.doc_stride):
            part = pieces[first:first + size]
            ids = np.asarray(head + list(part) + [tok.sep_id], np.int64)
            segments = np.asarray([0] * len(head) + [1] * (len(part) + 1), np.int64)
            mask = np.zeros(len(ids), np.int64)
            mask[len(head):len(head) + len(part)] = 1
            chars = np.full((len(ids), 2), -1, np.int64)
            chars[len(head):len(head) + len(part)] = np.asarray(offsets[first:first + size], np.int64).reshape(-1, 2)
            start = end = 0
            if target is not None and first <= target[0] and target[1] < first + len(part):
                start, end = target[0] - first + len(head), target[1] - first + len(head)
            self._samples.append({"token_ids": ids, "segment_ids": segments, "start": np.int64(start),
                                  "end": np.int64(end), "context_mask": mask, "piece_chars": chars,
                                  "example_index": np.int64(index)})

    def fields(self):
        """Text fields, ``start``, ``end``, ``context_mask``, ``piece_chars`` and ``example_index``."""
        return self.text_fields() + [Field("start", (), "int64"), Field("end", (), "int64"),
                                     Field("context_mask", (None,), "int64", pad=0),
                                     Field("piece_chars", (None, 2), "int64", pad=-1),
                                     Field("example_index", (), "int64")]

    def input_spec(self):
        """New questions come as a SQuAD file (answers not needed), windowed as training windows them."""
        return self.text_spec("question", doc_stride=self.doc_stride, max_query_length=self.max_query_length)

    def example_context(self, example):
        """The context of question ``example``."""
        return self.questions[example].context

    def example_answers(self, example):
        """The gold answer texts of question ``example``."""
        return [text for text, _ in self.questions[example].answers]

    def example_count(self):
        """Questions in the split."""
        return len(self.questions)
