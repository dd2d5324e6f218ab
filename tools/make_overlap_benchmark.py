"""A benchmark whose face datasets really share people, built from a multi-dataset config.

    python tools/make_overlap_benchmark.py --config examples/configs/faces_six.yaml --fraction 0.5 --seed 0 \\
        --out runs/overlap_f0.5

Every identity task of the config (an ``image_list`` reader without ``target_list``) becomes two sources, tasks
``NAME_a`` and ``NAME_b``, that share a fraction F of the dataset's training people:

* **Shared people**: ``round(F * T)`` of the dataset's T training people, drawn with
  ``numpy.random.default_rng([seed, crc32(NAME)])`` (a dataset's draw does not depend on the others). Each shared
  person's images are split between the sources by condition (:mod:`mtl.evaluation.conditions`): where the image
  root's ``index.tsv`` gives the light azimuth (Extended Yale B), light from one side (azimuth < 0) goes to source A
  and from the other (azimuth > 0) to source B; the 6 frontal-light images (azimuth 0) belong to neither side and
  alternate between A and B in list order, the first to A. Elsewhere the person's first ``ceil(n / 2)`` images in
  list order go to A, the others to B.
* **The other training people** alternate between the sources in label order (the first to A) with all their images.
* **Held-out people** (the task's ``holdout_classes``, whatever they are) stay exactly as they are, in source A's task
  only: the same images in the same order, evaluated once per dataset. Source B has no evaluation.

Each source's list labels its people densely (its training people 0..K-1 in the data's label order, then, in source
A, the held-out people K.. in the same order, named by ``holdout_classes``), so that a source label is the class id
of its head. Written to ``DIR``:

* ``faces_overlap.yaml``: the config with its identity tasks replaced by the sources (2 x 6 = 12 heads for the six
  datasets; each source keeps the task's reader options and head, and half its ratio and half its loss weight, so
  each dataset keeps its share of the batch and of the loss), its other keys and other tasks kept,
  ``output_dir: runs/faces_overlap``;
* ``tasks/NAME_a.yaml``, ``tasks/NAME_b.yaml`` and their lists ``lists/NAME_a.txt``, ``lists/NAME_b.txt`` (the
  images stay where they are: the reader's ``root`` points at them);
* ``duplicates.json``: the true pairs, in the form ``mtl overlap --json`` writes (``task_a, class_a, task_b,
  class_b, similarity``; similarity 1.0: a true pair);
* ``oracle/NAME_a.txt``, ``oracle/NAME_b.txt``: each source's training images in the same order with the true person
  as label, one label space over every dataset (the report's ``oracle`` arm: a ``concat`` reader with
  ``shared_labels: true`` over them);
* ``benchmark.json``: fraction, seed, the source config, per dataset its tasks, rule, training, shared and held-out
  people (the data's labels), and ``persons``: the data label (person) of every class of every source.
"""
import argparse
import json
import os
import sys
import zlib
from dataclasses import dataclass

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mtl.core.errors import ConfigError  # noqa: E402

SOURCES = ("a", "b")
OUTPUT_DIR = "runs/faces_overlap"


@dataclass
class DatasetSplit:
    """One dataset's images (list order) and where each goes: ``source`` 0 (A) or 1 (B) per image."""

    name: str
    root: str
    paths: list
    labels: np.ndarray   # the data's labels (person)
    held: np.ndarray     # held-out people (sorted labels)
    shared: np.ndarray   # shared people (sorted labels)
    source: np.ndarray   # per image: 0 or 1
    rule: str            # condition rule of the shared people's split

    def training_people(self) -> np.ndarray:
        """The dataset's training people (sorted labels)."""
        return np.setdiff1d(np.unique(self.labels), self.held)

    def people(self, k: int) -> np.ndarray:
        """Source k's training people (sorted labels): its classes 0..K-1."""
        chosen = (self.source == k) & ~np.isin(self.labels, self.held)
        return np.unique(self.labels[chosen])

    def classes(self, k: int) -> np.ndarray:
        """Source k's class of every one of its images, in list order (held-out people after its training
        people)."""
        people = [*self.people(k).tolist(), *(self.held.tolist() if k == 0 else [])]
        index = {person: i for i, person in enumerate(people)}
        return np.asarray([index[int(p)] for p in self.labels[self.source == k]], dtype=np.int64)


