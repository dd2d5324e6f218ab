"""Shared machinery of the face-image readers (``recordio``, ``image_list``).

A face reader knows, before decoding any image, every candidate sample's label (from RecordIO headers or a list
file) and the problems found at start-up (bad magic, label outside ``[0, num_classes)``, missing file). It then

1. resolves ``num_classes`` (config > the dataset's own statement > max label + 1) and checks every label;
2. raises the first problem as a :class:`DataError` (``on_bad_sample: error``) or drops the bad samples and counts
   them (``on_bad_sample: skip``) -- all in the main process, so these counts are exact;
3. takes a deterministic, stratified hold-out: within each class (in file order) sample ``r`` goes to eval when
   ``floor((r + 1) * f) > floor(r * f)``, i.e. ``floor(n * f)`` evenly spread images per class, no RNG involved;
   or, with ``holdout_classes``, an open-set split: whole identities are held out (a list of labels, a count or a
   fraction drawn from the seed), training sees only the others (relabelled 0..K-1 in label order) and the eval
   split holds only the held-out identities (relabelled 0..H-1, ``open_set`` True: scored by verification);
4. decodes on demand, prepares every image of every split alike (``preprocess``: crop, histogram equalisation,
   per-image standardisation, :mod:`mtl.data.preprocess`), with the optional training augmentation of
   :class:`mtl.data.transforms.Augment`. An image
   that fails to decode raises (``error``) or is replaced by the next good sample (``skip``). Such run-time skips
   happen in DataLoader workers; they are recorded in a shared-memory byte per sample (created before the workers
   start, inherited by fork or passed at spawn), so ``bad_samples`` in the main process counts every distinct
   sample skipped so far by any worker.
"""
import multiprocessing
import re
from multiprocessing import context as mp_context
from typing import Dict

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError, ParameterError
from mtl.data.preprocess import Preprocess, option_error
from mtl.data.transforms import Augment, DecodeError, FaceTransform
from mtl.readers._holdout import choose_holdout, holdout_mask
from mtl.readers.base import Reader
from mtl.readers.label_names import complete, label_index

ON_BAD_SAMPLE = ("error", "skip")


class SkipLog:
    """One shared byte per sample marking run-time skips; survives fork and spawn (not other pickling)."""

    def __init__(self, n: int):
        self._flags = multiprocessing.RawArray("b", max(int(n), 1))

    def __getstate__(self):
        if mp_context.get_spawning_popen() is not None:
            return {"_flags": self._flags}
        return {"_flags": bytearray(bytes(self._flags))}  # a private copy outside process start-up

    def mark(self, i: int):
        """Record that sample ``i`` was skipped."""
        self._flags[i] = 1

    def is_marked(self, i: int) -> bool:
        """True when some process already found sample ``i`` bad."""
        return bool(self._flags[i])

    def count(self) -> int:
        """Number of distinct samples skipped at run time."""
        return int(np.frombuffer(self._flags, dtype=np.int8).sum())

    def marked(self) -> np.ndarray:
        """The samples skipped at run time, in order."""
        return np.flatnonzero(np.frombuffer(self._flags, dtype=np.int8))


