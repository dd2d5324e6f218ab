"""Names of the labels a reader yields: which folder (person), class, attribute or measured property a label stands
for, so that ``mtl data inspect``, ``holdout_classes``, ``mtl overlap`` and ``mtl predict`` can say them.

A label map is a ``labels.json`` file: ``{field: [name of value 0, name of value 1, ...]}``, e.g.
``{"label": ["s1", "s10", "s11", ...]}``. ``mtl data pack`` writes one beside the pack it makes (an image folder's
sub-folder names, in the order that numbers them); a label list's readers and tools find one beside the list, or read
the names off the list's paths when every label's images sit in one folder of their own (``s12/3.png`` -> ``s12``).
A training run writes ``output_dir/labels.json`` (``{task: {field: names}}``) and an export keeps it.
"""
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from mtl.core.errors import DataError
from mtl.core.utf8 import open_utf8

LABELS_FILE = "labels.json"


def label_file(folder: str) -> str:
    """Where the label map of a data folder is (``folder/labels.json``)."""
    return os.path.join(folder or ".", LABELS_FILE)


def read_label_file(path: str) -> Optional[Dict[str, List[str]]]:
    """The label map in ``path`` (``{field: [names]}``), None when there is no such file; a DataError naming the
    file when it is not such a map."""
    if not os.path.isfile(path):
        return None
    try:
        with open_utf8(path, "label map") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"label map '{path}' cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, list) and
                                             all(isinstance(n, str) for n in v) for k, v in data.items()):
        raise DataError(f"label map '{path}': expected a mapping of field names to lists of names, e.g. "
                        '{"label": ["s1", "s10"]}')
    return data


def write_label_file(path: str, names: Dict[str, Sequence[str]]):
    """Write the label map ``names`` (``{field: [names]}``) to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({field: [str(n) for n in values] for field, values in names.items()}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")


def names_from_paths(paths: Sequence[str], labels: Sequence[float]) -> Optional[List[str]]:
    """Class names read off image paths: when every label's images are in one folder of their own (the folder the
    image is in, ``faces/s12/3.png`` -> ``s12``), the folder names in label order (``"<n>"`` for a label without
    images); None when the folders do not tell (images at the top, a folder shared by two labels, a label in two)."""
    folders = {}
    for path, label in zip(paths, labels):
        if not np.isfinite(label):
            continue
        parts = str(path).replace("\\", "/").split("/")
        if len(parts) < 2:
            return None
        folders.setdefault(int(label), set()).add(parts[-2])
    if not folders or any(len(f) != 1 for f in folders.values()):
        return None
    names = {label: next(iter(f)) for label, f in folders.items()}
    if len(set(names.values())) != len(names):
        return None
    return [names.get(label, str(label)) for label in range(max(names) + 1)]


def complete(names: Optional[Sequence[str]], count: int) -> Optional[List[str]]:
    """``names`` for labels ``0..count-1``: the given ones, then ``"<n>"`` for labels past them (None stays None)."""
    if names is None:
        return None
    names = [str(n) for n in names[:count]]
    return names + [str(i) for i in range(len(names), count)]


def label_index(names: Sequence[str], wanted, what: str) -> int:
    """The label whose name is ``wanted`` (a ParameterError naming ``what`` and the closest names otherwise)."""
    from mtl.core.errors import ParameterError
    from mtl.core.registry import did_you_mean

    if wanted in names:
        return list(names).index(wanted)
    raise ParameterError(f"{what} names '{wanted}', which is not a label name of the data{did_you_mean(wanted, names)}"
                         f" (its names: {', '.join(list(names)[:10])}{', ...' if len(names) > 10 else ''})")


def run_label_names(job) -> Dict[str, Dict[str, List[str]]]:
    """``{task: {field: names}}`` of a built job's training readers (tasks whose reader knows no names left out)."""
    return {t.name: names for t in job.tasks if (names := t.reader.label_names())}


def field_names(mapping: Optional[dict], task: str, field: str) -> Optional[List[str]]:
    """The names of ``field`` of ``task`` in a run's or an export's label map, or None."""
    return ((mapping or {}).get(task) or {}).get(field)
