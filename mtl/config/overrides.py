"""``--set key.path=value`` overrides of job and task configs, and the error sentence of a value one of them gave."""
import copy

import yaml

from mtl.core.errors import ConfigError


def parse_override(text: str):
    """Split ``a.b.c=value`` into (["a", "b", "c"], parsed YAML value)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key.path=value, got {text!r}", "--set")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key.path=value, got {text!r}", "--set")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides, source="--set"):
    """Apply ``--set`` overrides (text ``a.b=v`` or parsed ``(path, value)``) to a raw config dict.

    Lists are indexed by number; a path that runs into a scalar, or an index past a list's end, is a ConfigError.
    """
    data = copy.deepcopy(data)
    for item in overrides or ():
        path, value = parse_override(item) if isinstance(item, str) else item
        node = data
        for depth, part in enumerate(path[:-1]):
            if isinstance(node, list):
                node = node[_list_index(node, part, path[:depth + 1], source)]
                continue
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set '{'.'.join(path)}': '{'.'.join(path[:depth])}' is not a mapping",
                                  source)
            if part not in node or not isinstance(node[part], (dict, list)):
                node[part] = {}
            node = node[part]
        last = path[-1]
        if isinstance(node, list):
            node[_list_index(node, last, path, source)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"cannot set '{'.'.join(path)}': its parent is not a mapping", source)
    return data


def _list_index(node, part, path, source):
    if not str(part).lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
        raise ConfigError(f"index {part} does not exist: the list has {len(node)} entries", source, ".".join(path))
    return int(part)


def split_task_overrides(overrides):
    """Split ``--set`` overrides into job-level ones and ``{task index: [(sub path, value)]}``.

    ``tasks.N.key=value`` applies to task N after its file is read, so it works for tasks named by file.
    """
    job_level, per_task = [], {}
    for text in overrides or ():
        path, value = parse_override(text)
        if path[0] == "tasks" and len(path) > 2 and path[1].isdigit():
            per_task.setdefault(int(path[1]), []).append((path[2:], value))
        else:
            job_level.append((path, value))
    return job_level, per_task


def set_keys(overrides):
    """The key paths (inside a task) that ``--set tasks.N.<path>=value`` overrides give."""
    return [".".join(map(str, path)) for path, _ in overrides or ()]


SET_MARK = " (with --set)"  # what a job's source says when --set changed it


def key_source(cfg: dict, key: str) -> str:
    """Who gave the loaded job ``cfg``'s key ``key`` (dotted) its value, for an error about it: ``--set`` when a
    ``--set`` gave it (or a mapping above it), else the job's own file (not "with --set": it did not give the key)."""
    if any(key == given or key.startswith(given + ".") for given in cfg.get("set_keys") or ()):
        return "--set"
    source = cfg.get("source") or "<config>"
    return source[:-len(SET_MARK)] if source.endswith(SET_MARK) else source


def blame_set(task: dict, exc: ConfigError) -> ConfigError:
    """``exc`` (raised for a key of the loaded ``task``) as the error of the ``--set tasks.N.<path>`` that gave the
    failing key, when one did and the task comes from a task file: that file never held the key, so the sentence
    names ``--set`` and the job's key path; other errors are returned as they are."""
    key = exc.key or ""
    if task.get("key"):  # an inline task: the job's own file is named already, "(with --set)"
        return exc
    inner = key
    for given in task.get("set_keys") or ():
        named = given.startswith(inner + ".") and f" {given.rsplit('.', 1)[-1]} " in f" {exc.bare_message} "
        if inner == given or inner.startswith(given + ".") or named:  # named: a plug-in's sentence about the key
            return ConfigError(f"{exc.bare_message} (a value given by --set, not by the task file)", "--set",
                               f"{task['set_prefix']}.{given if named else inner}")
    return exc
