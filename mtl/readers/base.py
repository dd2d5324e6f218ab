"""Reader base class: a map-style dataset of samples (dicts of numpy arrays) with declared fields."""
from typing import Dict, List

import numpy as np

from mtl.contracts import Field


class Reader:
    """Base class of readers.

    A reader is built once per process (and pickled into DataLoader workers). ``fields()`` declares every field of a
    sample; ``__getitem__(i)`` returns ``{field: np.ndarray}`` for sample ``i`` of the chosen split; ``num_classes``
    (when the reader knows it) lets a head default its class count; ``labels()`` returns all labels of the split
    without decoding images (used to build verification pairs and to check label ranges).
    A reader whose augmentation depends on the epoch defines ``set_epoch(epoch)`` and then also accepts
    ``reader[(index, epoch)]``; the step pipeline uses that form so that worker processes need no epoch state.
    """

    num_classes = None
    # True for a split of identities the heads never trained on (face readers' ``holdout_classes``): its labels are
    # not head classes, and it is scored by verification on pairs of its identities (``mtl.evaluation.open_set``)
    open_set = False
    max_positive_pairs = 3000  # open-set splits: cap on the positive pairs (as many negatives are drawn)

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
