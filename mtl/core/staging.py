"""Folders written whole or not at all: the files go into a hidden folder beside the destination, which is renamed
into place once everything is written; any failure (a bad file, Ctrl-C) removes it, and what was at the
destination before stays as it was until the new folder replaces it."""
import contextlib
import os
import shutil


def _beside(out: str, what: str) -> str:
    out = os.path.abspath(out)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{what}")


@contextlib.contextmanager
def staged_folder(out: str, replace: bool = False):
    """Yield a fresh temporary folder beside ``out``; when the block ends without an error it becomes ``out``.

    ``replace``: an existing ``out`` is swapped out only then (renamed aside, then removed); otherwise ``out`` must
    not exist (the caller checks, naming its own rule). On an error the temporary folder is removed and ``out`` is
    untouched. A folder left by a killed run of the same destination is cleared first."""
    partial = _beside(out, "partial")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    try:
        yield partial
        if replace and os.path.exists(out):
            _swap(partial, out)
        else:
            os.rename(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _swap(partial: str, out: str):
    """``partial`` becomes ``out``; the former ``out`` is renamed aside first, put back if the second rename fails
    (or is interrupted), and removed once the new one is in place."""
    old = _beside(out, f"old-{os.getpid()}")
    os.rename(out, old)
    try:
        os.rename(partial, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
