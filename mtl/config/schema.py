"""A small declarative schema for YAML configs: types, defaults, choices, ranges, "did you mean" for unknown keys.

``validate(schema, data, source, prefix)`` returns a new dict with defaults filled in, or raises ConfigError naming
the file and the dotted key path.
"""
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Tuple

from mtl.core.errors import ConfigError
from mtl.core.registry import did_you_mean

REQUIRED = object()

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
               dict: "a mapping"}


@dataclass
class Opt:
    """One key: accepted types, default (REQUIRED if none), optional choices, bounds and a custom check."""

    types: Tuple[type, ...]
    default: Any = REQUIRED
    choices: Optional[Sequence] = None
    min: Optional[float] = None
    max: Optional[float] = None
    min_exclusive: bool = False
    nullable: bool = False
    check: Optional[Callable[[Any], Optional[str]]] = None
    doc: str = ""

    def __post_init__(self):
        if not isinstance(self.types, tuple):
            self.types = (self.types,)


@dataclass
class Section:
    """A nested mapping with its own schema; ``open`` sections accept any extra keys (e.g. component params)."""

    schema: dict
    open: bool = False
    nullable: bool = False
    doc: str = ""
    default: Any = field(default_factory=dict)
    check: Optional[Callable[[dict, str, str], None]] = None  # (validated section, source, key path): raises


def _type_ok(value, types):
    for t in types:
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t not in (int, float) and isinstance(value, t):
            return True
    return False


def _expected(types):
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def validate(schema: dict, data, source: str, prefix: str = ""):
    """Validate ``data`` against ``schema``; return it with defaults filled in."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {type(data).__name__}", source, prefix or None)
    out = {}
    for key in data:
        if key not in schema:
            path = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(
                f"unknown key{did_you_mean(key, schema)}; allowed here: {', '.join(schema)}", source, path
            )
    for key, spec in schema.items():
        path = f"{prefix}.{key}" if prefix else key
        present = key in data
        value = data.get(key)
        if isinstance(spec, Section):
            if present and value is None and spec.nullable:
                out[key] = None
                continue
            value = {} if not present else value
            if not isinstance(value, dict):
                raise ConfigError(f"expected a mapping, got {value!r}", source, path)
            inner = validate(spec.schema, {k: v for k, v in value.items() if k in spec.schema or not spec.open},
                             source, path)
            if spec.open:
                inner.update({k: v for k, v in value.items() if k not in spec.schema})
            if spec.check is not None:
                spec.check(inner, source, path)
            out[key] = inner
            continue
        if not present:
            if spec.default is REQUIRED:
                raise ConfigError(f"missing required key (expected {_expected(spec.types)})", source, path)
            out[key] = spec.default
            continue
        out[key] = check_value(spec, value, source, path)
    return out


def check_value(spec: Opt, value, source, path):
    """Check one value against its Opt; return it (ints accepted where floats are expected, as floats)."""
    if value is None:
        if spec.nullable or spec.default is None:
            return None
        raise ConfigError(f"must not be empty (expected {_expected(spec.types)})", source, path)
    if not _type_ok(value, spec.types):
        raise ConfigError(f"expected {_expected(spec.types)}, got {value!r}", source, path)
    if float in spec.types and int not in spec.types and isinstance(value, int):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):  # nan passes every bound; inf is no setting
        raise ConfigError(f"must be a finite number, got {value!r}", source, path)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(
            f"must be one of {', '.join(map(str, spec.choices))}, got {value!r}{did_you_mean(value, spec.choices)}",
            source, path,
        )
    if spec.min is not None and (value < spec.min or (spec.min_exclusive and value == spec.min)):
        rel = ">" if spec.min_exclusive else ">="
        raise ConfigError(f"must be {rel} {spec.min}, got {value!r}", source, path)
    if spec.max is not None and value > spec.max:
        raise ConfigError(f"must be <= {spec.max}, got {value!r}", source, path)
    if spec.check is not None:
        problem = spec.check(value)
        if problem:
            raise ConfigError(problem, source, path)
    return value


def describe(schema: dict, prefix: str = ""):
    """Rows (key path, type, default, description) for the README's config reference."""
    rows = []
    for key, spec in schema.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(spec, Section):
            rows.append((path, "mapping", "", spec.doc))
            rows.extend(describe(spec.schema, path))
        else:
            default = "required" if spec.default is REQUIRED else repr(spec.default)
            kind = _expected(spec.types)
            if spec.choices:
                kind = "|".join(map(str, spec.choices))
            rows.append((path, kind, default, spec.doc))
    return rows
