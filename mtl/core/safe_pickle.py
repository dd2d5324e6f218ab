"""Read pickled files from elsewhere without running code from them: the one restricted unpickler of the project.

A pickle is a small program: every ``GLOBAL`` it names is imported and called while it loads, so ``pickle.load`` or
``paddle.load`` of a file someone else wrote runs whatever that file asks. Every pickle the project reads (Paddle's
``.pdparams`` / ``.pdopt`` files, checkpoints, InsightFace ``.bin`` verification sets, the ``data.pkl`` of a torch
archive) goes through :class:`RestrictedUnpickler`, which admits only the globals listed for the file's kind and
builds numpy arrays, dtypes and scalars itself, from checked parts, instead of handing the file's bytes to numpy:

* ``numpy`` ``_reconstruct`` / ``ndarray`` / ``dtype`` / ``scalar`` / ``_frombuffer``: an array is rebuilt only from
  a plain numeric or string dtype (no object arrays, no fields, no sub-arrays), a shape of non-negative integers and
  exactly ``prod(shape) * itemsize`` bytes present in the file;
* the built-in containers and ``collections.OrderedDict``;
* what ``paddle.save`` itself writes: a tensor as ``tuple((name, array))``, a dense tensor as
  ``eval("data", {"data": array})`` (only that exact expression is accepted, nothing is evaluated) and a random
  generator's state (``paddle.base.libpaddle.GeneratorState``, kept as its plain state tuple: :class:`GeneratorRecord`).

Anything else (a class, a function, ``os.system``) is refused with one sentence naming the file and the global it
holds, before it is imported. After loading, the arrays counted once per reference may not exceed ``MAX_EXPANSION``
times the file's size (a file that repeats one array a million times is refused instead of exhausting memory), and
cycles are refused.
"""
import _compat_pickle
import collections
import io
import math
import os
import pickle
import re
from typing import Dict, Tuple

import numpy as np

from mtl.core.errors import DataError, absent
from mtl.core.file_kinds import not_a_pickle

MAX_EXPANSION = 4  # arrays counted per reference, at most this many times the bytes of the file
MAX_GENERATOR_STATE = 1 << 20  # characters of one serialised random generator state
_DTYPE_CODE = re.compile(r"^(b1|[iu][1248]|f[248]|c(8|16)|[US]\d{1,7})$")
NUMPY_MODULES = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                 "numpy._core.numeric")


class Refused(pickle.UnpicklingError):
    """The file holds something the reader does not build (the sentence says what)."""


class _NdarrayType:
    """Stands for ``numpy.ndarray`` in a pickle: only ever the first argument of ``_reconstruct``."""


class DtypeBuilder:
    """A numpy dtype named by the pickle, checked: plain numeric or string codes, byte order set by its state."""

    def __init__(self, code, align=False, copy=True):
        code = code.decode("latin1") if isinstance(code, bytes) else code
        if not isinstance(code, str) or not _DTYPE_CODE.match(code):
            raise Refused(f"it holds an array of dtype {str(code)[:20]!r}, which a weight file does not hold")
        self.dtype = np.dtype(code)

    def __setstate__(self, state):
        """numpy's dtype state ``(version, byte order, subarray, names, fields, itemsize, alignment, flags)``: only
        the byte order may differ from the plain dtype."""
        if not (isinstance(state, tuple) and len(state) >= 2 and state[1] in ("<", ">", "|", "=")
                and all(part is None for part in state[2:5])):
            raise Refused("it holds a structured or nested array dtype, which a weight file does not hold")
        if state[1] in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(state[1])


def _dtype_of(value) -> np.dtype:
    if not isinstance(value, DtypeBuilder):
        raise Refused(f"it names an array dtype as a {type(value).__name__}")
    return value.dtype


def _checked_shape(shape) -> Tuple[int, ...]:
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                               for n in shape):
        raise Refused(f"it holds an array of shape {str(shape)[:40]}, not a tuple of non-negative integers")
    return shape


