"""The arms of the face report (``examples/faces_report.py``): what each trains, how it samples, what it is scored on.

Every arm trains with the config's backbone, steps, optimizer, seed and batch size (images per step); they differ in
their heads and in how the batch is drawn:

* ``separate``: the config as it is, one head per identity task, without cross-head negatives
  (``cross_negatives.rate=0``). Each task gets its share of every step's batch (``ratio``: 32 images of each of
  the six datasets; on the overlap benchmark 16 of each source), read in epochs of its own images.
* ``dropout``, ``cross``, ``cross_oracle``: ``separate`` plus the job key ``cross_negatives`` (the other heads'
  classes as negatives): DAIL's random crossing at rate 1e-4 without a mask; all of them with the online
  same-person mask; all of them masked with the benchmark's true pairs (``duplicates.json``). Sampled as
  ``separate``. Each with the job's default ``update: both`` (the other heads' rows learn from the sample too, as a
  merged head's rows do) unless the config sets it.
* ``two_stage``: separate heads first (the ``separate`` arm's run of the same seed), then ``mtl overlap`` on that run
  (its calibrated same-person decision, ``overlap.json`` in the run folder), then ``separate`` plus
  ``cross_negatives`` masked with those pairs (``mask: pairs``, rate 1). Sampled as ``separate``; trained after it.
* ``merged`` (``naive`` on the overlap benchmark: the same construction): the identity tasks replaced by one task
  whose ``concat`` reader merges their training people, every task's people distinct classes (duplicates stay two
  classes), with the first identity task's head and the identity tasks' summed sub-batch. The merged images are
  read uniformly (epochs of the merged list), so each dataset's share of a step follows its image count, not its
  ratio: the sampling difference the report prints (``sampling``).
* ``oracle`` (overlap benchmark only): ``naive`` with the true person labels (the benchmark's ``oracle/`` lists, a
  ``concat`` reader with ``shared_labels``): the same task name, the same images in the same order and the same
  augmentation draws at every step as ``naive``; only the labels differ.
* ``alone`` (kept from the former report): each identity task by itself, with its sub-batch of the joint job (fewer
  images per step than the other arms).
"""
import json
import os

import numpy as np
import yaml

CROSS_NEGATIVES = {
    "dropout": {"tasks": "all", "rate": 1.0e-4, "mask": "none"},
    "cross": {"tasks": "all", "rate": 1.0, "mask": "online"},
    "cross_oracle": {"tasks": "all", "rate": 1.0, "mask": "pairs"},  # pairs: the benchmark's duplicates.json
}
ARMS = ("separate", "alone", "merged", "naive", "oracle", "dropout", "cross", "cross_oracle", "two_stage")
OVERLAP_ARMS = ("naive", "oracle", "separate", "dropout", "cross", "cross_oracle", "two_stage")
SIX_ARMS = ("separate", "merged", "cross", "two_stage")
SEPARATE_PAIRS = "SEPARATE_PAIRS_FILE"  # placeholder: the same seed's separate run's mtl overlap --json
LEGACY = {"joint": "separate", "alone": "alone", "merged": "merged"}  # --only KIND of the former report
MERGED, ORACLE = "MERGED_TASK_FILE", "ORACLE_TASK_FILE"  # placeholders for the task files the report writes


class Benchmark:
    """The overlap benchmark's files beside its config (``tools/make_overlap_benchmark.py``)."""

    def __init__(self, folder, info):
        self.folder = folder
        self.info = info
        self.duplicates = os.path.join(folder, "duplicates.json")

    @classmethod
    def beside(cls, config_path):
        """The benchmark whose ``benchmark.json`` is in the config's folder, or None."""
        folder = os.path.dirname(os.path.abspath(config_path))
        path = os.path.join(folder, "benchmark.json")
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            return cls(folder, json.load(f))

    def dataset_of(self) -> dict:
        """``{source task: dataset}``."""
        return {task: name for name, d in self.info["datasets"].items() for task in d["tasks"]}

    def oracle_list(self, task) -> str:
        """The true-person list of a source task."""
        return os.path.join(self.folder, "oracle", task + ".txt")


