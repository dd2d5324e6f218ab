"""Deterministic per-image preparation of face images, the same for every split and every image: crop, lighting.

Face datasets come from different laboratories: tight crops or upper bodies, dim or side-lit faces. A task's reader
prepares each image the same way, so that the vendored pixels stay unchanged and people added later get the same
treatment:

* ``crop: [left, top, right, bottom]``: keep this box, in fractions of the decoded image's width and height
  (pixel box ``round(left * W) .. round(right * W)``), before resizing to the backbone's input size;
* ``equalize: true``: histogram equalisation of the cropped image's grey levels (of its luminance Y for colour
  images, whose chroma is kept): the grey-level map ``v -> round(255 * (cdf(v) - cdf_min) / (N - cdf_min))``
  (Gonzalez and Woods, Digital Image Processing, 3.3), so that a face lit from one side spreads over every grey level;
* ``standardize: true``: per-image standardisation of the normalised float image, ``(x - mean) / max(std,
  1 / sqrt(n))`` over all its n values (TensorFlow's ``per_image_standardization``): every image then has mean 0 and
  standard deviation 1, whatever its exposure.

Crop and equalisation act on uint8 RGB pixels before the resize, standardisation on the float image after the
photometric augmentation and before random erasing (whose grey fill then equals the image mean).
"""
import numpy as np
from PIL import Image

KEYS = ("crop", "equalize", "standardize")


