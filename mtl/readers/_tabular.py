"""Shared part of the tabular readers: deterministic split, train-only standardisation, fields of a table."""
import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.readers.base import Reader


def split_rows(n: int, classes, eval_fraction: float, seed: int):
    """(train rows, eval rows) of ``n`` rows, sorted; stratified by ``classes`` when given, else over all rows.

    Per stratum the rows are permuted by ``RandomState(seed)`` and the first ``max(1, round(fraction * size))``
    are held out (a stratum of one row stays in training). Only (n, classes, fraction, seed) decide the split.
    """
    rng = np.random.RandomState(seed)
    strata = [np.arange(n)] if classes is None else [np.flatnonzero(classes == c) for c in np.unique(classes)]
    held = []
    for rows in strata:
        rows = rows[rng.permutation(len(rows))]
        count = 0 if len(rows) < 2 else max(1, int(round(len(rows) * eval_fraction)))
        held.append(rows[:count])
    eval_rows = np.sort(np.concatenate(held)).astype(np.int64)
    return np.setdiff1d(np.arange(n), eval_rows), eval_rows


def standardise(values: np.ndarray, train_rows: np.ndarray):
    """``(x - mean) / std`` with mean and (population) std of the training rows only; a constant column keeps std 1.

    Returns the standardised array and the (mean, std) used, so that nothing of the evaluation rows leaks in.
    """
    mean = values[train_rows].mean(axis=0)
    std = values[train_rows].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (values - mean) / std, (mean, std)


def check_fraction(eval_fraction, split):
    """A ConfigError unless ``split`` is train/eval and 0 < ``eval_fraction`` < 1."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split must be 'train' or 'eval', got {split!r}", key="split")
    if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) or not 0 < eval_fraction < 1:
        raise ConfigError(f"eval_fraction must be a number in (0, 1), got {eval_fraction!r}", key="eval_fraction")


class TableReader(Reader):
    """Base of readers over one numeric table: features, and class labels and/or regression targets per row.

    Subclasses load the whole table and call :meth:`_build`. Fields: ``features`` [F] float32 (standardised with
    training-split statistics, zero-padded to ``pad_to`` columns when asked); with class labels ``label`` int64
    and ``labels`` (the one-hot float32 vector of the class, so the ``multilabel`` head works one-vs-rest); with
    targets ``target`` [K] float32 (standardised too when ``standardize_targets``).

    Parameters:
        split (str): train or eval (the job sets eval for evaluation)
        eval_fraction (float): the rows held out for the eval split (stratified by class, drawn from seed)
        seed (int): seed of the split
        standardize (bool): standardise every feature with the training split's mean and std
        standardize_targets (bool): standardise regression targets likewise
        pad_to (int): zero-pad the features to this many columns (tables of different widths on one backbone)
        feature_field (str): name of the feature field of a sample
    """

    class_names = None  # the name of each class label (a subclass sets them)
    output_names = None  # the name of each regression target

    def _build(self, features, classes, targets, split, eval_fraction, seed, standardize, standardize_targets,
               pad_to, feature_field):
        check_fraction(eval_fraction, split)
        features = np.asarray(features, dtype=np.float64)
        train_rows, eval_rows = split_rows(len(features), classes, float(eval_fraction), int(seed))
        rows = eval_rows if split == "eval" else train_rows
        self.feature_stats = None
        if standardize:
            features, self.feature_stats = standardise(features, train_rows)
        width = features.shape[1]
        if pad_to is not None:
            if isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < width:
                raise ConfigError(f"pad_to must be an integer >= the table's {width} feature columns, got "
                                  f"{pad_to!r}", key="pad_to")
            features = np.pad(features, ((0, 0), (0, pad_to - width)))
        self.feature_field = feature_field
        self.pad_to = pad_to
        self.rows = rows
        self._features = np.ascontiguousarray(features[rows], dtype=np.float32)
        self._arrays = {}
        if classes is not None:
            self.num_classes = int(classes.max()) + 1
            self._arrays["label"] = classes[rows].astype(np.int64)
            self._arrays["labels"] = np.eye(self.num_classes, dtype=np.float32)[classes[rows]]
            self.num_labels = self.num_classes
        self.target_stats = None
        if targets is not None:
            targets = np.asarray(targets, dtype=np.float64).reshape(len(features), -1)
            if standardize_targets:
                targets, self.target_stats = standardise(targets, train_rows)
            self.num_outputs = targets.shape[1]
            self._arrays["target"] = np.ascontiguousarray(targets[rows], dtype=np.float32)
        if feature_field in self._arrays:
            raise ConfigError(f"feature_field '{feature_field}' collides with a target field", key="feature_field")

    def fields(self):
        """``features`` [F], then ``label`` and ``labels`` [C] (classes) and/or ``target`` [K] (regression)."""
        out = [Field(self.feature_field, self._features.shape[1:], "float32")]
        return out + [Field(name, array.shape[1:], array.dtype.name) for name, array in self._arrays.items()]

    def __len__(self):
        return len(self._features)

    def __getitem__(self, index):
        sample = {self.feature_field: self._features[index]}
        sample.update((name, array[index]) for name, array in self._arrays.items())
        return sample

    def labels(self):
        """Class labels of the split, in row order (tables with a class column)."""
        return self._arrays["label"].copy()

    feature_names = None  # the name of each feature column (a subclass sets them)

    def input_spec(self):
        """A raw row's columns, and the training split's standardisation and padding that make it an input."""
        mean, std = self.feature_stats if self.feature_stats is not None else (None, None)
        return {"kind": "table", "field": self.feature_field, "columns": list(self.feature_names or []),
                "mean": None if mean is None else [float(v) for v in mean],
                "std": None if std is None else [float(v) for v in std], "pad_to": self.pad_to}

    def label_names(self):
        """The class of each label (and of each one-hot ``labels`` entry) and the column of each ``target``."""
        names = {}
        if "label" in self._arrays and self.class_names is not None:
            names.update(label=list(self.class_names), labels=list(self.class_names))
        if "target" in self._arrays and self.output_names is not None:
            names["target"] = list(self.output_names)
        return names
