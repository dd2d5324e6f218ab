"""The same-person JSON: pairs of people of two tasks (or two datasets) believed to be one person, written by
``mtl overlap --json``, by the online mask of cross-head negatives (``same_person.json``) and by the overlap benchmark
(``duplicates.json``); read by cross-head negatives' ``mask: pairs``, by ``mtl data merge`` and by the face report.

An entry is ``{task_a, ..., task_b, ...}`` and each of its two ends names one person of its task as the user knows
them, never by the ids a head gives its classes (``holdout_classes`` renumbers the people a head trains on):

* ``name_a``: the person's name as the dataset labels it (a folder name, ``labels.json`` of a pack, a list's
  folders: :mod:`mtl.readers.label_names`);
* ``label_a``: the dataset's own label of the person (the number ``mtl data inspect`` lists);
* ``class_a``: a name (a string), or a number as older files and the overlap benchmark have it. A bare number is
  taken only where it cannot be misread: where the task's head numbers its classes as the dataset labels them (no
  person held out before them); where ``holdout_classes`` renumbered them it could be either, and is refused.

Given together they must name the same person (``class_a`` may then also be the head's id of it, as ``mtl overlap``
wrote it before it wrote names and labels). The tools write ``name_a`` (null when the data has no names) and
``label_a``.
"""
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mtl.core.errors import DataError

KEYS = ("task_a", "class_a", "task_b", "class_b")  # the older form's keys (the face report compares by class_a)
ENDS = ("a", "b")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def end_problem(pair: dict, end: str) -> Optional[str]:
    """What is wrong with end ``end`` of ``pair`` (None: nothing)."""
    if not isinstance(pair.get(f"task_{end}"), str) or not pair[f"task_{end}"]:
        return f"task_{end} must name a task"
    name, label, cls = pair.get(f"name_{end}"), pair.get(f"label_{end}"), pair.get(f"class_{end}")
    if name is None and label is None and cls is None:
        return f"name_{end} (a name) or label_{end} (the dataset's label) must say who the person of task_{end} is"
    if name is not None and (not isinstance(name, str) or not name):
        return f"name_{end} must be a name (a string)"
    if label is not None and not _is_count(label):
        return f"label_{end} must be a label >= 0"
    if cls is not None and not _is_count(cls) and not (isinstance(cls, str) and cls):
        return f"class_{end} must be a name or a label >= 0"
    return None


def read_pairs(path: str) -> list:
    """The pairs of a same-person JSON file, each checked (one sentence naming the file and the entry). An end given
    by ``label_x`` without ``class_x`` also gets ``class_x`` = that label (the key the face report compares)."""
    if not os.path.isfile(path):
        raise DataError(f"same-person pairs '{path}' do not exist")
    try:
        with open(path, encoding="utf-8") as f:
            pairs = json.load(f)
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise DataError(f"same-person pairs '{path}' cannot be read as JSON ({exc})") from None
    if not isinstance(pairs, list):
        raise DataError(f"same-person pairs '{path}': expected a list of pairs (mtl overlap --json), got "
                        f"{type(pairs).__name__}")
    for i, pair in enumerate(pairs):
        problem = "it is not a mapping" if not isinstance(pair, dict) else \
            end_problem(pair, "a") or end_problem(pair, "b")
        if problem:
            raise DataError(f"same-person pairs '{path}' entry {i}: expected {{task_a, name_a or label_a, task_b, "
                            f"name_b or label_b}} ({problem}), got {pair!r}")
        for end in ENDS:
            if pair.get(f"label_{end}") is not None and pair.get(f"class_{end}") is None:
                pair[f"class_{end}"] = pair[f"label_{end}"]
    return pairs