class Preprocess:
    """The ``preprocess`` options of a face reader (see the module docstring); every part off by default."""

    def __init__(self, crop=None, equalize=False, standardize=False):
        self.crop = None if crop is None else _crop_box(crop)
        for name, value in (("equalize", equalize), ("standardize", standardize)):
            if not isinstance(value, bool):
                raise ValueError(f"preprocess.{name} must be true or false, got {value!r}")
        self.equalize = equalize
        self.standardize = standardize

    @classmethod
    def from_config(cls, cfg):
        """A :class:`Preprocess` from a reader's ``preprocess`` mapping, or None when it is empty / None."""
        if not cfg:
            return None
        if not isinstance(cfg, dict):
            raise ValueError(f"preprocess must be a mapping of {', '.join(KEYS)}, got {cfg!r}")
        check_option_keys(cfg, KEYS)
        return cls(**cfg)

    def as_config(self) -> dict:
        """The options as a plain mapping (for export metadata)."""
        return {"crop": list(self.crop) if self.crop else None, "equalize": self.equalize,
                "standardize": self.standardize}

    def prepare(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 RGB [H, W, 3] -> the cropped and (when asked) equalised uint8 RGB image, before any resize."""
        if self.crop is not None:
            rgb = crop_pixels(rgb, self.crop)
        if self.equalize:
            rgb = equalize_pixels(rgb)
        return rgb

    def finish(self, chw: np.ndarray) -> np.ndarray:
        """The normalised float image, standardised in place when asked."""
        return standardize_image(chw) if self.standardize else chw


def check_option_keys(cfg: dict, keys):
    """A :class:`ParameterError` keyed by the first key of the option mapping ``cfg`` that is not one of ``keys``,
    with a "did you mean" (the caller adds the mapping's own key path: ``preprocess``, ``augment``)."""
    from mtl.core.errors import ParameterError
    from mtl.core.registry import did_you_mean

    for key in cfg:
        if key not in keys:
            raise ParameterError(f"unknown key{did_you_mean(key, keys)}; allowed here: {', '.join(keys)}", key=key)


def option_error(exc, section: str):
    """A reader's ConfigError for the bad ``section`` mapping (``preprocess``, ``augment``) of ``exc`` (a ValueError),
    keyed by the exact key path when ``exc`` names one; :func:`mtl.core.registry.build` adds the task file."""
    from mtl.core.errors import ConfigError, MtlError

    key, message = (exc.key, exc.bare_message) if isinstance(exc, MtlError) else (None, str(exc))
    return ConfigError(message, None, f"{section}.{key}" if key else section)


def task_preprocessing(tasks) -> dict:
    """``{task name: its reader's preprocess mapping or None}`` of validated task configs (what export records)."""
    return {t["name"]: (t["reader"].get("preprocess") or None) for t in tasks}


def choose(preprocessing: dict, task=None, where: str = "the model"):
    """The :class:`Preprocess` to prepare new images for a model trained on tasks with ``preprocessing``
    (``{task: mapping or None}``): ``task``'s, or the one all tasks share. Several different ones and no ``task``
    raise a ValueError sentence naming them (images must be prepared the way one of the tasks saw them)."""
    if task is not None:
        if task not in preprocessing:
            raise ValueError(f"{where} has no task '{task}' (its tasks: {', '.join(preprocessing)})")
        return Preprocess.from_config(preprocessing[task])
    distinct = {repr(sorted((v or {}).items())): v for v in preprocessing.values()}
    if len(distinct) > 1:
        raise ValueError(f"the tasks of {where} prepare their images differently ({preprocessing}); say which "
                         f"task's way to use with --preprocess TASK")
    return Preprocess.from_config(next(iter(distinct.values()), None))


def _crop_box(value):
    """``value`` as a (left, top, right, bottom) tuple of fractions with left < right and top < bottom."""
    try:
        box = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        box = ()
    if len(box) != 4 or isinstance(value, str) or not all(0.0 <= v <= 1.0 for v in box) \
            or not (box[0] < box[2] and box[1] < box[3]):
        raise ValueError("preprocess.crop must be [left, top, right, bottom], fractions of the width and height in "
                         f"[0, 1] with left < right and top < bottom, got {value!r}")
    return box


def crop_pixels(rgb: np.ndarray, box) -> np.ndarray:
    """The pixels ``[round(top * H), round(bottom * H)) x [round(left * W), round(right * W))`` (at least 1 x 1)."""
    height, width = rgb.shape[:2]
    left, top, right, bottom = box
    x0, x1 = int(round(left * width)), int(round(right * width))
    y0, y1 = int(round(top * height)), int(round(bottom * height))
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)
    return np.ascontiguousarray(rgb[y0:y1, x0:x1])


def equalize_grey(grey: np.ndarray) -> np.ndarray:
    """Histogram equalisation of uint8 grey levels: ``v -> round(255 * (cdf(v) - cdf_min) / (N - cdf_min))``.

    ``cdf(v)`` counts the pixels <= v, ``cdf_min`` is the count of the darkest level present. An image of one grey
    level is returned unchanged (nothing to spread)."""
    counts = np.bincount(grey.ravel(), minlength=256)
    cdf = np.cumsum(counts)
    cdf_min = cdf[np.flatnonzero(counts)[0]]
    total = grey.size
    if total == cdf_min:
        return grey.copy()
    lut = np.round(255.0 * (cdf - cdf_min) / (total - cdf_min))
    return np.clip(lut, 0, 255).astype(np.uint8)[grey]


def equalize_pixels(rgb: np.ndarray) -> np.ndarray:
    """Equalise a uint8 RGB image: directly when it is grey (R = G = B), else its luminance Y (YCbCr, chroma kept)."""
    if np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2]):
        grey = equalize_grey(rgb[..., 0])
        return np.repeat(grey[..., None], 3, axis=2)
    ycbcr = np.array(Image.fromarray(rgb).convert("YCbCr"))
    ycbcr[..., 0] = equalize_grey(np.ascontiguousarray(ycbcr[..., 0]))
    return np.asarray(Image.fromarray(ycbcr, "YCbCr").convert("RGB"), dtype=np.uint8)


def standardize_image(chw: np.ndarray) -> np.ndarray:
    """In place: ``(x - mean) / max(std, 1 / sqrt(n))`` over every value of the float image (n values)."""
    mean = chw.mean(dtype=np.float64)
    std = max(float(chw.std(dtype=np.float64)), 1.0 / np.sqrt(chw.size))
    chw -= np.float32(mean)
    chw *= np.float32(1.0 / std)
    return chw
