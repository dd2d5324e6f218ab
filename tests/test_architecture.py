"""Structural rules of the code base, checked by reading the source (ast): the reshaped core must stay reshaped.

* Generic code never probes plug-ins: no ``getattr``/``hasattr`` whose object is a head, reader or backbone.
* The trainer never talks to ``paddle.distributed`` and has no Partial FC code path.
* No function in ``mtl/`` or ``heads/`` reaches 45 lines.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGIN_WORDS = ("head", "reader", "backbone")
MAX_FUNCTION_LINES = 45


def _sources(*folders):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(), filename=str(path))


def _names_in(node):
    return {n.id.lower() for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {n.attr.lower() for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def test_no_capability_probing_of_plugins():
    """``getattr(head, ...)`` / ``hasattr(reader, ...)`` in generic code: capabilities are declared instead."""
    found = []
    for path, tree in _sources("mtl"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr") and node.args:
                target = _names_in(node.args[0])
                if any(word in name for name in target for word in PLUGIN_WORDS):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"plug-ins probed with getattr/hasattr at {found}; declare a capability on the base class"


def test_probe_check_would_catch_a_probe(tmp_path):
    """The rule above is not vacuous: it flags a planted probe."""
    tree = ast.parse("def f(task):\n    return getattr(task.head, 'sharded', False)\n")
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert any(word in name for name in _names_in(call.args[0]) for word in PLUGIN_WORDS)


def test_trainer_has_no_collectives_and_no_partial_fc_branch():
    text = (ROOT / "mtl" / "train" / "trainer.py").read_text()
    for word in ("paddle.distributed", "import distributed", "sample_ratio", "partial", "Partial",
                 "all_reduce", "all_gather"):
        assert word not in text, f"mtl/train/trainer.py mentions {word!r}"


@pytest.mark.parametrize("folder", ["mtl", "heads"])
def test_functions_are_short(folder):
    long = []
    for path, tree in _sources(folder):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions of {MAX_FUNCTION_LINES}+ lines: {long}"
