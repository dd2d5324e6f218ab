"""The same-person JSON: pairs of (task, class) believed to be one person, in ``mtl overlap --json``'s form
(``[{task_a, class_a, task_b, class_b, ...}]``): written by ``mtl overlap``, by the online mask of cross-head
negatives (``same_person.json``) and by the overlap benchmark (``duplicates.json``); read by cross-head negatives'
``mask: pairs`` and by the face report."""
import json
import os
from typing import Sequence

from mtl.errors import DataError

KEYS = ("task_a", "class_a", "task_b", "class_b")
ENDS = ("a", "b")


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


def closest_task(word: str, tasks: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the task of ``tasks`` closest to ``word`` (case, ``_`` and ``-`` aside first)."""
    from mtl.registry import did_you_mean

    def plain(text):
        return str(text).lower().replace("_", "").replace("-", "").replace(" ", "")

    same = [t for t in tasks if plain(t) == plain(word)]
    return f" (did you mean '{same[0]}'?)" if same else did_you_mean(word, tasks)


def check_tasks(pairs: list, path: str, tasks: Sequence[str], taking_part: Sequence[str] = None,
                what: str = "cross-head negatives (cross_negatives.tasks)"):
    """A DataError naming the file, the entry, the task it gives and the job's tasks for the first pair whose task
    is not one of ``tasks``, or (``taking_part``) one that does not take part in ``what``."""
    taking_part = list(tasks) if taking_part is None else list(taking_part)
    for i, pair in enumerate(pairs):
        for end in ENDS:
            task = pair[f"task_{end}"]
            if task not in tasks:
                raise DataError(f"same-person pairs '{path}' entry {i}: task_{end} '{task}' is not a task of this "
                                f"job (its tasks: {', '.join(tasks)}){closest_task(task, tasks)}")
            if task not in taking_part:
                raise DataError(f"same-person pairs '{path}' entry {i}: task_{end} '{task}' does not take part in "
                                f"{what}: {', '.join(taking_part)}")
