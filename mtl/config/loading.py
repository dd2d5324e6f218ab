"""Job and task configuration: a job config, its tasks and plug-ins loaded (its YAML files:
:mod:`mtl.config.yaml_files`), validated at load time.

Every error is caught at load time, before any training, as one ConfigError naming the file and the dotted key path
(the checks across keys: :mod:`mtl.config.checks`; ``--set``: :mod:`mtl.config.overrides`).
"""
import copy
import os

from mtl.config.checks import check_job
from mtl.config.keys import JOB, TASK
from mtl.config.overrides import SET_MARK, apply_overrides, blame_set, set_keys, split_task_overrides
from mtl.config.paths import BACKBONE_PATH_KEYS, REPO_ROOT, resolve_path, resolve_reader_paths
from mtl.config.schema import validate
from mtl.config.yaml_files import name_the_base, read_job_yaml, read_yaml, record_set, replace_alternatives
from mtl.core import registry
from mtl.core.errors import ConfigError, absent


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
