"""A job config's YAML files: read with duplicate keys refused, a variant laid over its ``base:``, and the file
that gave each key its value (so that an error of a base's key names that base).

Every error is one ConfigError naming the file and the key (:mod:`mtl.config.loading` validates what these return).
"""
import os

import yaml

from mtl.config.keys import ALTERNATIVES
from mtl.config.paths import resolve_path
from mtl.core.errors import ConfigError, MtlError, absent
from mtl.core.utf8 import NotUtf8, open_utf8


def duplicate_key(node, seen=None):
    """``(key, its first line, the mark of its second)`` of the first mapping in the composed YAML ``node`` that
    names a key twice, or None. YAML forbids it; PyYAML keeps the last value without a word (a second ``ratio:``
    further down a task file silently won). Checked on the composed nodes, before merge keys (``<<: *anchor``,
    whose keys may be overridden) are flattened; keys compare by tag and text, so ``1`` and ``true`` differ."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: the same node again
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                name = (key_node.tag, key_node.value)
                if name in lines:
                    return key_node.value, lines[name], key_node.start_mark
                lines[name] = key_node.start_mark.line + 1
            found = duplicate_key(key_node, seen) or duplicate_key(value_node, seen)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = duplicate_key(item, seen)
            if found:
                return found
    return None


def load_yaml_text(text: str):
    """The YAML document ``text`` as PyYAML's safe loader builds it, after :func:`duplicate_key` found no key named
    twice (a ``yaml.YAMLError`` with the line otherwise)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        found = duplicate_key(node)
        if found:
            key, first, mark = found
            raise yaml.constructor.ConstructorError(None, None, f"key '{key}' appears twice (lines {first} and "
                                                    f"{mark.line + 1})", mark)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str, what: str = "config"):
    """Read a YAML mapping, with a one-line error for a missing or malformed file."""
    if not os.path.isfile(path):
        raise ConfigError(f"{what} file {absent(path)}", path)
    try:
        with open_utf8(path, what) as f:
            data = load_yaml_text(f.read())
    except NotUtf8 as exc:
        raise ConfigError(f"is not UTF-8 text: {exc.where}; save it as UTF-8", path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"is not valid YAML{where}: {getattr(exc, 'problem', exc)}", path) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", path)
    return data


def read_job_yaml(path: str, seen=(), origins=None):
    """A job config's raw mapping; ``base: OTHER.yaml`` (relative to this file) starts from another job config.

    The variant's keys are merged over the base's (mappings key by key, anything else replaced whole), so a variant
    states only what differs. The base's task files and plug-in folders are taken relative to the base's folder.
    ``origins``, when given, is filled with the file that gave each key path (a tuple) its value."""
    origins = {} if origins is None else origins
    raw = read_yaml(path, "job config")
    if "base" not in raw:
        record_origins(raw, path, origins)
        return raw
    ref = raw.pop("base")
    if not isinstance(ref, str):
        raise ConfigError(f"expected the path of another job config, got {ref!r}", path, "base")
    base_path = resolve_path(ref, os.path.dirname(os.path.abspath(path)))
    if not os.path.isfile(base_path):
        raise ConfigError(f"base config '{ref}' does not exist (looked for '{os.path.abspath(base_path)}')", path,
                          "base")
    if os.path.abspath(base_path) in seen:
        raise ConfigError(f"base configs form a loop through '{base_path}'", path, "base")
    base = read_job_yaml(base_path, (*seen, os.path.abspath(path)), origins)
    base_dir = os.path.dirname(os.path.abspath(base_path))
    for key in ("tasks", "plugins"):
        if isinstance(base.get(key), list):
            base[key] = [resolve_path(v, base_dir) if isinstance(v, str) and os.path.exists(os.path.join(base_dir, v))
                         else v for v in base[key]]
    record_origins(raw, path, origins)
    named = set(ALTERNATIVES) | {other for others in ALTERNATIVES.values() for other in others}
    return replace_alternatives(_merged(base, raw), [path for path in named if _given(raw, path)])


def record_origins(layer, source, origins, prefix=()):
    """Record the file ``source`` in ``origins`` as the giver of every key path of the mapping ``layer``, as
    :func:`_merged` lays it over what is there: mappings key by key, any other value replacing the keys below it."""
    for key, value in layer.items():
        path = (*prefix, str(key))
        if not isinstance(value, dict):
            _forget_below(origins, path)
        origins[path] = source
        if isinstance(value, dict):
            record_origins(value, source, origins, path)


def record_set(path, origins):
    """Record a ``--set`` of the key path ``path``: it replaces the value whole, a mapping too."""
    _forget_below(origins, tuple(map(str, path)))
    origins[tuple(map(str, path))] = "--set"


def _forget_below(origins, path):
    for below in [p for p in origins if p[:len(path)] == path]:
        del origins[below]


def name_the_base(exc, origins, path):
    """``exc`` (raised for a key of the variant config ``path``) saying which base config gave the failing key's
    value, when a base did (the variant never held it; the fault may still be the variant's, as a key it changed
    beside it); errors of keys the variant or ``--set`` gave are returned as they are."""
    parts = tuple(exc.key.split(".")) if exc.key else ()
    origin = next((origins[parts[:n]] for n in range(len(parts), 0, -1) if parts[:n] in origins), None)
    if origin in (None, "--set") or os.path.abspath(origin) == os.path.abspath(path):
        return exc
    told = type(exc).__new__(type(exc))  # the same error (whatever its constructor takes), one clause longer
    told.__dict__.update(exc.__dict__)
    MtlError.__init__(told, f"{exc.bare_message} (the value comes from {origin}, which {os.path.basename(path)} is "
                            "based on)", exc.source, exc.key)
    return told


def _given(data, path):
    """True when ``data`` gives the key ``path`` a value (null is no value: it replaces nothing)."""
    for part in path:
        if not isinstance(data, dict) or data.get(part) is None:
            return False
        data = data[part]
    return True


def replace_alternatives(data, given):
    """``data`` without the keys that a layer above it replaces (:data:`ALTERNATIVES`: ``schedule.epochs`` of a
    variant or a ``--set`` replaces the base's ``schedule.steps``; ``schedule.steps`` its ``epochs`` and
    ``epochs_of``); ``given``: the key paths that layer gives a value (what it gives itself stays)."""
    given = {tuple(path) for path in given}
    for path in given:
        for other in ALTERNATIVES.get(path, ()):
            parent = data
            for part in other[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            if other not in given and isinstance(parent, dict):
                parent.pop(other[-1], None)
    return data


def _merged(base, update):
    """``update`` over ``base``: mappings merged key by key, other values replaced."""
    out = dict(base)
    for key, value in update.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
