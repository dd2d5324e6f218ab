"""A run's plug-in code, read back: the ``.py`` files of its plug-in folders and the Python task files its ``job.json``
names are code from elsewhere. They are imported only with ``trust_plugins`` (``--trust-plugins``), or when every
such file is one the project installs itself (its ``heads/`` and ``tasks/``)."""
import os
from typing import List

from mtl.core.errors import ConfigError


def installed_plugin_folders() -> List[str]:
    """The plug-in folders the project installs itself: its head plug-ins and its task files."""
    from mtl.config.paths import REPO_ROOT
    from mtl.core import registry

    return [os.path.abspath(registry.builtin_heads_folder()), os.path.abspath(os.path.join(REPO_ROOT, "tasks"))]


def plugin_files(cfg: dict) -> List[str]:
    """The ``.py`` files importing a run's ``job.json`` would run: every plug-in file of its ``plugin_folders`` and
    its Python task files, except the ones the project installs itself; sorted."""
    installed = installed_plugin_folders()
    found = set()
    for folder in cfg.get("plugin_folders") or []:
        if os.path.isdir(folder):
            found.update(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py") and
                         not n.startswith("_"))
    found.update(t["source"] for t in cfg.get("tasks", []) if str(t.get("source", "")).endswith(".py"))
    return sorted(os.path.abspath(f) for f in found
                  if not any(os.path.dirname(os.path.abspath(f)) == folder for folder in installed))


def import_plugins(cfg: dict, where: str, trust_plugins: bool):
    """Register what a finished run needs: the built-in plug-ins always; the run's own plug-in files only when
    trusted (else a ConfigError naming them)."""
    from mtl.core import registry

    registry.load_builtin()
    files = plugin_files(cfg)
    if files and not trust_plugins:
        raise ConfigError(f"'{where}' was trained with plug-in code ({', '.join(files)}); importing it runs that "
                          f"code: pass --trust-plugins if you trust these files")
    if files:
        registry.load_all(cfg.get("plugin_folders") or [])
        for task in cfg.get("tasks", []):
            if str(task.get("source", "")).endswith(".py"):
                registry.load_file(task["source"])


def add_trust_plugins(parser):
    """The ``--trust-plugins`` option of the commands that read a finished run (eval, export, overlap)."""
    parser.add_argument("--trust-plugins", action="store_true",
                        help="import the plug-in files the run's job.json names (their code runs); without it a run "
                             "trained with plug-ins of its own is refused, naming the files")
