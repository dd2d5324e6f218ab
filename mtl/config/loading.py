"""Job and task configuration: YAML loading (a job config, its base, its tasks), validation at load time.

Every error is caught at load time, before any training, as one ConfigError naming the file and the dotted key path
(the checks across keys: :mod:`mtl.config.checks`; ``--set``: :mod:`mtl.config.overrides`).
"""
import copy
import os

import yaml

from mtl.config.checks import check_job
from mtl.config.keys import ALTERNATIVES, JOB, TASK
from mtl.config.overrides import SET_MARK, apply_overrides, blame_set, set_keys, split_task_overrides
from mtl.config.paths import BACKBONE_PATH_KEYS, REPO_ROOT, resolve_path, resolve_reader_paths
from mtl.config.schema import validate
from mtl.core import registry
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


def task_folders(job_dir, plugin_folders):
    """Folders searched for task names: the job's plug-in folders, ./tasks and the repository's tasks/."""
    folders = list(plugin_folders) + [os.path.join(os.getcwd(), "tasks"), os.path.join(REPO_ROOT, "tasks")]
    if job_dir:
        folders.insert(0, os.path.join(job_dir, "tasks"))
    seen, out = set(), []
    for f in folders:
        f = os.path.abspath(f)
        if f not in seen and os.path.isdir(f):
            seen.add(f)
            out.append(f)
    return out


def find_task_file(ref: str, base_dir, folders):
    """Resolve a task reference: a file path; else a name, looked up in the task folders (in order) as the file
    NAME.yaml/.yml/.py, else as the ``name`` that a Python task file's ``TASK`` declares.

    Two Python files declaring the same name is a ConfigError naming both. None when nothing matches.
    """
    path = resolve_path(ref, base_dir)
    if os.path.isfile(path):
        return path
    if os.path.splitext(ref)[1]:
        return None
    for folder in folders:
        for ext in (".yaml", ".yml", ".py"):
            candidate = os.path.join(folder, ref + ext)
            if os.path.isfile(candidate):
                return candidate
    declaring = [p for p in _python_task_files(folders) if _python_task(p).get("name") == ref]
    if len(declaring) > 1:
        raise ConfigError(f"task name '{ref}' is declared by more than one Python task file: "
                          f"{', '.join(declaring)}; rename one (TASK['name']) or name the file by its path")
    return declaring[0] if declaring else None


def _python_task_files(folders):
    """The plug-in ``.py`` files of the task folders (as ``registry.load_folder`` imports them), sorted per folder."""
    return [os.path.join(folder, f) for folder in folders for f in sorted(os.listdir(folder))
            if f.endswith(".py") and not f.startswith("_")]


def _python_task(path) -> dict:
    """The ``TASK`` mapping of a Python task file (called if it is a function); ``{}`` when it defines none."""
    data = getattr(registry.load_file(path), "TASK", None)
    if callable(data):
        data = data()
    if not isinstance(data, dict):
        return {}
    return data


