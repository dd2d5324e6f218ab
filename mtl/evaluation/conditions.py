"""Which side of a condition split each image of a person falls on: the split of the overlap benchmark.

The overlap benchmark (``tools/make_overlap_benchmark.py``) gives a person shared by two sources one part of its
images in each, split by a condition where the data records one, so that the two sources see the person under
different conditions; the report's ``cross_condition`` figure scores positive pairs of held-out people whose two
images lie on opposite sides of the same split. One rule serves both:

* **light direction**, when the image root holds ``index.tsv`` with a ``light azimuth (deg)`` column (Extended
  Yale B): side 0 is light from one side (azimuth < 0), side 1 from the other (azimuth > 0); azimuth 0 (light from
  the front, 6 of Extended Yale B's 64 directions) is on neither side (-1). A person without images on both sides
  falls back to the halves rule;
* **halves** otherwise: in list order, a person's first ``ceil(n / 2)`` images are side 0, the others side 1.
"""
import math
import os

import numpy as np

from mtl.core.utf8 import open_utf8

INDEX_FILE = "index.tsv"
AZIMUTH_COLUMN = "light azimuth (deg)"
NEITHER = -1


def light_azimuths(root, paths):
    """The light azimuth (degrees, float64) of every image of ``paths`` from ``root/index.tsv``, or None when the
    root has no such table or the table no azimuth column."""
    from mtl.readers.image_list import read_target_table

    table = os.path.join(str(root), INDEX_FILE)
    if not os.path.isfile(table):
        return None
    with open_utf8(table, "target list") as f:
        header = [c.strip() for c in f.readline().lstrip("#").rstrip("\r\n").split("\t")]
    if AZIMUTH_COLUMN not in header:
        return None
    return read_target_table(table, [AZIMUTH_COLUMN], list(paths))[:, 0]


def rule_of(azimuths) -> str:
    """The name of the rule :func:`condition_sides` applies with these azimuths (None: halves)."""
    return "light azimuth" if azimuths is not None else "halves"


def halves(count: int) -> np.ndarray:
    """Sides of ``count`` images of one person in list order: the first ``ceil(count / 2)`` 0, the rest 1."""
    return (np.arange(count) >= math.ceil(count / 2)).astype(np.int64)


def condition_sides(labels, azimuths=None) -> np.ndarray:
    """Side (0, 1 or -1 for neither) of every image; ``labels`` are the images' persons in list order, ``azimuths``
    their light azimuths (None: the halves rule for everyone)."""
    labels = np.asarray(labels).reshape(-1)
    sides = np.empty(len(labels), dtype=np.int64)
    for person in np.unique(labels):
        rows = np.flatnonzero(labels == person)
        if azimuths is not None:
            light = np.asarray(azimuths, dtype=np.float64)[rows]
            if (light < 0).any() and (light > 0).any():
                sides[rows] = np.where(light < 0, 0, np.where(light > 0, 1, NEITHER))
                continue
        sides[rows] = halves(len(rows))
    return sides


def cross_condition(sides_first, sides_second) -> np.ndarray:
    """True for pairs whose two images lie on opposite sides (0 and 1; an image on neither side never counts)."""
    first, second = np.asarray(sides_first), np.asarray(sides_second)
    return (first >= 0) & (second >= 0) & (first != second)
