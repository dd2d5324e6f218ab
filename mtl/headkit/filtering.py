"""Negatives taken out of a sample's margin softmax: inter-class filtering and known same-person class pairs.

* **Inter-class filtering** (Partial FC v2, arcface_torch's ``CombinedMarginLoss(interclass_filtering_threshold)``):
  a negative class j of sample n whose cosine exceeds ``threshold`` (``cos_jn > t``, the target never) is treated
  as a likely mislabelled duplicate of the sample's identity.
* **Known same-person pairs** (``same_person``): pairs of people of this head known to be one person, a merged
  head over a ``concat`` reader, each task of the pairs mapped to the source whose classes start at its offset.
  People are named as a same-person file names them (``mtl overlap --json``'s names and dataset labels), resolved
  with the people of that source (who it holds out, how it numbers the rest), as cross-head negatives resolve them;
  a bare class number only where it cannot be misread (a head built outside a job, which has no people, reads it
  as the person's number in its source's reader). For a sample of class a, every class paired
  with a is such a negative, whatever its cosine.

What happens to such a negative is ``mode``:

* ``zero`` (the peer's, the default): its logit is set to 0 (``s * 0``), a constant. It still adds ``exp(0 - m_n)``
  to the sample's softmax denominator, and gets no gradient (nor does the sample's feature through it). This is
  arcface_torch's ``logits = (1 - dirty) * logits`` on the cosines before the margin and the scale.
* ``remove``: the class leaves the sample's softmax (logit -inf): no term in the denominator, no gradient. This is
  what "the class is the same person, not a negative" means; ``zero`` keeps a term that pushes the loss up by
  ``log(1 + sum of exp(-m_n))`` (small at s = 64 when the sample is well classified, large early in training).

The top-1 prediction the head logs is taken before the filtering (it is a property of the model, not of the loss).
Pairs are used as listed, in both directions, not transitively. Pairs whose two classes belong to two different
heads are the business of cross-head negatives (:mod:`mtl.headkit.cross_negatives`), where another head's class
believed to be the sample's person is always removed; without cross-head negatives no sample is ever scored against
another head's classes, so such a pair has no effect here.

A :class:`ChunkMask` says, per segment of the scored columns (the head's own rows, each other head's rows), what is
filtered: logits above a limit and listed (column, row) entries, with the segment's mode.
"""
import json
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from mtl.core.errors import ParameterError
from mtl.core.utf8 import NotUtf8, open_utf8
from mtl.data.same_person import ENDS, People, class_in_sources, end_problem

MODES = ("zero", "remove")


def _read_spec(spec):
    """``(pairs, offsets)`` of a ``same_person`` option, the pairs file read (ParameterError naming what is wrong)."""
    if not isinstance(spec, dict) or set(spec) - {"pairs", "offsets"} or "pairs" not in spec:
        raise ParameterError(f"same_person must be {{pairs: FILE or list, offsets: {{task: offset}}}}, got {spec!r}")
    pairs, offsets = spec["pairs"], spec.get("offsets") or {}
    if isinstance(pairs, str):
        if not os.path.isfile(pairs):
            raise ParameterError(f"same_person.pairs: file '{pairs}' does not exist")
        try:
            with open_utf8(pairs, "same_person.pairs file") as f:
                pairs = json.loads(f.read())
        except NotUtf8 as exc:
            raise ParameterError(f"same_person.pairs: file '{pairs}' is not UTF-8 text: {exc.where}") from None
        except json.JSONDecodeError as exc:
            raise ParameterError(f"same_person.pairs: file '{pairs}' is not JSON ({exc}); expected the list "
                                 "of {task_a, name_a or label_a, task_b, name_b or label_b} entries") from None
    if not isinstance(offsets, dict) or not offsets or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in offsets.values()):
        raise ParameterError("same_person.offsets must map task names (as in the pairs) to their first class id in "
                             f"this head, e.g. {{webface: 0, vggface2: 10572}}, got {offsets!r}")
    return pairs if isinstance(pairs, list) else [None], offsets