def load_task(ref, base_dir, folders, source, key, overrides=()):
    """Load one task: a YAML file, a Python file defining ``TASK`` (a dict), or an inline mapping; validate it."""
    if isinstance(ref, dict):
        data, task_source = ref, source
        task_key = key
    elif isinstance(ref, str):
        path = find_task_file(ref, base_dir, folders)
        if path is None:
            searched = ", ".join(folders) or "no task folders"
            tried = [os.path.abspath(os.path.join(d, ref)) for d in (base_dir, os.getcwd()) if d and not
                     os.path.isabs(ref)] or [ref]
            raise ConfigError(f"task '{ref}' does not exist: no file {' or '.join(dict.fromkeys(tried))}, "
                              f"and no task of that name (file NAME.yaml/.yml/.py, or a Python file whose TASK "
                              f"declares that name) in {searched}", source, key)
        if path.endswith(".py"):
            data = _python_task(path) or None
            if not isinstance(data, dict):
                raise ConfigError("a Python task file must define TASK, a mapping (or a function returning one)",
                                  path, "TASK")
        else:
            data = read_yaml(path, "task")
        task_source, task_key = path, ""
    else:
        raise ConfigError(f"expected a task file path or a mapping, got {ref!r}", source, key)
    label = task_source
    if overrides:
        label = f"{task_source} (with --set {key}.*)" if task_source != source else task_source
        data = apply_overrides(data, overrides, label)
    try:
        task = validate(TASK, data, label, task_key)
    except ConfigError as exc:
        raise blame_set({"key": task_key, "set_prefix": key, "set_keys": set_keys(overrides)}, exc) from None
    task["source"] = task_source
    task["key"] = task_key
    task["set_prefix"], task["set_keys"] = key, set_keys(overrides)  # what --set tasks.N.* changed in this task
    if task["eval"] is None:
        task["eval"] = {"enabled": False, "reader": {"split": "eval"}, "max_samples": None, "sets": [], "split": True}
    _normalise_components(task, base_dir)
    base = os.path.dirname(os.path.abspath(task_source)) if os.path.isfile(str(task_source)) else base_dir
    task["eval"]["sets"] = [_verification_set(entry, base, task_source, f"{task_key + '.' if task_key else ''}"
                                                                        f"eval.sets.{i}")
                            for i, entry in enumerate(task["eval"]["sets"])]
    return task


def _normalise_components(task, base_dir=None):
    """Reader and head become ``{type: ...}`` dicts; the reader's data paths (and those of its evaluation
    overrides) and the head's ``same_person.pairs`` file are resolved against the task file (an inline task's:
    ``base_dir``, its job config's folder), once, here."""
    task["reader"] = resolve_reader_paths(registry.as_component(task["reader"]), task["source"], base_dir)
    task["head"] = registry.as_component(task["head"])
    same = task["head"].get("same_person")
    if isinstance(same, dict) and isinstance(same.get("pairs"), str) and os.path.isfile(str(task["source"])):
        same = dict(same, pairs=resolve_path(same["pairs"], os.path.dirname(os.path.abspath(task["source"]))))
        task["head"]["same_person"] = same  # a pairs file is taken relative to the task file, as data paths are
    if task["eval"]["reader"]:
        task["eval"]["reader"] = resolve_reader_paths(dict(task["eval"]["reader"]), task["source"], base_dir)


def _verification_set(entry, base_dir, source, key):
    """Normalise one ``eval.sets`` entry to ``{path, root, name}`` with an existing file."""
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict) or "path" not in entry:
        raise ConfigError("expected a path or a mapping with 'path' (and optional 'root', 'name')", source, key)
    unknown = set(entry) - {"path", "root", "name"}
    if unknown:
        raise ConfigError(f"unknown key '{sorted(unknown)[0]}'; allowed: path, root, name", source, key)
    path = resolve_path(str(entry["path"]), base_dir)
    if not os.path.isfile(path):
        raise ConfigError(f"verification set '{entry['path']}' {absent(path)}", source, key + ".path")
    root = entry.get("root")
    if root is not None:
        root = resolve_path(str(root), base_dir)
        if not os.path.isdir(root):
            raise ConfigError(f"image root '{entry['root']}' does not exist", source, key + ".root")
    name = entry.get("name") or os.path.splitext(os.path.basename(path))[0]
    return {"path": path, "root": root, "name": str(name)}


def _plugin_folders(job, base_dir, source):
    """The job's ``plugins`` folders, resolved and checked."""
    folders = []
    for i, folder in enumerate(job["plugins"]):
        if not isinstance(folder, str):
            raise ConfigError(f"expected a folder path, got {folder!r}", source, f"plugins.{i}")
        resolved = resolve_path(folder, base_dir)
        if not os.path.isdir(resolved):
            raise ConfigError(f"plug-in folder '{folder}' does not exist (looked for '{os.path.abspath(resolved)}')",
                              source, f"plugins.{i}")
        folders.append(resolved)
    return folders


