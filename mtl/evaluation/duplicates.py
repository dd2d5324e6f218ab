"""Estimated same-person class pairs against the true ones: precision and recall (the face report's duplicates figures).

Pairs are entries of the ``mtl overlap --json`` form (``{task_a, class_a, task_b, class_b, ...}``; the overlap
benchmark's ``duplicates.json``, ``mtl overlap``'s decision, the online mask's ``same_person.json``). A pair is the
unordered couple of its two (task, class) ends: listed in either direction or twice, it counts once.
``precision = correct / estimated`` (None when nothing was estimated), ``recall = correct / true`` (None when there
is no true pair).
"""
import json
import os

from mtl.errors import DataError

KEYS = ("task_a", "class_a", "task_b", "class_b")


def read_pairs(path: str) -> list:
    """The pairs of a same-person JSON file, each checked (one sentence naming the file and the entry)."""
    if not os.path.isfile(path):
        raise DataError(f"same-person pairs '{path}' do not exist")
    try:
        with open(path) as f:
            pairs = json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(f"same-person pairs '{path}' are not JSON: {exc}") from None
    if not isinstance(pairs, list):
        raise DataError(f"same-person pairs '{path}': expected a list of pairs (mtl overlap --json), got "
                        f"{type(pairs).__name__}")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict) or not set(KEYS) <= set(pair) or not all(
                isinstance(pair[k], int) and not isinstance(pair[k], bool) and pair[k] >= 0 for k in KEYS[1::2]):
            raise DataError(f"same-person pairs '{path}' entry {i}: expected {{task_a, class_a, task_b, class_b}} "
                            f"with class ids >= 0, got {pair!r}")
    return pairs


def pair_keys(pairs) -> set:
    """The unordered pairs ``((task, class), (task, class))`` of ``pairs``."""
    return {tuple(sorted([(str(p["task_a"]), int(p["class_a"])), (str(p["task_b"]), int(p["class_b"]))]))
            for p in pairs}


def duplicate_scores(estimated, truth) -> dict:
    """``{"pairs", "correct", "true", "precision", "recall"}`` of the ``estimated`` pairs against ``truth``."""
    found, true = pair_keys(estimated), pair_keys(truth)
    correct = len(found & true)
    return {"pairs": len(found), "correct": correct, "true": len(true),
            "precision": correct / len(found) if found else None, "recall": correct / len(true) if true else None}