def shared_people(name, training, counts, fraction, seed) -> np.ndarray:
    """``round(fraction * T)`` of the T ``training`` people (those with two images or more can be split), drawn from
    ``default_rng([seed, crc32(name)])``; sorted."""
    count = int(np.floor(fraction * len(training) + 0.5))
    eligible = np.asarray([p for p in training if counts[p] >= 2], dtype=np.int64)
    if count > len(eligible):
        raise ConfigError(f"dataset '{name}': --fraction {fraction} asks for {count} shared people but only "
                          f"{len(eligible)} training people have two images or more to split")
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
    return np.sort(rng.choice(eligible, size=count, replace=False)) if count else np.zeros(0, dtype=np.int64)


def assign_sources(labels, held, shared, azimuths) -> np.ndarray:
    """Source (0 = A, 1 = B) of every image: held-out people in A; shared people split by condition (images on
    neither side alternating, the first to A); the other training people alternating in label order, first to A."""
    from mtl.evaluation.conditions import condition_sides

    source = np.zeros(len(labels), dtype=np.int64)
    others = np.setdiff1d(np.unique(labels), np.concatenate([held, shared]))
    for k, person in enumerate(others):
        source[labels == person] = k % 2
    for person in shared:
        rows = np.flatnonzero(labels == person)
        sides = condition_sides(labels[rows], None if azimuths is None else azimuths[rows])
        neither = sides < 0
        sides[neither] = np.arange(int(neither.sum())) % 2
        source[rows] = sides
    return source


def split_dataset(task, fraction, seed) -> DatasetSplit:
    """The split of one identity task's list."""
    from mtl.evaluation.conditions import light_azimuths, rule_of
    from mtl.readers.image_list import parse_label_list

    reader = task["reader"]
    for key in ("list", "root", "holdout_classes"):
        if key in task["eval"]["reader"]:
            raise ConfigError(f"task '{task['name']}': eval.reader.{key} is not supported by the overlap benchmark "
                              "(the held-out people must come from the task's own list)", task["source"])
    entries, problems = parse_label_list(reader["list"])
    if problems:
        raise ConfigError(problems[min(problems)], task["source"], "reader.list")
    root = reader.get("root") or os.path.dirname(reader["list"])
    paths = [path for _, path, _ in entries]
    labels = np.asarray([label for _, _, label in entries], dtype=np.int64)
    held = held_out_people(task)
    training = np.setdiff1d(np.unique(labels), held)
    counts = {int(p): int(c) for p, c in zip(*np.unique(labels, return_counts=True))}
    shared = shared_people(task["name"], training, counts, fraction, seed)
    azimuths = light_azimuths(root, paths)
    source = assign_sources(labels, held, shared, azimuths)
    for k in (0, 1):
        if not ((source == k) & ~np.isin(labels, held)).any():
            raise ConfigError(f"dataset '{task['name']}': source {SOURCES[k].upper()} would hold no training person "
                              f"({len(training)} training people, fraction {fraction:g})", task["source"])
    return DatasetSplit(task["name"], root, paths, labels, held, shared, source, rule_of(azimuths))


def held_out_people(task) -> np.ndarray:
    """The task's held-out people (data labels), as its reader resolves ``holdout_classes`` (none: empty)."""
    from mtl.train.job import build_reader

    if task["reader"].get("holdout_classes") is None:
        return np.zeros(0, dtype=np.int64)
    reader = build_reader(task, {"split": "eval"})
    return np.asarray(reader.class_labels, dtype=np.int64)


