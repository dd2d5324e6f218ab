"""Reader base class: a map-style dataset of samples (dicts of numpy arrays) with declared fields."""
import os
from typing import Dict, List

import numpy as np

from mtl.contracts import Field


class Reader:
    """Base class of readers.

    A reader is built once per process (and pickled into DataLoader workers). ``fields()`` declares every field of a
    sample; ``__getitem__(i)`` returns ``{field: np.ndarray}`` for sample ``i`` of the chosen split; ``num_classes``
    (when the reader knows it) lets a head default its class count, ``num_labels`` the length of a multi-hot
    ``labels`` vector and ``num_outputs`` the length of a regression ``target`` vector (None: not provided);
    ``labels()`` returns all labels of the split without decoding images (used to build verification pairs and to
    check label ranges).
    Declared capabilities (generic code reads them, never probes):
    ``epoch_aware``: the reader's augmentation depends on the epoch; it then also accepts ``reader[(index, epoch)]``,
    the form the step pipeline uses so that worker processes need no epoch state.
    ``counts_skipped``: the reader skips bad samples (``on_bad_sample: skip``) and ``bad_samples`` counts them.
    """

    num_classes = None
    num_labels = None
    num_outputs = None
    epoch_aware = False
    counts_skipped = False
    # True for a split of identities the heads never trained on (face readers' ``holdout_classes``): its labels are
    # not head classes, and it is scored by verification on pairs of its identities (``mtl.evaluation.pairs``)
    open_set = False
    max_positive_pairs = 3000  # open-set splits: cap on the positive pairs (as many negatives are drawn)
    registered_name = ""  # set by the registration decorator; error messages name the reader by it

    def sizes(self) -> dict:
        """The sizes a head may take from this reader: ``num_classes``, ``num_labels``, ``num_outputs``."""
        return {"num_classes": self.num_classes, "num_labels": self.num_labels, "num_outputs": self.num_outputs}

    @property
    def bad_samples(self) -> int:
        """Samples skipped so far (0 for readers that never skip)."""
        return 0

    def fields(self) -> List[Field]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, index: int) -> Dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_augmentation(self, enabled: bool):
        """Turn random training augmentation (flips, crops, ...) on or off; readers without any ignore this."""

    def labels(self):
        """All labels of the split, in sample order (default: read every sample)."""
        return np.array([self[i]["label"] for i in range(len(self))])


def missing_file(path: str, what: str = "file") -> str:
    """The sentence for a data file that is not there: the path as given, resolved, and the folder it was taken from.

    The job resolves a reader's relative ``path`` against the task file's folder when the file exists there, so a
    relative path that reaches a reader was looked up from the working directory.
    """
    if os.path.isabs(path):
        return f"{what} '{path}' does not exist"
    return (f"{what} '{path}' does not exist (resolved to '{os.path.abspath(path)}' from the working directory "
            f"'{os.getcwd()}'; relative paths are also tried from the task file's folder)")
