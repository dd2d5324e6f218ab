"""Arrays from ``.npy`` / ``.npz`` files as a reader."""
import os

import numpy as np

from mtl.core.contracts import Field, canonical_dtype, check_conversion, conversion_problem
from mtl.core.errors import ConfigError
from mtl.core.registry import register_reader
from mtl.readers.base import MissingFile, Reader


@register_reader("numpy")
class NumpyReader(Reader):
    """Samples from numpy files: ``files: {field: path.npy}`` or ``path: data.npz`` (every array is a field).

    Each array's first axis indexes samples; all arrays must have the same length. ``split``/``eval_path`` choose
    the file set: with ``split: eval`` the reader reads ``eval_files``/``eval_path`` instead. Safe conversions are
    made: one integer or bool per sample (a class label) becomes int64; everything else becomes float32 (bool or
    integer multi-hot vectors, integer pixels, float64 features). ``dtypes: {field: dtype}`` asks for another
    dtype, refused when it would lose information (a float label to int64). ``num_classes`` may be given, else it is
    max(label) + 1 for an integer ``label``.

    Parameters:
        path (str): an .npz whose arrays are the fields (give path or files)
        files (mapping): {field: path.npy} (give path or files)
        eval_path (str): the .npz of the eval split
        eval_files (mapping): the {field: path.npy} of the eval split
        split (str): train or eval (the job sets eval for evaluation)
        num_classes (int): the class count (default: max(label) + 1 of an integer label)
        mmap (bool): memory-map .npy files instead of reading them whole
        dtypes (mapping): {field: dtype} instead of the safe default conversion
    """

    def __init__(self, path=None, files=None, eval_path=None, eval_files=None, split="train", num_classes=None,
                 mmap=True, dtypes=None):
        if split == "eval":
            path, files = eval_path, eval_files
            if path is None and files is None:
                raise ConfigError("split 'eval' needs 'eval_path' or 'eval_files'", key="eval_path")
        if (path is None) == (files is None):
            raise ConfigError("give exactly one of 'path' (an .npz) or 'files' (field: .npy)", key="path")
        arrays = {}
        if path is not None:
            if not os.path.isfile(path):
                raise MissingFile(path, key="eval_path" if split == "eval" else "path")
            with np.load(path) as npz:
                arrays = {k: npz[k] for k in npz.files}
        else:
            for field, fpath in files.items():
                if not os.path.isfile(fpath):
                    raise MissingFile(fpath, key=f"{'eval_files' if split == 'eval' else 'files'}.{field}")
                arrays[field] = np.load(fpath, mmap_mode="r" if mmap else None)
        lengths = {k: len(v) for k, v in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"arrays have different lengths: {lengths}", key="files" if files else "path")
        self._arrays = arrays
        self._dtypes = self._choose_dtypes(arrays, dtypes or {})
        for k, v in arrays.items():  # the value checks of the conversion (integers exact as floats), once
            if np.issubdtype(v.dtype, np.integer) and self._dtypes[k] != "int64":
                check_conversion(v, self._dtypes[k], f"array '{k}'")
        self._len = next(iter(lengths.values()))
        if num_classes is not None:
            self.num_classes = int(num_classes)
        elif "label" in self._arrays and self._dtypes["label"] == "int64":
            self.num_classes = int(np.max(self._arrays["label"])) + 1

    @staticmethod
    def _choose_dtypes(arrays, requested):
        """Per field: the requested dtype (checked with the contract's safe-conversion rule) or the default."""
        if not isinstance(requested, dict) or set(requested) - set(arrays):
            unknown = sorted(set(requested) - set(arrays)) if isinstance(requested, dict) else requested
            raise ConfigError(f"expected a mapping of array names ({', '.join(arrays)}) to dtypes, got {unknown!r}",
                              key="dtypes")
        out = {}
        for k, v in arrays.items():
            label_like = v.ndim == 1 and (np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_)
            out[k] = canonical_dtype(requested.get(k, "int64" if label_like else "float32"))
            problem = conversion_problem(v.dtype, out[k])
            if problem:
                raise ConfigError(f"array '{k}' is {v.dtype.name}: {problem}", key=f"dtypes.{k}")
        return out

    def fields(self):
        return [Field(k, v.shape[1:], self._dtypes[k]) for k, v in self._arrays.items()]

    def __len__(self):
        return self._len

    def __getitem__(self, index):
        return {k: np.asarray(v[index]).astype(self._dtypes[k]) for k, v in self._arrays.items()}

    def labels(self):
        return np.asarray(self._arrays["label"]).astype(np.int64)
