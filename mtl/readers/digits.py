"""scikit-learn's bundled handwritten digits (1797 8x8 images, 10 classes) as a reader: real data, no download."""
import numpy as np

from mtl.contracts import Field
from mtl.errors import ConfigError
from mtl.readers.base import Reader
from mtl.registry import register_reader


def _resize_nearest(images: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour resize of [N, H, W] to [N, size, size] (pixel centres mapped back to the source grid)."""
    n, h, w = images.shape
    rows = np.minimum((np.arange(size) + 0.5) * h / size, h - 1).astype(int)
    cols = np.minimum((np.arange(size) + 0.5) * w / size, w - 1).astype(int)
    return images[:, rows][:, :, cols]


@register_reader("digits")
class DigitsReader(Reader):
    """scikit-learn load_digits: a class subset, a deterministic train/eval split, labels remapped to 0..C-1.

    Pixels (0..16) are scaled to [-1, 1]. ``samples`` picks a deterministic part of each class's images ("even":
    every other image starting at 0, "odd": starting at 1, "all"), so that two tasks can share classes but never
    samples. The split holds out ``eval_fraction`` of each class (stratified, seeded by ``seed``).
    """

    def __init__(self, classes=None, split="train", eval_fraction=0.3, samples="all", image_size=8,
                 channels=1, seed=0, label_field="label", image_field="image"):
        from sklearn.datasets import load_digits

        if split not in ("train", "eval"):
            raise ConfigError(f"split must be 'train' or 'eval', got {split!r}", key="split")
        if samples not in ("all", "even", "odd"):
            raise ConfigError(f"samples must be 'all', 'even' or 'odd', got {samples!r}", key="samples")
        if not 0.0 < float(eval_fraction) < 1.0:
            raise ConfigError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}", key="eval_fraction")
        data = load_digits()
        classes = list(range(10)) if classes is None else [int(c) for c in classes]
        bad = [c for c in classes if not 0 <= c <= 9]
        if bad or len(set(classes)) != len(classes) or not classes:
            raise ConfigError(f"classes must be distinct digits 0..9, got {classes}", key="classes")
        rng = np.random.RandomState(seed)
        chosen = []
        for new_label, digit in enumerate(classes):
            idx = np.flatnonzero(data.target == digit)
            if samples != "all":
                idx = idx[(0 if samples == "even" else 1)::2]
            idx = idx[rng.permutation(len(idx))]
            n_eval = max(1, int(round(len(idx) * float(eval_fraction))))
            part = idx[:n_eval] if split == "eval" else idx[n_eval:]
            chosen.extend((i, new_label) for i in sorted(part))
        order = np.array([i for i, _ in chosen])
        self._labels = np.array([lab for _, lab in chosen], dtype=np.int64)
        images = data.images[order].astype(np.float32) / 8.0 - 1.0
        if int(image_size) != 8:
            images = _resize_nearest(images, int(image_size))
        images = images[:, None]
        if int(channels) > 1:
            images = np.repeat(images, int(channels), axis=1)
        self._images = np.ascontiguousarray(images, dtype=np.float32)
        self.num_classes = len(classes)
        self.source_indices = order
        self.label_field = label_field
        self.image_field = image_field

    def fields(self):
        return [Field(self.image_field, self._images.shape[1:], "float32"), Field(self.label_field, (), "int64")]

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, index):
        return {self.image_field: self._images[index], self.label_field: self._labels[index]}

    def labels(self):
        return self._labels.copy()
