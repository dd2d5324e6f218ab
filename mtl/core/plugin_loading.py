"""Finding plug-in files: the built-in readers, backbones, weighting strategies, architectures and the ``heads/``
folder, any folder of ``.py`` files (``tasks/``, a job's ``plugins:``), and the entry-point group ``mtl.plugins``.

Importing a plug-in file is what registers it (its decorators call :func:`mtl.core.registry.register`); this module only
imports, and never imports the registry. :mod:`mtl.core.registry` re-exports every function here.
"""
import importlib
import importlib.util
import os
import re
import sys
from importlib import metadata

from mtl.core.errors import ConfigError, MtlError, PluginError

ENTRY_POINT_GROUP = "mtl.plugins"
_LOADED_FOLDERS = set()
_ENTRY_POINTS_LOADED = False


def builtin_heads_folder() -> str:
    """The folder of the built-in head plug-ins: ``heads/`` of the checkout, or where an installed wheel put it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mtl/core/ -> the checkout
    checkout = os.path.join(root, "heads")
    return checkout if os.path.isdir(checkout) else os.path.join(sys.prefix, "share", "mtl", "heads")


def load_builtin():
    """Import the library's own readers, backbones and weighting strategies, and load the head plug-in folder
    ``heads/`` (by path, like ``tasks/``: it is a folder of plug-in files, not an installed package)."""
    import pkgutil

    for package in ("mtl.readers", "mtl.backbones", "mtl.weighting", "mtl.architectures"):
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{package}.{info.name}")
    load_folder(builtin_heads_folder())


def load_folder(folder: str, source: str = None, key: str = "plugins"):
    """Import every ``.py`` file of ``folder`` (not recursively) so that its decorators register."""
    folder = os.path.abspath(folder)
    if folder in _LOADED_FOLDERS:
        return
    if not os.path.isdir(folder):
        raise ConfigError(f"plug-in folder '{folder}' does not exist", source, key)
    _LOADED_FOLDERS.add(folder)
    for fname in sorted(os.listdir(folder)):
        if fname.endswith(".py") and not fname.startswith("_"):
            load_file(os.path.join(folder, fname))


def load_file(path: str):
    """Import one plug-in file by path under a unique module name; return the module."""
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    modname = "mtl_plugin_" + str(abs(hash(path)))[:10] + "_" + stem
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except MtlError:  # a plug-in may check its own settings when imported
        del sys.modules[modname]
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - anything else is a bug in the plug-in file (sys.exit(0)
        del sys.modules[modname]             # in one ended `mtl train` with status 0 and nothing trained)
        raise import_error(path, exc) from None
    return module


# Modules that moved when the package was cut into floors (issue 56, docs/architecture.md): a plug-in file written
# before imports the old name; its import error names the new one.
MOVED_MODULES = {
    **{f"mtl.{name}": f"mtl.core.{name}" for name in (
        "registry", "contracts", "errors", "arrays", "activity", "charts", "console", "generated_pages",
        "low_precision", "plugin_loading", "progress", "runtime", "safe_pickle", "staging", "union_find", "utf8")},
    "mtl.heads": "mtl.headkit", "mtl.job": "mtl.train.job",
    "mtl.train.optim": "mtl.optimizer.joint", "mtl.train.sparse": "mtl.optimizer.sparse",
    **{f"mtl.{name}": f"mtl.serving.{name}" for name in ("export", "inference", "prediction", "prediction_text")},
    **{f"mtl.train.{name}": f"mtl.store.{name}" for name in (
        "checkpoint", "integrity", "layout", "reshard", "run_lock", "rundir")},
    "mtl.commands.pack": "mtl.writers.pack", "mtl.commands.merge_write": "mtl.writers.merge_write",
    "mtl.commands.evaluate_people": "mtl.studies.all_people",
}


# names that left a module that still exists, or that did not follow their module where it moved:
# {old module: {name: the module that holds it now}}
MOVED_NAMES = {
    "mtl.train.sparse": {"RowGradient": "mtl.headkit.row_gradients", "merge_rows": "mtl.headkit.row_gradients"},
    "mtl.optimizer.sparse": {"RowGradient": "mtl.headkit.row_gradients"},
    "mtl.config.loading": {name: "mtl.config.yaml_files" for name in (
        "duplicate_key", "load_yaml_text", "record_origins")},
    "mtl.core.safe_pickle": {"looks_like_safetensors": "mtl.core.file_kinds"},
}


def moved_module(name: str):
    """Where the module ``name`` is now when it moved (:data:`MOVED_MODULES`, also for a module inside a moved
    package: ``mtl.heads.base`` -> ``mtl.headkit.base``); None when it did not."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        new = MOVED_MODULES.get(".".join(parts[:n]))
        if new:
            return ".".join([new, *parts[n:]])
    return None


