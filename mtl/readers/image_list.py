"""Face images in a folder plus a label list (PLSC style): one ``relative/path<TAB>label`` line per image."""
import os

import numpy as np

from mtl.errors import DataError
from mtl.readers._face import FaceImageReader
from mtl.registry import register_reader


def parse_label_list(list_path: str):
    """Read a label list; return (entries, problems).

    ``entries``: one (line number, relative path, label or NaN) per non-blank, non-``#`` line. A line is
    ``path<TAB>label``; without a tab it is split at its last run of spaces. ``problems``: entry position ->
    message for lines that do not parse.
    """
    if not os.path.isfile(list_path):
        raise DataError(f"label list '{list_path}' does not exist")
    entries, problems = [], {}
    with open(list_path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rsplit("\t", 1) if "\t" in line else line.strip().rsplit(None, 1)
            label = np.nan
            if len(parts) == 2 and parts[0].strip():
                try:
                    label = float(int(parts[1].strip()))
                except ValueError:
                    problems[len(entries)] = (
                        f"label list '{list_path}' line {lineno}: label {parts[1].strip()!r} is not an integer"
                    )
                path = parts[0].strip()
            else:
                path = line.strip()
                problems[len(entries)] = f"label list '{list_path}' line {lineno}: expected 'path<TAB>label'"
            entries.append((lineno, path, label))
    return entries, problems


@register_reader("image_list")
class ImageListReader(FaceImageReader):
    """Face images under ``root`` listed with their class labels in ``list`` (``relative/path<TAB>label`` lines).

    ``root`` defaults to the list file's folder. ``check_files`` stats every image at start-up so that a missing
    file is reported (or skipped) before training; turn it off for huge lists on slow file systems. Other
    parameters (``split``, ``eval_fraction``, ``flip``, ``on_bad_sample``, ``decoder``, ``augment``,
    ``holdout_classes``, ...) as for the ``recordio`` reader; ``num_classes`` defaults to max label + 1.
    """

    def __init__(self, list, root=None, split="train", eval_fraction=0.0, num_classes=None, image_size=112,  # noqa: A002
                 flip=None, on_bad_sample="error", seed=0, check_files=True, image_field="image",
                 label_field="label", decoder="auto",
                 augment=None, holdout_classes=None, max_positive_pairs=3000):
        self.source = f"image_list '{list}'"
        self._check_options(split, eval_fraction, image_size, flip, on_bad_sample, seed, image_field, label_field,
                            decoder, augment, holdout_classes, max_positive_pairs)
        self.list_path = str(list)
        self.root = str(root) if root is not None else (os.path.dirname(self.list_path) or ".")
        if not os.path.isdir(self.root):
            raise DataError(f"image root '{self.root}' does not exist (label list '{self.list_path}')")
        entries, problems = parse_label_list(self.list_path)
        self._lines = np.array([e[0] for e in entries], dtype=np.int64)
        # one numpy bytes array, not a list of str: forked workers then share it without copy-on-write churn
        self._paths = np.array([e[1].encode("utf-8") for e in entries], dtype=np.bytes_)
        labels = np.array([e[2] for e in entries], dtype=np.float64)
        if check_files:
            for pos in range(len(entries)):
                path = self._path(pos)
                if pos not in problems and not os.path.isfile(path):
                    problems[pos] = f"{self._describe(pos)}: file '{path}' does not exist"
        self._finish(np.arange(len(entries)), labels, problems, num_classes=num_classes)

    def _relative(self, candidate: int) -> str:
        return self._paths[candidate].decode("utf-8")

    def _path(self, candidate: int) -> str:
        return os.path.join(self.root, self._relative(candidate))

    def _describe(self, candidate: int) -> str:
        return f"label list '{self.list_path}' line {int(self._lines[candidate])} ('{self._relative(candidate)}')"

    def _load_bytes(self, candidate: int) -> bytes:
        path = self._path(candidate)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise DataError(f"{self._describe(candidate)}: cannot read '{path}': {exc.strerror}") from None
