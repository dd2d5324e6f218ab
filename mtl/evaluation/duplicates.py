"""Estimated same-person class pairs against the true ones: precision and recall (the face report's duplicates figures).

Pairs are entries of the ``mtl overlap --json`` form (``{task_a, class_a, task_b, class_b, ...}``; the overlap
benchmark's ``duplicates.json``, ``mtl overlap``'s decision, the online mask's ``same_person.json``). A pair is the
unordered couple of its two (task, class) ends: listed in either direction or twice, it counts once.
``precision = correct / estimated`` (None when nothing was estimated), ``recall = correct / true`` (None when there
is no true pair).
"""
from mtl.data.same_person import KEYS, read_pairs  # noqa: F401  (read here by the face report)


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
