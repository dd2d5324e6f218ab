"""Face images in a folder plus a label list (PLSC style): one ``relative/path<TAB>label`` line per image."""
import os

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError, absent
from mtl.core.registry import register_reader
from mtl.core.utf8 import open_utf8
from mtl.readers._face import FaceImageReader
from mtl.readers.base import MissingFile
from mtl.readers.label_names import label_file, names_from_paths, read_label_file


def parse_label_list(list_path: str):
    """Read a label list; return (entries, problems).

    ``entries``: one (line number, relative path, label or NaN) per non-blank, non-``#`` line. A line is
    ``path<TAB>label``; without a tab it is split at its last run of spaces. ``problems``: entry position ->
    message for lines that do not parse.
    """
    if not os.path.isfile(list_path):
        raise DataError(f"label list '{list_path}' {absent(list_path)}")
    entries, problems = [], {}
    with open_utf8(list_path, "image list") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rsplit("\t", 1) if "\t" in line else line.strip().rsplit(None, 1)
            label = np.nan
            if len(parts) == 2 and parts[0].strip():
                try:
                    label = float(int(parts[1].strip()))
                except ValueError:
                    problems[len(entries)] = (
                        f"label list '{list_path}' line {lineno}: label {parts[1].strip()!r} is not an integer"
                    )
                if label < 0:  # a class index: 0 .. classes - 1 (a negative one broke counts and heads later)
                    problems[len(entries)] = (f"label list '{list_path}' line {lineno}: label {int(label)} is "
                                              "negative; class labels count from 0")
                    label = np.nan
                path = parts[0].strip()
            else:
                path = line.strip()
                problems[len(entries)] = f"label list '{list_path}' line {lineno}: expected 'path<TAB>label'"
            entries.append((lineno, path, label))
    return entries, problems


def read_target_table(path: str, columns, paths):
    """``[len(paths), len(columns)]`` float64 targets of the images ``paths`` from a tab-separated table.

    The table's first line names its columns (a leading ``#`` is ignored); its first column is the image path as
    the label list writes it. ``columns`` are column names or 0-based numbers. Raises :class:`DataError` naming the
    file and line (or the image) for a missing column, a path without a row or a value that is not a number."""
    if not os.path.isfile(path):
        raise DataError(f"target list '{path}' {absent(path)}")
    with open_utf8(path, "target list") as f:
        lines = [line.rstrip("\r\n") for line in f]
    if not lines:
        raise DataError(f"target list '{path}' is empty: expected a header line naming its columns")
    header = [c.strip() for c in lines[0].lstrip("#").split("\t")]
    index = []
    for column in columns:
        number = column if isinstance(column, int) and not isinstance(column, bool) else None
        if number is None and column not in header:
            raise DataError(f"target list '{path}' has no column {column!r}; its columns: {header}")
        index.append(header.index(column) if number is None else number)
    rows = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if line.strip() and not line.lstrip().startswith("#"):
            cells = line.split("\t")
            rows[cells[0].strip()] = (lineno, cells)
    out = np.empty((len(paths), len(index)), dtype=np.float64)
    for n, image in enumerate(paths):
        if image not in rows:
            raise DataError(f"target list '{path}' has no row for image '{image}'")
        lineno, cells = rows[image]
        try:
            out[n] = [float(cells[k]) for k in index]
        except (IndexError, ValueError):
            raise DataError(f"target list '{path}' line {lineno}: columns {list(columns)} must hold numbers, got "
                            f"{cells}") from None
    return out


