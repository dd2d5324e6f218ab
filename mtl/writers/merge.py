"""``mtl data merge OUT NAME=SOURCE NAME=SOURCE ... --pairs PAIRS.json``: one de-duplicated dataset from several.

The other way to train on datasets that share people (the first is one head each, masked with the same-person pairs:
docs/faces.md): every person becomes one class. Each SOURCE is a folder with one sub-folder per person (LFW's
``Name/Name_0001.jpg``; labels in the order of the sorted folder names, as ``mtl data pack`` gives them), a label list
(``relative/path<TAB>label``) or a RecordIO pack; NAME is how the pairs file calls it (the task names of the run that
``mtl overlap --json`` wrote it from). The pairs give people by name or by the dataset's label
(:mod:`mtl.data.same_person`). Every person of every source is a node; every pair joins two nodes (union-find, so
chains merge: a-b and b-c make one class of a, b and c); each group becomes one class, numbered in the order of its
first person (source order, then label). Only people with images are classes.

Written at ``OUT`` (a prefix such as ``runs/merged/train``, or a folder, then ``folder/train``): ``OUT.txt``, a label
list whose paths are relative to its folder (sources on disk), or with ``--pack`` ``OUT.rec``, ``OUT.idx`` and
``property`` (images stored as they are, grouped by class, InsightFace's layout; a pack source needs it); and
``labels.json`` beside them, naming every class by its sources' people: ``lfw/George_W_Bush+glint/1234``. Nothing
that exists is overwritten; files are written under temporary names and renamed once complete.
"""
import os
from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np

from mtl.core.errors import ConfigError, DataError
from mtl.core.union_find import DisjointSets
from mtl.data.same_person import People, check_tasks, read_pairs, resolve
from mtl.writers.pack import folder_items, list_items, output_prefix


@dataclass
class Source:
    """One dataset to merge: each image's label (``labels``), the label count and names of its labels, how to read
    and name an image (``image(i)`` bytes, ``where(i)``), its files (``paths``; None for a pack) and the image size
    its ``property`` states (a pack)."""

    name: str
    path: str
    labels: np.ndarray
    count: int
    names: Optional[List[str]]
    image: Callable[[int], bytes]
    where: Callable[[int], str]
    paths: Optional[List[str]] = None
    size: Optional[tuple] = None

    def person(self, label: int) -> str:
        """``NAME/person`` of ``label`` (its name, else its number)."""
        named = self.names[label] if self.names is not None and label < len(self.names) else str(label)
        return f"{self.name}/{named}"


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise DataError(f"cannot read image '{path}': {exc.strerror}") from None


def _files_source(name, path, files, labels, count, names) -> Source:
    return Source(name, path, np.asarray(labels, np.int64), int(count), names, lambda i: _read_file(files[i]),
                  lambda i: f"image '{files[i]}'", paths=[os.path.abspath(f) for f in files])


def _folder_source(name: str, path: str) -> Source:
    items, count, names = folder_items(path)
    return _files_source(name, path, [p for p, _ in items], [label for _, label in items], count, names)


def _list_source(name: str, path: str) -> Source:
    items, count, names = list_items(path)
    return _files_source(name, path, [p for p, _ in items], [label for _, label in items], count, names)


def _pack_source(name: str, path: str) -> Source:
    from mtl.data.recordio import RecordIOReader, unpack
    from mtl.readers.label_names import label_file, read_label_file
    from mtl.readers.recordio_reader import image_rows, read_property, resolve_paths

    rec, idx, prop = resolve_paths(path)
    records = RecordIOReader(rec, idx)
    rows, header_classes = image_rows(records)
    heads = records.scan_headers(rows)
    bad = np.flatnonzero(~heads["magic_ok"] | ~np.isfinite(heads["label"]) | (heads["label"] < 0))
    if len(bad):
        raise DataError(f"'{rec}' record {int(records.keys[rows[bad[0]]])}: unreadable header or label ({len(bad)} "
                        "such records; mtl data inspect lists them)")
    labels = heads["label"].astype(np.int64)
    stated = read_property(prop)
    count = stated[0] if stated else header_classes if header_classes is not None else int(labels.max()) + 1
    given = read_label_file(label_file(os.path.dirname(rec)))
    return Source(name, path, labels, int(count), given.get("label") if given else None,
                  lambda i: unpack(records.read_row(int(rows[i])), f"'{rec}' record {int(records.keys[rows[i]])}")[1],
                  lambda i: f"'{rec}' record {int(records.keys[rows[i]])}",
                  size=(stated[1], stated[2]) if stated else None)


