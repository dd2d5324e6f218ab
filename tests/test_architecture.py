"""Structural rules of the code base, checked by reading the source (ast): the reshaped core must stay reshaped.

* Generic code never probes plug-ins: no ``getattr``/``hasattr`` whose object is a head, reader or backbone.
* The loop (every module of ``mtl/train``, ``mtl/optimizer``, ``mtl/store``) never talks to ``paddle.distributed``:
  the parallel strategy does; the trainer has no Partial FC code path; the step's modules name no feature (cross-head
  negatives, Partial FC): step hooks and declared rows carry them.
* No head counts steps. No module imports a package beside or above its floor (``LAYERS``).
* No function in ``mtl/`` or ``heads/`` reaches 45 lines, no module passes 400.
"""
import ast
import io
import pathlib
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGIN_WORDS = ("head", "reader", "backbone")
MAX_FUNCTION_LINES = 45
MAX_MODULE_LINES = 400


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


# what runs before the strategy exists: the memory plan agrees on the smallest free memory; the job assembles the
# model (synchronised BatchNorm when there are several processes, the plan printed by rank 0)
LOOP_EXCEPTIONS = {"memory_plan.py", "job.py"}
COLLECTIVE_WORDS = ("paddle.distributed", "all_reduce", "all_gather", "lowest_rank_text", "min_over_ranks",
                    "distributed.barrier", "distributed.agree", "broadcast")


