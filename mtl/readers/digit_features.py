"""Targets for non-class heads on the bundled digits: a fixed attribute table and measured image properties.

Attributes (multi-hot, for the ``multilabel`` head) are properties of the written numeral, the same for every image
of a digit. Properties (real values, for the ``regression`` head) are measured on each 8x8 image (pixel values
0..16 as scikit-learn ships them), before any resizing.
"""
import numpy as np

from mtl.core.errors import ConfigError

# digit -> attributes it has. The glyphs are those of the handwriting in scikit-learn's digits: a 4 is written open
# (no closed triangle), a 7 without a crossbar, a 1 as a single stroke.
ATTRIBUTES = {
    "even": {0, 2, 4, 6, 8},
    "prime": {2, 3, 5, 7},
    "at_least_5": {5, 6, 7, 8, 9},
    "closed_loop": {0, 6, 8, 9},          # a region of paper enclosed by ink
    "vertical_stroke": {1, 4},            # a straight vertical stroke (1's stem, 4's right stem)
    "horizontal_stroke": {2, 4, 5, 7},    # a straight horizontal stroke (2's base, 4's bar, 5's and 7's top)
    "curved": {0, 2, 3, 5, 6, 8, 9},      # any curved stroke
}

PROPERTIES = {
    "ink": "mean pixel value / 16: the fraction of the 8x8 cell covered by ink, in [0, 1]",
    "row_centre": "row of the centre of mass of the ink, 0 = top row, 1 = bottom row",
    "col_centre": "column of the centre of mass of the ink, 0 = left column, 1 = right column",
    "stroke_width": "2 * area / perimeter of the ink mask (pixels >= 8), in pixels: a strip of width w has area "
                    "w * L and perimeter ~ 2 * L",
}

INK_THRESHOLD = 8  # pixel value (0..16) from which a pixel counts as ink for the stroke-width estimate


def choose(names, table, key):
    """The names of ``table`` to use: all (``names`` None) or the given ones, checked; a ConfigError otherwise."""
    if names is None:
        return list(table)
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
        raise ConfigError(f"expected a non-empty list of names from: {', '.join(table)}; got {names!r}", key=key)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ConfigError(f"unknown name '{unknown[0]}'; known: {', '.join(table)}", key=key)
    if len(set(names)) != len(names):
        raise ConfigError(f"names must be distinct, got {list(names)}", key=key)
    return list(names)


def attribute_matrix(digits: np.ndarray, names) -> np.ndarray:
    """Multi-hot float32 ``[N, len(names)]``: cell (i, j) is 1 when digit ``digits[i]`` has attribute ``names[j]``."""
    digits = np.asarray(digits).reshape(-1)
    return np.stack([np.isin(digits, sorted(ATTRIBUTES[n])) for n in names], axis=1).astype(np.float32)


def _stroke_width(images: np.ndarray) -> np.ndarray:
    """``2 A / P`` per image: A = ink pixels, P = pixel edges between ink and background (or the border)."""
    ink = (images >= INK_THRESHOLD).astype(np.int64)
    padded = np.pad(ink, ((0, 0), (1, 1), (1, 1)))
    perimeter = (np.abs(np.diff(padded, axis=1)).sum(axis=(1, 2)) + np.abs(np.diff(padded, axis=2)).sum(axis=(1, 2)))
    area = ink.sum(axis=(1, 2))
    return np.where(perimeter > 0, 2.0 * area / np.maximum(perimeter, 1), 0.0)


def property_matrix(images: np.ndarray, names) -> np.ndarray:
    """Measured float32 ``[N, len(names)]`` of ``images`` ``[N, H, W]`` (values 0..16); see :data:`PROPERTIES`.

    Centre of mass: ``r = sum(p * row) / sum(p) / (H - 1)`` with ``p`` the pixel values (likewise for columns).
    """
    images = np.asarray(images, dtype=np.float64)
    n, h, w = images.shape
    mass = images.sum(axis=(1, 2))
    safe = np.maximum(mass, 1e-12)
    columns = {
        "ink": images.mean(axis=(1, 2)) / 16.0,
        "row_centre": (images.sum(axis=2) @ np.arange(h)) / safe / (h - 1),
        "col_centre": (images.sum(axis=1) @ np.arange(w)) / safe / (w - 1),
        "stroke_width": _stroke_width(images),
    }
    return np.stack([columns[name] for name in names], axis=1).astype(np.float32)
