"""LFW's protocol files: people files (which people form a set) and pairs files (the verification pairs of a set).

Formats (LFW's README, section 3 and 4; unchanged in every copy of LFW):

* people file: a first line with a count. View 1's ``peopleDevTrain.txt``/``peopleDevTest.txt`` hold one set: the
  count is the number of ``Name<TAB>images`` lines that follow. View 2's ``people.txt`` holds ten sets: the first
  line is the number of sets, then each set is a count line followed by that many ``Name<TAB>images`` lines.
* pairs file: a first line ``sets<TAB>n`` (View 2's ``pairs.txt``: ``10<TAB>300``) or ``n`` (View 1's files: one
  set); each set is ``n`` same-person lines ``Name<TAB>i<TAB>j`` followed by ``n`` different-person lines
  ``Name1<TAB>i<TAB>Name2<TAB>j``. Image numbers count from 1: image ``i`` of ``Name`` is ``Name/Name_%04d.jpg``.

Every malformed line is a :class:`mtl.core.errors.DataError` naming the file, the line and what was expected.
"""
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from mtl.core.errors import DataError, absent
from mtl.core.utf8 import open_utf8

VIEW_FILES = {1: ("pairsDevTrain.txt", "pairsDevTest.txt"), 2: ("pairs.txt",)}


@dataclass(frozen=True)
class Person:
    """One ``Name<TAB>images`` line of a people file."""

    name: str
    images: int
    line: int


@dataclass
class PairSet:
    """The pairs of one set: image paths relative to the image root (``Name/Name_0001.jpg``), and which are the same
    person; ``lines`` are the pairs file's line numbers."""

    first: List[str]
    second: List[str]
    issame: np.ndarray
    lines: List[int]

    def __len__(self) -> int:
        return len(self.issame)

    def people(self) -> set:
        """Every person whose image is in one of the pairs."""
        return {path.split("/")[0] for path in self.first + self.second}


def image_path(name: str, number: int) -> str:
    """LFW's relative path of image ``number`` (from 1) of ``name``: ``Name/Name_0001.jpg``."""
    return f"{name}/{name}_{int(number):04d}.jpg"


def _lines(path: str, what: str) -> List[Tuple[int, List[str]]]:
    """``(line number, tab- or space-separated cells)`` of every non-blank line of ``path``."""
    if not os.path.isfile(path):
        raise DataError(f"{what} '{path}' {absent(path)}")
    out = []
    with open_utf8(path, what) as f:
        for number, raw in enumerate(f, start=1):
            cells = raw.split()
            if cells:
                out.append((number, cells))
    if not out:
        raise DataError(f"{what} '{path}' is empty: expected a count on its first line")
    return out


def _count(path, what, number, cells, meaning) -> int:
    if len(cells) != 1 or not cells[0].isdigit():
        raise DataError(f"{what} '{path}' line {number}: expected {meaning} (one whole number), got "
                        f"{' '.join(cells)!r}")
    return int(cells[0])


def read_people(path: str) -> List[List[Person]]:
    """The sets of a people file (one for View 1's files, ten for ``people.txt``): lists of :class:`Person`."""
    what = "people file"
    lines = _lines(path, what)
    first = _count(path, what, *lines[0], "the number of people or of sets")
    multi = len(lines) > 1 and len(lines[1][1]) == 1
    sets, at = [], 1
    for _ in range(first if multi else 1):
        if multi:
            if at >= len(lines):
                raise DataError(f"{what} '{path}' ends after {len(sets)} of its {first} sets")
            size = _count(path, what, *lines[at], f"the number of people of set {len(sets) + 1}")
            at += 1
        else:
            size = first
        people = []
        for number, cells in lines[at:at + size]:
            if len(cells) != 2 or not cells[1].isdigit() or int(cells[1]) < 1:
                raise DataError(f"{what} '{path}' line {number}: expected 'Name<TAB>number of images', got "
                                f"{' '.join(cells)!r}")
            people.append(Person(cells[0], int(cells[1]), number))
        if len(people) != size:
            raise DataError(f"{what} '{path}': set {len(sets) + 1} announces {size} people but the file ends after "
                            f"{len(people)}")
        sets.append(people)
        at += size
    if at != len(lines):
        raise DataError(f"{what} '{path}' line {lines[at][0]}: more lines than its counts announce")
    return sets


