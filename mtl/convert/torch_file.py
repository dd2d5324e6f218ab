"""Read a PyTorch ``.pth`` state_dict without PyTorch: a safe reader of ``torch.save``'s zip format.

Since torch 1.6, ``torch.save`` writes a zip archive ``<name>/data.pkl`` (a pickle of the object) plus one raw file per
tensor storage ``<name>/data/<key>`` (little-endian unless ``<name>/byteorder`` says otherwise). In the pickle a tensor
is ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`` and its
storage a persistent id ``("storage", torch.FloatStorage, key, location, numel)``. This reader rebuilds exactly that
as numpy arrays, plus ``collections.OrderedDict`` and the built-in containers, through the project's one restricted
unpickler (:mod:`mtl.core.safe_pickle`); any other global the pickle names (a whole pickled model, a class, a function)
is refused with one sentence, so nothing in the file can run code.

A crafted archive cannot make the reader read outside a storage or allocate without bound: offsets, sizes and
strides must be non-negative integers whose last element lies inside the storage; a storage member must hold exactly
its elements; a member may not be compressed more than ``MAX_COMPRESSION`` times; and all tensors together may not be
larger than ``MAX_EXPANSION`` times the storages the archive holds (a zero-stride view of one float is refused
before anything is allocated).
"""
import math
import zipfile

import numpy as np

from mtl.core import safe_pickle
from mtl.core.errors import DataError
from mtl.core.safe_pickle import Refused

MAX_EXPANSION = safe_pickle.MAX_EXPANSION  # all tensors together, at most this many times the storages' bytes
MAX_COMPRESSION = 20  # uncompressed / compressed size of one member (torch.save stores members uncompressed)

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


def _non_negative(values, what):
    if not isinstance(values, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                for v in values):
        raise Refused(f"it holds a tensor whose {what} {str(values)[:40]} is not a tuple of non-negative integers")
    return values


def _rebuild_parameter(data, *_):
    """``_rebuild_parameter`` (a state_dict saved with ``keep_vars=True``): the tensor itself."""
    return data


class StateDictUnpickler(safe_pickle.RestrictedUnpickler):
    """Unpickles ``data.pkl`` of a torch zip archive: tensors become numpy arrays, storages are read from the zip."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, byteorder: str):
        allowed = {**safe_pickle.BUILTINS,
                   ("torch._utils", "_rebuild_tensor_v2"): self.rebuild_tensor,
                   ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
                   ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter}
        allowed.update({("torch", name): StorageType(name) for name in STORAGE_DTYPES})
        super().__init__(file, allowed)
        self.archive, self.prefix, self.byteorder = archive, prefix, byteorder
        self.storages = {}
        stored = sum(i.file_size for i in archive.infolist() if i.filename.startswith(f"{prefix}data/"))
        self.budget, self.built = MAX_EXPANSION * stored + (1 << 16), 0

    def persistent_load(self, pid):
        """``("storage", StorageType, key, location, numel)`` -> the storage's elements as a 1-d numpy array."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)
                and pid[4] >= 0):
            raise Refused(f"it holds an unknown persistent object {str(pid)[:60]!r}")
        key = pid[2]
        if key not in self.storages:
            self.storages[key] = self._read_storage(key, pid[1].dtype, pid[4])
        return self.storages[key]

    def _read_storage(self, key, dtype, numel):
        """The raw storage ``data/<key>``: exactly ``numel`` elements of ``dtype`` (bfloat16 widened to float32)."""
        try:
            info = self.archive.getinfo(f"{self.prefix}data/{key}")
        except KeyError:
            raise Refused(f"its tensor storage 'data/{key[:40]}' is missing") from None
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        if info.file_size != numel * itemsize:
            raise Refused(f"its tensor storage 'data/{key}' holds {info.file_size} bytes, {numel} elements of "
                          f"{itemsize} bytes were declared")
        raw = self.archive.read(info)
        order = "<" if self.byteorder == "little" else ">"
        if dtype == "bfloat16":
            bits = np.frombuffer(raw, dtype=order + "u2", count=numel).astype(np.uint32) << 16
            return bits.view(np.float32)
        array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder(order), count=numel)
        return array.astype(np.dtype(dtype).newbyteorder("="), copy=False)

    def rebuild_tensor(self, storage, offset, size, stride, *_):
        """``_rebuild_tensor_v2``: the strided view ``(offset, size, stride)`` of a storage (in elements), copied,
        after checking that it stays inside the storage and within the output budget."""
        if not isinstance(storage, np.ndarray) or storage.ndim != 1:
            raise Refused("it holds a tensor without a storage")
        offset = _non_negative((offset,), "offset")[0]
        size, stride = _non_negative(tuple(size), "size"), _non_negative(tuple(stride), "stride")
        if any(n >= (1 << 62) for n in size):
            raise Refused(f"it holds a tensor of size {str(list(size))[:60]}, larger than any array")
        if len(size) != len(stride):
            raise Refused(f"it holds a tensor of size {list(size)} with {len(stride)} strides")
        numel = math.prod(size)
        self.built += numel * storage.itemsize
        if self.built > self.budget:
            raise Refused(f"its tensors would be larger than {MAX_EXPANSION} times the storages in the file "
                          f"(a tensor of size {list(size)[:8]} over {len(storage)} stored elements)")
        if numel == 0:
            return np.zeros(size, dtype=storage.dtype)
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= len(storage):
            raise Refused(f"a tensor of size {list(size)} at offset {offset} reaches past its storage of "
                          f"{len(storage)} elements")
        if not size:
            return storage[offset].copy()
        stride = tuple(s if n > 1 else 0 for n, s in zip(size, stride))  # a dimension of one is never stepped
        view = np.lib.stride_tricks.as_strided(storage[offset:], size, [s * storage.itemsize for s in stride],
                                               writeable=False)
        return np.ascontiguousarray(view)


