"""Reader base class: a map-style dataset of samples (dicts of numpy arrays) with declared fields."""
import os
import sys
from typing import Dict, List

import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError, DataError


class Reader:
    """Base class of readers.

    A reader is built once per process (and pickled into DataLoader workers). ``fields()`` declares every field of a
    sample; ``__getitem__(i)`` returns ``{field: np.ndarray}`` for sample ``i`` of the chosen split; ``num_classes``
    (when the reader knows it) lets a head default its class count, ``num_labels`` the length of a multi-hot
    ``labels`` vector and ``num_outputs`` the length of a regression ``target`` vector (None: not provided);
    ``labels()`` returns all labels of the split without decoding images (used to build verification pairs and to
    check label ranges).
    Declared capabilities (generic code reads them, never probes):
    ``epoch_aware``: the reader's augmentation depends on the epoch; it then also accepts ``reader[(index, epoch)]``,
    the form the step pipeline uses so that worker processes need no epoch state.
    ``counts_skipped``: the reader skips bad samples (``on_bad_sample: skip``) and ``bad_samples`` counts them.
    ``alters_inputs``: the reader changes the backbone inputs of the samples it reads (masked LM's corruption), so
    its rows are never the same inputs as another task's (under ``schedule.same_rows`` it keeps rows, an order and a
    backbone pass of its own).
    """

    num_classes = None
    num_labels = None
    num_outputs = None
    epoch_aware = False
    counts_skipped = False
    alters_inputs = False
    # True for a split of identities the heads never trained on (face readers' ``holdout_classes``): its labels are
    # not head classes, and it is scored by verification on pairs of its identities (``mtl.evaluation.pairs``)
    open_set = False
    max_positive_pairs = 3000  # open-set splits: cap on the positive pairs (as many negatives are drawn)
    registered_name = ""  # set by the registration decorator; error messages name the reader by it

    def sizes(self) -> dict:
        """The sizes a head may take from this reader: ``num_classes``, ``num_labels``, ``num_outputs``."""
        return {"num_classes": self.num_classes, "num_labels": self.num_labels, "num_outputs": self.num_outputs}

    @property
    def bad_samples(self) -> int:
        """Samples skipped so far (0 for readers that never skip)."""
        return 0

    def skipped_samples(self, limit: int = 10) -> List[str]:
        """A sentence for each of the first ``limit`` samples skipped so far, naming its file and record or line
        (readers that skip: ``counts_skipped``); default none."""
        return []

    def fields(self) -> List[Field]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, index: int) -> Dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_augmentation(self, enabled: bool):
        """Turn random training augmentation (flips, crops, ...) on or off; readers without any ignore this."""

    def check_samples(self, count: int):
        """Read the first ``count`` samples once, so that one that cannot be read fails now (a DataError naming its
        file and record) rather than where it is first used; default: nothing to do (readers whose samples are read
        into memory when they are built have failed already). A training run checks its evaluation splits so."""

    def lengths(self):
        """The length of every sample (token count of a text), for length-bucketed batches
        (:mod:`mtl.data.buckets`); None (the default): samples have no length, batches are not bucketed."""
        return None

    def labels(self):
        """All labels of the split, in sample order (default: read every sample)."""
        return np.array([self[i]["label"] for i in range(len(self))])

    def input_spec(self) -> dict:
        """How a raw input becomes this reader's input field, for predictions (``mtl predict``): a JSON-able mapping
        recorded with the run, e.g. a table's ``{"kind": "table", "columns", "mean", "std", "pad_to"}`` (its
        standardisation by the training split); default ``{}``: inputs are given as the model reads them (images
        are prepared as ``preprocess`` says)."""
        return {}

    def sample_files(self):
        """The image file of every sample of the split, in sample order (absolute paths), or None (the default)
        when samples are not files of their own (RecordIO records, generated data): what tells that two tasks hold
        the same image (``mtl eval --all-people``) and what a pairs list names (``mtl data pairs``)."""
        return None

    def label_names(self) -> Dict[str, List[str]]:
        """What the values of this split's label fields stand for: ``{field: [name of value 0, ...]}``, e.g.
        ``{"label": ["s1", "s10", ...]}`` (the people of a face split, in label order), ``{"labels": ["even",
        "prime", ...]}`` (multi-hot attributes), ``{"target": ["ink", ...]}`` (regression outputs). Fields the
        reader has no names for are left out; default: none (:mod:`mtl.readers.label_names`)."""
        return {}

    def class_people(self, field: str = "label"):
        """The people (classes) behind this split's class labels ``field`` as the user knows them: the dataset's own
        label of every class and the names of the dataset's labels (:class:`mtl.data.same_person.People`; what a
        same-person pairs file and ``mtl overlap`` name them by). Default: the classes are the dataset's labels,
        named by :meth:`label_names`; None without a known class count."""
        from mtl.data.same_person import People

        if self.num_classes is None:
            return None
        return People.numbered(self.num_classes, self.label_names().get(field))

    def source_people(self, field: str = "label"):
        """Who the classes are, per source of this reader's class labels ``field``: ``[(first class id, People)]``
        (:meth:`class_people` of each source, numbered in the source's own reader): what a merged head over a
        ``concat`` reader resolves its same-person pairs by. Default: the one source, at class 0 (none without a
        known class count)."""
        people = self.class_people(field)
        return [] if people is None else [(0, people)]

    def __init_subclass__(cls, **kwargs):
        """Every reader class is checked when it is defined: no class attribute hides a method of ``Reader``."""
        super().__init_subclass__(**kwargs)
        check_reserved_names(cls)

    def __setattr__(self, name, value):
        """Refuse an instance attribute that would hide a method or property of ``Reader`` (see
        :func:`check_reserved_names`); every other attribute is set as usual."""
        if name in RESERVED_NAMES and _hidden_by_instance(type(self), name):
            raise ConfigError(_shadow_sentence(type(self), name, instance=True))
        object.__setattr__(self, name, value)