class FaceImageReader(Reader):
    """Base of readers that yield ``image`` float32 [3, S, S] and ``label`` int64 from encoded face images.

    Subclasses call :meth:`_check_options` first, then :meth:`_finish` with the candidate samples, and implement
    ``_load_bytes(candidate)`` (encoded image bytes) and ``_describe(candidate)`` ("'file' record 7").

    Parameters:
        split (str): train or eval: which part of the data this reader yields (the job sets eval for evaluation)
        eval_fraction (float): the images of every class held out for the eval split (floor(n * f) evenly spread
            per class); 0 with holdout_classes
        num_classes (int): the class count (default: the data's own statement, else max label + 1)
        image_size (int): side of the square images the reader yields (the job sets the backbone's)
        flip (bool): mirror training images at random (default: on for train, off for eval)
        on_bad_sample (str): error (stop with the file and record) or skip (skip and count bad samples)
        seed (int): seed of the flips, the augmentation and a drawn holdout_classes
        image_field (str): name of the image field of a sample
        label_field (str): name of the class-label field of a sample
        decoder (str): auto (OpenCV when installed, else Pillow), opencv or pillow
        augment (mapping): training augmentation: crop_scale, rotate, translate, brightness, contrast, erase,
            erase_area (off for eval)
        holdout_classes (list|int|float): whole identities kept out of training and verified on at the end:
            labels or names ([s1, s12]), a count, or a fraction drawn from seed
        max_positive_pairs (int): open-set evaluation: at most this many positive pairs (as many negatives)
        preprocess (mapping): every image of every split: crop [left, top, right, bottom], equalize, standardize
    """

    epoch_aware = True  # random flips drawn per (epoch, index)
    counts_skipped = True

    source = "<reader>"

    def _check_options(self, split, eval_fraction, image_size, flip, on_bad_sample, seed, image_field, label_field,
                       decoder="auto", augment=None, holdout_classes=None, max_positive_pairs=3000, preprocess=None):
        if split not in ("train", "eval"):
            raise ConfigError(f"split must be 'train' or 'eval', got {split!r}", None, "split")
        try:
            eval_fraction = float(eval_fraction)
        except (TypeError, ValueError):
            eval_fraction = -1.0
        if not 0.0 <= eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {eval_fraction!r}", None, "eval_fraction")
        if holdout_classes is not None and eval_fraction > 0.0:
            raise ConfigError("holdout_classes and eval_fraction cannot be combined: with held-out identities the "
                              "eval split is those identities", None, "holdout_classes")
        if split == "eval" and eval_fraction == 0.0 and holdout_classes is None:
            raise ConfigError(
                "split 'eval' needs a held-out part: set eval_fraction (e.g. 0.05) or holdout_classes, or evaluate "
                "on a verification set (.bin) instead",
                None,
                "eval_fraction",
            )
        if on_bad_sample not in ON_BAD_SAMPLE:
            raise ConfigError(f"on_bad_sample must be 'error' or 'skip', got {on_bad_sample!r}", None,
                              "on_bad_sample")
        if int(image_size) <= 0:
            raise ConfigError(f"image_size must be a positive integer, got {image_size!r}", None, "image_size")
        self.split = split
        self.eval_fraction = eval_fraction
        self.image_size = int(image_size)
        self.on_bad_sample = on_bad_sample
        self.seed = int(seed)
        self.flip = (split == "train") if flip is None else bool(flip)
        self.epoch = 0
        self.image_field = image_field
        self.label_field = label_field
        self._check_image_options(augment, holdout_classes, max_positive_pairs, preprocess)
        try:
            self.transform = FaceTransform(self.image_size, self.flip, self.seed, decoder, self._augment,
                                           self.preprocess)
        except ValueError as exc:
            raise ConfigError(str(exc), None, "decoder") from None
        self._flip_configured = self.flip

    def _check_image_options(self, augment, holdout_classes, max_positive_pairs, preprocess):
        """Store ``holdout_classes`` and ``max_positive_pairs``, build the preprocessing (every split) and the
        training augmentation (not for eval)."""
        try:
            self.preprocess = Preprocess.from_config(preprocess)
        except (TypeError, ValueError) as exc:
            raise option_error(exc, "preprocess") from None
        self.holdout_classes = holdout_classes
        if isinstance(max_positive_pairs, bool) or not isinstance(max_positive_pairs, int) or max_positive_pairs < 1:
            raise ConfigError(f"max_positive_pairs must be an integer >= 1, got {max_positive_pairs!r}", None,
                              "max_positive_pairs")
        self.max_positive_pairs = max_positive_pairs
        try:
            self._augment = Augment.from_config(augment) if self.split == "train" else None
        except (TypeError, ValueError) as exc:
            raise option_error(exc, "augment") from None

    def set_augmentation(self, enabled: bool):
        """Switch the training flip and augmentation on (as configured) or off (plain decoded images)."""
        self.transform.flip = bool(enabled) and self._flip_configured
        self.transform.augment = self._augment if enabled else None

    def _finish(self, candidates, labels, problems: Dict[int, str], num_classes=None, stated_classes=None):
        """Check labels, apply ``on_bad_sample`` to start-up problems, take the split.

        ``candidates``: int array of sample handles (record rows, list lines); ``labels``: float array (NaN when
        unknown); ``problems``: position in ``candidates`` -> message; ``stated_classes``: the dataset's own class
        count (property file, header record), used when ``num_classes`` is not configured.
        """
        candidates = np.asarray(candidates, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.float64)
        finite = np.isfinite(labels)
        if num_classes is not None:
            self.num_classes = int(num_classes)
        elif stated_classes is not None:
            self.num_classes = int(stated_classes)
        else:
            self.num_classes = int(labels[finite].max()) + 1 if finite.any() else 0
        self._data_classes = self.num_classes  # the data's class count, before a hold-out relabels
        if num_classes is not None:
            self._check_num_classes(candidates, labels)
        problems = self._label_problems(candidates, labels, dict(problems))
        if problems and self.on_bad_sample == "error":
            raise DataError(problems[min(problems)] + " (set on_bad_sample: skip to skip such samples)")
        keep = np.ones(len(candidates), dtype=bool)
        keep[list(problems)] = False
        self.startup_bad_samples = len(problems)
        self.bad_sample_messages = [problems[k] for k in sorted(problems)[:20]]
        candidates, labels = self._take_split(candidates[keep], labels[keep].astype(np.int64))
        if len(candidates) == 0:
            raise DataError(f"{self.source}: no usable sample")
        self._candidates = candidates
        self._labels = labels
        self._skips = SkipLog(len(candidates))

    def _check_num_classes(self, candidates, labels):
        """A configured ``num_classes`` that the data's labels run past is the configuration's mistake, whatever
        ``on_bad_sample`` says (it would skip whole classes as bad samples): refused naming the count that fits.
        The data holds the label ``num_classes`` itself, the next class; a stray label far past the others (a
        corrupt line) is a bad sample as before."""
        past = np.flatnonzero(labels == self.num_classes)
        if not len(past):
            return
        whole = labels[np.isfinite(labels) & (labels == np.floor(labels))]
        top = self.num_classes
        while (whole == top + 1).any():  # the run of classes after num_classes (a stray label is not in it)
            top += 1
        where = re.split(r" (?=(?:line|record) \d)", self._describe(int(candidates[past[0]])), maxsplit=1)
        first = where[-1]  # "line 13 ('d/0.png')", "record 7"
        raise ConfigError(f"num_classes is {self.num_classes} but the labels of {where[0]} go up to {top} "
                          f"({top + 1} classes; label {self.num_classes} first at {first}): set num_classes to "
                          f"{top + 1} or leave it out (the data's own count is then used)", None, "num_classes")

    def _label_problems(self, candidates, labels, problems):
        """``problems`` plus a message for every label that is missing, not an integer or outside [0, C)."""
        finite = np.isfinite(labels)
        bad_label = finite & ((labels != np.floor(labels)) | (labels < 0) | (labels >= self.num_classes))
        for pos in np.flatnonzero(bad_label):
            value = labels[pos]
            shown = str(int(value)) if value == np.floor(value) else repr(float(value))
            problems.setdefault(
                int(pos),
                f"{self._describe(int(candidates[pos]))}: label {shown} is outside [0, {self.num_classes})"
                + ("" if value == np.floor(value) else " or not an integer"),
            )
        for pos in np.flatnonzero(~finite):
            problems.setdefault(int(pos), f"{self._describe(int(candidates[pos]))}: no readable label")
        return problems

    def _take_split(self, candidates, labels):
        """This reader's split: held-out identities (open set) or held-out images (``eval_fraction``)."""
        if self.holdout_classes is not None:
            return self._split_identities(candidates, labels)
        if self.eval_fraction > 0:
            held = holdout_mask(labels, self.eval_fraction)
            chosen = held if self.split == "eval" else ~held
            if not chosen.any():
                raise ConfigError(
                    f"eval_fraction {self.eval_fraction} leaves no {self.split} sample (each class holds "
                    f"floor(n * eval_fraction) of its n images out)", None, "eval_fraction")
            return candidates[chosen], labels[chosen]
        return candidates, labels

    def _split_identities(self, candidates, labels):
        """Open-set split: keep the training identities (train) or the held-out ones (eval), relabelled densely.

        ``class_labels`` maps the new labels back to the data's labels (``class_labels[new] = old``).
        """
        try:
            held = choose_holdout(np.unique(labels), self._holdout_labels(self.holdout_classes), self.seed)
        except ValueError as exc:
            raise ConfigError(str(exc), None, "holdout_classes") from None
        is_held = np.isin(labels, held)
        chosen = is_held if self.split == "eval" else ~is_held
        self.open_set = self.split == "eval"
        self.held_out_labels = held
        self.class_labels = np.unique(labels[chosen])
        self.num_classes = len(self.class_labels)
        return candidates[chosen], np.searchsorted(self.class_labels, labels[chosen]).astype(np.int64)

    def _holdout_labels(self, spec):
        """``holdout_classes`` with the names of people (``[s1, s12]``) turned into their labels by the data's label
        names; numbers, counts and fractions as they are."""
        if not isinstance(spec, (list, tuple)) or not any(isinstance(v, str) for v in spec):
            return spec
        names = self._data_class_names()
        if names is None:
            raise ParameterError(f"holdout_classes names {[v for v in spec if isinstance(v, str)][:3]}, but the data "
                                 f"has no label names ({self._names_hint()}); give labels (numbers)")
        return [label_index(names, v, "holdout_classes") if isinstance(v, str) else v for v in spec]

    # -------------------------------------------------------------------------------- Reader interface
    def label_names(self):
        """The names of this split's classes (``label``): the data's names (:meth:`_data_class_names`), those of
        the identities the split keeps when whole identities are held out; none when the data has none."""
        names = complete(self._data_class_names(), self._data_classes)
        if names is None:
            return {}
        if self.holdout_classes is not None:
            names = [names[int(old)] for old in self.class_labels]
        return {self.label_field: names}

    def class_people(self, field: str = "label"):
        """The dataset's label of every class (``class_labels`` once ``holdout_classes`` renumbered them), the names
        of all the dataset's labels, and the labels held out."""
        from mtl.data.same_person import People

        names = complete(self._data_class_names(), self._data_classes)
        if self.holdout_classes is None:
            return People.numbered(self.num_classes, names)
        return People(np.asarray(self.class_labels, np.int64), names, tuple(int(v) for v in self.held_out_labels))

    def _data_class_names(self):
        """The names of the data's labels ``0..C-1`` (before any hold-out), or None; subclasses read them."""
        return None

    def _names_hint(self) -> str:
        """Where the data's label names would be (for the sentence that says there are none)."""
        return "no labels.json beside it"

    def fields(self):
        return [
            Field(self.image_field, (3, self.image_size, self.image_size), "float32"),
            Field(self.label_field, (), "int64"),
        ] + self._extra_fields()

    def __len__(self):
        return len(self._labels)

    def labels(self):
        """Labels of the split from headers / the list file only (no image is decoded)."""
        return self._labels.copy()

    @property
    def bad_samples(self) -> int:
        """Samples skipped so far: found at start-up plus distinct samples replaced at run time (all workers)."""
        return self.startup_bad_samples + self._skips.count()

    def skipped_samples(self, limit: int = 10):
        """The start-up problems, then the samples that failed to decode at run time (in sample order)."""
        found = list(self.bad_sample_messages[:limit])
        for i in self._skips.marked()[:max(0, limit - len(found))]:
            found.append(f"{self._describe(int(self._candidates[i]))}: could not be decoded")
        return found

    def check_samples(self, count: int):
        """Decode the first ``count`` images as :meth:`__getitem__` does: the first bad one raises (``on_bad_sample:
        error``) or is marked skipped and counted (``skip``)."""
        for i in range(min(int(count), len(self))):
            self[i]

    def set_epoch(self, epoch: int):
        """Epoch used by the flip coin for integer indices (``reader[(index, epoch)]`` passes it explicitly)."""
        self.epoch = int(epoch)

    def __getitem__(self, item):
        """Sample ``item`` (an int, or an ``(index, epoch)`` tuple so that workers need no epoch state)."""
        index, epoch = item if isinstance(item, tuple) else (item, self.epoch)
        n = len(self._labels)
        index = int(index)
        if not -n <= index < n:
            raise IndexError(f"{self.source}: sample {index} out of range for {n} samples")
        index %= n
        for step in range(n):
            i = (index + step) % n
            if self.on_bad_sample == "skip" and self._skips.is_marked(i):
                continue
            candidate = int(self._candidates[i])
            try:
                image = self.transform(self._load_bytes(candidate), i, epoch)
            except (DecodeError, DataError) as exc:
                message = str(exc) if isinstance(exc, DataError) else f"{self._describe(candidate)}: {exc}"
                if self.on_bad_sample == "error":
                    raise DataError(message + " (set on_bad_sample: skip to skip such samples)") from exc
                self._skips.mark(i)
                continue
            sample = {self.image_field: image, self.label_field: np.array(self._labels[i], dtype=np.int64)}
            sample.update(self._extra_values(candidate))
            return sample
        raise DataError(f"{self.source}: every sample failed to decode")

    # -------------------------------------------------------------------------------- subclass hooks
    def _extra_fields(self):
        """Fields a subclass adds to every sample (besides image and label); none by default."""
        return []

    def _extra_values(self, candidate: int) -> dict:
        """The values of :meth:`_extra_fields` for ``candidate``."""
        return {}

    def _load_bytes(self, candidate: int) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def _describe(self, candidate: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError
