"""The configuration reference (``docs/configuration.md``), generated from the schema:
``python -m mtl.config.reference [--write]``.

The tables between the ``config-reference`` markers of that page are this module's output; a test checks that they
are up to date, so a key added to the schema without ``--write`` fails the suite.
"""
import os
import sys

from tabulate import tabulate

from mtl.config.keys import BACKBONE, JOB, TASK
from mtl.config.paths import REPO_ROOT
from mtl.config.schema import describe
from mtl.core.generated_pages import read_section, write_section

SECTION = "config-reference"  # the markers of the generated section (mtl.core.generated_pages)
PAGE = os.path.join(REPO_ROOT, "docs", "configuration.md")


def reference() -> str:
    """Markdown: the job keys' table, then the task files' table."""
    headers = ["key", "type", "default", "meaning"]
    rows = describe(JOB)
    at = next(i for i, row in enumerate(rows) if row[0] == "backbone") + 1
    rows[at:at] = describe(BACKBONE, "backbone")  # the job's own keys of the backbone mapping
    job = tabulate(rows, headers=headers, tablefmt="github")
    task = tabulate(describe(TASK), headers=headers, tablefmt="github")
    return f"{job}\n\nTask files:\n\n{task}"


def readme_reference(path: str = PAGE) -> str:
    """The text between the markers of the reference page (empty when they are missing)."""
    return read_section(path, SECTION)


def write(path: str = PAGE):
    """Replace the text between the markers with :func:`reference`."""
    write_section(path, SECTION, reference())


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    else:
        print(reference())
