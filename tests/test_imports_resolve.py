"""Every import of ``mtl`` anywhere in the checkout names a module that exists and a name that module defines.

Read from the source (no import is run), so that a module moved or a name renamed shows here at once, also in the
scripts no test runs (``bench/``, ``tools/``, ``examples/``) and in imports inside functions, which only run when
their branch does.
"""
import ast
import functools
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("mtl", "heads", "tasks", "bench", "tools", "examples", "tests")


def module_file(module):
    """The file of a dotted ``mtl`` module in this checkout, or None."""
    base = os.path.join(ROOT, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=None)
def defined_names(path):
    """Names bound at the top level of a module (defs, classes, assignments, imports, also under ``if``/``try``)."""
    names, todo = set(), list(ast.parse(open(path, encoding="utf-8").read()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def unresolved(path):
    """The ``mtl`` imports of one file that name no module or no name of it, as ``line: import`` strings."""
    bad = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in targets:
            if module != "mtl" and not module.startswith("mtl."):
                continue
            where = module_file(module)
            if where is None:
                bad.append(f"{node.lineno}: {module}")
            elif name and name != "*" and module_file(f"{module}.{name}") is None \
                    and name not in defined_names(where):
                bad.append(f"{node.lineno}: from {module} import {name}")
    return bad


def source_files():
    """Every Python file of the checkout's code folders."""
    for folder in FOLDERS:
        for base, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
            yield from (os.path.join(base, f) for f in sorted(files) if f.endswith(".py"))


def test_every_mtl_import_resolves():
    bad = {os.path.relpath(p, ROOT): u for p in source_files() if (u := unresolved(p))}
    assert not bad, f"imports of modules or names that do not exist: {bad}"


def test_a_planted_stale_import_is_found(tmp_path):
    planted = tmp_path / "stale.py"
    planted.write_text("def f():\n    from mtl import recordio_gone\n    from mtl.core.arrays import no_such_name\n"
                       "    from mtl.core.arrays import to_numpy\n")
    assert unresolved(str(planted)) == ["2: from mtl import recordio_gone",
                                        "3: from mtl.core.arrays import no_such_name"]


@pytest.mark.parametrize("module", ["mtl.core.arrays", "mtl.train"])
def test_module_file_finds_modules_and_packages(module):
    assert module_file(module) is not None
