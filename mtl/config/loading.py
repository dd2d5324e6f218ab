"""Job and task configuration: YAML loading, ``--set key.path=value`` overrides, validation at load time.

Every error is caught here, before any training, as one ConfigError naming the file and the dotted key path.
"""
import copy
import os

import yaml

from mtl import registry
from mtl.config.keys import BACKBONE, JOB, TASK, resolve_milestones
from mtl.config.schema import validate
from mtl.errors import ConfigError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def read_yaml(path: str, what: str = "config"):
    """Read a YAML mapping, with a one-line error for a missing or malformed file."""
    if not os.path.isfile(path):
        raise ConfigError(f"{what} file does not exist", path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"is not valid YAML{where}: {getattr(exc, 'problem', exc)}", path) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", path)
    return data


def read_job_yaml(path: str, seen=()):
    """A job config's raw mapping; ``base: OTHER.yaml`` (relative to this file) starts from another job config.

    The variant's keys are merged over the base's (mappings key by key, anything else replaced whole), so a variant
    states only what differs. The base's task files and plug-in folders are taken relative to the base's folder."""
    raw = read_yaml(path, "job config")
    if "base" not in raw:
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
    base = read_job_yaml(base_path, (*seen, os.path.abspath(path)))
    base_dir = os.path.dirname(os.path.abspath(base_path))
    for key in ("tasks", "plugins"):
        if isinstance(base.get(key), list):
            base[key] = [resolve_path(v, base_dir) if isinstance(v, str) and os.path.exists(os.path.join(base_dir, v))
                         else v for v in base[key]]
    return _merged(base, raw)


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


def resolve_path(path, base_dir, suffixes=("",)):
    """A path relative to ``base_dir`` (the config or task file's folder) if it exists there (with one of
    ``suffixes``), else relative to the working directory. The one path resolution of configs."""
    if os.path.isabs(path):
        return path
    if base_dir:
        candidate = os.path.join(base_dir, path)
        if any(os.path.exists(candidate + s) for s in suffixes):
            return os.path.normpath(candidate)
    return os.path.normpath(path)


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
        raise blame_set({"key": task_key, "set_prefix": key, "set_keys": _set_keys(overrides)}, exc) from None
    task["source"] = task_source
    task["key"] = task_key
    task["set_prefix"], task["set_keys"] = key, _set_keys(overrides)  # what --set tasks.N.* changed in this task
    if task["eval"] is None:
        task["eval"] = {"enabled": False, "reader": {"split": "eval"}, "max_samples": None, "sets": [], "split": True}
    _normalise_components(task, base_dir)
    base = os.path.dirname(os.path.abspath(task_source)) if os.path.isfile(str(task_source)) else base_dir
    task["eval"]["sets"] = [_verification_set(entry, base, task_source, f"{task_key + '.' if task_key else ''}"
                                                                        f"eval.sets.{i}")
                            for i, entry in enumerate(task["eval"]["sets"])]
    return task


def _set_keys(overrides):
    """The key paths (inside a task) that ``--set tasks.N.<path>=value`` overrides give."""
    return [".".join(map(str, path)) for path, _ in overrides or ()]


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


PATH_KEYS = ("path", "root", "list", "eval_path", "target_list", "mnist_dir")
BACKBONE_PATH_KEYS = ("tokenizer", "weights")


def resolve_reader_paths(cfg, task_source, base_dir=None):
    """Relative data paths of a reader config (``path``, ``root``, ``list``, ``eval_path``, ``target_list``,
    ``mnist_dir``, and those of the sources of a ``concat`` reader's ``readers`` and of a ``masked_lm`` reader's
    ``source``) are taken relative to the task file's folder (``base_dir`` for a task written inline in a job config
    whose source label is not a file, e.g. with ``--set``) when they exist there, else left as they are (relative to
    the working directory)."""
    if task_source and os.path.isfile(str(task_source)):
        base_dir = os.path.dirname(os.path.abspath(task_source))
    if not base_dir:
        return cfg
    base = base_dir
    for key in PATH_KEYS:
        if isinstance(cfg.get(key), str):
            cfg[key] = resolve_path(cfg[key], base, suffixes=("", ".rec"))  # a RecordIO prefix names train.rec
    if isinstance(cfg.get("source"), dict):  # a reader over another reader (masked_lm)
        cfg["source"] = resolve_reader_paths(dict(cfg["source"]), None, base)
    if isinstance(cfg.get("readers"), list):
        cfg["readers"] = [resolve_reader_paths(dict(r), None, base) if isinstance(r, dict) else r
                          for r in cfg["readers"]]
    return cfg


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
        raise ConfigError(f"verification set '{entry['path']}' does not exist", source, key + ".path")
    root = entry.get("root")
    if root is not None:
        root = resolve_path(str(root), base_dir)
        if not os.path.isdir(root):
            raise ConfigError(f"image root '{entry['root']}' does not exist", source, key + ".root")
    name = entry.get("name") or os.path.splitext(os.path.basename(path))[0]
    return {"path": path, "root": root, "name": str(name)}