def _code_only(text: str) -> str:
    """The source without comments and string literals (docstrings may name ``paddle.distributed.launch``)."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return "".join(t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.STRING))


LOOP_PACKAGES = ("train", "optimizer", "store")  # the loop, its optimizer and the run's files


def _loop_modules():
    return [p for package in LOOP_PACKAGES for p in sorted((ROOT / "mtl" / package).rglob("*.py"))
            if p.name not in LOOP_EXCEPTIONS]


def test_the_loop_communicates_only_through_the_parallel_strategy():
    """No module of mtl/train, mtl/optimizer or mtl/store (the loop, the optimizer, checkpoints, the run folder,
    averaging, ...) issues a collective or imports a process-group module: everything that involves other processes
    is the strategy's."""
    found = []
    for path in _loop_modules():
        text = path.read_text()
        code = _code_only(text)
        found += [f"{path.relative_to(ROOT)}: {w}" for w in COLLECTIVE_WORDS if w in code]
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("mtl.parallel", "paddle") and \
                    any(a.name == "distributed" for a in node.names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports distributed")
            if isinstance(node, ast.ImportFrom) and node.module in ("mtl.parallel.distributed",
                                                                     "mtl.parallel.collective"):
                names = [a.name for a in node.names if a.name != "shard_range"]  # the class split is arithmetic
                if names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {names}")
    assert not found, f"collectives outside the parallel strategy: {found}"


def test_loop_check_would_catch_a_collective(tmp_path):
    """The rule above is not vacuous: a planted barrier is flagged by its words."""
    planted = _code_only('"""paddle.distributed.launch"""\nfrom mtl.parallel import distributed\n'
                         'distributed.barrier()\n')
    assert [w for w in COLLECTIVE_WORDS if w in planted] == ["distributed.barrier"]


def test_trainer_has_no_partial_fc_branch():
    text = (ROOT / "mtl" / "train" / "trainer.py").read_text()
    for word in ("sample_ratio", "partial", "Partial"):
        assert word not in text, f"mtl/train/trainer.py mentions {word!r}"


# the loop and the weighting: what a step does, which sees heads' features only through declared rows and step hooks
STEP_MODULES = ("train/trainer.py", "train/step.py", "train/loop.py", "train/balancing.py", "train/state.py",
                "train/model.py", "optimizer/joint.py")  # not optimizer/sparse.py: the row-sparse update itself
FEATURE_WORDS = ("cross", "sample_ratio", "partial_fc", "row_sparse")


def _feature_words(code: str):
    """The feature words (any case) in ``code`` (comments and strings already removed)."""
    lowered = code.lower()
    return [w for w in FEATURE_WORDS if w in lowered]


def test_the_loop_and_the_weighting_have_no_feature_branch():
    """No code of the step's modules names cross-head negatives or Partial FC: the model's step hooks and the
    heads' row declarations carry them (docstrings may explain)."""
    found = [f"mtl/{name}: {_feature_words(_code_only((ROOT / 'mtl' / name).read_text()))}" for name in STEP_MODULES]
    found = [f for f in found if not f.endswith("[]")]
    assert not found, f"feature branches in the loop or the weighting: {found}"


def test_feature_branch_check_would_catch_one():
    planted = _code_only('"""cross-head negatives"""\nif self.model.cross_negatives is not None:\n    pass\n')
    assert _feature_words(planted) == ["cross"]


def _step_counters(tree):
    """``def set_step`` and ``self.<...step...> += ...`` in a module: a head counting steps itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "set_step":
            found.append(f"{node.lineno} def set_step")
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute) and \
                isinstance(node.target.value, ast.Name) and node.target.value.id == "self" and \
                "step" in node.target.attr:
            found.append(f"{node.lineno} self.{node.target.attr} +=")
    return found


def test_no_head_counts_its_own_steps():
    """The step comes in as an argument (``Head.uses_step``): no head keeps a step counter."""
    found = [f"{path.relative_to(ROOT)}:{where}" for path, tree in _sources("heads", "mtl/headkit")
             for where in _step_counters(tree)]
    assert not found, f"heads counting steps: {found}"


def test_step_counter_check_would_catch_one():
    planted = ast.parse("class H:\n    def set_step(self, s):\n        self.s = s\n"
                        "    def forward(self):\n        self.sample_step += 1\n")
    assert _step_counters(planted) == ["2 def set_step", "5 self.sample_step +="]


def _imports_of(tree, here=""):
    """``(line, module)`` of every import of ``tree``, the module ``here`` (dotted) being the one it is read from:
    ``from X import name`` gives ``X.name`` when that is a module of this checkout (``from mtl import train``), and a
    relative import is resolved against ``here``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.split(".")[:-node.level] if here else []
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").is_file() or \
                    (ROOT / sub.replace(".", "/") / "__init__.py").is_file()
                yield node.lineno, sub if is_module else base
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


# The floors of the house, lowest first (docs/architecture.md draws them). A module imports only its own package or
# a package of a lower floor: never one beside it, never one above.
LAYERS = (
    ("mtl.core",),
    ("mtl", "mtl.data", "mtl.pretrained", "mtl.weighting", "mtl.convert"),
    ("mtl.text", "mtl.parallel"),
    ("mtl.headkit", "mtl.readers", "mtl.backbones", "mtl.store"),
    ("mtl.architectures", "mtl.config", "mtl.writers"),
    ("mtl.evaluation", "mtl.serving", "mtl.optimizer"),
    ("mtl.train", "heads"),
    ("mtl.studies",),
    ("mtl.commands",),
    ("mtl.cli",),
)
FLOOR = {package: floor for floor, packages in enumerate(LAYERS) for package in packages}


def _package(module):
    """The listed package a dotted module belongs to (``mtl.headkit.base`` -> ``mtl.headkit``; ``mtl`` itself is
    the package's face, ``mtl/__init__.py``), or None."""
    parts = module.split(".")
    if module == "mtl":
        return "mtl"
    return next((".".join(parts[:n]) for n in range(len(parts), 1, -1) if ".".join(parts[:n]) in FLOOR),
                "heads" if parts[0] == "heads" else None)


def _wrong_way(package, tree, here=""):
    """The imports of one module (``here``) of ``package`` that reach a package beside or above its floor."""
    return [f"{line} {module}" for line, module in _imports_of(tree, here)
            if (to := _package(module)) is not None and to != package and FLOOR[to] >= FLOOR[package]]


def _module_of(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_every_package_of_mtl_has_a_floor():
    packages = {f"mtl.{p.name}" for p in (ROOT / "mtl").iterdir() if (p / "__init__.py").exists()} | \
        {f"mtl.{p.stem}" for p in (ROOT / "mtl").glob("*.py") if p.stem != "__init__"}
    assert packages - set(FLOOR) == set(), "a package of mtl/ that tests/test_architecture.py LAYERS does not place"


def test_no_import_runs_sideways_or_up_a_floor():
    """The heads' core and the head plug-ins sit below the loop (their row declarations are their own,
    :mod:`mtl.headkit.row_gradients`, never the optimizer's); the ground floor imports nothing above it; ..."""
    found = []
    for path, tree in _sources("mtl", "heads"):
        module = _module_of(path)
        found += [f"{path.relative_to(ROOT)}:{where}" for where in _wrong_way(_package(module), tree, module)]
    assert not found, f"imports against the floors: {found}"


@pytest.mark.parametrize("package, code, wrong", [
    ("mtl.headkit", "def f():\n    from mtl.optimizer.sparse import RowGradient\n", ["2 mtl.optimizer.sparse"]),
    ("heads", "from mtl.train.model import JointModel\n", ["1 mtl.train.model"]),
    ("mtl.core", "import mtl.data.loader\n", ["1 mtl.data.loader"]),
    ("mtl.readers", "from mtl.backbones.base import Backbone\n", ["1 mtl.backbones.base"]),  # beside it
    ("mtl.readers", "from mtl.text.words import x\nfrom mtl.readers.base import Reader\n", []),
    ("mtl.headkit", "from mtl import train\n", ["1 mtl.train"]),  # a package named after from
    ("mtl.headkit", "from ..train import model\n", ["1 mtl.train.model"]),  # relative
    ("mtl.headkit", "from .. import cli\n", ["1 mtl.cli"]),
    ("mtl.data", "from mtl import core\nfrom mtl.core import registry\n", []),
    ("mtl.core", "import mtl\n", ["1 mtl"]),  # the package's face is above the ground floor
])
def test_the_floor_check_catches_a_planted_import(package, code, wrong):
    assert _wrong_way(package, ast.parse(code), f"{package}.planted") == wrong


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


@pytest.mark.parametrize("folder", ["mtl", "heads"])
def test_modules_are_short(folder):
    """A module past 400 lines is probably two concepts (the coding habits): split it where it is."""
    long = [f"{path.relative_to(ROOT)} ({n} lines)" for path in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


# ---- the test suite: one package, imported one way; no test module imports another --------------------------
TESTS = ROOT / "tests"


def _test_suite_imports(tree):
    """Every module name an ``import`` / ``from ... import`` of ``tree`` names (absolute imports only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node.lineno, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, [node.module] + [f"{node.module}.{a.name}" for a in node.names]


def _import_problems(path, tree):
    """Imports of a test module (``test_*``, as ``tests.test_x`` or bare) and bare imports of the suite's own
    modules (``step_util`` instead of ``tests.step_util``)."""
    own = {p.stem for p in TESTS.glob("*.py")} | {p.name for p in TESTS.iterdir() if p.is_dir()}
    found = []
    for line, names in _test_suite_imports(tree):
        for name in names:  # one finding per import statement
            parts = name.split(".")
            if any(part.startswith("test_") for part in parts[:2]) and parts[0] in ("tests", *own):
                found.append(f"{path.relative_to(ROOT)}:{line} imports the test module {name}")
                break
            if parts[0] in own and parts[0] != "tests":
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name} (import it as tests.{name})")
                break
    return found


def test_no_test_module_is_imported_and_the_suite_is_imported_one_way():
    """What several test modules share lives in tests/references/ (or a helper module); test modules import it as
    ``tests.x``, never as a top-level module, and never import each other."""
    found = []
    for folder in ("tests", "bench", "tools"):
        for path, tree in _sources(folder):
            found += _import_problems(path, tree)
    assert not found, f"{found}"


def test_import_check_would_catch_a_test_module_and_a_bare_import():
    """The rule above is not vacuous: both planted imports are flagged."""
    tree = ast.parse("from test_margin_heads import np_psi\nfrom shared_runs import train_here\n"
                     "import tests.test_export\nfrom tests.references.margin import np_psi\n")
    found = _import_problems(TESTS / "test_planted.py", tree)
    assert len(found) == 3 and "test_margin_heads" in found[0] and "tests.shared_runs" in found[1], found