def task_overrides(task_sets, count):
    """``tasks.N.KEY=VALUE`` for every task N < count and every ``KEY=VALUE`` of ``task_sets``."""
    return [f"tasks.{n}.{item}" for n in range(count) for item in task_sets]


def held_out_sides(task, reader):
    """The condition side (:mod:`mtl.evaluation.conditions`) of every held-out image of an ``image_list`` task,
    from its list file (the evaluation split keeps the list's order); None for other readers."""
    from mtl.evaluation.conditions import condition_sides, light_azimuths
    from mtl.readers.image_list import parse_label_list

    if task["reader"]["type"] != "image_list":
        return None
    held = np.asarray(reader.class_labels)
    entries = [(path, int(label)) for _, path, label in parse_label_list(task["reader"]["list"])[0]
               if np.isfinite(label) and int(label) in set(held.tolist())]
    labels = np.asarray([label for _, label in entries], dtype=np.int64)
    if len(labels) != len(reader) or not np.array_equal(np.searchsorted(held, labels), reader.labels()):
        print(f"warning: task '{task['name']}': its evaluation split does not follow its list file (skipped "
              "images?): no cross-condition pairs from it", flush=True)
        return None
    root = task["reader"].get("root") or os.path.dirname(task["reader"]["list"])
    return condition_sides(labels, light_azimuths(root, [path for path, _ in entries]))


