"""Deterministic random samples for tests and benchmarks: any shape, any class count, no files."""
import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.core.registry import register_reader
from mtl.readers.base import Reader

EAGER_ELEMENTS = 1 << 22  # prototype numbers drawn at start-up (16 MB of float32); more are drawn on demand


@register_reader("synthetic")
class SyntheticReader(Reader):
    """Deterministic random images with class labels (or regression / multi-label targets), generated per index.

    Sample ``i`` depends only on (seed, split, i). Images are class prototypes plus noise, so a model can learn them.
    Prototypes of all classes together up to ``EAGER_ELEMENTS`` numbers are drawn at once from the seed (16 MB: the
    tests' and demos' readers); beyond that a class's prototype is drawn when a sample of it is read, from
    (seed, class) alone, so the reader's memory does not grow with the class count (a 100k-class reader of
    3 x 112 x 112 images would otherwise hold 15 GB of prototypes).
    ``target: class`` gives an int64 ``label``; ``regression`` a float32 ``target`` of ``num_outputs`` values (a fixed
    linear function of the image); ``multilabel`` a 0/1 float32 ``labels`` vector of ``num_classes``.

    Parameters:
        num_samples (int): samples of the split
        num_classes (int): classes (class labels), or labels (multilabel)
        shape (list): shape of a sample's image (the job sets the backbone's input shape)
        split (str): train or eval (the job sets eval for evaluation)
        seed (int): seed of the prototypes and the noise
        noise (float): standard deviation of the noise added to the class prototype
        target (str): class, regression or multilabel: the kind of target
        num_outputs (int): regression targets per sample
        image_field (str): name of the image field
    """

    def __init__(self, num_samples=256, num_classes=10, shape=(1, 8, 8), split="train", seed=0, noise=0.5,
                 target="class", num_outputs=1, image_field="image"):
        for name, value in (("num_samples", num_samples), ("num_classes", num_classes), ("num_outputs", num_outputs)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
                raise ConfigError(f"must be a positive integer, got {value!r}", key=name)
        if target not in ("class", "regression", "multilabel"):
            raise ConfigError(f"target must be class, regression or multilabel, got {target!r}", key="target")
        self.num_samples = int(num_samples)
        self.num_classes = int(num_classes)
        self.shape = tuple(int(d) for d in shape)
        self.split_offset = 0 if split == "train" else 1_000_003
        self.seed = int(seed)
        self.noise = float(noise)
        self.target = target
        self.num_outputs = int(num_outputs)
        self.num_labels = self.num_classes if target == "multilabel" else None  # multi-hot length
        self.image_field = image_field
        proto_rng = np.random.RandomState(self.seed)
        eager = self.num_classes * int(np.prod(self.shape)) <= EAGER_ELEMENTS
        self._prototypes = proto_rng.randn(self.num_classes, *self.shape).astype(np.float32) if eager else None
        self._projection = proto_rng.randn(int(np.prod(self.shape)), self.num_outputs).astype(np.float32)
        self._projection /= np.sqrt(self._projection.shape[0])

    def prototype(self, label: int) -> np.ndarray:
        """The class's prototype image (float32 of ``shape``): drawn at start-up for a small reader, else from
        (seed, label) alone when it is needed."""
        if self._prototypes is not None:
            return self._prototypes[label]
        return np.random.default_rng([self.seed, int(label), 0x5EED]).standard_normal(self.shape, dtype=np.float32)

    def fields(self):
        out = [Field(self.image_field, self.shape, "float32")]
        if self.target == "class":
            out.append(Field("label", (), "int64"))
        elif self.target == "regression":
            out.append(Field("target", (self.num_outputs,), "float32"))
        else:
            out.append(Field("labels", (self.num_classes,), "float32"))
        return out

    def __len__(self):
        return self.num_samples

    def _label(self, index):
        return (index * 7919 + self.seed) % self.num_classes

    def __getitem__(self, index):
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        rng = np.random.RandomState((self.seed * 1_000_033 + self.split_offset + index) % (2**31))
        label = self._label(index)
        image = self.prototype(label) + self.noise * rng.randn(*self.shape).astype(np.float32)
        sample = {self.image_field: image.astype(np.float32)}
        if self.target == "class":
            sample["label"] = np.int64(label)
        elif self.target == "regression":
            sample["target"] = (image.reshape(-1) @ self._projection).astype(np.float32)
        else:
            sample["labels"] = (rng.rand(self.num_classes) < 0.3).astype(np.float32)
            sample["labels"][label] = 1.0
        return sample

    def labels(self):
        return np.array([self._label(i) for i in range(self.num_samples)], dtype=np.int64)
