"""Field contracts between readers, backbones and heads (PaddlePALM-style).

A reader declares the fields each sample carries, a backbone the fields it reads and its feature size, a head the
fields it scores against. ``check_*`` functions compare both sides once when the job is built and name the task, both
components and the field on a mismatch.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from mtl.core.errors import ContractError

_DTYPE_ALIASES = {"float": "float32", "int": "int64", "long": "int64", "double": "float64"}


def canonical_dtype(dtype) -> str:
    """Return the numpy name of ``dtype`` ("float32", "int64", ...)."""
    name = str(dtype).replace("paddle.", "")
    name = _DTYPE_ALIASES.get(name, name)
    return np.dtype(name).name


@dataclass(frozen=True)
class Field:
    """One named array per sample. ``shape`` excludes the batch axis; ``None`` in it means "any size".

    ``pad``: the value a batch pads a sample with along its ``None`` axes (token ids with the tokenizer's
    ``[PAD]``, labels with -1 = no label); None: every sample of the field must have the same shape.
    """

    name: str
    shape: Tuple[Optional[int], ...]
    dtype: str = "float32"
    doc: str = ""
    pad: Optional[float] = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    def accepts(self, other: "Field") -> bool:
        """True when a value described by ``other`` satisfies this field's declaration."""
        if self.dtype != other.dtype or len(self.shape) != len(other.shape):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self.shape, other.shape))

    def group_size(self, other: "Field") -> Optional[int]:
        """Rows of this (backbone input) field that one sample of ``other`` holds: 1 when it accepts ``other``;
        K when ``other`` is a group of K such rows (shape ``(K, *shape)``, e.g. a pairwise matching sample's
        query + positive and query + negative); None when neither."""
        if self.accepts(other):
            return 1
        if len(other.shape) == len(self.shape) + 1 and isinstance(other.shape[0], int) and \
                self.accepts(Field(other.name, other.shape[1:], other.dtype)):
            return other.shape[0]
        return None

    def describe(self) -> str:
        """Human-readable ``name[shape] dtype``."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}[{dims}] {self.dtype}"


def _require(task, consumer, provider, fields, provided, groups=False):
    for need in fields:
        have = provided.get(need.name)
        if have is None:
            names = ", ".join(sorted(provided)) or "nothing"
            raise ContractError(
                f"task '{task}': {consumer} needs field '{need.name}' ({need.describe()}) "
                f"but {provider} provides only: {names}"
            )
        if not (need.group_size(have) if groups else need.accepts(have)):
            problem = conversion_problem(have.dtype, need.dtype) if have.dtype != need.dtype else None
            raise ContractError(
                f"task '{task}': {consumer} needs field {need.describe()} "
                f"but {provider} provides {have.describe()}" + (f" ({problem})" if problem else "")
            )


def check_task(task, reader_name, reader_fields, backbone_name, backbone_fields, head_name, head_fields):
    """Check that the reader provides every field the backbone and the head need; raise ContractError if not."""
    provided = {f.name: f for f in reader_fields}
    _require(task, f"backbone '{backbone_name}'", f"reader '{reader_name}'", backbone_fields, provided, groups=True)
    _require(task, f"head '{head_name}'", f"reader '{reader_name}'", head_fields, provided)


def check_output(task, backbone_name, outputs, default, head_name, reads):
    """The head reads an output the backbone has: ``reads`` (or the backbone's ``default_output``) among its
    named outputs; a head that names an output needs a backbone that returns several."""
    if outputs is None:
        if reads is not None:
            raise ContractError(f"task '{task}': head '{head_name}' reads the backbone output '{reads}', but backbone "
                                f"'{backbone_name}' returns one feature vector per sample (use a text encoder)")
        return
    key = reads or default
    if key not in outputs:
        raise ContractError(f"task '{task}': head '{head_name}' reads the backbone output '{key}', but backbone "
                            f"'{backbone_name}' returns only: {', '.join(sorted(outputs))}")


def check_batch(task, component, fields, batch, groups=()):
    """Per-batch check: every declared field is present with the declared dtype and per-sample shape (the fields
    named in ``groups``, a backbone's inputs, may also hold a group of rows: :meth:`Field.group_size`)."""
    for f in fields:
        if f.name not in batch:
            raise ContractError(f"task '{task}': batch from {component} lacks field '{f.name}'")
        value = batch[f.name]
        shape = tuple(value.shape)[1:]
        got = Field(f.name, shape, canonical_dtype(value.dtype))
        if not (f.group_size(got) if f.name in groups else f.accepts(got)):
            raise ContractError(
                f"task '{task}': {component} declared {f.describe()} but a batch holds {got.describe()}"
            )


_EXACT_FLOAT_INTEGERS = {"float32": 2 ** 24, "float64": 2 ** 53, "float16": 2 ** 11}


def conversion_problem(source, target) -> Optional[str]:
    """Why an array of dtype ``source`` cannot be given as ``target``, or None when the conversion is safe.

    Safe: bool to any number (multi-hot flags), a narrower integer to int64, an integer to a float (exact while
    the values stay within the float's integer range, checked by :func:`convert`), a float to float32 (the
    precision every model here computes in). Refused: a float to an integer or bool (the fraction would be lost),
    a number to bool.
    """
    source, target = canonical_dtype(source), canonical_dtype(target)
    src, dst = np.dtype(source), np.dtype(target)
    if src == dst or src == np.bool_ and dst != np.bool_:
        return None
    if dst == np.bool_:
        return f"{source} cannot become bool without losing information"
    if np.issubdtype(src, np.integer):
        if np.issubdtype(dst, np.floating) or np.can_cast(src, dst, casting="safe"):
            return None
        return f"{source} values may not fit {target}"
    if np.issubdtype(src, np.floating) and np.issubdtype(dst, np.floating):
        return None if dst.itemsize >= 4 else f"{source} cannot become {target} without losing precision"
    if np.issubdtype(src, np.floating):
        return f"a {source} value cannot become {target} without losing information (its fraction)"
    return f"{source} cannot be converted to {target}"


def convert(array, dtype, what: str):
    """``array`` as ``dtype`` when :func:`check_conversion` allows it; a DataError naming ``what`` otherwise."""
    array = np.asarray(array)
    check_conversion(array, dtype, what)
    return array.astype(canonical_dtype(dtype), copy=False)


def check_conversion(array, dtype, what: str):
    """A DataError naming ``what`` unless ``array`` converts safely to ``dtype`` (:func:`conversion_problem`).

    Integers going to a float are checked to be exactly representable (``|v| <= 2^24`` for float32).
    """
    from mtl.core.errors import DataError

    target = canonical_dtype(dtype)
    problem = conversion_problem(array.dtype, target)
    if problem:
        raise DataError(f"{what}: {problem}")
    limit = _EXACT_FLOAT_INTEGERS.get(target)
    if limit is None or not np.issubdtype(array.dtype, np.integer) or not array.size:
        return
    info = np.iinfo(array.dtype)
    if max(-int(info.min), int(info.max)) > limit and int(np.abs(array).max()) > limit:  # narrow types: no scan
        raise DataError(f"{what}: integer values up to {int(np.abs(array).max())} are not exact in {target} "
                        f"(limit {limit})")