def _source_class(pair: dict, end: str, offset: int, people, index: int) -> int:
    """The class of the person of end ``end`` of pair ``index`` in its source's reader: resolved among ``people``
    (:meth:`mtl.readers.base.Reader.source_people`: the sources that start at ``offset``) as cross-head negatives
    resolve people (:func:`mtl.data.same_person.class_in_sources`); without such a source only a bare class
    number is read (as it is)."""
    task, cls = pair[f"task_{end}"], pair.get(f"class_{end}")
    sources = [(number, who) for number, (start, who) in enumerate(people or []) if start == offset]
    if not sources:
        if pair.get(f"name_{end}") is None and pair.get(f"label_{end}") is None and isinstance(cls, int):
            return int(cls)
        why = ("this head was built without its reader's people (outside a job)" if people is None else
               f"no source of this head's reader starts at its offset {offset} (they start at "
               f"{', '.join(str(start) for start, _ in people) or 'none'})")
        raise ParameterError(f"same_person.pairs[{index}]: the person of task '{task}' is given by name or dataset "
                             f"label, but {why}: give offsets where the concat reader's sources start, or class_{end}, "
                             "the person's number in its source's reader")
    try:
        return class_in_sources(pair, end, sources)
    except ValueError as exc:
        raise ParameterError(f"same_person.pairs[{index}]: the person of task '{task}' {exc}") from None


def same_person_pairs(spec, num_classes: int, people=None) -> np.ndarray:
    """``[E, 2]`` int64 class ids of this head, both directions, sorted, from ``{pairs: FILE or list, offsets:
    {task: first class id of that task in this head}}``: entries ``{task_a, ..., task_b, ...}`` naming each person
    as a same-person file does (:mod:`mtl.data.same_person`: ``name_x``, ``label_x`` or ``class_x``, as ``mtl
    overlap --json`` writes them), resolved with ``people`` (the reader's sources: :func:`_source_class`); pairs
    naming a task without an offset are dropped."""
    pairs, offsets = _read_spec(spec)
    found = []
    for i, pair in enumerate(pairs):
        problem = "it is not a mapping" if not isinstance(pair, dict) else \
            end_problem(pair, "a") or end_problem(pair, "b")
        if problem:
            raise ParameterError(f"same_person.pairs[{i}] must be a mapping {{task_a, name_a, label_a or class_a, "
                                 f"task_b, name_b, label_b or class_b}} ({problem}), got {pair!r}")
        if pair["task_a"] in offsets and pair["task_b"] in offsets:
            found.append(tuple(offsets[pair[f"task_{end}"]] +
                               _source_class(pair, end, offsets[pair[f"task_{end}"]], people, i) for end in ENDS))
    ids = np.array(found, dtype=np.int64).reshape(-1, 2)
    bad = ids[(ids < 0) | (ids >= num_classes)]
    if bad.size:
        raise ParameterError(f"same_person: class {int(bad[0])} (offset + class) is outside this head's "
                             f"[0, {num_classes})")
    ids = ids[ids[:, 0] != ids[:, 1]]
    both = np.unique(np.concatenate([ids, ids[:, ::-1]]), axis=0)
    return both


@dataclass
class Filtering:
    """A head's filtering: ``threshold`` on the cosine (None: off), ``mode`` and the ``[E, 2]`` same-person pairs."""

    threshold: Optional[float] = None
    mode: str = "zero"
    pairs: Optional[np.ndarray] = None

    @property
    def active(self) -> bool:
        """Whether anything is ever filtered."""
        return self.threshold is not None or (self.pairs is not None and len(self.pairs) > 0)

    def partners(self, labels: np.ndarray):
        """``(batch rows [F], partner class ids [F])``: every (sample, class paired with its label)."""
        if self.pairs is None or not len(self.pairs):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        low = np.searchsorted(self.pairs[:, 0], labels, side="left")
        high = np.searchsorted(self.pairs[:, 0], labels, side="right")
        rows = np.repeat(np.arange(len(labels), dtype=np.int64), high - low)
        index = np.concatenate([np.arange(a, b) for a, b in zip(low, high)] + [np.zeros(0, np.int64)])
        return rows, self.pairs[index.astype(np.int64), 1]


@dataclass
class Segment:
    """Columns ``[begin, end)`` of the scored rows (one source's) and how they are filtered: logits above ``limit``
    (None: none) and listed entries, with ``mode``; ``record``: keep the filtered entries (cross-head estimation)."""

    begin: int
    end: int
    limit: Optional[float] = None
    mode: str = "zero"
    record: bool = False


