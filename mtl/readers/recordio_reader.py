"""InsightFace-style MXNet RecordIO face datasets (``train.rec`` + ``train.idx`` [+ ``property``]), no MXNet needed."""
import os

import numpy as np

from mtl.core.errors import DataError
from mtl.core.registry import register_reader
from mtl.data.recordio import RecordIOReader as RecordFile
from mtl.data.recordio import unpack
from mtl.readers._face import FaceImageReader
from mtl.readers.label_names import label_file, read_label_file


def resolve_paths(path: str):
    """(rec, idx, property) paths for a folder holding ``train.rec``, a ``.rec`` file or a prefix like ``d/train``."""
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        prefix = os.path.join(path, "train")
    elif path.endswith((".rec", ".idx")):
        prefix = path[:-4]
    else:
        prefix = path
    return prefix + ".rec", prefix + ".idx", os.path.join(os.path.dirname(prefix) or ".", "property")


def read_property(path: str):
    """``(num_classes, height, width)`` from an InsightFace ``property`` file (first line ``C,H,W``), or None."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        first = f.readline().strip()
    try:
        values = [int(v) for v in first.split(",")]
        if len(values) != 3:
            raise ValueError
    except ValueError:
        raise DataError(f"property file '{path}' line 1: expected 'num_classes,height,width', got {first!r}") from None
    return tuple(values)


def image_rows(records: RecordFile):
    """Index rows of the image records and the class count stated by InsightFace's header record 0 (or None).

    Record 0 is InsightFace's header when it carries flag >= 2 labels and no image: its labels (a, b) say that
    images are records 1 .. a-1 and identity records a .. b-1 (b - a classes). Otherwise (no record 0, or record 0
    holds an image, e.g. with a multi-float label) every record of the index is an image.
    """
    if records.has_key(0):
        try:
            header, rest = unpack(records.read_row(records.position(0)), f"'{records.rec_path}' record 0")
        except DataError:
            header, rest = None, b""  # reported with the other bad records
        if header is not None and header.flag >= 2 and len(rest) == 0:
            first_identity, end = float(header.label[0]), float(header.label[1])
            if first_identity != int(first_identity) or end != int(end) or not 1 <= first_identity <= end:
                raise DataError(
                    f"'{records.rec_path}' record 0: header labels ({first_identity:g}, {end:g}) are not a "
                    f"range (first identity record, end)"
                )
            keys = np.arange(1, int(first_identity), dtype=np.int64)
            rows = records.rows_of(keys)
            missing = keys[rows < 0]
            if len(missing):
                raise DataError(
                    f"index file '{records.idx_path}' has no record {missing[0]} ({len(missing)} missing) although "
                    f"header record 0 says images are records 1..{int(first_identity) - 1} (truncated .idx?)"
                )
            _check_identity_records(records, int(first_identity), int(end))
            return rows, int(end - first_identity)
    return np.arange(len(records.keys), dtype=np.int64), None


def _check_identity_records(records: RecordFile, first: int, end: int):
    """DataError when record ``first``, where header record 0 says the images end, holds an image: a header that
    does not fit the records (another pack's, or altered) made the reader drop the images from there on without a
    word. A set without identity records (no record ``first``) reads as before."""
    said = f"header record 0 says images are records 1..{first - 1}" + (
        f" and identity records {first}..{end - 1}" if end > first else " and that there are no identity records")
    if not records.has_key(first):  # a set of images and a header without identity records reads as before
        return
    _, rest = unpack(records.read_row(records.position(first)), f"'{records.rec_path}' record {first}")
    if len(rest):
        raise DataError(f"'{records.rec_path}' record {first} holds an image although {said}: the header does not "
                        f"fit the records (altered, or written for another pack); pack the images again")


@register_reader("recordio")
class RecordIOFaceReader(FaceImageReader):
    """Face images and class labels from an InsightFace/MXNet RecordIO pair (train.rec + train.idx).

    ``path``: a folder holding ``train.rec``/``train.idx``, or a prefix (``data/webface/train``). ``num_classes``
    defaults to the ``property`` file, then to header record 0, then to max label + 1. A record with a label vector
    (flag > 0) has its first value as class label, as InsightFace reads it. Every header is read and
    checked at start-up (vectorised, no image decoded); images are decoded, resized to ``image_size`` if needed,
    flipped at random for training (``flip``) and scaled to [-1, 1]. ``split: eval`` needs ``eval_fraction`` > 0
    (a stratified hold-out, see :mod:`mtl.readers._face`). ``on_bad_sample``: ``error`` or ``skip``. ``decoder``:
    ``auto`` (OpenCV when installed, else Pillow), ``opencv`` or ``pillow``. ``augment``: training augmentation
    (:class:`mtl.data.transforms.Augment` keys; off for evaluation). ``holdout_classes``: hold out whole identities
    (labels, a count or a fraction; the eval split is then open-set, scored by verification on at most
    ``max_positive_pairs`` positive pairs and as many negatives).

    Parameters:
        path (str): a folder holding train.rec and train.idx, or their prefix (data/webface/train); a labels.json
            beside them names the labels
    """

    def __init__(self, path, split="train", eval_fraction=0.0, num_classes=None, image_size=112, flip=None,
                 on_bad_sample="error", seed=0, image_field="image", label_field="label", decoder="auto",
                 augment=None, holdout_classes=None, max_positive_pairs=3000, preprocess=None):
        self.source = f"recordio '{path}'"
        self._check_options(split, eval_fraction, image_size, flip, on_bad_sample, seed, image_field, label_field,
                            decoder, augment, holdout_classes, max_positive_pairs, preprocess)
        rec_path, idx_path, property_path = resolve_paths(str(path))
        for needed in (rec_path, idx_path):
            if not os.path.isfile(needed):
                raise DataError(f"{needed}: file does not exist (recordio path '{path}')")
        self.records = RecordFile(rec_path, idx_path)
        self.path = path
        prop = read_property(property_path)
        rows, header_classes = image_rows(self.records)
        self.has_header_record = header_classes is not None
        stated = prop[0] if prop is not None else header_classes
        heads = self.records.scan_headers(rows)
        problems = {}
        for pos in np.flatnonzero(~heads["magic_ok"]):
            problems[int(pos)] = self._record_problem(int(rows[pos]))
        labels = np.where(heads["magic_ok"], heads["label"], np.nan)
        self._finish(rows, labels, problems, num_classes=num_classes, stated_classes=stated)

    def _data_class_names(self):
        """The ``labels.json`` beside the ``.rec`` (``mtl data pack`` writes it), or None."""
        given = read_label_file(label_file(os.path.dirname(self.records.rec_path)))
        return None if given is None else given.get(self.label_field)

    def _names_hint(self) -> str:
        return f"no {label_file(os.path.dirname(self.records.rec_path))}"

    def _record_problem(self, row: int) -> str:
        """The precise message for a record whose header scan failed (bad magic, truncation, ...)."""
        try:
            unpack(self.records.read_row(row), self._describe(row))
        except DataError as exc:
            return str(exc)
        return f"{self._describe(row)}: unreadable header"

    def _describe(self, candidate: int) -> str:
        return f"'{self.records.rec_path}' record {int(self.records.keys[candidate])}"

    def _load_bytes(self, candidate: int) -> bytes:
        return unpack(self.records.read_row(candidate), lambda: self._describe(candidate))[1]
