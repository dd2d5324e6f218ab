"""``mtl plugins [FOLDER ...] [--describe NAME]``: every registered reader, backbone, head and task-weighting
strategy, or one plug-in's parameters; ``python -m mtl.commands.plugins [--write]``: the reference page
``docs/plugins.md`` of every built-in plug-in and averager, generated from the same declarations (constructor
signatures and the ``Parameters:`` sections of their docstrings: :func:`mtl.core.registry.parameters`); a test checks
that the page is current."""
import os
import sys

from mtl.core.generated_pages import read_section, write_section

SECTION = "plugin-reference"  # the markers of the generated section (mtl.core.generated_pages)
PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                    "plugins.md")
HEADERS = ["parameter", "type", "default", "meaning"]
BUILT_IN = ("mtl/", "heads/")  # where the plug-ins of the reference page are defined (not those a job loads)
KIND_TITLES = {"reader": "Readers", "backbone": "Backbones", "head": "Heads", "weighting": "Task weighting",
               "architecture": "Architectures (between backbone and heads)"}


def summary(cls) -> str:
    """The first paragraph of a plug-in class's docstring, on one line."""
    import inspect

    return " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())


def source_of(cls) -> str:
    """The file that defines ``cls``, relative to the repository (the same page from any working directory)."""
    root = os.path.dirname(PAGE)
    path = os.path.abspath(sys.modules[cls.__module__].__file__)
    return os.path.relpath(path, os.path.dirname(root))


def parameter_rows(params):
    """Table rows of :class:`mtl.core.registry.Parameter` values."""
    return [(p.name, p.type, p.default, p.meaning or "(not documented yet)") for p in params]


def averagers():
    """``[(name, class, parameters)]`` of the averagers (``averaging: {type: NAME}``): their config keys, typed and
    defaulted by their constructors, meant as the job schema says (``mtl.config.keys.AVERAGING``)."""
    from mtl.config.averaging import KEYS
    from mtl.config.keys import AVERAGING
    from mtl.core import registry
    from mtl.train.averaging.config import KINDS

    found = []
    for name, cls in KINDS.items():
        params = [p for p in registry.parameters(cls) if p.name in KEYS[name]]
        for p in params:
            p.meaning = p.meaning or AVERAGING[p.name].doc
            p.type = p.type or "|".join(t.__name__ for t in AVERAGING[p.name].types)
        found.append((name, cls, params))
    return found


def describe(name, kind=None) -> str:
    """What ``mtl plugins --describe NAME`` prints: each plug-in called ``name`` (of ``kind``), where it comes from,
    its one-line description and a table of its parameters."""
    from tabulate import tabulate

    from mtl.core import registry
    from mtl.core.errors import ConfigError

    found = [(n, c, p) for n, c, p in averagers() if n == name] if kind in (None, "averager") else []
    entries = [("averager", n, registry.origin_of(c), summary(c), p) for n, c, p in found]
    if kind != "averager":
        try:
            entries = [(e.kind, e.name, e.origin, summary(e.cls), registry.parameters(e.cls))
                       for e in registry.find(name, kind)] + entries
        except ConfigError:
            if not entries:
                raise
    if not entries:
        raise ConfigError(f"no averager is called '{name}'; averagers: {', '.join(n for n, _, _ in averagers())}")
    blocks = []
    for kind_name, entry_name, origin, description, params in entries:
        table = tabulate(parameter_rows(params), headers=HEADERS, tablefmt="github") if params else "(no parameters)"
        blocks.append(f"{kind_name} '{entry_name}' ({origin}): {description}\n\n{table}")
    return "\n\n".join(blocks)


def reference() -> str:
    """Markdown: one section per kind, one table of parameters per built-in plug-in (and averager): those defined
    in ``mtl/`` and ``heads/``, whatever else this process registered."""
    from tabulate import tabulate

    from mtl.core import registry

    registry.load_builtin()
    out = []
    for kind in registry.KINDS:
        out.append(f"## {KIND_TITLES[kind]}")
        for entry in [e for e in registry.entries(kind) if source_of(e.cls).startswith(BUILT_IN)]:
            rows = parameter_rows(registry.parameters(entry.cls))
            table = tabulate(rows, headers=HEADERS, tablefmt="github") if rows else "(no parameters)"
            out.append(f"### `{entry.name}`\n\n{summary(entry.cls)} (`{source_of(entry.cls)}`)\n\n{table}")
    out.append("## Averagers (`averaging: {type: NAME}`)")
    for name, cls, params in averagers():
        out.append(f"### `{name}`\n\n{summary(cls)} (`{source_of(cls)}`)\n\n"
                   f"{tabulate(parameter_rows(params), headers=HEADERS, tablefmt='github')}")
    return "\n\n".join(out)


def page_reference(path: str = PAGE) -> str:
    """The text between the markers of the reference page (empty when they are missing)."""
    return read_section(path, SECTION)


def write(path: str = PAGE):
    """Replace the text between the markers of ``path`` with :func:`reference`."""
    write_section(path, SECTION, reference())


def plugins(args):
    """Print a table of every registered reader, backbone, head and task-weighting strategy, or (``--describe``)
    one plug-in's parameters."""
    from tabulate import tabulate

    from mtl.config.loading import task_folders
    from mtl.core import registry

    folders = list(args.plugins) + [f for f in task_folders(None, args.plugins) if f not in args.plugins]
    registry.load_all(folders)  # the same folders a job loads: given ones, ./tasks and the repository's tasks/
    if args.describe:
        print(describe(args.describe, args.kind))
        return
    rows = [(e.kind, e.name, e.origin, e.description) for e in registry.entries()]
    rows += [("averager", name, registry.origin_of(cls), registry.first_sentence(cls.__doc__))
             for name, cls, _ in averagers()]
    print(tabulate(rows, headers=["kind", "name", "from", "description"], tablefmt="github"))
    print("\n(`mtl plugins --describe NAME` lists a plug-in's parameters; docs/plugins.md all of them)")


def add_cli(sub):
    """Register ``mtl plugins``."""
    p = sub.add_parser("plugins", help="list registered readers, backbones, heads and weighting strategies, or one "
                                       "plug-in's parameters (--describe NAME)")
    p.add_argument("plugins", nargs="*", help="extra plug-in folders to load (./tasks and tasks/ always are)")
    p.add_argument("--describe", metavar="NAME", help="the parameters of the plug-in NAME: type, default, meaning")
    p.add_argument("--kind", choices=["reader", "backbone", "head", "weighting", "architecture", "averager"],
                   help="--describe: the kind of plug-in, when several kinds have one called NAME")
    p.set_defaults(func=plugins)


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    else:
        print(reference())
