"""Field contracts between readers, backbones and heads (PaddlePALM-style).

A reader declares the fields each sample carries, a backbone the fields it reads and its feature size, a head the
fields it scores against. ``check_*`` functions compare both sides once when the job is built and name the task, both
components and the field on a mismatch.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from mtl.errors import ContractError

_DTYPE_ALIASES = {"float": "float32", "int": "int64", "long": "int64", "double": "float64"}


def canonical_dtype(dtype) -> str:
    """Return the numpy name of ``dtype`` ("float32", "int64", ...)."""
    name = str(dtype).replace("paddle.", "")
    name = _DTYPE_ALIASES.get(name, name)
    return np.dtype(name).name


@dataclass(frozen=True)
class Field:
    """One named array per sample. ``shape`` excludes the batch axis; ``None`` in it means "any size"."""

    name: str
    shape: Tuple[Optional[int], ...]
    dtype: str = "float32"
    doc: str = ""

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    def accepts(self, other: "Field") -> bool:
        """True when a value described by ``other`` satisfies this field's declaration."""
        if self.dtype != other.dtype or len(self.shape) != len(other.shape):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self.shape, other.shape))

    def describe(self) -> str:
        """Human-readable ``name[shape] dtype``."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}[{dims}] {self.dtype}"


def _require(task, consumer, provider, fields, provided):
    for need in fields:
        have = provided.get(need.name)
        if have is None:
            names = ", ".join(sorted(provided)) or "nothing"
            raise ContractError(
                f"task '{task}': {consumer} needs field '{need.name}' ({need.describe()}) "
                f"but {provider} provides only: {names}"
            )
        if not need.accepts(have):
            raise ContractError(
                f"task '{task}': {consumer} needs field {need.describe()} "
                f"but {provider} provides {have.describe()}"
            )


def check_task(task, reader_name, reader_fields, backbone_name, backbone_fields, head_name, head_fields):
    """Check that the reader provides every field the backbone and the head need; raise ContractError if not."""
    provided = {f.name: f for f in reader_fields}
    _require(task, f"backbone '{backbone_name}'", f"reader '{reader_name}'", backbone_fields, provided)
    _require(task, f"head '{head_name}'", f"reader '{reader_name}'", head_fields, provided)


def check_batch(task, component, fields, batch):
    """Per-batch check: every declared field is present with the declared dtype and per-sample shape."""
    for f in fields:
        if f.name not in batch:
            raise ContractError(f"task '{task}': batch from {component} lacks field '{f.name}'")
        value = batch[f.name]
        shape = tuple(value.shape)[1:]
        got = Field(f.name, shape, canonical_dtype(value.dtype))
        if not f.accepts(got):
            raise ContractError(
                f"task '{task}': {component} declared {f.describe()} but a batch holds {got.describe()}"
            )
