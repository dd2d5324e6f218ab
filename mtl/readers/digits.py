"""scikit-learn's bundled handwritten digits (1797 8x8 images, 10 classes) as a reader: real data, no download."""
import functools
import importlib.util
import os

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.core.registry import register_reader
from mtl.readers.base import Reader
from mtl.readers.digit_features import ATTRIBUTES, PROPERTIES, attribute_matrix, choose, property_matrix


@functools.lru_cache(maxsize=1)
def load_digits_arrays():
    """(images [1797, 8, 8] float64 in 0..16, targets [1797] int64): the file ``sklearn.datasets.load_digits`` reads
    (``sklearn/datasets/data/digits.csv.gz``, 64 pixels then the digit per row), read once per process without
    importing scikit-learn (whose import costs more than the rest of a short demo run's set-up)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the digits reader needs scikit-learn installed (its bundled digits are the data)")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",")
    images, targets = table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    images.flags.writeable = targets.flags.writeable = False  # shared by every reader of the process
    return images, targets


def _resize_nearest(images: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour resize of [N, H, W] to [N, size, size] (pixel centres mapped back to the source grid)."""
    n, h, w = images.shape
    rows = np.minimum((np.arange(size) + 0.5) * h / size, h - 1).astype(int)
    cols = np.minimum((np.arange(size) + 0.5) * w / size, w - 1).astype(int)
    return images[:, rows][:, :, cols]


def _select(targets, classes, samples, split, eval_fraction, seed):
    """(dataset indices, labels 0..C-1) of the split: per class, ``samples`` (all / even / odd positions), then a
    seeded permutation whose first ``max(1, round(fraction * n))`` images are the evaluation split."""
    rng = np.random.RandomState(seed)
    chosen = []
    for new_label, digit in enumerate(classes):
        idx = np.flatnonzero(targets == digit)
        if samples != "all":
            idx = idx[(0 if samples == "even" else 1)::2]
        idx = idx[rng.permutation(len(idx))]
        n_eval = max(1, int(round(len(idx) * eval_fraction)))
        part = idx[:n_eval] if split == "eval" else idx[n_eval:]
        chosen.extend((i, new_label) for i in sorted(part))
    return np.array([i for i, _ in chosen]), np.array([lab for _, lab in chosen], dtype=np.int64)


@register_reader("digits")
class DigitsReader(Reader):
    """scikit-learn's bundled handwritten digits: class label, digit attributes (multi-hot) and measured properties.

    A class subset, a deterministic train/eval split, labels remapped to 0..C-1. Every sample also carries
    ``labels``, a float32 multi-hot vector of the numeral's ``attributes`` (default: all of
    :data:`~mtl.readers.digit_features.ATTRIBUTES`: even, prime, at_least_5, closed_loop, vertical_stroke,
    horizontal_stroke, curved) for the ``multilabel`` head, and ``target``, a float32 vector of the image's measured
    ``properties`` (default: all of :data:`~mtl.readers.digit_features.PROPERTIES`: ink, row_centre, col_centre,
    stroke_width) for the ``regression`` head; ``num_labels`` and ``num_outputs`` give their lengths.
    Pixels (0..16) are scaled to [-1, 1]. ``samples`` picks a deterministic part of each class's images ("even":
    every other image starting at 0, "odd": starting at 1, "all"), so that two tasks can share classes but never
    samples. The split holds out ``eval_fraction`` of each class (stratified, seeded by ``seed``).

    Parameters:
        classes (list): the digits this task classifies (labels 0..C-1 in this order; default all ten)
        split (str): train or eval (the job sets eval for evaluation)
        eval_fraction (float): the images of each class held out for the eval split
        samples (str): all, even or odd: which images of each class (two tasks can share digits, not images)
        image_size (int): side of the images (8: the data's own; larger ones are resized, nearest neighbour)
        channels (int): image channels (the grey image repeated)
        seed (int): seed of the split
        label_field (str): name of the class-label field
        image_field (str): name of the image field
        attributes (list): the digit attributes of the multi-hot labels field (default all)
        properties (list): the measured properties of the target field (default all)
        labels_field (str): name of the multi-hot attributes field
        target_field (str): name of the properties field
    """

    def __init__(self, classes=None, split="train", eval_fraction=0.3, samples="all", image_size=8,
                 channels=1, seed=0, label_field="label", image_field="image", attributes=None, properties=None,
                 labels_field="labels", target_field="target"):
        if split not in ("train", "eval"):
            raise ConfigError(f"split must be 'train' or 'eval', got {split!r}", key="split")
        if samples not in ("all", "even", "odd"):
            raise ConfigError(f"samples must be 'all', 'even' or 'odd', got {samples!r}", key="samples")
        if not 0.0 < float(eval_fraction) < 1.0:
            raise ConfigError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}", key="eval_fraction")
        self.attribute_names = choose(attributes, ATTRIBUTES, "attributes")
        self.property_names = choose(properties, PROPERTIES, "properties")
        all_images, all_targets = load_digits_arrays()
        classes = list(range(10)) if classes is None else [int(c) for c in classes]
        bad = [c for c in classes if not 0 <= c <= 9]
        if bad or len(set(classes)) != len(classes) or not classes:
            raise ConfigError(f"classes must be distinct digits 0..9, got {classes}", key="classes")
        order, self._labels = _select(all_targets, classes, samples, split, float(eval_fraction), seed)
        images = all_images[order].astype(np.float32) / 8.0 - 1.0
        if int(image_size) != 8:
            images = _resize_nearest(images, int(image_size))
        images = images[:, None]
        if int(channels) > 1:
            images = np.repeat(images, int(channels), axis=1)
        self._images = np.ascontiguousarray(images, dtype=np.float32)
        self.num_classes = len(classes)
        self.classes = classes  # the digit of each label
        self.source_indices = order
        self._attributes = attribute_matrix(all_targets[order], self.attribute_names)
        self._properties = property_matrix(all_images[order], self.property_names)
        self.num_labels = len(self.attribute_names)
        self.num_outputs = len(self.property_names)
        self.label_field = label_field
        self.image_field = image_field
        self.labels_field = labels_field
        self.target_field = target_field
        names = [image_field, label_field, labels_field, target_field]
        if len(set(names)) != len(names):
            raise ConfigError(f"field names must be distinct, got {names}", key="labels_field")

    def fields(self):
        """The image, the class label, the attribute vector and the property vector."""
        return [Field(self.image_field, self._images.shape[1:], "float32"), Field(self.label_field, (), "int64"),
                Field(self.labels_field, (self.num_labels,), "float32"),
                Field(self.target_field, (self.num_outputs,), "float32")]

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, index):
        return {self.image_field: self._images[index], self.label_field: self._labels[index],
                self.labels_field: self._attributes[index], self.target_field: self._properties[index]}

    def labels(self):
        return self._labels.copy()

    def label_names(self):
        """The digit of each class label, the attribute of each ``labels`` entry, the property of each ``target``."""
        return {self.label_field: [str(d) for d in self.classes], self.labels_field: list(self.attribute_names),
                self.target_field: list(self.property_names)}