def _reserved_names():
    """Public methods and properties of :class:`Reader`: what generic code calls on every reader."""
    return frozenset(name for name, value in vars(Reader).items()
                     if not name.startswith("_") and (callable(value) or isinstance(value, property)))


RESERVED_NAMES = _reserved_names()


def _class_attribute(cls, name):
    """``name`` as the class ``cls`` resolves it (its own or inherited), without calling descriptors."""
    return next(vars(klass)[name] for klass in cls.__mro__ if name in vars(klass))


def _is_method(value) -> bool:
    return callable(value) or isinstance(value, (staticmethod, classmethod))


def _hidden_by_instance(cls, name) -> bool:
    """True when an instance attribute ``name`` would hide a method or a read-only property of ``cls``; a property
    with a setter (the subclass's own) takes the assignment itself, and a plain class value may be replaced."""
    value = _class_attribute(cls, name)
    if isinstance(value, property):
        return value.fset is None
    return _is_method(value)


def _shadow_sentence(cls, name, instance) -> str:
    """The one sentence for an attribute ``name`` of reader class ``cls`` (set on instances when ``instance``, else
    a class attribute) that hides ``Reader.<name>``."""
    base = vars(Reader)[name]
    what = f"the property Reader.{name}" if isinstance(base, property) else f"the method Reader.{name}()"
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    where = f" ({path if os.path.relpath(path).startswith('..') else os.path.relpath(path)})" if path else ""
    how, example = (f"sets self.{name}", f"self._{name}") if instance else \
        (f"defines the class attribute '{name}'", f"_{name}")
    return (f"reader class '{cls.__name__}'{where} {how}, which hides {what} that the job calls on every reader; "
            f"rename the attribute (e.g. {example})")


def check_reserved_names(cls):
    """Refuse, when it is defined, a reader class whose class attributes hide a method or property of ``Reader`` with
    a value (``labels = [...]``); overriding a method with a method, or a property with a property, is fine.

    Attributes set on instances (``self.labels = ...`` in ``__init__`` or anywhere else) are caught by
    ``Reader.__setattr__`` when the reader is built, which the job does before anything trains. That guard was
    chosen over reading the class source with ``ast`` at registration: it sees every assignment however it is
    written (helpers, ``setattr``, mixins, a subclass of a subclass) and needs no source file, where the ``ast``
    scan would miss those and could be fooled by a nested class; its cost is one set lookup per assignment.
    """
    if not (isinstance(cls, type) and issubclass(cls, Reader)):
        return
    for name in RESERVED_NAMES:  # a property of Reader may be overridden by a value; a method only by a method
        if not isinstance(vars(Reader)[name], property) and not _is_method(_class_attribute(cls, name)):
            raise ConfigError(_shadow_sentence(cls, name, instance=False))


def missing_file(path: str, what: str = "file", base_dir: str = None) -> str:
    """The sentence for a data file that is not there: the path as given, resolved, and where relative paths are
    looked up.

    The job resolves a reader's relative path against the folder of the task file (``base_dir``, when known) if the
    file exists there, else leaves it relative to the working directory; so a relative path that reaches a reader
    and is missing was looked up in both places.
    """
    if os.path.isabs(path):
        return f"{what} '{path}' does not exist"
    start = (f"{what} '{path}' does not exist (resolved to '{os.path.abspath(path)}' from the working directory "
             f"'{os.getcwd()}'")
    if base_dir is None:
        return start + "; relative paths are also tried from the task file's folder)"
    return (start + f"; relative paths resolve from the task file's folder '{base_dir}' when the file is there, and "
            f"'{os.path.join(base_dir, path)}' does not exist either)")


class MissingFile(ConfigError, DataError):
    """A data file (or folder) that a reader parameter names does not exist: a configuration error and a data error
    alike. :func:`mtl.core.registry.build`, which knows the task file, adds it, the key path and that file's folder."""

    def __init__(self, path, what="file", key=None):
        self.path, self.what = str(path), what
        super().__init__(missing_file(self.path, what), None, key)

    def located(self, source) -> str:
        """The sentence with the folder of ``source`` (the task file), where relative paths are looked up first."""
        if not source or not os.path.isfile(str(source)):
            return self.bare_message
        return missing_file(self.path, self.what, os.path.dirname(os.path.abspath(str(source))))
