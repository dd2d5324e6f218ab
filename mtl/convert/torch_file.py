"""Read a PyTorch ``.pth`` state_dict without PyTorch: a safe reader of ``torch.save``'s zip format.

Since torch 1.6, ``torch.save`` writes a zip archive ``<name>/data.pkl`` (a pickle of the object) plus one raw file per
tensor storage ``<name>/data/<key>`` (little-endian unless ``<name>/byteorder`` says otherwise). In the pickle a tensor
is ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`` and its
storage a persistent id ``("storage", torch.FloatStorage, key, location, numel)``. This reader rebuilds exactly that
as numpy arrays, plus ``collections.OrderedDict`` and the built-in containers; any other global the pickle names (a
whole pickled model, a class, a function) is refused with one sentence, so nothing in the file can run code.
"""
import collections
import pickle
import zipfile

import numpy as np

from mtl.errors import DataError

# torch storage class -> numpy dtype ("bfloat16" is widened to float32 by hand: numpy has no bfloat16)
STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16, "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class StorageType:
    """Stands for a torch storage class (``torch.FloatStorage``) in the pickle: only its element type matters."""

    def __init__(self, name):
        self.name = name
        self.dtype = STORAGE_DTYPES[name]


def _rebuild_tensor(storage, offset, size, stride, *_):
    """``_rebuild_tensor_v2``: the strided view ``(offset, size, stride)`` of a storage (all in elements), copied."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if not size:
        return storage[offset].copy()
    if any(s == 0 for s in size):
        return np.zeros(size, dtype=storage.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= len(storage):
        raise pickle.UnpicklingError(f"a tensor of size {list(size)} reaches past its storage of {len(storage)} "
                                     "elements")
    view = np.lib.stride_tricks.as_strided(storage[offset:], size, [s * storage.itemsize for s in stride],
                                           writeable=False)
    return np.ascontiguousarray(view)


def _rebuild_parameter(data, *_):
    """``_rebuild_parameter`` (a state_dict saved with ``keep_vars=True``): the tensor itself."""
    return data


ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}


class StateDictUnpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` of a torch zip archive: tensors become numpy arrays, storages are read from the zip."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, path: str, byteorder: str):
        super().__init__(file)
        self.archive, self.prefix, self.path, self.byteorder = archive, prefix, path, byteorder
        self.storages = {}

    def find_class(self, module, name):
        """Only the globals of a state_dict; anything else is refused."""
        if (module, name) in ALLOWED:
            return ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(name)
        raise pickle.UnpicklingError(f"it holds '{module}.{name}', which a state_dict does not hold (only tensors, "
                                     "OrderedDict and plain containers are read)")

    def persistent_load(self, pid):
        """``("storage", StorageType, key, location, numel)`` -> the storage's elements as a 1-d numpy array."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], StorageType)):
            raise pickle.UnpicklingError(f"it holds an unknown persistent object {str(pid)[:60]!r}")
        key = str(pid[2])
        if key not in self.storages:
            self.storages[key] = self._read_storage(key, pid[1].dtype, int(pid[4]))
        return self.storages[key]

    def _read_storage(self, key, dtype, numel):
        """The raw storage ``data/<key>`` as ``numel`` elements of ``dtype`` (bfloat16 widened to float32)."""
        try:
            raw = self.archive.read(f"{self.prefix}data/{key}")
        except KeyError:
            raise pickle.UnpicklingError(f"its tensor storage 'data/{key}' is missing") from None
        order = "<" if self.byteorder == "little" else ">"
        if dtype == "bfloat16":
            bits = np.frombuffer(raw, dtype=order + "u2", count=numel).astype(np.uint32) << 16
            return bits.view(np.float32)
        array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder(order), count=numel)
        return array.astype(np.dtype(dtype).newbyteorder("="), copy=False)


def _data_pickle(archive: zipfile.ZipFile, path: str) -> str:
    """The archive's ``<name>/data.pkl`` member (torch names the top folder after the file it saved to)."""
    names = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
    if not names:
        raise DataError(f"'{path}' is a zip file but not a torch.save archive: it has no data.pkl")
    return names[0]


def read_torch_file(path: str):
    """The object ``torch.save`` wrote to ``path`` (a state_dict: names -> numpy arrays), read without torch."""
    if not zipfile.is_zipfile(path):
        raise DataError(f"'{path}' is not a zip-format torch file (torch >= 1.6 writes one): re-save it with "
                        "torch.save(model.state_dict(), path) in a recent PyTorch")
    with zipfile.ZipFile(path) as archive:
        member = _data_pickle(archive, path)
        prefix = member[:-len("data.pkl")]
        byteorder = "little"
        if f"{prefix}byteorder" in archive.namelist():
            byteorder = archive.read(f"{prefix}byteorder").decode().strip()
        with archive.open(member) as f:
            try:
                return StateDictUnpickler(f, archive, prefix, path, byteorder).load()
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
                raise DataError(f"'{path}' cannot be read as a state_dict: {exc}") from None
