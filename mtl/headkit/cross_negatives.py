"""Cross-head negatives: a sample of one face head is scored, as negatives, against the classes of the other face
heads, except the classes believed to be the same person.

Separate heads (one per dataset) never push people of two datasets apart: a deployed model verifies everyone
against everyone, so that way of training gives a worse model than merging the datasets, unless the heads also see
each other's classes. Here a sample of task A keeps its own head's margin softmax (its classes, its margin, Partial
FC as configured) and its softmax denominator also holds, as plain negatives (no margin), the classes of every other
participating head B on this rank: all of them (``rate`` 1) or a fraction drawn from (seed, step, A, B) over B's
classes (Partial FC style; every rank keeps its own range, so the set does not depend on the process count), or
with ``rows: shared`` the rows B scores itself at the step (its Partial FC sample: its batch's classes and its drawn
negatives), the rows one merged head over A's and B's classes would score, so that no other row of B learns. Every
rank already holds a shard of every head and the gathered features of every task, so nothing new is communicated:
B's rows are more rows of A's chunk passes, inside A's two all-reduces. What B's class centres learn from A's
samples is ``update``:

* ``own``: nothing (negatives as a memory bank: a sample is pushed away from them; they move with their own data),
  which keeps every head's update row-sparse exactly as it was and costs the backward one product per extra chunk;
* ``both`` (the default: better on validation people, docs/faces.md): B's scored rows get the gradient of A's
  loss, by the same formula as A's own rows (chunked_softmax), as the rows of one merged head over A's and B's
  classes would. The rows' gradient is kept per step
  (:class:`ReceivedRows`, tagged with A) and settled once after the backward (:meth:`CrossNegatives.settle`): added
  into B's ``weight.grad`` when B's whole shard learns through autograd, merged with B's sampled rows (their union,
  the gradients summed, by the optimizer's one merge) when B uses Partial FC, so that every row gets one optimizer
  update per step. A weighting strategy that rescales A's gradients rescales A's contributions to B too
  (``rescale``). The loop and the weighting see all this through the step-hook interface
  (:class:`mtl.headkit.step_hooks.StepHook`). It costs one more product
  per extra chunk in the backward and a copy of the extra rows' gradient.

A class of B believed to be the sample's person leaves that sample's softmax (no term, no gradient), as
``mask`` says:

* ``pairs``: the pairs given in a same-person JSON (``mtl overlap --json``'s form: each person by name or by the
  dataset's label, :mod:`mtl.data.same_person`), both directions;
* ``online`` (the default): per sample, a class of another head whose cosine with the sample is at least ``tau``,
  where ``tau`` is the ``quantile`` of the target cosines (a sample's cosine with its own class centre), taken as
  mean - z_q std of an exponential average (``momentum``) of the global batch statistics, floored at ``floor``;
  calibrated on the run itself, refreshed every step, from step ``warmup`` on (before it the heads are separate, as
  the target cosines mean little yet; the average starts ``CALIBRATION_STEPS`` steps earlier). Removed entries are
  counted per (class of A, class of B); a pair removed for at least half of the samples of its A class seen since
  the warm-up, and mutually the most removed one, is written to ``output_dir/same_person.json`` at the end (the
  estimate of who is the same person);
* ``none``: no mask (DAIL's crossing dropout, with its rate 1e-4).

What ``online`` cannot promise: it removes every other-head class that looks as much like the sample as its own
class does, which is also what a hard negative of another person can look like (arcface_torch's inter-class
filtering makes the same trade inside one head); and a person seen only under conditions the model does not
generalise across is not recognised.
"""
import json
import math
import os
import zlib
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import paddle

from mtl.core.arrays import host_floats, tensor_from
from mtl.core.errors import ConfigError
from mtl.data.same_person import People
from mtl.headkit.class_rows import RowSource
from mtl.headkit.filtering import Segment, listed_columns
from mtl.headkit.online_rule import estimated_pairs, normal_quantile
from mtl.headkit.row_gradients import RowGradient
from mtl.headkit.sharded import sample_classes_globally, shard_of_sample
from mtl.headkit.step_hooks import StepHook

MASKS = ("none", "pairs", "online")
CALIBRATION_STEPS = 20  # the online rule averages the target cosines of this many steps before the warm-up ends


def read_pairs(path: str, source=None, key="cross_negatives.pairs", tasks=None) -> List[dict]:
    """The pairs of a same-person JSON (:func:`mtl.data.same_person.read_pairs`), a bad file as the config error of
    ``key``; ``tasks``: the job's tasks, every pair's tasks checked against them
    (:func:`mtl.data.same_person.check_tasks`: a task name typed wrong would drop its pairs without a word)."""
    from mtl.core.errors import DataError
    from mtl.data.same_person import check_tasks
    from mtl.data.same_person import read_pairs as read

    try:
        pairs = read(path)
        if tasks is not None:
            check_tasks(pairs, path, tasks)
        return pairs
    except DataError as exc:
        raise ConfigError(exc.bare_message, source, key) from None


@dataclass
class ReceivedRows:
    """Gradient rows one head's loss gave another head's class rows in a step (``update: both``): ``rows`` (the
    local rows of head ``task``'s weight, their gradient and the task whose loss gave it, ``rows.source``)."""

    task: str
    rows: RowGradient


class CrossNegatives(StepHook):
    """The cross-head negatives of a job (module docstring): which rows each head scores as negatives, their mask,
    and the online rule's state (saved with the run); a step hook of the joint model."""

    name = "cross_negatives"  # its state's key in the checkpoint

    def __init__(self, cfg: dict, heads: Dict[str, object], seed: int, source=None, people=None):
        self.rate, self.mask = float(cfg["rate"]), cfg["mask"]
        self.warmup, self.quantile, self.momentum = int(cfg["warmup"]), float(cfg["quantile"]), float(cfg["momentum"])
        self.floor, self.seed = float(cfg["floor"]), int(seed)
        names = list(heads) if cfg["tasks"] == "all" else list(cfg["tasks"])
        self.heads = {name: heads[name] for name in names}
        self.source, self.pairs_path, self.inside_one_head = source, cfg["pairs"], 0
        # who each head's classes are (mtl.data.same_person.People: the data's labels and names), as pairs name them
        self.people = dict(people or {})
        self.not_taking_part: Dict[str, int] = {}  # mask pairs: pairs naming a task outside these heads, per task
        self.pairs = self._pair_table(read_pairs(cfg["pairs"], source), cfg["pairs"]) if self.mask == "pairs" else {}
        self.state = {"mean": None, "var": None, "removed": {}, "seen": {}}
        self.update, self.rows = cfg["update"], cfg["rows"]
        self.needs_step_samples = self.rows == "shared"  # the other heads' own samples, drawn before any forward
        self.received: List[ReceivedRows] = []  # update both: this step's rows, until settled

    @property
    def tasks(self) -> List[str]:
        """The participating tasks, in job order."""
        return list(self.heads)

    def active(self, step: int) -> bool:
        """Whether the heads score each other's classes at ``step`` (0-based): from the warm-up on, and with the
        online rule once its threshold has been calibrated."""
        calibrated = self.mask != "online" or self.state["mean"] is not None
        return self.rate > 0 and len(self.heads) > 1 and step >= self.warmup and calibrated

    def _pair_table(self, pairs, path: str) -> Dict[tuple, np.ndarray]:
        """``{(A, B): [E, 2] sorted (class of A, class of B)}`` from the pairs (people by name or dataset label:
        :func:`mtl.data.same_person.resolve`), both directions; a person who is not a class of its head is a
        ConfigError naming the file and the entry."""
        from mtl.core.errors import DataError
        from mtl.data.same_person import resolve

        try:
            found = resolve(pairs, path, {name: self.people_of(name) for name in self.heads},
                            {name: head.num_classes for name, head in self.heads.items()})
        except DataError as exc:
            raise ConfigError(exc.bare_message, self.source, "cross_negatives.pairs") from None
        for pair in pairs:  # the job's other tasks (the load checked every name): counted, said at the start
            for task in {pair["task_a"], pair["task_b"]} - set(self.heads):
                self.not_taking_part[task] = self.not_taking_part.get(task, 0) + 1
        table = {}
        for a, class_a, b, class_b in found:
            if a != b:
                table.setdefault((a, b), []).append((class_a, class_b))
                table.setdefault((b, a), []).append((class_b, class_a))
            else:
                self.inside_one_head += 1
        return {k: np.unique(np.array(v, np.int64), axis=0) for k, v in table.items()}

    def people_of(self, task: str) -> People:
        """Who ``task``'s classes are (given by the job, else the head's classes as the dataset's labels)."""
        return self.people.get(task) or People.numbered(self.heads[task].num_classes)

    def pair_counts(self) -> Dict[tuple, int]:
        """``{(A, B): distinct same-person pairs in use}`` of ``mask: pairs``, one entry per two heads (A before B
        in job order), every two heads listed (0: none)."""
        names = self.tasks
        return {(a, b): len(self.pairs.get((a, b), ())) for i, a in enumerate(names) for b in names[i + 1:]}

    def describe(self) -> str:
        """One line on what the mask holds (``mask: pairs``: the pairs in use per two heads), for the console and
        the log; empty for the other masks."""
        if self.mask != "pairs":
            return ""
        counts = self.pair_counts()
        each = ", ".join(f"{a}-{b} {n}" for (a, b), n in counts.items())
        unused = [f"{self.inside_one_head} of two classes of one head"] if self.inside_one_head else []
        unused += [f"{n} of task '{task}', which takes no part" for task, n in self.not_taking_part.items()]
        return (f"cross-head negatives: {sum(counts.values())} same-person pairs of {self.pairs_path} masked "
                f"({each})" + (f"; pairs not used: {', '.join(unused)}" if unused else ""))

    def sources(self, task: str, step: int) -> List[RowSource]:
        """The other heads' rows this rank scores as negatives of ``task``'s samples at ``step``."""
        if task not in self.heads or not self.active(step):
            return []
        out = []
        for other, head in self.heads.items():
            if other == task:
                continue
            index = None
            if self.rows == "shared":  # the rows the other head scores itself: gathered and updated once
                local = head.step_rows(step)
                if local is not None and not len(local):
                    continue  # that head's task is not in this step: it scores no rows of its own
                index = None if local is None else tensor_from(local, dtype="int64")
            elif self.rate < 1.0:
                count = max(1, math.ceil(self.rate * head.num_classes))
                salt = zlib.crc32(f"{task}\0{other}".encode())
                sampled = sample_classes_globally([], head.num_classes, count, self.seed + salt, step)
                index = tensor_from(shard_of_sample(sampled, head.shard_start, head.shard_size), dtype="int64")
            sink = self._sink(task) if self.update == "both" else None
            out.append(RowSource(head.weight, index, head.shard_start, other, sink))
        return out

    def _sink(self, task: str):
        """Where ``task``'s backward hands another head's rows' gradient (``update: both``)."""
        def take(source: RowSource, grad):
            self.received.append(ReceivedRows(source.task, RowGradient(source.weight, source.local_rows(), grad,
                                                                       task)))
        return take

    def begin_step(self, step: int):
        """A training step starts: what an earlier step received and never settled (a skipped step) is dropped."""
        self.received = []

    @paddle.no_grad()
    def rescale(self, task: str, factor: float):
        """Scale what ``task``'s loss gave the other heads this step (a weighting strategy changed its weight)."""
        for entry in self.received:
            if entry.rows.source == task:
                entry.rows.grad.scale_(factor)

    @paddle.no_grad()
    def settle(self) -> list:
        """After the backward, once per step (``update: both``): every received gradient into its head: added into
        ``weight.grad`` of a head whose whole shard learns through autograd; under Partial FC returned as row
        declarations (:class:`mtl.headkit.row_gradients.RowGradient`), which the optimizer merges with the head's own
        sampled rows (their union, the gradients summed)."""
        received, self.received = self.received, []
        out = []
        for entry in received:
            rows = entry.rows
            if self.heads[entry.task].sample_ratio < 1.0:  # Partial FC: the head's optimizer update is row-sparse
                out.append(rows)
                continue
            if rows.parameter.grad is None:  # the head had no rows in this step: this is all its gradient
                rows.parameter.grad = paddle.zeros_like(rows.parameter)
            grad = rows.parameter.grad
            grad.index_add_(rows.index, 0, rows.grad.astype(grad.dtype))
        return out

    def threshold(self):
        """The online rule's cosine ``tau`` (None before the target cosines have been seen)."""
        if self.state["mean"] is None:
            return None
        tau = self.state["mean"] + normal_quantile(self.quantile) * math.sqrt(max(self.state["var"], 0.0))
        return max(tau, self.floor)

    def segments(self, task: str, labels: np.ndarray, rows, scale: float):
        """``(segments, columns, rows)`` of the other heads' columns of ``rows`` (a ScoredRows whose own source is
        ``task``'s): each one removed entries only (``remove``), above ``scale * tau`` with the online rule, the
        listed same-person classes with ``pairs``."""
        segments, columns, batch = [], [], []
        tau = self.threshold() if self.mask == "online" else None
        for source, offset in zip(rows.sources[1:], rows.offsets[1:]):
            segments.append(Segment(offset, offset + source.count, None if tau is None else float(scale) * tau,
                                    "remove", record=self.mask == "online"))
            table = self.pairs.get((task, source.task))
            if table is None or not len(table):
                continue
            low = np.searchsorted(table[:, 0], labels, side="left")
            high = np.searchsorted(table[:, 0], labels, side="right")
            which = np.repeat(np.arange(len(labels), dtype=np.int64), high - low)
            partners = table[np.concatenate([np.arange(a, b) for a, b in zip(low, high)] + [np.zeros(0, np.int64)])
                             .astype(np.int64), 1]
            index = None if source.index is None else source.index.numpy()
            hit, local = listed_columns(partners, source.first_id, source.count, index)
            columns.append(local[hit] + offset)
            batch.append(which[hit])
        join = (lambda parts: np.concatenate(parts).astype(np.int64)) if columns else \
            (lambda parts: np.zeros(0, np.int64))
        return segments, join(columns), join(batch)

    def observe(self, task: str, step: int, labels: np.ndarray, target_cosine, rows, mask):
        """After ``task``'s forward at ``step`` (training): the target cosines into the online rule's average, and
        the entries the rule removed into the same-person counts."""
        if task not in self.heads or self.mask != "online" or step < self.warmup - CALIBRATION_STEPS:
            return
        cosines = np.asarray(host_floats([target_cosine.mean(), (target_cosine * target_cosine).mean()]))
        mean, second = cosines
        if self.state["mean"] is None:
            self.state["mean"], self.state["var"] = mean, second - mean * mean
        else:
            keep = self.momentum
            self.state["mean"] = keep * self.state["mean"] + (1 - keep) * mean
            self.state["var"] = keep * self.state["var"] + (1 - keep) * (second - mean * mean)
        seen = self.state["seen"].setdefault(task, {})
        for label in labels.tolist():
            seen[label] = seen.get(label, 0) + 1
        if mask is None or not self.active(step):
            return
        removed = self.state["removed"].setdefault(task, {})
        for columns, batch in mask.found:
            for column, row in zip(columns.tolist(), batch.tolist()):
                source, offset = rows.source_of(column)
                local = column - offset
                cls = int(local if source.index is None else source.index[local]) + source.first_id
                key = f"{labels[row]} {source.task} {cls}"
                removed[key] = removed.get(key, 0) + 1

    def write_estimate(self, path: str, removed_per_rank: List[dict]) -> List[dict]:
        """Write the estimated same-person pairs (``mtl overlap --json``'s form: the people by name and dataset
        label) from every rank's removal counts (each rank finds the entries of its own shards: summed here);
        returns them."""
        from mtl.data.same_person import written

        removed: Dict[str, Dict[str, int]] = {}
        for counts in removed_per_rank:
            for task, table in counts.items():
                mine = removed.setdefault(task, {})
                for key, count in table.items():
                    mine[key] = mine.get(key, 0) + count
        pairs = [written(p["task_a"], self.people_of(p["task_a"]), p["class_a"], p["task_b"],
                         self.people_of(p["task_b"]), p["class_b"], similarity=p["similarity"])
                 for p in estimated_pairs(removed, self.state["seen"])]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(pairs, f, indent=1)
        return pairs

    def finish(self, output_dir: str, gather_texts, is_main: bool) -> str:
        """At the end of training, the online rule: the same-person pairs it estimated, to
        ``output_dir/same_person.json`` (every rank's counts merged on the main one); the console line."""
        if self.mask != "online":
            return ""
        texts = gather_texts(json.dumps(self.state["removed"]))
        if not is_main:
            return ""
        path = os.path.join(output_dir, "same_person.json")
        pairs = self.write_estimate(path, [json.loads(text) for text in texts])
        return f"cross-head negatives: {len(pairs)} likely-same people across heads ({path})"

    def state_dict(self) -> dict:
        """The online rule's threshold statistics (equal on every rank; they decide the masks, so a resumed run
        continues exactly). The removal counts behind ``same_person.json`` are each rank's own (it finds the entries
        of its own shards) and are not saved: after a resume the estimate counts from the resumed step on."""
        return {"mean": self.state["mean"], "var": self.state["var"]}

    def set_state_dict(self, state: dict):
        """Restore :meth:`state_dict` output."""
        self.state.update(mean=state.get("mean"), var=state.get("var"))