def closest_task(word: str, tasks: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the task of ``tasks`` closest to ``word`` (case, ``_`` and ``-`` aside first)."""
    from mtl.core.registry import did_you_mean

    def plain(text):
        return str(text).lower().replace("_", "").replace("-", "").replace(" ", "")

    same = [t for t in tasks if plain(t) == plain(word)]
    return f" (did you mean '{same[0]}'?)" if same else did_you_mean(word, tasks)


def check_tasks(pairs: list, path: str, tasks: Sequence[str], what: str = "job"):
    """A DataError naming the file, the entry, the task it gives and the ``what``'s tasks (the closest first) for
    the first pair whose task is not one of ``tasks``: a task name typed wrong would otherwise drop its pairs."""
    for i, pair in enumerate(pairs):
        for end in ENDS:
            task = pair[f"task_{end}"]
            if task not in tasks:
                raise DataError(f"same-person pairs '{path}' entry {i}: task_{end} '{task}' is not a task of this "
                                f"{what} (its tasks: {', '.join(tasks)}){closest_task(task, tasks)}")


@dataclass
class People:
    """The people of one class head (or one dataset) as the user knows them: ``labels[c]`` is the dataset's own
    label of class ``c`` (differs from ``c`` once ``holdout_classes`` removed people before it), ``names`` the names
    of the dataset's labels ``0..D-1`` (None: the data has none), ``held`` the labels held out of the head."""

    labels: np.ndarray
    names: Optional[List[str]] = None
    held: Tuple[int, ...] = ()

    @classmethod
    def numbered(cls, count: int, names: Optional[Sequence[str]] = None) -> "People":
        """Classes ``0..count-1`` that are the dataset's labels, named by ``names`` (if any)."""
        return cls(np.arange(int(count), dtype=np.int64), None if names is None else [str(n) for n in names])

    @property
    def renumbered(self) -> bool:
        """Whether some class id differs from the dataset's label of its person."""
        return not np.array_equal(self.labels, np.arange(len(self.labels)))

    def describe(self, cls: int) -> Tuple[int, Optional[str]]:
        """``(dataset label, name or None)`` of class ``cls`` (a class past the data's: its own number)."""
        label = int(self.labels[cls]) if cls < len(self.labels) else int(cls)
        return label, (self.names[label] if self.names is not None and label < len(self.names) else None)

    def _label_of_name(self, name: str) -> int:
        from mtl.core.registry import did_you_mean

        if self.names is None:
            raise ValueError(f"names the person '{name}', but the data has no names (no labels.json beside it, and "
                             "its folders do not name its labels): give the dataset's label (label_x)")
        if name not in self.names:
            raise ValueError(f"names '{name}', which is not a name of the data{did_you_mean(name, self.names)}")
        if self.names.count(name) > 1:
            raise ValueError(f"names '{name}', which the data gives to several labels: give the label (label_x)")
        return self.names.index(name)

    def _class_of_label(self, label: int, head_classes: int) -> int:
        """The class of the dataset label ``label`` (ValueError: held out or outside the head)."""
        if int(label) in self.held:
            raise ValueError(f"is label {label}, a person held out of training (holdout_classes): not a class of "
                             "the head")
        if not self.renumbered:
            if int(label) < head_classes:
                return int(label)
            raise ValueError(f"is label {label}, outside the head's classes [0, {head_classes})")
        where = np.flatnonzero(self.labels == int(label))
        if not len(where):
            raise ValueError(f"is label {label}, not a person the head trains on (the data's labels it trains on: "
                             f"{', '.join(str(v) for v in self.labels[:8])}{', ...' if len(self.labels) > 8 else ''})")
        return int(where[0])

    def head_class(self, pair: dict, end: str, head_classes: int) -> int:
        """The class of the person of end ``end`` of ``pair`` (read by :func:`read_pairs`); ValueError with the rest
        of a sentence ("names ..., which ...") when it names nobody of this head, or two people."""
        name, label, cls = pair.get(f"name_{end}"), pair.get(f"label_{end}"), pair.get(f"class_{end}")
        if isinstance(cls, str):
            if name is not None and name != cls:
                raise ValueError(f"names '{name}' in name_{end} and '{cls}' in class_{end}")
            name, cls = cls, None
        if name is not None:
            found = self._label_of_name(name)
            if label is not None and label != found:
                raise ValueError(f"names '{name}', which is label {found} of the data, but label_{end} says {label}")
            label = found
        if label is None:
            if self.renumbered:
                raise ValueError(f"gives only class_{end} {cls}, and this head numbers its people otherwise than "
                                 "the dataset (holdout_classes took people out), so it could be either: give the "
                                 f"person's name (name_{end}) or the dataset's label (label_{end}, as mtl data "
                                 "inspect lists it)")
            if cls >= head_classes:
                raise ValueError(f"is class {cls}, outside the head's classes [0, {head_classes})")
            return int(cls)
        found = self._class_of_label(label, head_classes)
        if cls is not None and cls not in (label, found):
            raise ValueError(f"is label {label} (class {found} of the head), but class_{end} says {cls}")
        return found


def resolve(pairs: list, path: str, people: Dict[str, People], head_classes: Dict[str, int]) -> List[tuple]:
    """``[(task_a, class_a, task_b, class_b)]`` in the heads' class ids of every pair whose two tasks are in
    ``people``; a DataError naming the file, the entry, the task and what is wrong when an end names nobody of its
    head."""
    out = []
    for i, pair in enumerate(pairs):
        if pair["task_a"] not in people or pair["task_b"] not in people:
            continue
        ends = []
        for end in ENDS:
            task = pair[f"task_{end}"]
            try:
                ends += [task, people[task].head_class(pair, end, head_classes[task])]
            except ValueError as exc:
                raise DataError(f"same-person pairs '{path}' entry {i}: the person of task '{task}' {exc}") from None
        out.append(tuple(ends))
    return out


def class_in_sources(pair: dict, end: str, sources: Sequence[Tuple[int, People]]) -> int:
    """The class of the person of end ``end`` of ``pair`` in its source's own numbering, among ``sources``
    (``[(source number, People)]``: the one source of a merged head's reader its task maps to, or several that
    share one label space), read as :meth:`People.head_class` reads it; ValueError with the rest of a sentence when
    it names nobody of them, or when two of them give it different classes (truly ambiguous)."""
    found, problems = {}, []
    for number, people in sources:
        try:
            found.setdefault(people.head_class(pair, end, len(people.labels)), []).append(number)
        except ValueError as exc:
            problems.append(exc)
    if len(found) == 1:
        return next(iter(found))
    if not found:
        raise problems[0]
    said = "; ".join(f"class {cls} of source{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"
                     for cls, numbers in sorted(found.items()))
    raise ValueError(f"is ambiguous: the reader's sources that start at the task's offset give it different classes "
                     f"({said}), though they share one label space (shared_labels): number their people alike (the "
                     f"same holdout_classes)")


def written(task_a: str, people_a: People, class_a: int, task_b: str, people_b: People, class_b: int,
            **extra) -> dict:
    """An entry in the written form: the two people by name (None without names) and dataset label, then
    ``extra`` (e.g. ``similarity``)."""
    label_a, name_a = people_a.describe(class_a)
    label_b, name_b = people_b.describe(class_b)
    return {"task_a": task_a, "name_a": name_a, "label_a": label_a, "task_b": task_b, "name_b": name_b,
            "label_b": label_b, **extra}
