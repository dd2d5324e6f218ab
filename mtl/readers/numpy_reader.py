"""Arrays from ``.npy`` / ``.npz`` files as a reader."""
import os

import numpy as np

from mtl.contracts import Field
from mtl.errors import ConfigError
from mtl.readers.base import Reader
from mtl.registry import register_reader


@register_reader("numpy")
class NumpyReader(Reader):
    """Samples from numpy files: ``files: {field: path.npy}`` or ``path: data.npz`` (every array is a field).

    Each array's first axis indexes samples; all arrays must have the same length. ``split``/``eval_path`` choose
    the file set: with ``split: eval`` the reader reads ``eval_files``/``eval_path`` instead. Integer arrays become
    int64, floating arrays float32. ``num_classes`` may be given, else it is max(label) + 1 for an integer ``label``.
    """

    def __init__(self, path=None, files=None, eval_path=None, eval_files=None, split="train", num_classes=None,
                 mmap=True):
        if split == "eval":
            path, files = eval_path, eval_files
            if path is None and files is None:
                raise ConfigError("split 'eval' needs 'eval_path' or 'eval_files'", key="eval_path")
        if (path is None) == (files is None):
            raise ConfigError("give exactly one of 'path' (an .npz) or 'files' (field: .npy)", key="path")
        arrays = {}
        if path is not None:
            if not os.path.isfile(path):
                raise ConfigError(f"file '{path}' does not exist", key="path")
            with np.load(path) as npz:
                arrays = {k: npz[k] for k in npz.files}
        else:
            for field, fpath in files.items():
                if not os.path.isfile(fpath):
                    raise ConfigError(f"file '{fpath}' does not exist", key=f"files.{field}")
                arrays[field] = np.load(fpath, mmap_mode="r" if mmap else None)
        lengths = {k: len(v) for k, v in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"arrays have different lengths: {lengths}", key="files" if files else "path")
        self._arrays = {}
        for k, v in arrays.items():
            if np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_:
                self._arrays[k] = np.asarray(v).astype(np.int64) if v.dtype == np.bool_ else v
            else:
                self._arrays[k] = v
        self._len = next(iter(lengths.values()))
        if num_classes is not None:
            self.num_classes = int(num_classes)
        elif "label" in self._arrays and np.issubdtype(self._arrays["label"].dtype, np.integer):
            self.num_classes = int(np.max(self._arrays["label"])) + 1

    @staticmethod
    def _dtype(a):
        return "int64" if np.issubdtype(a.dtype, np.integer) else "float32"

    def fields(self):
        return [Field(k, v.shape[1:], self._dtype(v)) for k, v in self._arrays.items()]

    def __len__(self):
        return self._len

    def __getitem__(self, index):
        return {k: np.asarray(v[index]).astype(self._dtype(v)) for k, v in self._arrays.items()}

    def labels(self):
        return np.asarray(self._arrays["label"]).astype(np.int64)
