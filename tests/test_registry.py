"""Registry and plug-ins: decorators, discovery of plug-in folders and entry points, the `mtl plugins` table."""
import os
import sys

import pytest

import mtl
from mtl.core import registry
from mtl.core.errors import ConfigError
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_build_functions():
    reader = mtl.build_reader({"type": "synthetic", "num_samples": 5, "num_classes": 2})
    backbone = mtl.build_backbone({"type": "mlp", "embedding_size": 4})
    head = mtl.build_head({"type": "softmax", "num_classes": 2}, feature_size=4)
    assert len(reader) == 5 and backbone.feature_size == 4 and head.feature_size == 4


@pytest.mark.subprocess
def test_the_registry_finds_a_builtin_head_in_a_fresh_interpreter():
    """``registry.build`` straight after ``from mtl.core import registry`` (no job, no plug-in loading first): the
    built-ins are loaded on the first name it does not know (a new interpreter: the warm one has them loaded)."""
    import subprocess

    code = ("from mtl.core import registry\n"
            "head = registry.build('head', {'type': 'regression', 'feature_size': 3}, feature_size=3)\n"
            "print(type(head).__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0 and done.stdout.strip() == "RegressionHead", done.stdout + done.stderr[-2000:]


def test_unknown_name_and_parameter():
    with pytest.raises(ConfigError, match="did you mean 'softmax'"):
        mtl.build_head({"type": "sofmax"}, feature_size=4)
    with pytest.raises(ConfigError, match="has no parameter 'num_clases'.*did you mean 'num_classes'"):
        mtl.build_head({"type": "softmax", "num_clases": 3}, feature_size=4)


def test_plugin_folder_is_discovered(tmp_path):
    (tmp_path / "p1.py").write_text(
        "from mtl.core.registry import register_backbone\n"
        "from mtl.backbones.small import MLP\n"
        "@register_backbone('tiny_test_mlp')\n"
        "class Tiny(MLP):\n"
        "    '''A plug-in backbone for the registry test.'''\n")
    registry.load_folder(str(tmp_path))
    entry = registry.get("backbone", "tiny_test_mlp")
    assert entry.description == "A plug-in backbone for the registry test." and "p1.py" in entry.origin


def test_a_plugin_that_ends_the_process_when_imported_is_a_plugin_error(tmp_path):
    """sys.exit(0) in a plug-in file ended `mtl train` with status 0, no output and nothing trained (found by a
    fuzzing helper)."""
    from mtl.core.errors import PluginError

    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(PluginError, match=r"quits.py' line 2: SystemExit: 0 when it was imported; this is a bug"):
        registry.load_folder(str(tmp_path))


@pytest.mark.parametrize("line, old, new", [
    ("from mtl.registry import register_head", "mtl.registry", "mtl.core.registry"),
    ("from mtl.heads.base import Head", "mtl.heads", "mtl.headkit"),  # the package that moved
    ("import mtl.job", "mtl.job", "mtl.train.job"),
    ("from mtl import registry", "mtl.registry", "mtl.core.registry"),  # ImportError, not ModuleNotFoundError
])
def test_a_plugin_written_before_the_modules_moved_is_told_where_they_are(tmp_path, line, old, new):
    from mtl.core.errors import PluginError
    from mtl.core.plugin_loading import MOVED_MODULES, moved_module

    (tmp_path / "old.py").write_text(f"import os\n{line}\n")
    with pytest.raises(PluginError, match=rf"old.py' line 2: it imports {old}, which is now {new} .*change the import"):
        registry.load_folder(str(tmp_path))
    assert moved_module("mtl.heads.base") == "mtl.headkit.base"  # inside a moved package
    assert moved_module("mtl.core.registry") is None and moved_module("mtl") is None
    for now in MOVED_MODULES.values():  # every new name is a module of this checkout
        __import__(now)


@pytest.mark.parametrize("line, told", [
    # RowGradient left the training layer for the heads' core, not for the optimizer its module moved to
    ("from mtl.train.sparse import RowGradient, row_sparse_momentum_",
     "line 2 imports from mtl.train.sparse RowGradient, now in mtl.headkit.row_gradients; row_sparse_momentum_, now "
     "in mtl.optimizer.sparse"),
    ("from mtl.optimizer.sparse import (\n    RowGradient,\n)", "line 2 imports from mtl.optimizer.sparse "
     "RowGradient, now in mtl.headkit.row_gradients"),  # over several lines
    ("from mtl.config.loading import load_job, \\\n    load_yaml_text as read", "line 2 imports from "
     "mtl.config.loading load_yaml_text, now in mtl.config.yaml_files"),  # only the name that is gone
    ("import helper_of_mine", "line 2, through '{folder}/helper_of_mine.py' line 1, imports from mtl.train.sparse "
     "RowGradient, now in mtl.headkit.row_gradients"),  # in a module the plug-in imports
])
def test_a_plugin_importing_a_name_that_left_its_module_is_told_where_it_is(tmp_path, monkeypatch, line, told):
    from mtl.core.errors import PluginError
    from mtl.core.plugin_loading import MOVED_NAMES

    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "helper_of_mine.py").write_text("from mtl.train.sparse import RowGradient\n")
    monkeypatch.syspath_prepend(str(helpers))
    monkeypatch.delitem(sys.modules, "helper_of_mine", raising=False)
    (tmp_path / "old.py").write_text(f"import os\n{line}\n")
    with pytest.raises(PluginError) as caught:
        registry.load_folder(str(tmp_path))
    text = str(caught.value)
    assert "old.py' " + told.format(folder=helpers) in text and text.endswith("change the import"), text
    for names in MOVED_NAMES.values():  # every name is where the table says
        for name, now in names.items():
            assert hasattr(__import__(now, fromlist=[name]), name), (name, now)


