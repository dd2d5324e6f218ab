"""Several readers as one dataset: the merged alternative to one head per dataset.

``{type: concat, readers: [{type: image_list, ...}, {type: recordio, ...}, ...]}`` yields the samples of every
source in turn (source 0's, then source 1's, ...). Class labels stay apart: source k's label ``y`` becomes
``y + sum of the class counts of sources 0..k-1``, as if the datasets had been merged into one label list that
assumes no person is in two of them (the de-duplicated case). Each source keeps its own options (its crop, its
held-out people, its augmentation), so that merging changes nothing but the labels. An evaluation split is open-set
(verification) when every source's is.

``shared_labels: true`` keeps every source's labels as they are: the sources are already labelled in one label space
(the same person has the same label in every source, as the overlap benchmark's true-person lists are,
``tools/make_overlap_benchmark.py``), and the class count is the largest source's.
"""
import numpy as np

from mtl.core import registry
from mtl.core.errors import ConfigError
from mtl.core.registry import register_reader
from mtl.readers.base import Reader


@register_reader("concat")
class ConcatReader(Reader):
    """The samples of several readers, one after another, with class labels offset per source (none with
    ``shared_labels``).

    Parameters:
        readers (list): the reader configs whose samples follow one another (the same fields each)
        split (str): train or eval, given to every reader (the job sets eval for evaluation)
        image_size (int): given to every reader (the job sets the backbone's)
        channels (int): given to every reader (the job sets the backbone's)
        shape (list): given to every reader (the job sets the backbone's)
        label_field (str): the class-label field whose values are offset per reader
        shared_labels (bool): the readers share one label space (no offset)
    """

    def __init__(self, readers, split="train", image_size=None, channels=None, shape=None, label_field="label",
                 shared_labels=False):
        if not isinstance(shared_labels, bool):
            raise ConfigError(f"shared_labels must be true or false, got {shared_labels!r}", key="shared_labels")
        if not isinstance(readers, (list, tuple)) or not readers:
            raise ConfigError(f"readers must be a non-empty list of reader configs, got {readers!r}", key="readers")
        context = {k: v for k, v in (("image_size", image_size), ("channels", channels), ("shape", shape))
                   if v is not None}
        self.sources = []
        for i, cfg in enumerate(readers):
            cfg = registry.as_component(cfg)
            cfg.setdefault("split", split)
            if cfg["type"] == "concat":
                raise ConfigError("a concat reader cannot hold another concat reader", key=f"readers.{i}.type")
            self.sources.append(registry.build("reader", cfg, None, f"readers.{i}", **context))
        self.label_field = label_field
        self._check_sources()
        counts = [int(s.num_classes) for s in self.sources]
        if shared_labels:
            self.offsets = np.zeros(len(counts), dtype=np.int64)
            self.num_classes = int(max(counts))
        else:
            self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
            self.num_classes = int(sum(counts))
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in self.sources])]).astype(np.int64)
        self.open_set = all(s.open_set for s in self.sources)
        self.max_positive_pairs = max(s.max_positive_pairs for s in self.sources)
        self.epoch_aware = any(s.epoch_aware for s in self.sources)
        self.counts_skipped = any(s.counts_skipped for s in self.sources)

    def _check_sources(self):
        """Every source yields the same fields (name, shape, dtype), with class labels and a known class count."""
        first = self.sources[0].fields()
        for i, source in enumerate(self.sources):
            if source.fields() != first:
                raise ConfigError(f"reader {i} ('{source.registered_name}') yields {source.fields()}, reader 0 "
                                  f"yields {first}: merged readers must yield the same fields", key=f"readers.{i}")
            if source.num_classes is None or self.label_field not in {f.name for f in first}:
                raise ConfigError(f"reader {i} ('{source.registered_name}') has no class labels "
                                  f"'{self.label_field}' with a known class count: only class labels can be merged",
                                  key=f"readers.{i}")
        self._fields = first

    def fields(self):
        """The sources' common fields."""
        return list(self._fields)

    def __len__(self):
        return int(self.starts[-1])

    def _locate(self, index: int):
        """(source number, index inside it) of merged sample ``index``."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"concat reader: sample {index} out of range for {n} samples")
        index %= n
        k = int(np.searchsorted(self.starts, index, side="right") - 1)
        return k, index - int(self.starts[k])

    def __getitem__(self, item):
        """Sample ``item`` (an int or, for epoch-aware sources, an ``(index, epoch)`` tuple), its label offset."""
        index, epoch = item if isinstance(item, tuple) else (item, None)
        k, inner = self._locate(int(index))
        source = self.sources[k]
        sample = source[(inner, epoch)] if source.epoch_aware and epoch is not None else source[inner]
        sample = dict(sample)
        sample[self.label_field] = np.asarray(sample[self.label_field] + self.offsets[k], dtype=np.int64)
        return sample

    def sample_files(self):
        """Every source's image files in sample order, or None when a source's samples are not files."""
        files = [s.sample_files() for s in self.sources]
        return None if any(f is None for f in files) else [path for f in files for path in f]

    def labels(self):
        """Every source's labels (read without decoding), offset, in sample order."""
        return np.concatenate([np.asarray(s.labels(), dtype=np.int64) + off
                               for s, off in zip(self.sources, self.offsets)])

    def label_names(self):
        """The sources' class names one after another (as their labels are offset), ``<reader i>:<name>`` being
        unambiguous; with ``shared_labels`` the names the sources agree on. None unless every source has names."""
        names = [s.label_names().get(self.label_field) for s in self.sources]
        if any(n is None for n in names):
            return {}
        if not self.offsets.any():  # shared labels
            return {self.label_field: names[0]} if all(n == names[0] for n in names) else {}
        return {self.label_field: [f"{i}:{name}" for i, source in enumerate(names) for name in source]}

    def source_people(self, field: str = "label"):
        """Every source's people (names, dataset labels, the labels it holds out) at the first class id its labels
        are offset to."""
        return [(int(offset), source.class_people(field)) for offset, source in zip(self.offsets, self.sources)]

    def set_augmentation(self, enabled: bool):
        """Forwarded to every source."""
        for source in self.sources:
            source.set_augmentation(enabled)

    @property
    def bad_samples(self) -> int:
        """Samples skipped by all sources."""
        return sum(s.bad_samples for s in self.sources)

    def skipped_samples(self, limit: int = 10):
        """The sources' skipped samples, one source after another."""
        return [line for s in self.sources for line in s.skipped_samples(limit)][:limit]