def planned_bytes(cfg: dict, classes: Dict[str, int], global_rows: int, dim: int, world_size: int,
                  rank: int, sample_ratios: Dict[str, float] = None) -> Dict[str, Dict[str, int]]:
    """``{task: {part: bytes}}`` the other heads' rows add to a task's step on process ``rank``: their exp values
    (``max(N, D)`` floats per row of the work buffer), their inverse norms, and (a sampled rate) the gathered
    block, and (``update: both``) the copy of their rows' gradient kept until the step settles; ``classes``:
    ``{task: class count}`` of the heads that can take part; ``sample_ratios``: their Partial FC ratios (``rows:
    shared`` scores that fraction of another head's classes)."""
    from mtl.parallel.distributed import shard_range

    if not cfg or float(cfg.get("rate", 0.0)) <= 0:
        return {}
    names = list(classes) if cfg.get("tasks", "all") == "all" else [t for t in cfg["tasks"] if t in classes]
    rate, item = float(cfg["rate"]), np.dtype(paddle.get_default_dtype()).itemsize
    out = {}
    for task in names:
        rows = 0
        for other in names:
            if other != task:
                shard = shard_range(classes[other], world_size, rank)[1]
                if cfg.get("rows") == "shared":  # the other head's own sample: its share, plus its positives
                    share = (sample_ratios or {}).get(other, 1.0)
                    rows += shard if share >= 1.0 else min(shard, math.ceil(share * shard) + int(global_rows))
                else:
                    rows += shard if rate >= 1.0 else min(shard, math.ceil(rate * shard) + 1)
        out[task] = {"other heads' rows: exp values": rows * max(int(global_rows), int(dim)) * item,
                     "their norms": rows * item}
        if cfg.get("update", "own") == "both":
            out[task]["their rows' gradient (update: both)"] = rows * int(dim) * item
    return out
