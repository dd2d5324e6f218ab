"""The plug-in reference (issue 30, item 8): ``mtl plugins --describe NAME`` and docs/plugins.md, both generated
from the plug-ins' own declarations (constructor signatures, ``Parameters:`` docstring sections)."""
import inspect

import pytest

from mtl.commands import plugins as reference
from mtl.core import registry
from mtl.core.errors import ConfigError

PLUGIN = '''
from mtl.core.contracts import Field
from mtl.readers.base import Reader
from mtl.core.registry import register_reader


class Base(Reader):
    """A base that documents what its subclasses share.

    Parameters:
        size (int): side of the images, documented once
        seed: the base's meaning, hidden by the subclass's
    """


@register_reader("pr_documented")
class Documented(Base):
    """A reader of one's own.

    Parameters:
        path (file): where the samples are; a long meaning
            that goes on on a second line
        seed: the subclass's own meaning
    """

    def __init__(self, path, size=32, seed=0, ratio=0.5, split="train"):
        self.path = path

    def fields(self):
        return [Field("image", (1, 8, 8), "float32")]
'''


def test_the_reference_page_is_current():
    """``python -m mtl.commands.plugins --write`` regenerates docs/plugins.md between its markers."""
    assert reference.page_reference() == reference.reference().strip(), \
        "docs/plugins.md is stale: run python -m mtl.commands.plugins --write"


def documented_kinds():
    registry.load_builtin()
    found = [(e.kind, e.name, e.cls, registry.parameters(e.cls)) for e in registry.entries()
             if reference.source_of(e.cls).startswith(reference.BUILT_IN)]  # not the plug-ins other tests register
    return found + [("averager", name, cls, params) for name, cls, params in reference.averagers()]


def test_every_parameter_of_every_built_in_plugin_and_averager_has_a_meaning():
    """Readers, backbones, heads, weighting strategies, architectures and averagers: none left undocumented."""
    missing = [(kind, name, p.name) for kind, name, _, params in documented_kinds() for p in params
               if not p.meaning]
    assert not missing, missing
    assert {kind for kind, *_ in documented_kinds()} >= {"reader", "backbone", "head", "weighting", "averager"}


def test_no_docstring_documents_a_parameter_the_constructor_does_not_have():
    stale = [(kind, name, documented) for kind, name, cls, _ in documented_kinds()
             for documented in registry.documented_parameters(cls)
             if documented not in inspect.signature(cls.__init__).parameters]
    assert not stale, stale


def test_describe_reads_types_defaults_and_meanings_of_a_plugin_of_ones_own(tmp_path):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "documented.py").write_text(PLUGIN)
    registry.load_folder(str(folder))
    params = {p.name: p for p in registry.parameters(registry.get("reader", "pr_documented").cls)}
    assert [*params] == ["path", "size", "seed", "ratio", "split"]
    assert (params["path"].type, params["path"].default) == ("file", "required")
    assert params["path"].meaning == "where the samples are; a long meaning that goes on on a second line"
    assert (params["size"].type, params["size"].default, params["size"].meaning) == \
        ("int", "32", "side of the images, documented once")  # from the base's section
    assert params["seed"].meaning == "the subclass's own meaning"  # the subclass's wins
    assert (params["ratio"].type, params["ratio"].meaning) == ("float", "")  # the default's type, no meaning
    assert params["split"].meaning == registry.CONTEXT_MEANINGS["split"]  # the job sets it
    text = reference.describe("pr_documented")
    assert text.startswith("reader 'pr_documented' (") and "A reader of one's own." in text
    assert "| path        | file   | required  | where the samples are; a long meaning" in text, text
    assert "(not documented yet)" in text  # ratio


def test_describe_from_the_command_line_and_its_errors(capsys):
    from mtl import cli

    args = cli.build_parser().parse_args(["plugins", "--describe", "window"])
    args.func(args)
    out = capsys.readouterr().out
    assert out.startswith("averager 'window'") and "| average_window_rate | float  | required  |" in out, out
    args = cli.build_parser().parse_args(["plugins", "--describe", "cosfase"])
    with pytest.raises(ConfigError, match=r"no plug-in is registered as 'cosfase' \(did you mean 'cosface'\?\)"):
        args.func(args)
    args = cli.build_parser().parse_args(["plugins", "--describe", "static", "--kind", "reader"])
    with pytest.raises(ConfigError, match="no reader is registered as 'static'"):
        args.func(args)


def test_the_page_holds_the_built_in_plugins_only(tmp_path):
    """A plug-in a job (or another test) registered in this process is not on the page."""
    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "other.py").write_text(PLUGIN.replace("pr_documented", "pr_elsewhere"))
    registry.load_folder(str(folder))
    page = reference.reference()
    assert "pr_elsewhere" not in page and "### `image_list`" in page and "### `window`" in page