class Recipe:
    """What the report derives from the config: identity tasks, their readers, sub-batches, the arms' runs."""

    def __init__(self, cfg, benchmark=None):
        from mtl.backbones.base import constructor_config
        from mtl.core import registry
        from mtl.core.errors import ConfigError
        from mtl.studies.all_people import held_out_readers
        from mtl.studies.comparison import sub_batches
        from mtl.train.job import build_reader, reader_context, steps_override

        self.cfg, self.benchmark = cfg, benchmark
        context = reader_context(registry.build("backbone", constructor_config(registry.as_component(cfg["backbone"])),
                                                cfg["source"], "backbone"))
        self.train_readers = {}
        self.eval_readers = held_out_readers(cfg)  # as mtl eval --all-people finds them
        tasks = {task["name"]: task for task in cfg["tasks"]}
        self.sides = {name: held_out_sides(tasks[name], reader) for name, reader in self.eval_readers.items()}
        if not self.eval_readers:
            raise ConfigError(f"{cfg['source']}: no task has held-out people (reader holdout_classes and an "
                             "evaluation split): nothing to verify")
        self.dataset = benchmark.dataset_of() if benchmark else {name: name for name in self.eval_readers}
        self.identity = [t for t in cfg["tasks"] if t["name"] in self.dataset]
        for task in self.identity:
            self.train_readers[task["name"]] = build_reader(task, None, context)
            self.train_readers[task["name"]].set_augmentation(False)
        self.sub_batch = sub_batches(cfg)
        self.pinned = steps_override(cfg)  # a config in epochs: every arm takes the steps of its joint job

    def merged_task(self) -> dict:
        """The merged identity task as a task mapping (reader paths already absolute)."""
        first = self.identity[0]
        return {"name": "merged", "reader": {"type": "concat", "readers": [t["reader"] for t in self.identity]},
                "head": first["head"], "ratio": float(sum(t["ratio"] for t in self.identity)),
                "eval": {"split": False}}

    def oracle_task(self) -> dict:
        """The merged task with the true persons: the benchmark's oracle lists in place of the sources' lists."""
        task = self.merged_task()
        readers = []
        for t in self.identity:
            reader = {k: v for k, v in t["reader"].items() if k not in ("holdout_classes", "num_classes")}
            readers.append(dict(reader, list=self.benchmark.oracle_list(t["name"]),
                                num_classes=int(self.benchmark.info["people"])))
        task["reader"] = {"type": "concat", "shared_labels": True, "readers": readers}
        return task

    def others(self):
        """The tasks that are not identity tasks (kept in every arm)."""
        return [t for t in self.cfg["tasks"] if t["name"] not in self.dataset]

    def _one_head(self, name, placeholder, task_sets):
        """A run with the identity tasks replaced by one task file (``placeholder``), the summed sub-batch."""
        others = self.others()
        size = sum(self.sub_batch[t["name"]] for t in self.cfg["tasks"])
        sets = [f"tasks.{n + 1}.{item}" for n in range(len(others)) for item in task_sets]
        return [(name, [f"tasks=[{placeholder}{''.join(', ' + t['source'] for t in others)}]",
                        f"schedule.batch_size={size}", "cross_negatives.rate=0", *sets, *self.pinned])]

    def runs(self, arm, task_sets=()):
        """``[(run name, overrides)]`` of one arm for one seed; ``task_sets`` apply to every task of a run (the
        merged and oracle task files are written with them)."""
        every = task_overrides(task_sets, len(self.cfg["tasks"]))
        if arm == "separate":
            return [("separate", ["cross_negatives.rate=0", *every])]
        if arm == "alone":
            return [(f"alone_{t['name']}", [f"tasks=[{t['source']}]",  # its loss: the mean over its step
                                            f"schedule.batch_size={self.sub_batch[t['name']]}",
                                            "cross_negatives.rate=0", "tasks.0.loss_weight=1.0",
                                            *task_overrides(task_sets, 1), *self.pinned])
                    for t in self.identity if t["name"] in self.eval_readers]
        if arm in ("merged", "naive"):
            return self._one_head(arm, MERGED, task_sets)
        if arm == "oracle":
            return self._one_head(arm, ORACLE, task_sets)
        if arm == "two_stage":
            spec = {"tasks": "all", "rate": 1.0, "mask": "pairs", "pairs": SEPARATE_PAIRS}
            return [(arm, [f"cross_negatives={yaml.safe_dump(spec, default_flow_style=True).strip()}", *every])]
        spec = dict(CROSS_NEGATIVES[arm])
        if arm == "cross_oracle":
            spec["pairs"] = self.benchmark.duplicates
        return [(arm, [f"cross_negatives={yaml.safe_dump(spec, default_flow_style=True).strip()}", *every])]

    def sampling(self, arm) -> dict:
        """``{dataset: images of it per step}`` (expected, for the uniformly read merged arms) of one arm."""
        from mtl.data.scheduler import largest_remainder

        out = {}
        if arm in ("merged", "naive", "oracle"):
            others = self.others()
            size = sum(self.sub_batch[t["name"]] for t in self.cfg["tasks"])
            merged = largest_remainder(size, [sum(t["ratio"] for t in self.identity), *(t["ratio"] for t in others)])[0]
            total = sum(len(r) for r in self.train_readers.values())
            shares = {t["name"]: merged * len(self.train_readers[t["name"]]) / total for t in self.identity}
        else:
            shares = {t["name"]: float(self.sub_batch[t["name"]]) for t in self.identity}
        for task, share in shares.items():
            out[self.dataset[task]] = out.get(self.dataset[task], 0.0) + share
        return {k: round(v, 2) for k, v in out.items()}

    def true_pairs(self, shared_labels=False):
        """The true same-person pairs: the benchmark's ``duplicates.json``; with ``shared_labels``, equal data
        labels of two identity tasks (the ORL overlap case; each person by that label, as ``mtl overlap`` and
        ``same_person.json`` give them); else None (unknown)."""
        from mtl.evaluation.duplicates import read_pairs

        if self.benchmark is not None:
            return read_pairs(self.benchmark.duplicates)
        if not shared_labels:
            return None
        people = {t["name"]: (np.asarray(self.train_readers[t["name"]].class_labels)
                              if t["reader"].get("holdout_classes") is not None
                              else np.arange(self.train_readers[t["name"]].num_classes)) for t in self.identity}
        names = list(people)
        return [{"task_a": a, "label_a": int(p), "class_a": int(p), "task_b": b, "label_b": int(p), "class_b": int(p)}
                for n, a in enumerate(names) for b in names[n + 1:] for p in people[a] if p in people[b]]