def identity_tasks(cfg):
    """The tasks split into two sources: face identity lists (``image_list`` readers without per-image targets)."""
    found = [t for t in cfg["tasks"] if t["reader"]["type"] == "image_list" and not t["reader"].get("target_list")]
    if not found:
        raise ConfigError("no task reads an image_list of identities: nothing to split into sources", cfg["source"],
                          "tasks")
    return found


def write_list(path, header, rows):
    """A label list: ``#`` header lines, then ``path<TAB>label`` rows."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"# {line}\n" for line in header)
        f.writelines(f"{p}\t{int(label)}\n" for p, label in rows)


def source_task(task, split, k, out):
    """The task mapping of source k of ``task`` (paths relative to ``out/tasks``)."""
    name = f"{task['name']}_{SOURCES[k]}"
    folder = os.path.join(out, "tasks")
    reader = {key: value for key, value in task["reader"].items() if key not in ("list", "root", "holdout_classes",
                                                                                  "num_classes")}
    reader.update(list=os.path.relpath(os.path.join(out, "lists", name + ".txt"), folder),
                  root=os.path.relpath(split.root, folder))
    if k == 0 and len(split.held):
        first = len(split.people(0))
        reader["holdout_classes"] = list(range(first, first + len(split.held)))
    evaluation = task["eval"] if k == 0 else {"enabled": False}
    return {"name": name, "reader": reader, "head": task["head"], "ratio": task["ratio"] / 2,
            "loss_weight": task["loss_weight"] / 2, "eval": evaluation}


def write_sources(task, split, out, fraction, seed, person_offset):
    """Lists, oracle lists and task files of the two sources of one dataset; ``{source task: persons}``."""
    persons = {}
    training = split.training_people()
    for k in (0, 1):
        name = f"{task['name']}_{SOURCES[k]}"
        mine = split.source == k
        paths = [p for p, keep in zip(split.paths, mine) if keep]
        held = np.isin(split.labels[mine], split.held)
        what = f"source {SOURCES[k].upper()} of {task['name']} (tools/make_overlap_benchmark.py --fraction " \
               f"{fraction:g} --seed {seed})"
        write_list(os.path.join(out, "lists", name + ".txt"),
                   [f"{name}: {what}", "path<TAB>label (label = class of this source; benchmark.json: its person)"],
                   zip(paths, split.classes(k)))
        oracle = person_offset + np.searchsorted(training, split.labels[mine][~held])
        write_list(os.path.join(out, "oracle", name + ".txt"),
                   [f"{name}: the training images of {what}", "path<TAB>label (label = the true person over every "
                    "dataset of the benchmark)"], zip([p for p, h in zip(paths, held) if not h], oracle))
        with open(os.path.join(out, "tasks", name + ".yaml"), "w") as f:
            f.write(f"# {what}\n")
            yaml.safe_dump(source_task(task, split, k, out), f, sort_keys=False)
        persons[name] = [int(p) for p in split.people(k)]
    return persons


def true_pairs(task, split):
    """``mtl overlap --json`` entries of the dataset's shared people."""
    a, b = split.people(0), split.people(1)
    return [{"task_a": f"{task['name']}_a", "class_a": int(np.searchsorted(a, p)), "task_b": f"{task['name']}_b",
             "class_b": int(np.searchsorted(b, p)), "similarity": 1.0} for p in split.shared]


def job_config(config_path, cfg, out, tasks):
    """The benchmark's job mapping: the config's own keys but ``tasks`` (and ``output_dir``), plug-in folders
    relative to ``out``."""
    from mtl.config.paths import resolve_path
    from mtl.config.yaml_files import read_job_yaml

    raw = read_job_yaml(config_path)
    here = os.path.dirname(os.path.abspath(config_path))
    raw["plugins"] = [os.path.relpath(resolve_path(p, here), out) for p in raw.get("plugins", [])]
    if not raw["plugins"]:
        del raw["plugins"]
    raw.update(output_dir=OUTPUT_DIR, tasks=tasks)
    return raw


