"""The field's metrics for text tasks, on plain Python/numpy values, as fractions in [0, 1] like every other head's
(0.9328 = 93.28 %; the field's papers print them in percent, as ``examples/text_report.py`` does).

* accuracy: correct / total over words (or sentences);
* entity F1 (seqeval's default, conlleval's chunking: :func:`mtl.text.iob2.entities`): micro precision, recall and
  F1 over the entities of all sentences; an entity counts when its type, first and last word all match;
* attachment scores as the CoNLL 2018 shared task's ``conll18_ud_eval.py`` computes them: over every syntactic word,
  punctuation included, a relation compared on its universal part (``nmod:poss`` counts as ``nmod``): UAS = head
  right, LAS = head and relation right. The ``_nopunct`` variants leave out the words whose gold relation is
  ``punct`` (the CoNLL-X convention of excluding punctuation).
"""
from typing import List, Sequence

import numpy as np

from mtl.text.iob2 import entities


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """Micro ``precision``, ``recall`` and ``f1`` (fractions) of the entities of tag sequences."""
    true = found = right = 0
    for g, p in zip(gold, predicted):
        ge, pe = entities(g), entities(p)
        true, found, right = true + len(ge), found + len(pe), right + len(ge & pe)
    precision = right / found if found else 0.0
    recall = right / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def universal(relation: str) -> str:
    """The universal part of a UD relation (``acl:relcl`` -> ``acl``)."""
    return relation.split(":", 1)[0]


def attachment_scores(gold_heads: List[np.ndarray], gold_relations: List[Sequence[str]],
                      predicted_heads: List[np.ndarray], predicted_relations: List[Sequence[str]]) -> dict:
    """``uas``, ``las`` (CoNLL 2018: every word, universal relations) and ``uas_nopunct``, ``las_nopunct``
    (fractions)."""
    head_ok, label_ok, punct = [], [], []
    for gh, gr, ph, pr in zip(gold_heads, gold_relations, predicted_heads, predicted_relations):
        h = np.asarray(gh) == np.asarray(ph)
        r = np.array([universal(a) == universal(b) for a, b in zip(gr, pr)], bool)
        head_ok.append(h)
        label_ok.append(h & r)
        punct.append(np.array([universal(a) == "punct" for a in gr], bool))
    h, la, p = (np.concatenate(x) if x else np.zeros(0, bool) for x in (head_ok, label_ok, punct))
    keep = ~p

    def rate(values, where):
        return float(values[where].mean()) if where.any() else 0.0

    everything = np.ones(len(h), bool)
    return {"uas": rate(h, everything), "las": rate(la, everything), "uas_nopunct": rate(h, keep),
            "las_nopunct": rate(la, keep)}
