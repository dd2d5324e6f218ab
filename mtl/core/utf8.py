"""The text files users give (configs and task files, image, pair and target lists, CSV tables, treebanks,
vocabularies, JSON) read as UTF-8, with one sentence naming the file, the line and the byte for content that is not
UTF-8 (a list saved as GBK or Windows-1252, a binary file given by mistake), where Python's decoder names neither the
file nor the line.

:func:`open_utf8` is ``open(path, encoding="utf-8", newline=newline)`` (streamed, as before) whose decoding error
becomes :class:`NotUtf8`; only then is the file scanned again, as bytes, for the line and the byte, counting line
breaks as text mode splits lines (``\\n``, ``\\r\\n`` and a lone ``\\r``)."""
import contextlib

from mtl.core.errors import DataError


class NotUtf8(DataError):
    """A text file that is not UTF-8; ``where`` says where (``line 2, byte 1 of the line (0xd6)``)."""

    def __init__(self, path, what: str, where: str):
        super().__init__(f"{what} '{path}' is not UTF-8 text: {where}; save it as UTF-8")
        self.path, self.where = path, where


def first_fault(path) -> str:
    """Where the first byte of ``path`` that is not UTF-8 lies: ``line L, byte B of the line (0xXX)``."""
    number = 1
    with open(path, "rb") as f:
        for raw in f:  # split at b"\n" (a lone b"\r" also ends a line: counted below); never inside a character
            lines = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                before = raw[:exc.start].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                line, column = number + before.count(b"\n"), len(before) - (before.rfind(b"\n") + 1) + 1
                return f"line {line}, byte {column} of the line (0x{raw[exc.start]:02x})"
            number += lines.count(b"\n")
    return "no undecodable byte found on a second reading (the file changed?)"


class Utf8Text:
    """A text file open for reading (iteration, ``readline``, ``read``; a context manager) whose decoding error is a
    :class:`NotUtf8` naming the file, the line and the byte."""

    def __init__(self, path, what: str, newline=None):
        self.path, self.what = path, what
        # utf-8-sig: the byte-order mark Windows editors put first is not part of the text (it was read into the
        # first path of a pairs list, "cannot read '\ufeffs1/1.png'")
        self._file = open(path, encoding="utf-8-sig", newline=newline)

    @contextlib.contextmanager
    def _located(self):
        try:
            yield
        except UnicodeDecodeError:
            raise NotUtf8(self.path, self.what, first_fault(self.path)) from None

    def __iter__(self):
        with self._located():
            for line in self._file:  # not ``yield from``: closing this generator would close the file
                yield line

    def readline(self, size: int = -1) -> str:
        with self._located():
            return self._file.readline(size)

    def read(self, size: int = -1) -> str:
        with self._located():
            return self._file.read(size)

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_utf8(path, what: str, newline=None) -> Utf8Text:
    """``path`` open for reading as UTF-8 text (``what`` names the kind of file in the error: "image list")."""
    return Utf8Text(path, what, newline)


def read_json(path, what: str):
    """The JSON object of the user's or a run's file ``path``; a DataError naming ``what`` and the file when it cannot
    be read, is not UTF-8 (:func:`open_utf8`), is not JSON or is not an object."""
    import json

    try:
        with open_utf8(path, what) as f:
            value = json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(f"{what} '{path}' is not valid JSON ({exc})") from None
    except OSError as exc:
        raise DataError(f"{what} '{path}' cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):  # every such file is an object; a list gave AttributeErrors far from here
        raise DataError(f"{what} '{path}' holds a JSON {type(value).__name__}, expected an object ({{...}})")
    return value
