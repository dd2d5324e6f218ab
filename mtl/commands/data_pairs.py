"""``mtl data pairs SOURCE OUT.txt [--people P ...] [--positive N] [--seed S]``: a verification pairs list of
held-out people, in the format ``mtl eval --sets`` reads: ``img1<TAB>img2<TAB>1`` (same person) or ``0`` (two
people), one pair a line, paths relative to the list's own folder.

SOURCE is one of

* a folder with one sub-folder per person (LFW's ``Name/Name_0001.jpg``), people named by their folders;
* a label list (``relative/path<TAB>label``), people named by the ``labels.json`` beside it or the list's folders;
* a task file (``.yaml``/``.yml``/``.py``): the people its reader holds out of training (``holdout_classes``), the
  images of its evaluation split, i.e. the people a run of that task is verified on at its end.

``--people`` keeps only the people named (by name, or by the dataset's label as ``mtl data inspect`` lists them).
The pairs are those of the run's own evaluation of held-out people (:func:`mtl.evaluation.pairs.open_set_pairs`):
every same-person pair, or ``--positive N`` of them drawn by ``--seed`` when there are more (default: a task's
``max_positive_pairs``, else 3000), and as many different-person pairs drawn without repetition by the same seed,
alternating. For a task file, with the defaults, these are the very pairs a run of the task verified its held-out
people on at its end (``mtl eval RUN --sets LIST --folds file`` then gives the run's figure); ``mtl eval``'s default
folds are stratified by kind whatever the order of the file. A RecordIO pack has no image files to name: give the
folder or list it was packed from.
"""
import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from mtl.core.errors import ConfigError, DataError

TASK_FILES = (".yaml", ".yml", ".py")


@dataclass
class HeldOut:
    """The images a pairs list may use: their ``files`` (absolute), the dataset's label of each image's person
    (``labels``) and the names of the dataset's labels (``names``, None: the data has none)."""

    source: str
    files: List[str]
    labels: np.ndarray
    names: Optional[List[str]]
    max_positive: int = 3000  # the same-person pairs drawn by default

    def person(self, label: int) -> str:
        """The person of dataset label ``label``: its name (and label), else the label."""
        named = self.names[label] if self.names is not None and label < len(self.names) else None
        return f"'{named}' (label {label})" if named is not None else f"label {label}"


def task_held_out(path: str) -> HeldOut:
    """The held-out people of the task file ``path``: its evaluation split's images and their dataset labels."""
    from mtl.config.loading import load_task
    from mtl.train.job import build_reader

    task = load_task(path, os.path.dirname(os.path.abspath(path)), [], path, "")
    reader = build_reader(task, dict(task["eval"]["reader"] or {}, split="eval"))
    if not reader.open_set:
        raise ConfigError(f"task file '{path}' holds out no people (reader holdout_classes): its evaluation split is "
                          "of people it trains on; give holdout_classes, or the folder or list of the people to pair",
                          path, "reader.holdout_classes")
    files = reader.sample_files()
    if files is None:
        raise DataError(f"task file '{path}': reader '{reader.registered_name}' does not name a file for each image "
                        "(a RecordIO pack's are records), and a pairs list names image files; give the folder or "
                        "label list of its images instead (--people keeps the held-out ones)")
    people = reader.class_people()
    return HeldOut(path, files, np.asarray(people.labels)[np.asarray(reader.labels(), dtype=np.int64)], people.names,
                   reader.max_positive_pairs)


def data_held_out(path: str) -> HeldOut:
    """Every image of a folder of person folders or a label list, with its dataset label."""
    from mtl.writers.merge import read_source

    if not os.path.exists(path):
        raise DataError(f"pairs source '{path}' does not exist (a folder of person folders, a label list or a task "
                        "file)")
    source = read_source(path)
    if source.paths is None:
        raise DataError(f"pairs source '{path}' is a RecordIO pack: its images are records, not files a pairs list "
                        "can name; give the folder or label list it was packed from")
    return HeldOut(path, list(source.paths), np.asarray(source.labels, np.int64), source.names)


def read_held_out(path: str) -> HeldOut:
    """The images of ``path``: a task file's held-out people, else a folder or a label list (module docstring)."""
    if os.path.isfile(path) and path.lower().endswith(TASK_FILES):
        return task_held_out(path)
    return data_held_out(path)