def test_an_import_that_fails_for_another_reason_is_not_blamed_on_a_move(tmp_path, monkeypatch):
    """A module the plug-in imports that fails to import itself (here: a package of its own that is missing) is the
    error reported, not a name of the same line that moved."""
    from mtl.core.errors import PluginError

    helpers = tmp_path / "helpers"
    (helpers / "mine").mkdir(parents=True)
    (helpers / "mine" / "__init__.py").write_text("import a_package_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(helpers))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    (tmp_path / "old.py").write_text("from mine import RowGradient\n")
    with pytest.raises(PluginError, match="No module named 'a_package_that_is_not_installed'.*this is a bug"):
        registry.load_folder(str(tmp_path))


@pytest.mark.subprocess
def test_entry_point_group(tmp_path):
    pkg = tmp_path / "site"
    (pkg / "mtl_ep_demo").mkdir(parents=True)
    (pkg / "mtl_ep_demo" / "__init__.py").write_text(
        "from mtl.core.registry import register_reader\n"
        "from mtl.readers.synthetic import SyntheticReader\n"
        "@register_reader('ep_synthetic')\n"
        "class EP(SyntheticReader):\n"
        "    '''Registered through an entry point.'''\n")
    dist = pkg / "mtl_ep_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mtl-ep-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mtl.plugins]\ndemo = mtl_ep_demo\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg), ROOT]))
    out = warm_python.run([sys.executable, "-m", "mtl.cli", "plugins"], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("ep_synthetic" in ln and "Registered through an entry point." in ln for ln in lines)
    for kind, name in [("reader", "digits"), ("backbone", "iresnet50"), ("head", "arcface"), ("head", "regression")]:
        assert any(ln.split("|")[1].strip() == kind and ln.split("|")[2].strip() == name for ln in lines
                   if ln.count("|") > 3), name


TYPED_PLUGIN = '''from mtl.core.registry import register_backbone
from mtl.backbones.small import MLP


@register_backbone("typed_test_mlp")
class Typed(MLP):
    """A plug-in whose constructor does arithmetic on its parameters.

    Parameters:
        width (int): hidden units
        sizes (list|float): one or several
    """

    def __init__(self, width=4, sizes=1.0):
        width + 1, sizes * 2
        raise RuntimeError("a real bug")
'''


def test_a_value_of_another_type_than_declared_is_a_config_error_not_a_plugin_bug(tmp_path):
    """``classes: "x"`` reached the digits reader's int() and was reported as "a bug in the plug-in, not a mistake
    in the config" (found by a fuzzing helper). When a plug-in raises something other than a user error, a value not
    of the type its docstring declares is named as the config's mistake; with the declared types it stays a bug."""
    from mtl.core.errors import PluginError

    (tmp_path / "typed.py").write_text(TYPED_PLUGIN)
    registry.load_folder(str(tmp_path))
    for params, words in (({"width": "x"}, "parameter 'width' must be a whole number, got 'x'"),
                          ({"sizes": "y"}, "parameter 'sizes' must be a list or a number, got 'y'")):
        with pytest.raises(ConfigError, match=f"^job.yaml: backbone.{next(iter(params))}: backbone 'typed_test_mlp': "
                                              f"{words}$"):
            registry.build("backbone", {"type": "typed_test_mlp", **params}, "job.yaml", "backbone")
    with pytest.raises(PluginError, match="raised RuntimeError: a real bug while it was built; this is a bug"):
        registry.build("backbone", {"type": "typed_test_mlp", "width": 3, "sizes": [1]}, "job.yaml", "backbone")
