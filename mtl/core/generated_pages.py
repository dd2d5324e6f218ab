"""Generated sections of the docs: the text between a pair of HTML comment markers in a Markdown page.

The configuration reference (``mtl.config.reference``), the plug-in reference (``mtl.commands.plugins``) and the
architectures' tables (``examples/architectures_report.py``) are written between their markers by their generator;
a test compares the page's section with what the generator gives now.
"""
from mtl.core.errors import ConfigError


def markers(name: str):
    """``("<!-- name -->", "<!-- /name -->")``: the pair of markers of a generated section."""
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def read_section(path: str, name: str) -> str:
    """The text between the markers ``name`` of page ``path`` (stripped; empty when the markers are missing)."""
    begin, end = markers(name)
    with open(path) as f:
        content = f.read()
    if begin not in content or end not in content:
        return ""
    return content.split(begin, 1)[1].split(end, 1)[0].strip()


def write_section(path: str, name: str, text: str):
    """Replace the text between the markers ``name`` of page ``path`` with ``text``; ConfigError naming the page
    and the markers when it has none."""
    begin, end = markers(name)
    with open(path) as f:
        content = f.read()
    if begin not in content or end not in content:
        raise ConfigError(f"'{path}' has no {begin} ... {end} markers to write between")
    head, rest = content.split(begin, 1)
    with open(path, "w") as f:
        # a blank line before the end marker: a markdown table would take the marker line as a row of its own
        f.write(head + begin + "\n" + text + "\n\n" + end + rest.split(end, 1)[1])