def _check_component(kind, cfg, source, key):
    registry.split_cfg(kind, cfg, source, key)


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


def _check_components(job, tasks, source):
    """Every component (the architecture too) names a registered plug-in with parameters it accepts; the weighting
    fits the schedule."""
    from mtl.backbones.base import JOB_KEYS, constructor_config

    validate(BACKBONE, {k: v for k, v in job["backbone"].items() if k in JOB_KEYS}, source, "backbone")
    _check_component("backbone", constructor_config(job["backbone"]), source, "backbone")
    for t in tasks:
        prefix = f"{t['key']}." if t["key"] else ""
        for kind in ("reader", "head"):
            try:
                _check_component(kind, t[kind], t["source"], prefix + kind)
            except ConfigError as exc:
                raise blame_set(t, exc) from None
    _check_component("architecture", job["architecture"], source, "architecture")
    entry, _ = registry.split_cfg("weighting", job["weighting"], source, "weighting")
    # built once here (plain numpy, cheap) so that a bad hyper-parameter value fails at load time too
    registry.build("weighting", job["weighting"], source, "weighting", tasks=[t["name"] for t in tasks],
                   loss_weights=[t["loss_weight"] for t in tasks], seed=job["seed"])
    if job["schedule"]["mode"] == "sample" and not entry.cls.sample_mode:
        per_task = ", ".join(e.name for e in registry.entries("weighting") if e.cls.sample_mode)
        raise ConfigError(f"weighting '{entry.name}' needs every task in every step and cannot run with "
                          f"schedule.mode: sample (one task per step); use schedule.mode: joint, or a weighting that "
                          f"works per task ({per_task})", source, "weighting.type")
    if job["schedule"]["mode"] == "joint" and job["schedule"]["batch_size"] < len(tasks):
        raise ConfigError(
            f"joint mode needs at least one sample per task: batch_size {job['schedule']['batch_size']} "
            f"< {len(tasks)} tasks", source, "schedule.batch_size")
    if job["schedule"]["same_rows"]:
        _check_same_rows(job, tasks, source)


def _check_same_rows(job, tasks, source):
    """``schedule.same_rows``: joint mode, and the same sub-batch for every task (the training splits' sizes are
    checked when the readers are built, :func:`mtl.data.scheduler.build_schedule`)."""
    from mtl.data.scheduler import JointSchedule

    schedule = job["schedule"]
    if schedule["mode"] != "joint":
        raise ConfigError("every task reads the same samples in each step: this needs schedule.mode: "
                          "joint (sample mode has one task a step)", source, "schedule.same_rows")
    ratios = [t["ratio"] for t in tasks]
    try:
        JointSchedule([t["name"] for t in tasks], ratios, schedule["batch_size"], job["seed"], same_rows=True)
    except ValueError as exc:
        hint = (f"make schedule.batch_size a multiple of the {len(tasks)} tasks" if len(set(ratios)) == 1 else
                "give every task the same ratio")
        raise ConfigError(f"{exc}: {hint}", source, "schedule.same_rows") from None
    weighting = registry.build("weighting", job["weighting"], source, "weighting", tasks=[t["name"] for t in tasks],
                               loss_weights=[t["loss_weight"] for t in tasks], seed=job["seed"])
    architecture = registry.get("architecture", job["architecture"]["type"]).cls
    if weighting.uses_representation and architecture.per_task_backbone:
        raise ConfigError(f"MGDA-UB pairs each input's gradients at the representation every task shares, and "
                          f"architecture '{job['architecture']['type']}' has task layers inside the backbone, so "
                          f"there is none: use representation: false, or an architecture that shares the backbone",
                          source, "weighting.representation")