@register_reader("image_list")
class ImageListReader(FaceImageReader):
    """Face images under ``root`` listed with their class labels in ``list`` (``relative/path<TAB>label`` lines).

    ``root`` defaults to the list file's folder. ``check_files`` stats every image at start-up so that a missing
    file is reported (or skipped) before training; turn it off for huge lists on slow file systems. Other
    parameters (``split``, ``eval_fraction``, ``flip``, ``on_bad_sample``, ``decoder``, ``augment``,
    ``holdout_classes``, ``preprocess``, ...) as for the ``recordio`` reader; ``num_classes`` defaults to max
    label + 1.

    Per-image regression targets: ``target_list`` (a tab-separated table with a header line, first column the
    image path as in the list) and ``target_columns`` (names or numbers) add a float32 vector ``target``
    (``target_field``) of ``value * target_scale`` to every sample. The evaluation split of held-out people is then
    scored on those targets (regression), not by verification.

    Parameters:
        list (str): the label list: relative/path<TAB>label lines (a labels.json beside it names the labels)
        root (str): the folder the list's paths start from (default: the list's folder)
        check_files (bool): look for every listed image at start-up (turn off for huge lists on slow disks)
        target_list (str): a tab-separated table of per-image regression targets (header line, first column the
            image path)
        target_columns (list): the columns of target_list to use (names or numbers)
        target_scale (float): targets are multiplied by this
        target_field (str): name of the regression target field
    """

    def __init__(self, list, root=None, split="train", eval_fraction=0.0, num_classes=None, image_size=112,  # noqa: A002
                 flip=None, on_bad_sample="error", seed=0, check_files=True, image_field="image",
                 label_field="label", decoder="auto",
                 augment=None, holdout_classes=None, max_positive_pairs=3000, preprocess=None,
                 target_list=None, target_columns=None, target_scale=1.0, target_field="target"):
        self.source = f"image_list '{list}'"
        self._check_options(split, eval_fraction, image_size, flip, on_bad_sample, seed, image_field, label_field,
                            decoder, augment, holdout_classes, max_positive_pairs, preprocess)
        self.list_path = str(list)
        if not os.path.isfile(self.list_path):
            raise MissingFile(self.list_path, "label list", key="list")
        self.root = str(root) if root is not None else (os.path.dirname(self.list_path) or ".")
        if not os.path.isdir(self.root):
            raise MissingFile(self.root, "image root", key="root")
        entries, problems = parse_label_list(self.list_path)
        self._lines = np.array([e[0] for e in entries], dtype=np.int64)
        # one numpy bytes array, not a list of str: forked workers then share it without copy-on-write churn
        self._paths = np.array([e[1].encode("utf-8") for e in entries], dtype=np.bytes_)
        labels = np.array([e[2] for e in entries], dtype=np.float64)
        self._list_labels = labels  # every line's label (NaN: unreadable), for names read off the list's folders
        if check_files:
            for pos in range(len(entries)):
                path = self._path(pos)
                if pos not in problems and not os.path.isfile(path):
                    problems[pos] = f"{self._describe(pos)}: file '{path}' does not exist"
        self._targets = self._read_targets(target_list, target_columns, target_scale, target_field)
        self._finish(np.arange(len(entries)), labels, problems, num_classes=num_classes)
        if self._targets is not None:
            self.open_set = False  # held-out people are scored on their targets
            self.num_outputs = self._targets.shape[1]

    def _read_targets(self, target_list, target_columns, target_scale, target_field):
        """The ``[entries, k]`` float32 targets (scaled), or None without ``target_list``."""
        if target_list is None:
            if target_columns is not None:
                raise ConfigError("target_columns needs target_list (the table that holds them)", None,
                                  "target_columns")
            return None
        if not isinstance(target_columns, (list, tuple)) or not target_columns:
            raise ConfigError(f"target_columns must be a non-empty list of column names or numbers, got "
                              f"{target_columns!r}", None, "target_columns")
        try:
            scale = float(target_scale)
        except (TypeError, ValueError):
            scale = float("nan")
        if isinstance(target_scale, bool) or not np.isfinite(scale) or scale == 0.0:
            raise ConfigError(f"target_scale must be a non-zero number, got {target_scale!r}", None,
                              "target_scale")
        self.target_field = target_field
        paths = [p.decode("utf-8") for p in self._paths]
        return (read_target_table(str(target_list), list(target_columns), paths) * scale).astype(np.float32)

    def _extra_fields(self):
        if self._targets is None:
            return []
        return [Field(self.target_field, (self._targets.shape[1],), "float32")]

    def _extra_values(self, candidate: int) -> dict:
        if self._targets is None:
            return {}
        return {self.target_field: self._targets[candidate].copy()}

    def _data_class_names(self):
        """``labels.json`` beside the list, else the folders the list's images are in, when each label has its own
        (:func:`mtl.readers.label_names.names_from_paths`)."""
        given = read_label_file(label_file(os.path.dirname(self.list_path)))
        if given is not None:
            return given.get(self.label_field)
        return names_from_paths([p.decode("utf-8") for p in self._paths], self._list_labels)

    def _names_hint(self) -> str:
        return (f"no {label_file(os.path.dirname(self.list_path))}, and the list's folders do not tell one label from "
                "another")

    def _relative(self, candidate: int) -> str:
        return self._paths[candidate].decode("utf-8")

    def _path(self, candidate: int) -> str:
        return os.path.join(self.root, self._relative(candidate))

    def sample_files(self):
        """The absolute path of every sample's image, in sample order."""
        return [os.path.abspath(self._path(int(c))) for c in self._candidates]

    def _describe(self, candidate: int) -> str:
        return f"label list '{self.list_path}' line {int(self._lines[candidate])} ('{self._relative(candidate)}')"

    def _load_bytes(self, candidate: int) -> bytes:
        path = self._path(candidate)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise DataError(f"{self._describe(candidate)}: cannot read '{path}': {exc.strerror}") from None
