"""The generated sections of the docs (mtl.core.generated_pages): read and replaced between their markers only."""
import pytest

from mtl.core.errors import ConfigError
from mtl.core.generated_pages import read_section, write_section


def test_a_section_is_replaced_between_its_markers_and_nothing_else_moves(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("head\n<!-- s -->\nold\n<!-- /s -->\ntail <!-- t -->x<!-- /t -->\n")
    assert read_section(str(page), "s") == "old"
    write_section(str(page), "s", "new\ntext")
    assert page.read_text() == "head\n<!-- s -->\nnew\ntext\n\n<!-- /s -->\ntail <!-- t -->x<!-- /t -->\n"
    assert read_section(str(page), "s") == "new\ntext" and read_section(str(page), "t") == "x"


def test_a_page_without_the_markers_reads_empty_and_is_not_written(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("no markers\n")
    assert read_section(str(page), "s") == ""
    with pytest.raises(ConfigError, match="has no <!-- s --> ... <!-- /s --> markers"):
        write_section(str(page), "s", "text")
    assert page.read_text() == "no markers\n"