@dataclass
class ChunkMask:
    """What the chunk passes filter in one forward: per :class:`Segment`, its limit and mode, and the listed entries
    (``columns`` of the scored rows, batch ``rows``; numpy). Filtered entries of recording segments are collected
    in ``found`` as ``(columns, rows)`` (global columns)."""

    segments: List[Segment]
    columns: np.ndarray
    rows: np.ndarray
    found: List[Tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def segment(self, begin: int) -> Segment:
        """The segment holding column ``begin`` (a chunk lies in one)."""
        for seg in self.segments:
            if seg.begin <= begin < seg.end:
                return seg
        return Segment(begin, begin + 1)

    def setting(self, begin: int):
        """``(limit, mode)`` of the chunk starting at column ``begin``."""
        seg = self.segment(begin)
        return seg.limit, seg.mode

    def recording(self, begin: int) -> bool:
        """Whether the chunk's filtered entries are kept."""
        return self.segment(begin).record

    def record(self, begin: int, columns, rows):
        """Keep the filtered entries ``(columns - begin, rows)`` of a chunk."""
        if len(columns):
            self.found.append((np.asarray(columns, np.int64) + begin, np.asarray(rows, np.int64)))

    def entries(self, begin: int, end: int):
        """``(columns - begin, rows)`` of the listed entries inside the chunk ``[begin, end)``."""
        inside = (self.columns >= begin) & (self.columns < end)
        return self.columns[inside] - begin, self.rows[inside]

    @property
    def empty(self) -> bool:
        """Nothing is ever filtered."""
        return not len(self.columns) and all(seg.limit is None for seg in self.segments)


def listed_columns(partners: np.ndarray, first_id: int, count: int, index=None) -> Tuple[np.ndarray, np.ndarray]:
    """``(hit [F] bool, columns [F])``: which global class ids ``partners`` are among one source's rows — rows
    ``[0, count)`` of a shard whose first class is ``first_id``, or the sorted local ids ``index`` — and their
    columns in the source."""
    local = np.asarray(partners, np.int64) - int(first_id)
    if index is None:
        return (local >= 0) & (local < int(count)), local
    columns = np.searchsorted(index, local)
    hit = columns < len(index)
    hit[hit] = index[columns[hit]] == local[hit]
    return hit, columns


def own_segment(filtering: Filtering, labels: np.ndarray, scale: float, first_id: int, count: int, index=None):
    """The own rows' :class:`Segment` and listed ``(columns, rows)`` of one forward: inter-class filtering and the
    head's same-person pairs among this rank's scored rows."""
    limit = None if filtering is None or filtering.threshold is None else float(scale) * float(filtering.threshold)
    segment = Segment(0, int(count), limit, "zero" if filtering is None else filtering.mode)
    if filtering is None or not filtering.active:
        return segment, np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows, partners = filtering.partners(labels)
    hit, columns = listed_columns(partners, first_id, count, index)
    return segment, columns[hit].astype(np.int64), rows[hit].astype(np.int64)


def chunk_mask(filtering: Filtering, labels: np.ndarray, scale: float, first_id: int, count: int, index=None):
    """The :class:`ChunkMask` of one forward of the own rows alone (None when nothing can be filtered): the pairs'
    partners of the gathered ``labels`` that are among this rank's scored rows — rows ``[0, count)`` of the shard
    whose first class is ``first_id``, or (Partial FC) the sorted local ids ``index`` of the shard."""
    if filtering is None or not filtering.active:
        return None
    segment, columns, rows = own_segment(filtering, labels, scale, first_id, count, index)
    return ChunkMask([segment], columns, rows)


def check_filtering(threshold, mode, same_person, num_classes: int, people=None) -> Filtering:
    """The head options as a :class:`Filtering` (ValueError naming the option otherwise); threshold 0 is off, as
    in the peer; ``people``: the reader's sources (:func:`same_person_pairs`)."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold < 1.0:
        raise ParameterError(f"interclass_filtering_threshold must be a cosine in [0, 1) (0: off), got {threshold!r}")
    if mode not in MODES:
        raise ParameterError(f"interclass_filtering_mode must be one of {', '.join(MODES)}, got {mode!r}")
    if people is not None and not (isinstance(people, list) and all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], People) for p in people)):
        raise ParameterError("people is set by the job (who the classes of each source of the reader are), not by a "
                             f"config; got {people!r}")
    pairs = None if same_person is None else same_person_pairs(same_person, num_classes, people)
    return Filtering(float(threshold) if threshold > 0 else None, mode, pairs)