def _load_tasks(job, base_dir, folders, source, task_overrides):
    """Every task of the job, loaded and validated, with unique names."""
    if not job["tasks"]:
        raise ConfigError("the job needs at least one task", source, "tasks")
    for index in task_overrides:
        if index >= len(job["tasks"]):
            raise ConfigError(f"--set names task {index}, but the job lists {len(job['tasks'])} tasks (0-based)",
                              source, f"tasks.{index}")
    tasks = [load_task(ref, base_dir, folders, source, f"tasks.{i}", task_overrides.get(i, ()))
             for i, ref in enumerate(job["tasks"])]
    names = [t["name"] for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"task name '{dupes[0]}' is used by more than one task", source, "tasks")
    return tasks


def load_job(path=None, overrides=(), data=None):
    """Load, override and validate a job config; load plug-ins and tasks; return the validated dict.

    ``data`` may be given instead of ``path`` (a raw mapping, e.g. from tests). The result has ``tasks`` replaced by
    validated task dicts (each with ``source``), plus ``config_path``, ``config_dir`` and ``set_keys`` (the key paths
    ``--set`` gave).
    """
    source, origins = path or "<config>", {}
    raw = read_job_yaml(path, origins=origins) if path is not None else copy.deepcopy(data or {})
    job_overrides, task_overrides = split_task_overrides(overrides)
    for key, value in job_overrides:  # in order: a later --set giving steps replaces an earlier one's epochs
        raw = apply_overrides(raw, [(key, value)], source)
        raw = replace_alternatives(raw, [key] if value is not None else [])
        record_set(key, origins)
    for index, task_sets in task_overrides.items():
        for key, _ in task_sets:
            record_set(("tasks", index, *key), origins)
    if overrides:
        source = f"{source}{SET_MARK}" if path else source
    try:
        job = _validated_job(raw, path, source, task_overrides)
    except ConfigError as exc:
        told = name_the_base(exc, origins, path) if exc.source == source else exc  # a task file's names its file
        if told is exc:
            raise
        raise told from None
    job["set_keys"] = set_keys(job_overrides)  # what --set gave, for errors found later (overrides.key_source)
    return job


def _validated_job(raw, path, source, task_overrides):
    """The raw job mapping ``raw`` validated, its plug-ins and tasks loaded (:func:`load_job`)."""
    job = validate(JOB, raw, source)
    base_dir = os.path.dirname(os.path.abspath(path)) if path else None
    plugin_folders = _plugin_folders(job, base_dir, source)
    folders = task_folders(base_dir, plugin_folders)
    registry.load_all(plugin_folders + [f for f in folders if f not in plugin_folders], source, "plugins")
    tasks = _load_tasks(job, base_dir, folders, source, task_overrides)
    job["backbone"] = registry.as_component(job["backbone"])
    for key in BACKBONE_PATH_KEYS:  # a text encoder's files, taken relative to the job config when they are there
        if isinstance(job["backbone"].get(key), str):
            job["backbone"][key] = resolve_path(job["backbone"][key], base_dir)
    job["backbone"] = _pretrained(job["backbone"], base_dir, source)
    job["weighting"] = registry.as_component(job["weighting"])
    job["architecture"] = registry.as_component(job["architecture"])
    check_job(job, tasks, base_dir, source)
    job.update(tasks=tasks, config_path=os.path.abspath(path) if path else None, config_dir=base_dir,
               source=source, plugin_folders=plugin_folders)
    return job


def _pretrained(backbone, base_dir, source):
    """``backbone.pretrained`` taken relative to the job config when it is a path there, and a pretrained model or
    checkpoint folder turned into the backbone's own keys (:func:`mtl.pretrained.cache.expand_backbone`: a model
    missing from the cache is said here, before anything is built)."""
    from mtl.pretrained.cache import expand_backbone
    from mtl.pretrained.catalogue import CATALOGUE

    value = backbone.get("pretrained")
    if isinstance(value, str) and value not in CATALOGUE:
        backbone["pretrained"] = resolve_path(value, base_dir)
    return expand_backbone(backbone, source)[0]