def _array_from(data, dtype: np.dtype, shape, fortran=False) -> np.ndarray:
    """The array of ``shape`` and ``dtype`` over ``data``, which must hold exactly its bytes."""
    shape = _checked_shape(shape)
    if isinstance(data, pickle.PickleBuffer):
        data = data.raw()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Refused(f"it holds array data as a {type(data).__name__} (an object array)")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise Refused(f"it holds an array of shape {list(shape)} {dtype} with {len(data)} bytes, {expected} expected")
    if isinstance(data, bytes):  # numpy's own state setter on checked parts: the array keeps the bytes, no copy
        array = np.ndarray.__new__(np.ndarray, (0,), "b")
        array.__setstate__((1, shape, dtype, bool(fortran), data))
        return array
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array if array.flags.writeable else array.copy()


class ArrayBuilder:
    """An array (or numpy scalar) named by the pickle, built by :func:`_array_from` from checked parts:
    ``_reconstruct(ndarray, (0,), b'b')`` then its state, or ``_frombuffer`` / ``scalar`` at once. The pickle only
    ever holds this stand-in (its own operations cannot reach a real array); :func:`finish` puts the array in."""

    def __init__(self, array=None):
        self.array = array

    def __setstate__(self, state):
        """numpy's array state ``(version, shape, dtype, is_fortran, data)``."""
        if not (isinstance(state, tuple) and len(state) == 5):
            raise Refused("it holds an array whose state is not numpy's")
        _, shape, dtype, fortran, data = state
        self.array = _array_from(data, _dtype_of(dtype), shape, bool(fortran))


def _reconstruct(cls, shape, typecode):
    if cls is not _NdarrayType:
        raise Refused("it reconstructs an array of a type other than numpy.ndarray")
    return ArrayBuilder()