def read_pairs(path: str) -> List[PairSet]:
    """The sets of an LFW pairs file (one for View 1's files, ten for ``pairs.txt``): same pairs, then different."""
    what = "pairs file"
    lines = _lines(path, what)
    number, head = lines[0]
    if not 1 <= len(head) <= 2 or not all(c.isdigit() for c in head):
        raise DataError(f"{what} '{path}' line {number}: expected 'sets<TAB>pairs per kind' or 'pairs per kind', "
                        f"got {' '.join(head)!r}")
    sets_count, per_kind = (1, int(head[0])) if len(head) == 1 else (int(head[0]), int(head[1]))
    body = lines[1:]
    if len(body) != sets_count * 2 * per_kind:
        raise DataError(f"{what} '{path}': its first line announces {sets_count} set(s) of {per_kind} same and "
                        f"{per_kind} different pairs ({sets_count * 2 * per_kind} lines), the file holds {len(body)}")
    sets = []
    for k in range(sets_count):
        chunk = body[k * 2 * per_kind:(k + 1) * 2 * per_kind]
        first, second, issame, numbers = [], [], [], []
        for i, (number, cells) in enumerate(chunk):
            same = i < per_kind
            a, b = _pair(path, what, number, cells, same)
            first.append(a)
            second.append(b)
            issame.append(same)
            numbers.append(number)
        sets.append(PairSet(first, second, np.array(issame), numbers))
    return sets


def _pair(path, what, number, cells, same) -> Tuple[str, str]:
    """The two image paths of one pairs line (3 cells for a same pair, 4 for a different one)."""
    want = 3 if same else 4
    shape = "'Name<TAB>i<TAB>j'" if same else "'Name1<TAB>i<TAB>Name2<TAB>j'"
    numbers = (cells[1], cells[2]) if same and len(cells) == 3 else (cells[1], cells[3]) if len(cells) == 4 else ()
    if len(cells) != want or not all(n.isdigit() and int(n) >= 1 for n in numbers):
        kind = "same-person" if same else "different-person"
        raise DataError(f"{what} '{path}' line {number}: expected a {kind} pair {shape} (image numbers from 1), got "
                        f"{' '.join(cells)!r}")
    if same:
        return image_path(cells[0], cells[1]), image_path(cells[0], cells[2])
    return image_path(cells[0], cells[1]), image_path(cells[2], cells[3])


def view_pairs(lfw_dir: str, view: int) -> List[PairSet]:
    """View 1: ``[pairsDevTrain, pairsDevTest]``; View 2: the ten sets of ``pairs.txt``."""
    if view not in VIEW_FILES:
        raise DataError(f"LFW has views 1 and 2, not {view!r}")
    sets = []
    for name in VIEW_FILES[view]:
        sets += read_pairs(os.path.join(lfw_dir, name))
    return sets


def check_images(root: str, pairs: List[PairSet], source: str):
    """A DataError naming the pairs file's line of the first image missing under ``root``."""
    for pair_set in pairs:
        for a, b, line in zip(pair_set.first, pair_set.second, pair_set.lines):
            for rel in (a, b):
                if not os.path.isfile(os.path.join(root, rel)):
                    raise DataError(f"{source} line {line}: image '{os.path.join(root, rel)}' does not exist")


@dataclass(frozen=True)
class Split:
    """One training/test split of LFW's protocol: View 1's (train on ``peopleDevTrain``, test on ``pairsDevTest``,
    whose people are ``peopleDevTest``'s) or View 2's set ``test_set`` (train on the people of the other nine sets,
    test on the set's 600 pairs)."""

    view: int
    test_set: Optional[int] = None

    def __post_init__(self):
        if (self.view, self.test_set is None) not in ((1, True), (2, False)) or (
                self.view == 2 and not 1 <= self.test_set <= 10):
            raise DataError(f"an LFW split is View 1, or View 2 with a set from 1 to 10; got view {self.view}, set "
                            f"{self.test_set}")

    @property
    def name(self) -> str:
        """``view1`` or ``set3``."""
        return "view1" if self.view == 1 else f"set{self.test_set}"

    def train_people(self, lfw_dir: str) -> dict:
        """The ``image_folder`` reader options that keep this split's training people."""
        if self.view == 1:
            return {"people": os.path.join(lfw_dir, "peopleDevTrain.txt")}
        return {"people": os.path.join(lfw_dir, "people.txt"), "exclude_sets": [self.test_set]}

    def test_people(self, lfw_dir: str) -> dict:
        """The ``image_folder`` reader options that keep this split's test people (every one, whether or not a
        pair names them: no test person may be trained on)."""
        if self.view == 1:
            return {"people": os.path.join(lfw_dir, "peopleDevTest.txt")}
        return {"people": os.path.join(lfw_dir, "people.txt"), "sets": [self.test_set]}
