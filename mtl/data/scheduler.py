"""Which tasks a step holds and how many samples of each: a pure function of (seed, step).

``JointSchedule``: every task in every step, sizes by largest-remainder rounding of ``B * ratio_t / sum(ratio)``,
each at least 1. ``SampleSchedule``: one task per step (PaddlePALM's mode), drawn with probabilities from one of the
strategies below; every rank draws the same task because the draw depends only on (seed, step).
Both expose ``plan(step) -> {task: sub-batch size}`` (tasks in job order) and ``consumed(task, step)``: how many
samples of that task all steps before ``step`` used, which places the task's read cursor without any state; and
``order_key(task)``: the name whose seed orders the task's samples (its own; with ``same_rows`` the first row-sharing
task's, so that every such task reads the same sample indices in every step: one input, a label per task; a task of
``own_rows``, whose reader alters its inputs, keeps its own).
"""
import math
from typing import Dict, List, Sequence

import numpy as np

from mtl.core.errors import ConfigError


def largest_remainder(total: int, weights: Sequence[float], minimum: int = 1) -> List[int]:
    """Split ``total`` into integers proportional to ``weights``: floors, then +1 by largest fractional part.

    Ties go to the earlier entry. Entries below ``minimum`` are raised to it, taking from the entry with the most
    above its quota. Raises ValueError when ``total < minimum * len(weights)``.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if total < minimum * len(weights):
        raise ValueError(f"cannot give {len(weights)} tasks at least {minimum} of {total}")
    quotas = total * weights / weights.sum()
    sizes = np.floor(quotas).astype(int)
    remainder = total - sizes.sum()
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in order[:remainder]:
        sizes[i] += 1
    while (sizes < minimum).any():
        low = int(np.argmax(sizes < minimum))
        donors = [i for i in range(len(sizes)) if sizes[i] > minimum]
        donor = max(donors, key=lambda i: (sizes[i] - quotas[i], sizes[i], -i))
        sizes[donor] -= 1
        sizes[low] += 1
    return [int(s) for s in sizes]


class JointSchedule:
    """Every step holds a sub-batch of every task; sizes are the same at every step.

    ``same_rows``: every task reads the same sample positions of the same order in every step (LibMTL's single-input
    mode, Sener and Koltun's MultiMNIST step: one image, both digits' losses), for tasks whose readers hold the same
    inputs in the same order; ValueError unless every such task gets the same sub-batch. ``own_rows``: the tasks
    that keep rows of their own under ``same_rows`` (a reader that alters its inputs, masked LM: its own order, its
    own sub-batch of any size, its own backbone pass)."""

    mode = "joint"

    def __init__(self, tasks: Sequence[str], ratios: Sequence[float], batch_size: int, seed: int = 0,
                 same_rows: bool = False, own_rows: Sequence[str] = ()):
        self.tasks = list(tasks)
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self.ratios = [float(r) for r in ratios]
        self.sizes = dict(zip(self.tasks, largest_remainder(self.batch_size, ratios)))
        self.same_rows = bool(same_rows)
        self.own_rows = [t for t in self.tasks if t in set(own_rows)] if self.same_rows else []
        shared = {t: n for t, n in self.sizes.items() if self.shares_rows(t)}
        if self.same_rows and len(set(shared.values())) > 1:
            but = f" that shares rows (all but {', '.join(repr(t) for t in self.own_rows)})" if self.own_rows else ""
            raise ValueError(f"same_rows needs the same sub-batch for every task{but}, the ratios give " +
                             ", ".join(f"'{t}' {n}" for t, n in shared.items()))

    def with_batch_size(self, batch_size: int) -> "JointSchedule":
        """The same schedule with another global batch size."""
        return JointSchedule(self.tasks, self.ratios, batch_size, self.seed, self.same_rows, self.own_rows)

    def shares_rows(self, task: str) -> bool:
        """Whether ``task`` reads the rows every other such task reads (``same_rows``, not one of ``own_rows``)."""
        return self.same_rows and task not in self.own_rows

    def row_sharing(self) -> List[str]:
        """The tasks that read the same rows in every step, in job order (empty without ``same_rows``)."""
        return [t for t in self.tasks if self.shares_rows(t)]

    def order_key(self, task: str) -> str:
        """The name whose seed orders ``task``'s samples: the first row-sharing task's under ``same_rows``, else its
        own."""
        return self.row_sharing()[0] if self.shares_rows(task) else task

    def plan(self, step: int) -> Dict[str, int]:
        """Sub-batch size of every task at ``step``."""
        return dict(self.sizes)

    def consumed(self, task: str, step: int) -> int:
        """Samples of ``task`` used by steps 0..step-1."""
        return self.sizes[task] * int(step)

    def possible_sizes(self, task: str) -> List[int]:
        """Every sub-batch size this task can get."""
        return [self.sizes[task]]

    def rows_per_step(self, task: str) -> float:
        """Samples of ``task`` a step reads: its sub-batch."""
        return float(self.sizes[task])

    def state_dict(self):
        """Everything that defines the schedule (it has no other state: plans are pure functions of the step)."""
        same = {"same_rows": True} if self.same_rows else {}  # absent when off: older checkpoints still resume
        same.update({"own_rows": list(self.own_rows)} if self.own_rows else {})
        return {"mode": self.mode, "seed": self.seed, "batch_size": self.batch_size, "sizes": dict(self.sizes),
                **same}


def sampling_probabilities(strategy: str, ratios, sizes, temperature: float = 1.0) -> np.ndarray:
    """Task probabilities for sample mode.

    ratio: p_t = r_t / sum r;  proportional: p_t = n_t / sum n (n = training samples);
    temperature: p_t = n_t^(1/T) / sum n^(1/T) (T=1 is proportional, T->inf uniform);  uniform: p_t = 1/K.
    """
    ratios = np.asarray(ratios, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    if strategy == "ratio":
        p = ratios
    elif strategy == "proportional":
        p = sizes
    elif strategy == "temperature":
        p = sizes ** (1.0 / float(temperature))
    elif strategy == "uniform":
        p = np.ones_like(ratios)
    else:
        raise ValueError(f"unknown sampling strategy {strategy!r}")
    return p / p.sum()


class SampleSchedule:
    """One task per step, drawn from ``probabilities`` with a generator seeded by (seed, step)."""

    mode = "sample"
    same_rows = False  # one task a step: no rows to share
    own_rows: List[str] = []
    _CHUNK = 4096

    def __init__(self, tasks: Sequence[str], probabilities: Sequence[float], batch_size: int, seed: int = 0):
        self.tasks = list(tasks)
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self.probabilities = np.asarray(probabilities, dtype=np.float64)
        self._cdf = np.cumsum(self.probabilities)
        self._cdf[-1] = 1.0
        self._counts = np.zeros((1, len(self.tasks)), dtype=np.int64)  # counts[s, t]: draws of t in steps < s

    def shares_rows(self, task: str) -> bool:
        """Never: one task a step."""
        return False

    def row_sharing(self) -> List[str]:
        """None: one task a step."""
        return []

    def task_index(self, step: int) -> int:
        """Index of the task drawn at ``step``: inverse CDF of one uniform from ``default_rng([seed, step])``."""
        u = np.random.default_rng([self.seed, int(step)]).random()
        return int(np.searchsorted(self._cdf, u, side="right"))

    def plan(self, step: int) -> Dict[str, int]:
        """``{task: batch_size}`` for the single task of ``step``."""
        return {self.tasks[self.task_index(step)]: self.batch_size}

    def _extend(self, step: int):
        have = len(self._counts) - 1
        if step <= have:
            return
        upto = max(step, have + self._CHUNK)
        draws = np.array([self.task_index(s) for s in range(have, upto)])
        onehot = np.zeros((len(draws), len(self.tasks)), dtype=np.int64)
        onehot[np.arange(len(draws)), draws] = 1
        self._counts = np.concatenate([self._counts, self._counts[-1] + np.cumsum(onehot, axis=0)])

    def consumed(self, task: str, step: int) -> int:
        """Samples of ``task`` used by steps 0..step-1 (batch_size times the number of earlier draws)."""
        self._extend(int(step))
        return int(self._counts[int(step), self.tasks.index(task)]) * self.batch_size

    def possible_sizes(self, task: str) -> List[int]:
        """Every sub-batch size this task can get."""
        return [self.batch_size]

    def rows_per_step(self, task: str) -> float:
        """Samples of ``task`` a step reads on average: its probability times the batch."""
        return float(self.probabilities[self.tasks.index(task)]) * self.batch_size

    def with_batch_size(self, batch_size: int) -> "SampleSchedule":
        """The same schedule with another global batch size."""
        return SampleSchedule(self.tasks, self.probabilities, batch_size, self.seed)

    def order_key(self, task: str) -> str:
        """The name whose seed orders ``task``'s samples: its own."""
        return task

    def state_dict(self):
        """Everything that defines the schedule (plans are pure functions of the step)."""
        return {"mode": self.mode, "seed": self.seed, "batch_size": self.batch_size,
                "probabilities": self.probabilities.tolist()}