def _scalar(dtype, data=None):
    dtype = _dtype_of(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise Refused(f"it holds a {dtype} scalar without its {dtype.itemsize} bytes")
    return ArrayBuilder(np.frombuffer(data, dtype=dtype)[0].copy())


def _frombuffer(data, dtype, shape, order="C"):
    return ArrayBuilder(_array_from(data, _dtype_of(dtype), tuple(shape) if isinstance(shape, list) else shape,
                                    order == "F"))


def _latin1(text, encoding="latin1"):
    """``_codecs.encode(text, 'latin1')``: how a Python 2 pickle spells a byte string."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise Refused("it calls codecs.encode with something other than a latin-1 text")
    return text.encode("latin1")


def _paddle_dense_tensor(expression, namespace=None, *_):
    """``eval("data", {"data": array})``: how ``paddle.save`` writes a dense tensor; nothing is evaluated."""
    if expression != "data" or not isinstance(namespace, dict) or set(namespace) != {"data"}:
        raise Refused("it calls eval, which a weight file does not do")
    return namespace["data"]


class GeneratorRecord:
    """A random generator's state as ``paddle.save`` wrote it (``GeneratorState``), kept as its state tuple
    ``(device, seed, offset, characters of the engine's state)``; :meth:`to_paddle` makes Paddle's object."""

    def __init__(self, state=None):
        self.state = state

    def __setstate__(self, state):
        self.state = check_generator_state(state)

    def to_paddle(self):
        """Paddle's ``GeneratorState`` with this state (for ``paddle.set_rng_state``)."""
        return generator_state(self.state)


def check_generator_state(state) -> tuple:
    """``state`` if it is a generator state tuple of plain integers (a bounded engine string), else Refused."""
    if not (isinstance(state, (tuple, list)) and len(state) == 4 and all(isinstance(v, int) for v in state[:3])
            and isinstance(state[3], (list, tuple)) and len(state[3]) <= MAX_GENERATOR_STATE
            and all(isinstance(c, int) and 0 <= c < 256 for c in state[3])):
        raise Refused("it holds a random generator state that is not four plain values")
    return tuple(state[:3]) + (list(state[3]),)


def generator_state(state):
    """Paddle's ``GeneratorState`` object of a checked state tuple."""
    import paddle

    cls = paddle.base.core.GeneratorState
    out = cls.__new__(cls)
    out.__setstate__(check_generator_state(state))
    return out


BUILTINS = {
    ("builtins", "tuple"): tuple, ("builtins", "list"): list, ("builtins", "dict"): dict, ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset, ("builtins", "bytearray"): bytearray, ("builtins", "complex"): complex,
    ("builtins", "bytes"): bytes, ("builtins", "bool"): bool, ("builtins", "int"): int, ("builtins", "float"): float,
    ("builtins", "str"): str, ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _latin1,
}
NUMPY = {(module, name): value for module in NUMPY_MODULES for name, value in
         {"_reconstruct": _reconstruct, "ndarray": _NdarrayType, "dtype": DtypeBuilder, "scalar": _scalar,
          "_frombuffer": _frombuffer}.items()}
NUMPY[("numpy", "bool_")] = bool
PADDLE = {("builtins", "eval"): _paddle_dense_tensor,
          ("paddle.base.libpaddle", "GeneratorState"): GeneratorRecord,
          ("paddle.base.core", "GeneratorState"): GeneratorRecord}
PADDLE_FILE = {**BUILTINS, **NUMPY, **PADDLE}  # what paddle.save writes
# what BUILD may set the state of: the builders, and a state_dict's OrderedDict (torch gives it ``_metadata``)
BUILDABLE = (ArrayBuilder, DtypeBuilder, GeneratorRecord, collections.OrderedDict)


def _described(value) -> str:
    """``class 'DtypeBuilder'`` / ``function '_scalar'`` / ``a 'list'``: what a refused BUILD targets."""
    if isinstance(value, type):
        return f"class '{value.__name__}'"
    if callable(value):
        return f"function '{getattr(value, '__name__', type(value).__name__)}'"
    return f"a '{type(value).__name__}'"


class RestrictedUnpickler(pickle._Unpickler):
    """An unpickler admitting only the globals of ``allowed`` (``{(module, name): what to call}``), whose ``BUILD``
    sets the state of :data:`BUILDABLE` objects only.

    ``BUILD`` (set the state of the object below it) would otherwise set attributes on anything on the stack,
    the allowed stand-ins themselves included: a file could replace a method of a builder class for the rest of the
    process (``DtypeBuilder.__init__``, which checks every dtype). Python's own unpickler has no hook for one
    opcode, so this is the pure-Python one with its ``BUILD`` entry replaced; arrays arrive as whole byte strings,
    so the opcodes it runs are few.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, allowed: Dict[Tuple[str, str], object], **kwargs):
        super().__init__(file, **kwargs)
        self.allowed = allowed

    def load_build(self):
        """``BUILD`` of a builder or a plain mapping; anything else (a class, a function) is refused."""
        target = self.stack[-2] if len(self.stack) > 1 else None
        if not isinstance(target, BUILDABLE) or isinstance(target, type):
            raise Refused(f"it sets the state of {_described(target)}, which such a file does not do")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build

    def find_class(self, module, name):
        """The allowed stand-in for ``module.name``; anything else is refused before it is imported. Python 2
        names (``__builtin__.tuple`` in protocol 2 files) are read as their Python 3 names, as pickle does."""
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = self.allowed.get((module, name))
        if found is None:
            raise Refused(f"it holds '{module}.{name}', which such a file does not hold (only tensors, arrays, "
                          "numbers, strings and containers are read)")
        return found

    def persistent_load(self, pid):
        """No persistent objects unless a subclass reads them (torch's storages)."""
        raise Refused(f"it holds a persistent object {str(pid)[:60]!r}")


def finish(obj, budget: int, tensor_tuples: bool = False):
    """``obj`` with every :class:`ArrayBuilder` replaced by its array (and, with ``tensor_tuples``, Paddle's
    ``(name, array)`` tensor tuples by their arrays); Refused on a cycle or when the arrays, counted per reference,
    exceed ``budget`` bytes."""
    used = [0]

    def walk(value, path):
        if isinstance(value, ArrayBuilder):
            if value.array is None:
                raise Refused("it holds an array without its data")
            value = value.array
        if isinstance(value, (np.ndarray, np.generic)):
            used[0] += value.nbytes
            if used[0] > budget:
                raise Refused(f"its arrays, counted once per reference, exceed {MAX_EXPANSION} times the file's "
                              "size (an array repeated many times)")
            return value
        if isinstance(value, (dict, list, tuple, set, frozenset)):
            if id(value) in path:
                raise Refused("it holds a container that contains itself")
            path = path | {id(value)}
            if isinstance(value, dict):
                return type(value)((walk(k, path), walk(v, path)) for k, v in value.items())
            items = [walk(v, path) for v in value]
            if tensor_tuples and isinstance(value, tuple) and len(items) == 2 and isinstance(items[0], str) and \
                    isinstance(items[1], np.ndarray):
                return items[1]  # paddle.save's tensor: (name, array)
            return type(value)(items)
        return value

    try:
        return walk(obj, frozenset())
    except RecursionError:
        raise Refused("it nests containers too deeply") from None


def load_pickle(path: str, allowed=PADDLE_FILE, what: str = "a weight file", data: bytes = None,
                tensor_tuples: bool = False, **kwargs):
    """The object pickled in ``path`` (or in ``data``), read with :class:`RestrictedUnpickler` and :func:`finish`.

    A file that cannot be read, is not a pickle or holds anything outside ``allowed`` is a DataError of one sentence
    naming the file and what it holds; nothing from the file runs.
    """
    try:
        if data is None:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                obj = RestrictedUnpickler(f, allowed, **kwargs).load()
        else:
            size = len(data)
            obj = RestrictedUnpickler(io.BytesIO(data), allowed, **kwargs).load()
        return finish(obj, MAX_EXPANSION * size + (1 << 16), tensor_tuples)
    except OSError as exc:
        raise DataError(f"'{path}' cannot be read: {exc.strerror or exc}") from None
    except Refused as exc:
        # (a pickle of protocol 0 is text: a refused one is a pickle, and said to be refused)
        raise (not_a_pickle(path, data, what, text=False) or DataError(f"'{path}' was not loaded: {exc}")) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, OverflowError, UnicodeDecodeError) as exc:
        raise (not_a_pickle(path, data, what) or
               DataError(f"'{path}' cannot be read as {what} ({type(exc).__name__}: {str(exc)[:120]})")) from None


def _merge_big_parameters(state: dict) -> dict:
    """``paddle.save`` with protocol 2 or 3 cuts arrays above 4 GB into slices (``UnpackBigParamInfor@@``): put them
    back together."""
    info = state.pop("UnpackBigParamInfor@@", None)
    if not isinstance(info, dict):
        return state
    for key, entry in info.items():
        try:
            parts = [state.pop(name) for name in entry["slices"]]
            state[key] = np.concatenate([p.reshape(-1) for p in parts]).reshape(entry["OriginShape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"big parameter '{key}' cannot be put back together ({exc})") from None
    return state


def load_paddle_file(path: str, what: str = "a Paddle state file"):
    """What ``paddle.save`` wrote to ``path``, with numpy arrays where ``paddle.load`` gives tensors (state dicts,
    optimizer states, checkpoint files) and :class:`GeneratorRecord` for random generator states; read without
    running code from the file (:func:`load_pickle`). Paddle's name table ``StructuredToParameterName@@`` is
    dropped."""
    if not os.path.isfile(path):
        raise DataError(f"'{path}' {absent(path)}")
    obj = load_pickle(path, PADDLE_FILE, what, tensor_tuples=True, encoding="latin1")
    if isinstance(obj, dict):
        obj.pop("StructuredToParameterName@@", None)
        try:
            obj = _merge_big_parameters(obj)
        except DataError as exc:
            raise DataError(f"'{path}': {exc}") from None
    return obj


def load_state_dict(path: str, what: str = "a state_dict"):
    """A ``{name: array}`` state dict written by ``paddle.save``; a DataError when the file holds anything else."""
    obj = load_paddle_file(path, what)
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise DataError(f"'{path}' holds a {type(obj).__name__}, not {what} (a mapping of names to tensors)")
    return obj