def choose_people(held: HeldOut, people) -> HeldOut:
    """``held`` kept to the ``people`` given by name or dataset label (None: all of them)."""
    from mtl.core.registry import did_you_mean

    if not people:
        return held
    present = sorted(set(int(v) for v in held.labels))
    wanted = []
    for given in people:
        if held.names is not None and given in held.names:
            wanted.append(held.names.index(given))
        elif str(given).isdigit() and int(given) in present:
            wanted.append(int(given))
        else:
            known = [held.names[v] for v in present if held.names is not None and v < len(held.names)] or present
            raise ConfigError(f"'{given}' is not a person of '{held.source}'{did_you_mean(given, known)}: give the "
                              f"names or labels of its people ({', '.join(map(str, known[:8]))}"
                              f"{', ...' if len(known) > 8 else ''})", key="--people")
    keep = np.isin(held.labels, wanted)
    return HeldOut(held.source, [f for f, k in zip(held.files, keep) if k], held.labels[keep], held.names,
                   held.max_positive)


def write_pairs(out: str, held: HeldOut, positive: Optional[int] = None, seed: int = 0) -> dict:
    """Write the pairs list of ``held`` at ``out`` (module docstring; ``positive`` None: ``held.max_positive``); a
    summary of what was written."""
    from mtl.evaluation.pairs import open_set_pairs

    if os.path.isdir(out):
        raise ConfigError(f"'{out}' is a folder; OUT names the pairs list to write (e.g. {out.rstrip('/')}/pairs.txt)",
                          key="out")
    if os.path.exists(out):
        raise DataError(f"'{out}' exists: mtl data pairs writes a new list and overwrites nothing (remove it, or "
                        "choose another name)")
    try:
        first, second, issame = open_set_pairs(held.labels, held.max_positive if positive is None else positive, seed)
    except DataError:
        raise DataError(f"pairs source '{held.source}': {len(held.labels)} images of "
                        f"{len(np.unique(held.labels))} people make no pair of each kind; a pairs list needs two "
                        "people and one person with two images") from None
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    names = [os.path.relpath(f, folder) for f in held.files]
    temporary = os.path.join(folder, f".{os.path.basename(out)}.partial-{os.getpid()}")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            for a, b, same in zip(first, second, issame):
                f.write(f"{names[a]}\t{names[b]}\t{int(same)}\n")
        os.replace(temporary, out)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    used = np.unique(np.concatenate([first, second]))
    return {"out": out, "pairs": int(len(issame)), "same": int(issame.sum()), "different": int((~issame).sum()),
            "people": int(len(np.unique(held.labels))), "images": int(len(held.labels)),
            "images_used": int(len(used)), "issame": issame}


def _run_pairs(args) -> int:
    from mtl.evaluation.metrics import small_folds_warning

    if args.positive is not None and args.positive < 1:
        raise ConfigError(f"must be a whole number >= 1, got {args.positive}", key="--positive")
    held = choose_people(read_held_out(args.source), args.people)
    found = write_pairs(args.out, held, args.positive, args.seed)
    print(f"wrote {found['pairs']} pairs ({found['same']} same-person, {found['different']} different-person) of "
          f"{found['people']} people ({found['images']} images) from {args.source} to {args.out}")
    warning = small_folds_warning(found["issame"], folds=min(10, found["pairs"]))  # the folds mtl eval cuts
    if warning:
        print(warning)
    print(f"next: mtl eval RUN_DIR --sets {args.out}")
    return 0


def add_pairs_cli(sub):
    """Register ``data pairs SOURCE OUT [--people ...] [--positive N] [--seed S]`` on the ``data`` sub-parsers."""
    p = sub.add_parser("pairs", help="a verification pairs list (img1<TAB>img2<TAB>0|1, for mtl eval --sets) of "
                                     "held-out people")
    p.add_argument("source", help="a folder of person folders, a label list, or a task file (its held-out people: "
                                  "reader holdout_classes)")
    p.add_argument("out", help="the pairs list to write (paths in it relative to its folder)")
    p.add_argument("--people", nargs="+", default=None, metavar="PERSON",
                   help="only these people (names, or the dataset's labels as mtl data inspect lists them)")
    p.add_argument("--positive", type=int, default=None,
                   help="at most this many same-person pairs (drawn by --seed when there are more), as many "
                        "different-person pairs (default: a task's max_positive_pairs, else 3000)")
    p.add_argument("--seed", type=int, default=0, help="which pairs are drawn")
    p.set_defaults(func=_run_pairs)
    return p
