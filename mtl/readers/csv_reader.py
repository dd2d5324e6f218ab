"""Users' own tables: a CSV file with a header row, named feature columns and a class or target columns."""
import csv
import os

import numpy as np

from mtl.core.errors import ConfigError, DataError
from mtl.core.registry import did_you_mean, register_reader
from mtl.core.utf8 import open_utf8
from mtl.readers._tabular import TableReader
from mtl.readers.base import MissingFile


def read_csv(path: str, delimiter: str = ","):
    """(header, rows) of a CSV file with a header row; a DataError for a missing/empty file or a ragged row."""
    if not os.path.isfile(path):
        raise MissingFile(path, "CSV file", key="path")
    with open_utf8(path, "CSV file", newline="") as f:
        lines = list(csv.reader(f, delimiter=delimiter))
    lines = [(number, row) for number, row in enumerate(lines, start=1) if any(cell.strip() for cell in row)]
    if not lines:
        raise DataError(f"CSV file '{path}' is empty: expected a header row naming the columns")
    (_, header), rows = lines[0], lines[1:]
    header = [name.strip() for name in header]
    for number, row in rows:
        if len(row) != len(header):
            raise DataError(f"CSV file '{path}' line {number}: {len(row)} cells, the header names {len(header)} "
                            f"columns")
    if not rows:
        raise DataError(f"CSV file '{path}' has a header but no data rows")
    return header, rows


def numeric_columns(path, header, rows, names):
    """float64 ``[N, len(names)]`` of the named columns; a DataError naming line, column and cell if not a number."""
    out = np.empty((len(rows), len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        column = header.index(name)
        for i, (number, row) in enumerate(rows):
            cell = row[column].strip()
            try:
                out[i, j] = float(cell)
            except ValueError:
                out[i, j] = np.nan
            if not np.isfinite(out[i, j]):
                raise DataError(f"CSV file '{path}' line {number} column '{name}': expected a finite number, got "
                                f"{cell!r}")
    return out


@register_reader("csv")
class CsvReader(TableReader):
    """Your own table from a CSV file: named feature columns, a class column (``label``) and/or target columns.

    ``path``: the CSV file (header row first; relative paths are taken from the task file's folder when the file
    is there). ``label``: a column of class names or numbers, mapped in sorted order to ids 0..C-1
    (``class_names`` keeps the order). ``target``: a list of numeric columns for the ``regression`` head.
    ``features``: the numeric input columns (default: every other column). Split and standardisation as the
    ``table`` reader: ``eval_fraction`` held out (stratified by class), statistics of the training split only.

    Parameters:
        path (str): the CSV file (a header row names the columns)
        label (str): the column of class names or numbers (mapped in sorted order to labels 0..C-1)
        target (list): the numeric columns of regression targets
        features (list): the numeric input columns (default: every other column)
        delimiter (str): the cell separator
    """

    def __init__(self, path, label=None, target=None, features=None, split="train", eval_fraction=0.25, seed=0,
                 standardize=True, standardize_targets=True, pad_to=None, feature_field="features", delimiter=","):
        if label is None and not target:
            raise ConfigError("give 'label' (a class column) and/or 'target' (a list of numeric columns)", key="label")
        targets = [target] if isinstance(target, str) else list(target or [])
        self.path = str(path)
        header, rows = read_csv(self.path, delimiter)
        used = ([label] if label is not None else []) + targets
        features = [c for c in header if c not in used] if features is None else list(features)
        if not features:
            raise ConfigError(f"CSV file '{self.path}' has no feature column left", key="features")
        for key, names in (("label", [label] if label is not None else []), ("target", targets),
                           ("features", features)):
            for name in names:
                if name not in header:
                    raise ConfigError(f"CSV file '{self.path}' has no column '{name}'{did_you_mean(name, header)}; "
                                      f"its columns: {', '.join(header)}", key=key)
        self.feature_names, self.target_names = features, targets
        self.output_names = targets or None
        classes = None
        if label is not None:
            cells = [row[header.index(label)].strip() for _, row in rows]
            empty = [number for (number, _), cell in zip(rows, cells) if not cell]
            if empty:
                raise DataError(f"CSV file '{self.path}' line {empty[0]} column '{label}': the class cell is empty")
            self.class_names = sorted(set(cells), key=_class_order)
            ids = {name: i for i, name in enumerate(self.class_names)}
            classes = np.array([ids[c] for c in cells], dtype=np.int64)
        values = numeric_columns(self.path, header, rows, targets) if targets else None
        self._build(numeric_columns(self.path, header, rows, features), classes, values, split, eval_fraction, seed,
                    standardize, standardize_targets, pad_to, feature_field)


def _class_order(name: str):
    """Numbers sort by value (2 before 10), then names alphabetically."""
    try:
        return (0, float(name), "")
    except ValueError:
        return (1, 0.0, name)
