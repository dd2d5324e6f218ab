"""SQuAD-format reading comprehension: records, sliding windows over long contexts, and SQuAD v1.1's scores.

Windows (as BERT's ``run_squad.py``): a question of more than ``max_query_length`` pieces keeps its first ones (the
answer lies in the context, so no label is cut); the context's pieces are covered by windows of
``max_length - len(question) - 3`` pieces starting every ``doc_stride`` pieces, the last one reaching the end.
A window is ``[CLS] question [SEP] context part [SEP]``; its target is the first and last piece of the answer when
the answer lies wholly inside it, else ``[CLS]`` (position 0) for both: "not in this window".

Scores (SQuAD v1.1's ``evaluate-v1.1.py``): answers are normalised (lowercase, punctuation removed, the articles
a/an/the removed, whitespace collapsed); exact match = 1 when the normalised prediction equals a normalised gold
answer; F1 = the harmonic mean of token precision and recall against a gold answer (bag of tokens); both take the
best gold answer of a question, and are averaged over questions (fractions, as every head's metrics: the script
prints them in percent).
"""
import json
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mtl.core.errors import DataError
from mtl.core.utf8 import open_utf8


@dataclass
class Question:
    """One question: its id, text, context and gold answers ``(text, start character)``."""

    qid: str
    question: str
    context: str
    answers: List[Tuple[str, int]]


def read_squad(path: str) -> List[Question]:
    """Every question of a SQuAD v1.1 JSON file; a DataError naming the question for a misplaced answer."""
    try:
        with open_utf8(path, "SQuAD file") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(f"SQuAD file '{path}' is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"SQuAD file '{path}' needs a top-level {{\"data\": [...]}} list of articles")
    out = []
    for article in data["data"]:
        for paragraph in article.get("paragraphs", []):
            context = paragraph["context"]
            for qa in paragraph.get("qas", []):
                answers = [(a["text"], int(a["answer_start"])) for a in qa.get("answers", [])]
                for text, start in answers:
                    if context[start:start + len(text)] != text:
                        raise DataError(f"SQuAD file '{path}' question {qa.get('id')!r}: answer {text!r} is not at "
                                        f"character {start} of its context")
                out.append(Question(str(qa["id"]), qa["question"], context, answers))
    if not out:
        raise DataError(f"SQuAD file '{path}' holds no question")
    return out


def window_starts(count: int, size: int, stride: int) -> List[int]:
    """First context piece of every window over ``count`` pieces (``size`` per window, every ``stride``)."""
    starts, start = [], 0
    while True:
        starts.append(start)
        if start + size >= count:
            return starts
        start += min(size, stride)


def answer_pieces(offsets: Sequence[Tuple[int, int]], start_char: int, end_char: int) -> Tuple[int, int]:
    """First and last context piece that overlap the answer's characters ``[start_char, end_char)``."""
    inside = [k for k, (a, b) in enumerate(offsets) if a < end_char and b > start_char]
    if not inside:
        raise ValueError("the answer covers no piece")
    return inside[0], inside[-1]


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of two answers after normalisation (0 when they share no token)."""
    pred, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = Counter(pred) & Counter(truth)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised answers are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict:
    """``{"exact_match", "f1"}`` (fractions) over questions, each against its best gold answer."""
    em = [max(exact_match(p, g) for g in gs) for p, gs in zip(predictions, golds)]
    f1 = [max(f1_score(p, g) for g in gs) for p, gs in zip(predictions, golds)]
    return {"exact_match": float(np.mean(em)), "f1": float(np.mean(f1))}


class SpanExamples:
    """What a reader of span-extraction windows offers the span head's scoring: per question its context and gold
    answers (``example_index`` of a window names its question)."""

    def example_context(self, example: int) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def example_answers(self, example: int) -> List[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def example_count(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError


def best_span(start_logits, end_logits, allowed, max_answer_length: int) -> Optional[Tuple[float, int, int]]:
    """(score, first, last) of the best span ``first <= last < first + max_answer_length`` over the ``allowed``
    positions, score = start_logit[first] + end_logit[last]; None when no position is allowed."""
    positions = np.flatnonzero(np.asarray(allowed) > 0)
    if not len(positions):
        return None
    s, e = np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)
    best = None
    for i in positions:
        for j in positions[(positions >= i) & (positions < i + max_answer_length)]:
            score = s[i] + e[j]
            if best is None or score > best[0]:
                best = (float(score), int(i), int(j))
    return best