def _data_pickle(archive: zipfile.ZipFile, path: str) -> str:
    """The archive's ``<name>/data.pkl`` member (torch names the top folder after the file it saved to)."""
    names = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
    if not names:
        raise DataError(f"'{path}' is a zip file but not a torch.save archive: it has no data.pkl")
    return names[0]


def _check_members(archive: zipfile.ZipFile, path: str):
    """Refuse members compressed beyond ``MAX_COMPRESSION`` (a zip bomb): torch.save stores them uncompressed."""
    for info in archive.infolist():
        if info.file_size > MAX_COMPRESSION * max(info.compress_size, 1) and info.file_size > (1 << 20):
            raise DataError(f"'{path}' was not loaded: its member '{info.filename}' expands {info.file_size} bytes "
                            f"from {info.compress_size} (more than {MAX_COMPRESSION} times)")


def read_torch_file(path: str):
    """The object ``torch.save`` wrote to ``path`` (a state_dict: names -> numpy arrays), read without torch."""
    if not zipfile.is_zipfile(path):
        raise DataError(f"'{path}' is not a zip-format torch file (torch >= 1.6 writes one): re-save it with "
                        "torch.save(model.state_dict(), path) in a recent PyTorch")
    try:
        with zipfile.ZipFile(path) as archive:
            _check_members(archive, path)
            member = _data_pickle(archive, path)
            prefix = member[:-len("data.pkl")]
            byteorder = "little"
            if f"{prefix}byteorder" in archive.namelist():
                byteorder = archive.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise DataError(f"'{path}' was not loaded: its byteorder is {byteorder[:20]!r}, not little or big")
            with archive.open(member) as f:
                unpickler = StateDictUnpickler(f, archive, prefix, byteorder)
                try:
                    obj = unpickler.load()
                    return safe_pickle.finish(obj, unpickler.budget)
                except Refused as exc:
                    raise DataError(f"'{path}' was not loaded: {exc}") from None
                except (safe_pickle.pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                        IndexError, KeyError, MemoryError, OverflowError, UnicodeDecodeError) as exc:
                    raise DataError(f"'{path}' cannot be read as a state_dict ({type(exc).__name__}: "
                                    f"{str(exc)[:120]})") from None
    except (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError) as exc:  # damaged or odd archives
        raise DataError(f"'{path}' cannot be read as a torch archive ({type(exc).__name__}: {exc})") from None
