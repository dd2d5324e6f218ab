"""The same-person JSON: pairs of (task, class) believed to be one person, in ``mtl overlap --json``'s form
(``[{task_a, class_a, task_b, class_b, ...}]``): written by ``mtl overlap``, by the online mask of cross-head
negatives (``same_person.json``) and by the overlap benchmark (``duplicates.json``); read by cross-head negatives'
``mask: pairs`` and by the face report."""
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
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise DataError(f"same-person pairs '{path}' cannot be read as JSON ({exc})") from None
    if not isinstance(pairs, list):
        raise DataError(f"same-person pairs '{path}': expected a list of pairs (mtl overlap --json), got "
                        f"{type(pairs).__name__}")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict) or not set(KEYS) <= set(pair) or not all(
                isinstance(pair[k], int) and not isinstance(pair[k], bool) and pair[k] >= 0 for k in KEYS[1::2]):
            raise DataError(f"same-person pairs '{path}' entry {i}: expected {{task_a, class_a, task_b, class_b}} "
                            f"with class ids >= 0, got {pair!r}")
    return pairs
