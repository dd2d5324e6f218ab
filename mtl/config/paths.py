"""Where configs' relative paths point: the config or task file's folder when the path exists there, else the
working directory."""
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


PATH_KEYS = ("path", "root", "list", "eval_path", "target_list", "mnist_dir")
BACKBONE_PATH_KEYS = ("tokenizer", "weights", "model_config")


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