def _check_cross_negatives(job, tasks, base_dir, source):
    """Cross-head negatives name tasks of the job whose heads can score other heads' classes, at least two; the
    pairs file of ``mask: pairs`` exists and reads as same-person pairs (its path resolved as data paths are)."""
    cross = job["cross_negatives"]
    if cross["rate"] <= 0:
        return
    names = [t["name"] for t in tasks]
    able = [t["name"] for t in tasks if registry.get("head", t["head"]["type"]).cls.cross_negatives]
    chosen = able if cross["tasks"] == "all" else cross["tasks"]
    for name in chosen:
        if name not in names:
            raise ConfigError(f"task '{name}' is not a task of this job ({', '.join(names)})", source,
                              "cross_negatives.tasks")
        if name not in able:
            head = next(t["head"]["type"] for t in tasks if t["name"] == name)
            raise ConfigError(f"task '{name}': head '{head}' cannot score other heads' classes as negatives (the "
                              f"margin heads can: arcface, cosface)", source, "cross_negatives.tasks")
    if len(chosen) < 2:
        raise ConfigError(f"cross-head negatives need at least two heads that can take part, the job has "
                          f"{len(chosen)} ({', '.join(chosen) or 'none'})", source, "cross_negatives.tasks")
    if cross["mask"] == "pairs":
        if not cross["pairs"]:
            raise ConfigError("mask: pairs needs the same-person JSON in cross_negatives.pairs", source,
                              "cross_negatives.pairs")
        from mtl.heads.cross_negatives import read_pairs

        cross["pairs"] = os.path.abspath(resolve_path(cross["pairs"], base_dir))
        read_pairs(cross["pairs"], source)


def _check_optimizer(job, source):
    """The learning-rate schedule fits the job: multistep names milestones that resolve to increasing steps."""
    opt = job["optimizer"]
    if opt["decay"] != "multistep":
        return
    if not opt["milestones"]:
        raise ConfigError("decay multistep needs milestones (steps, or fractions of schedule.steps)", source,
                          "optimizer.milestones")
    try:
        resolve_milestones(opt["milestones"], job["schedule"]["steps"])
    except ValueError as exc:
        raise ConfigError(str(exc), source, "optimizer.milestones") from None


def _check_accumulate(job, tasks, source):
    """``schedule.accumulate`` K: every task's sub-batch of a step splits into K equal micro-batches (the process
    count is checked again at start-up, :func:`mtl.data.steps.check_divisible`)."""
    from mtl.data.scheduler import JointSchedule, SampleSchedule
    from mtl.data.steps import check_divisible

    schedule, names = job["schedule"], [t["name"] for t in tasks]
    if schedule["accumulate"] == 1:
        return
    if schedule["mode"] == "joint":
        plan = JointSchedule(names, [t["ratio"] for t in tasks], schedule["batch_size"], job["seed"])
    else:
        plan = SampleSchedule(names, [1.0 / len(names)] * len(names), schedule["batch_size"], job["seed"])
    check_divisible(plan, 1, source, schedule["accumulate"])


def load_job(path=None, overrides=(), data=None):
    """Load, override and validate a job config; load plug-ins and tasks; return the validated dict.

    ``data`` may be given instead of ``path`` (a raw mapping, e.g. from tests). The result has ``tasks`` replaced by
    validated task dicts (each with ``source``), plus ``config_path`` and ``config_dir``.
    """
    source = path or "<config>"
    raw = read_job_yaml(path) if path is not None else copy.deepcopy(data or {})
    job_overrides, task_overrides = split_task_overrides(overrides)
    raw = apply_overrides(raw, job_overrides, source)
    if overrides:
        source = f"{source} (with --set)" if path else source
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
    job["weighting"] = registry.as_component(job["weighting"])
    job["architecture"] = registry.as_component(job["architecture"])
    _check_components(job, tasks, source)
    _check_cross_negatives(job, tasks, base_dir, source)
    _check_optimizer(job, source)
    _check_accumulate(job, tasks, source)
    job.update(tasks=tasks, config_path=os.path.abspath(path) if path else None, config_dir=base_dir,
               source=source, plugin_folders=plugin_folders)
    return job
