"""MultiMNIST (Sener and Koltun, "Multi-Task Learning as Multi-Objective Optimization", NeurIPS 2018) built from the
MNIST digit files as their loader builds it (``multi_task/loaders/multi_mnist_loader.py`` of
isl-org/MultiObjectiveOptimization), with fixed seeds.

Every digit image gets one partner drawn uniformly from the same part of the data (itself included, as their
``np.random.permutation(length)[:1]``); on a 36 x 36 canvas the image's digit sits at rows and columns 0-27 (top left)
and the partner's at 6-33 (bottom right), the overlap taking the pixelwise maximum; the canvas is resized to 28 x 28
by nearest neighbour (PIL's rule: destination pixel i reads source pixel floor((i + 0.5) * 36 / 28)) and normalised
as theirs, ``(x / 255 - 0.1307) / 0.3081``. The ``left`` task's label is the top-left digit, ``right`` the bottom-right
one. (Their ``scipy.misc.imresize`` also stretches a canvas whose brightest pixel is below 255 to 255: about 1 % of
the canvases, whose brightest pixel is 254; not done here.)

Parts, all with fixed seeds: the 60,000 training digits (``train-*``) are split once into training digits and
``val_size`` validation digits (``numpy.random.RandomState(seed).permutation``; with ``eval_split: test``,
``val_size: 0`` makes every one of the 60,000 a training digit, as Sener and Koltun train); partners are drawn inside
each part.
``split: train`` reads the training part; the evaluation split (``split: eval``) is ``eval_split``: ``val`` (the
validation part, for choosing settings) or ``test`` (the 10,000 MNIST test digits, ``t10k-*`` of ``mnist_dir``, every
one of them with a partner among them, as Sener and Koltun's test set; kept back by the project and not on every
machine: reading them where they are absent is an error naming the files).
"""
import gzip
import os

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError
from mtl.core.registry import register_reader
from mtl.readers.base import Reader

SIDE, CANVAS, OFFSET = 28, 36, 6
# PIL's nearest neighbour from 36 to 28 pixels: destination i reads floor((i + 0.5) * 36 / 28)
NEAREST = np.floor((np.arange(SIDE) + 0.5) * CANVAS / SIDE).astype(np.int64)
MEAN, STD = 0.1307, 0.3081
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _idx_file(folder, stem):
    """The path of IDX file ``stem`` in ``folder`` (gzipped or not), or None."""
    for name in (stem + ".gz", stem):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def read_idx(path, magic):
    """The array of an IDX file (big-endian header: magic, then one count per dimension; uint8 data)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"'{path}' cannot be read as an IDX file: {exc}") from None
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found != magic:
        raise DataError(f"'{path}' is not an MNIST IDX file: magic number {found}, expected {magic}")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(magic & 0xFF)]
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims))
    if body.size != int(np.prod(dims)):
        raise DataError(f"'{path}' holds {body.size} values, its header says {dims}: the file is truncated")
    return body.reshape(dims)


def read_digits(folder, part):
    """(images [N, 28, 28] uint8, labels [N] uint8) of MNIST's ``train`` or ``test`` files in ``folder``."""
    stems = FILES[part]
    paths = [_idx_file(folder, stem) for stem in stems]
    missing = [stem for stem, path in zip(stems, paths) if path is None]
    if missing:
        extra = (" (the MNIST test digits are kept back by the project: evaluate on eval_split: val, the validation "
                 "part of the training digits)") if part == "test" else ""
        raise DataError(f"mnist_dir '{folder}' has no {' or '.join(m + '[.gz]' for m in missing)}{extra}")
    images, labels = read_idx(paths[0], 2051), read_idx(paths[1], 2049)
    if len(images) != len(labels) or images.shape[1:] != (SIDE, SIDE):
        raise DataError(f"mnist_dir '{folder}': {len(images)} images of {list(images.shape[1:])} and {len(labels)} "
                        f"labels; expected as many 28 x 28 images as labels")
    return images, labels


def compose(top_left, bottom_right):
    """The 28 x 28 uint8 MultiMNIST images of pairs of digits ``[N, 28, 28]`` (or of one pair ``[28, 28]``)."""
    top_left, bottom_right = np.asarray(top_left, np.uint8), np.asarray(bottom_right, np.uint8)
    canvas = np.zeros(top_left.shape[:-2] + (CANVAS, CANVAS), np.uint8)
    canvas[..., :SIDE, :SIDE] = top_left
    window = canvas[..., OFFSET:OFFSET + SIDE, OFFSET:OFFSET + SIDE]
    np.maximum(window, bottom_right, out=window)
    return canvas[..., NEAREST, :][..., NEAREST]