def read_source(spec: str) -> Source:
    """The source ``NAME=PATH`` (or ``PATH``, named by its file or folder name): a pack (a folder holding
    ``train.rec``, a ``.rec``/``.idx`` file or prefix), a folder of person folders, or a label list."""
    name, path = spec.split("=", 1) if "=" in spec else (None, spec)
    name = name or os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    if os.path.isfile(os.path.join(path, "train.rec")) or path.endswith((".rec", ".idx")) or \
            (not os.path.exists(path) and os.path.isfile(path + ".rec")):
        return _pack_source(name, path)
    if os.path.isdir(path):
        return _folder_source(name, path)
    if os.path.isfile(path):
        return _list_source(name, path)
    raise DataError(f"merge source '{spec}': '{path}' is neither a folder of person folders, a label list nor a "
                    "RecordIO pack")


def joined_classes(sources: List[Source], joins) -> np.ndarray:
    """The merged class of every person: ``[(source, label)] -> class`` as one array per source (``-1`` for a label
    without images), from ``joins`` (pairs of ``(source, label)``) by union-find; classes numbered in the order of
    their first person (source, then label)."""
    present = [(s, int(label)) for s, src in enumerate(sources) for label in np.unique(src.labels)]
    groups = DisjointSets(present)
    for a, b in joins:
        groups.union(a, b)  # the group's root is its first person
    roots = sorted({groups.find(node) for node in present})
    number = {r: k for k, r in enumerate(roots)}
    out = [np.full(src.count, -1, np.int64) for src in sources]
    for node in present:
        out[node[0]][node[1]] = number[groups.find(node)]
    return out


def pair_joins(sources: List[Source], pairs_path: str) -> list:
    """``[((source, label), (source, label))]`` of the pairs file, each person checked: a name or label the source
    has, with images."""
    names = [s.name for s in sources]
    pairs = read_pairs(pairs_path)
    check_tasks(pairs, pairs_path, names, what="merge (NAME=SOURCE)")
    people = {s.name: People.numbered(s.count, s.names) for s in sources}
    found = resolve(pairs, pairs_path, people, {s.name: s.count for s in sources})
    joins = []
    for i, (task_a, label_a, task_b, label_b) in enumerate(found):
        ends = []
        for task, label in ((task_a, label_a), (task_b, label_b)):
            s = names.index(task)
            if not np.any(sources[s].labels == label):
                raise DataError(f"same-person pairs '{pairs_path}' entry {i}: the person of '{task}' "
                                f"({sources[s].person(label)}, label {label}) has no image in '{sources[s].path}'")
            ends.append((s, int(label)))
        joins.append(tuple(ends))
    return joins


def class_names(sources: List[Source], classes: List[np.ndarray]) -> List[str]:
    """Every merged class named by its people, ``src/person+src/person``, in (source, label) order."""
    members = [[] for _ in range(1 + max((int(c.max()) for c in classes if len(c)), default=-1))]
    for src, mapping in zip(sources, classes):
        for label in np.flatnonzero(mapping >= 0):
            members[mapping[label]].append(src.person(int(label)))
    return ["+".join(m) for m in members]


def _outputs(out_prefix: str, as_pack: bool):
    from mtl.readers.label_names import label_file

    prefix = output_prefix(out_prefix)
    folder = os.path.dirname(prefix) or "."
    files = (prefix + ".rec", prefix + ".idx", os.path.join(folder, "property")) if as_pack else (prefix + ".txt",)
    return prefix, files + (label_file(folder),)


def merge(out_prefix: str, specs: List[str], pairs_path: str = None, as_pack: bool = False) -> dict:
    """Merge the sources ``specs`` (``NAME=PATH``) into one dataset at ``out_prefix`` with the same-person pairs of
    ``pairs_path`` (module docstring); returns a summary (files, images, classes, people, joins)."""
    from mtl.writers.merge_write import write_list, write_pack

    if len(specs) < 2:
        raise ConfigError(f"merge needs two sources or more (NAME=PATH each), got {len(specs)}", key="sources")
    sources = [read_source(spec) for spec in specs]
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"source name '{twice[0]}' is given twice: name each source (NAME=PATH) as the pairs do",
                          key="sources")
    packs = [s.name for s in sources if s.paths is None]
    if packs and not as_pack:
        raise ConfigError(f"source '{packs[0]}' is a RecordIO pack: its images can only be merged into a pack (add "
                          "--pack)", key="--pack")
    prefix, files = _outputs(out_prefix, as_pack)
    there = [f for f in files if os.path.exists(f)]
    if there:
        raise DataError(f"'{there[0]}' exists: merge writes a new dataset and overwrites nothing (choose another OUT, "
                        "or remove it)")
    joins = pair_joins(sources, pairs_path) if pairs_path else []
    classes = joined_classes(sources, joins)
    labels = class_names(sources, classes)
    written = (write_pack if as_pack else write_list)(files, sources, classes, labels)
    people = sum(int((c >= 0).sum()) for c in classes)
    return {"files": list(files), "images": written, "classes": len(labels), "people": people, "joins": len(joins),
            "sources": {s.name: s.path for s in sources}}
