"""The text files users give (image and pair lists, target tables, treebanks, tokenizer vocabularies, JSON) read as
UTF-8, with one sentence naming the file, the line and the byte for content that is not UTF-8 (a list saved as GBK or
Windows-1252, a binary file given by mistake), where Python's decoder names neither the file nor the line.

:func:`open_utf8` reads the whole file and returns a text stream that behaves as ``open(path, encoding="utf-8",
newline=newline)`` would (universal newlines by default; ``newline=""`` keeps the line endings, for ``csv``)."""
import io

from mtl.errors import DataError


def read_utf8(path, what: str) -> str:
    """The content of ``path`` decoded as UTF-8 (``what`` names the kind of file in the error: "image list")."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(f"{what} '{path}' is not UTF-8 text: line {line}, byte {column} of the line "
                        f"(0x{raw[exc.start]:02x}); save it as UTF-8") from None


def open_utf8(path, what: str, newline=None) -> io.StringIO:
    """A text stream over ``path`` (see the module docstring); a DataError for content that is not UTF-8."""
    return io.StringIO(read_utf8(path, what), newline=newline)