def parts(count, val_size, seed):
    """(training digit indices, validation digit indices) of ``count`` training digits, both sorted."""
    order = np.random.RandomState(seed).permutation(count)
    return np.sort(order[val_size:]), np.sort(order[:val_size])


def partners(count, seed):
    """One partner position per image, drawn uniformly among the ``count`` images of its part."""
    return np.random.RandomState(seed).randint(0, count, size=count)


@register_reader("multimnist")
class MultiMNISTReader(Reader):
    """Two overlapping MNIST digits per image; the label is the ``left`` (top-left) or ``right`` digit.

    Parameters:
        mnist_dir (str): the folder of the MNIST IDX files (gzipped or not): train-images-idx3-ubyte and
            train-labels-idx1-ubyte, and for eval_split: test t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte
        digit (str): the task's label: left (the top-left digit, Sener and Koltun's task L) or right (the
            bottom-right one, task R)
        eval_split (str): what the evaluation split reads: val (the val_size validation digits held out of the
            60,000 training digits, for choosing settings) or test (the 10,000 MNIST test digits, t10k-*, their
            test set; an error where those files are absent)
        val_size (int): training digits held out as the validation part (1 to 59,999); split: train reads the others.
            With eval_split: test it may be 0: training reads all 60,000 training digits, as Sener and Koltun's
            (settings chosen on the validation digits, the test look trains on every training digit)
        seed (int): seed of the training/validation split and of the partners drawn in each part: the left and
            right readers with the same seed read the same images
        image_field (str): name of the image field, float32 [1, 28, 28] normalised as (x / 255 - 0.1307) / 0.3081
            (the label is field label, int64)
    """

    num_classes = 10

    def __init__(self, mnist_dir: str, digit: str = "left", split: str = "train", eval_split: str = "val",
                 val_size: int = 10000, seed: int = 0, image_field: str = "image"):
        if digit not in ("left", "right"):
            raise ConfigError(f"digit must be 'left' (top-left digit) or 'right' (bottom-right), got {digit!r}",
                              key="digit")
        if eval_split not in ("val", "test"):
            raise ConfigError(f"eval_split must be 'val' (validation part of the training digits) or 'test' (the "
                              f"MNIST test digits, t10k-*), got {eval_split!r}", key="eval_split")
        if not isinstance(mnist_dir, str) or not os.path.isdir(mnist_dir):
            raise ConfigError(f"mnist_dir '{mnist_dir}' is not a folder (expected the MNIST IDX files)",
                              key="mnist_dir")
        self.digit, self.image_field = digit, image_field
        part = "train" if split == "train" else eval_split
        images, labels = read_digits(mnist_dir, "test" if part == "test" else "train")
        if part == "test":
            chosen, pair_seed = np.arange(len(images)), seed + 3
        else:
            least = 0 if eval_split == "test" else 1  # nothing to validate on: the test look may train on all
            if isinstance(val_size, bool) or not isinstance(val_size, int) or not least <= val_size < len(images):
                raise ConfigError(f"val_size must be an integer from {least} to {len(images) - 1}, got {val_size!r}"
                                  + ("" if least == 0 else " (0, training on all the training digits, is for "
                                     "eval_split: test)"), key="val_size")
            train, val = parts(len(images), val_size, seed)
            chosen, pair_seed = (train, seed + 1) if part == "train" else (val, seed + 2)
        self.first = chosen
        self.second = chosen[partners(len(chosen), pair_seed)]
        self.digit_labels, self.part = labels, part
        self.composed = np.concatenate([compose(images[self.first[i:i + 5000]], images[self.second[i:i + 5000]])
                                        for i in range(0, len(chosen), 5000)])  # uint8, 784 bytes an image

    def fields(self):
        return [Field(self.image_field, (1, SIDE, SIDE), "float32"), Field("label", (), "int64")]

    def __len__(self):
        return len(self.first)

    def labels(self):
        """The chosen digit's label of every image (no images composed)."""
        return self.digit_labels[self.first if self.digit == "left" else self.second].astype(np.int64)

    def __getitem__(self, index):
        image = (self.composed[index].astype(np.float32) / 255.0 - MEAN) / STD
        label = self.digit_labels[self.first[index] if self.digit == "left" else self.second[index]]
        return {self.image_field: image[None].astype(np.float32), "label": np.int64(label)}