def kept_task(task, out):
    """A task that is not split: its file (relative to ``out``), or its validated mapping when it was inline."""
    if not task["key"]:  # read from a task file
        return os.path.relpath(task["source"], out)
    return {k: v for k, v in task.items() if k not in ("source", "key")}


def build(config_path, fraction, seed, out):
    """Write the benchmark to ``out``; return ``benchmark.json``'s content."""
    from mtl.config.loading import load_job

    cfg = load_job(config_path)
    out = os.path.abspath(out)
    os.makedirs(os.path.join(out, "tasks"), exist_ok=True)
    splits = {t["name"]: split_dataset(t, fraction, seed) for t in identity_tasks(cfg)}
    refs, persons, pairs, datasets, offset = [], {}, [], {}, 0
    for task in cfg["tasks"]:
        if task["name"] not in splits:
            refs.append(kept_task(task, out))
            continue
        split = splits[task["name"]]
        persons.update(write_sources(task, split, out, fraction, seed, offset))
        offset += len(split.training_people())
        pairs += true_pairs(task, split)
        refs += [f"tasks/{task['name']}_{s}.yaml" for s in SOURCES]
        datasets[task["name"]] = {"tasks": [f"{task['name']}_{s}" for s in SOURCES], "eval_task": f"{task['name']}_a",
                                  "rule": split.rule, "training_people": split.training_people().tolist(),
                                  "shared_people": split.shared.tolist(), "held_out_people": split.held.tolist(),
                                  "images": [int((split.source == k).sum()) for k in (0, 1)]}
    with open(os.path.join(out, "faces_overlap.yaml"), "w") as f:
        f.write(f"# The overlap benchmark of {os.path.relpath(os.path.abspath(config_path), ROOT)}: fraction "
                f"{fraction:g}, seed {seed} (tools/make_overlap_benchmark.py; benchmark.json says what is where)\n")
        yaml.safe_dump(job_config(config_path, cfg, out, refs), f, sort_keys=False)
    with open(os.path.join(out, "duplicates.json"), "w") as f:
        json.dump(pairs, f, indent=1)
    info = {"config": os.path.abspath(config_path), "fraction": fraction, "seed": seed, "people": offset,
            "datasets": datasets, "persons": persons}
    with open(os.path.join(out, "benchmark.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def summary(info) -> str:
    """One row per dataset: people, shared, per source people and images, held-out people, rule."""
    from tabulate import tabulate

    rows = []
    for name, d in info["datasets"].items():
        a, b = (len(info["persons"][t]) for t in d["tasks"])
        rows.append([name, len(d["training_people"]), len(d["shared_people"]), f"{a} / {b}",
                     f"{d['images'][0]} / {d['images'][1]}", len(d["held_out_people"]), d["rule"]])
    return tabulate(rows, headers=["dataset", "training people", "shared", "people A / B", "images A / B",
                                   "held out (in A)", "shared split by"], tablefmt="github")


def parse_args(argv=None):
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a multi-dataset job config (e.g. faces_six.yaml)")
    parser.add_argument("--fraction", type=float, required=True, help="share F of each dataset's training people "
                                                                      "in both sources, in [0, 1]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw of the shared people")
    parser.add_argument("--out", required=True, help="the benchmark's folder")
    args = parser.parse_args(argv)
    if not 0.0 <= args.fraction <= 1.0:
        parser.error(f"--fraction must be in [0, 1], got {args.fraction}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    return args


def main(argv=None):
    """Build the benchmark and print what went where."""
    args = parse_args(argv)
    info = build(args.config, args.fraction, args.seed, args.out)
    print(summary(info))
    print(f"wrote {os.path.join(args.out, 'faces_overlap.yaml')} ({2 * len(info['datasets'])} identity tasks), "
          f"duplicates.json, benchmark.json")
    return info


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