def build_schedule(schedule_cfg: dict, tasks: Sequence[dict], train_sizes: Sequence[int], seed: int, source=None,
                   own_rows: Sequence[str] = ()):
    """Build the schedule of a job from its ``schedule`` section, the task configs and the training-set sizes;
    ``own_rows``: the tasks whose readers alter their inputs (``Reader.alters_inputs``: rows of their own under
    ``schedule.same_rows``)."""
    names = [t["name"] for t in tasks]
    ratios = [t["ratio"] for t in tasks]
    if schedule_cfg["mode"] == "joint":
        same_rows = bool(schedule_cfg.get("same_rows", False))
        sharing = [(n, s) for n, s in zip(names, train_sizes) if n not in set(own_rows)]
        if same_rows and len({s for _, s in sharing}) > 1:
            raise ConfigError("every task reads the same samples in each step, but the tasks' training splits "
                              "differ in size (" + ", ".join(f"'{n}' {s}" for n, s in sharing)
                              + "): their readers must hold the same inputs in the same order",
                              source, "schedule.same_rows")
        return JointSchedule(names, ratios, schedule_cfg["batch_size"], seed, same_rows, own_rows)
    probs = sampling_probabilities(schedule_cfg["sampling"], ratios, train_sizes, schedule_cfg["temperature"])
    return SampleSchedule(names, probs, schedule_cfg["batch_size"], seed)


def steps_for_epochs(schedule, epochs: float, task: str, train_size: int, source=None) -> int:
    """The steps that make ``epochs`` passes over ``task``'s ``train_size`` training samples: ceil(epochs *
    train_size / rows of the task a step) (sample mode: the expected rows), at least 1; ConfigError
    (``schedule.epochs_of``) when the task gets no rows."""
    rows = schedule.rows_per_step(task)
    if rows <= 0:
        raise ConfigError(f"task '{task}' gets no samples in a step, so its passes cannot count the job's steps: "
                          f"name another task", source, "schedule.epochs_of")
    return max(1, int(math.ceil(epochs * train_size / rows - 1e-9)))