def _unimportable_name(exc: BaseException):
    """``X`` of an ImportError "cannot import name 'X' from 'MODULE'" (not a ModuleNotFoundError); else None."""
    if isinstance(exc, ModuleNotFoundError) or not isinstance(exc, ImportError) or not exc.name:
        return None
    found = re.match(r"cannot import name '(\w+)'", str(exc))
    return found.group(1) if found else None


def _missing_module(exc: BaseException):
    """The module an import error could not find: ``mtl.registry`` from ``import mtl.registry`` (ModuleNotFoundError)
    and from ``from mtl import registry`` (ImportError: cannot import name 'registry' from 'mtl'); else None."""
    if isinstance(exc, ModuleNotFoundError):
        return exc.name
    name = _unimportable_name(exc)
    return f"{exc.name}.{name}" if name else None


def _import_from(path: str, line: int):
    """The ``from MODULE import ...`` statement of the Python file ``path`` that spans line ``line``; None."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and \
                node.lineno <= line <= (node.end_lineno or node.lineno):
            return node
    return None


def moved_names(exc: ImportError, path: str, line: int):
    """``(MODULE, [(name, its module now)])`` when the import that failed with ``exc``, the ``from MODULE import
    ...`` at line ``line`` of ``path``, failed for a name that left its module (:data:`MOVED_NAMES`; the other names
    of the statement that moved with their module are listed too, :data:`MOVED_MODULES`); ``(None, [])`` for any
    other failure (a whole module that moved is said by :func:`import_error` as such)."""
    node = _import_from(path, line)
    if node is None:
        return None, []
    module = node.module
    if isinstance(exc, ModuleNotFoundError):  # the module (or a package above it) is gone: every name it imports
        if not exc.name or not (module == exc.name or module.startswith(exc.name + ".")):
            return None, []
        names = [alias.name for alias in node.names]
    else:  # cannot import name 'X' from 'MODULE'
        name = _unimportable_name(exc)
        if not name or exc.name != module:
            return None, []
        names = [name]
    out, alone = [], False
    for name in names:
        now = MOVED_NAMES.get(module, {}).get(name) or MOVED_NAMES.get(moved_module(module) or "", {}).get(name)
        alone = alone or now is not None
        now = now or moved_module(module)
        if now:
            out.append((name, now))
    return (module, out) if alone else (None, [])


def import_error(path: str, exc: BaseException) -> PluginError:
    """The one-line report of a plug-in file that fails to import: its line and the error (a syntax error's text;
    for a module of mtl that moved, where it is now), the traceback kept in ``traceback_text``."""
    import traceback

    if isinstance(exc, SyntaxError):
        where, what = exc.lineno, f"{type(exc).__name__}: {exc.msg} ({(exc.text or '').strip()!r})"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == path]
        where, what = (frames[-1].lineno if frames else "?"), f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError):  # the deepest import statement the error came from, in this file or below
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            module, names = moved_names(exc, frame.filename, frame.lineno)
            if names:
                each = "; ".join(f"{name}, now in {now}" for name, now in names)
                at = f"line {frame.lineno}" if os.path.abspath(frame.filename) == path else \
                    f"line {where}, through '{frame.filename}' line {frame.lineno},"
                return PluginError(f"plug-in file '{path}' {at} imports from {module} {each} (mtl's modules moved "
                                   f"into layers: docs/architecture.md); change the import",
                                   "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    old = _missing_module(exc)
    now = moved_module(old) if old else None
    if now:
        return PluginError(f"plug-in file '{path}' line {where}: it imports {old}, which is now {now} (mtl's "
                           f"modules moved into layers: docs/architecture.md); change the import",
                           "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return PluginError(f"plug-in file '{path}' line {where}: {what} when it was imported; this is a bug in the "
                       f"file, not a mistake in the config",
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def load_entry_points():
    """Load plug-ins that installed packages declare in the entry-point group ``mtl.plugins``."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def load_all(extra_folders=(), source=None, key="plugins"):
    """Every plug-in: built-ins, entry points, then every folder of ``extra_folders`` (the one loading function)."""
    load_builtin()
    load_entry_points()
    for folder in extra_folders:
        load_folder(folder, source, key)
