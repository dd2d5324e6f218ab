"""Durable, verifiable checkpoint files: fsync before the rename, a SHA-256 per file in ``state.json``, verification.

Why SHA-256 and not CRC32: both catch truncation and random corruption; SHA-256 also catches a deliberate edit, is
what ``sha256sum -c`` checks by hand, and costs little: 1.18 GB/s here (CRC32: 2.8 GB/s), i.e. about 0.1 s for a
100k-class head with its momentum. The digest covers each file's bytes exactly as written.

Durability (POSIX): a rename is atomic but not durable by itself; after a power loss the new name may point to
blocks that never reached the disk. So every file is fsynced by the rank that wrote it, then the checkpoint folder
(and ``heads/``) before the rename, then the parent folder after it, so that the rename itself is on disk.
"""
import hashlib
import json
import os

CHUNK = 1 << 22
STATE_FILE = "state.json"


def fsync_file(path):
    """Flush a file's data and metadata to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    """Flush a folder's entries (new names, renames) to the disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a folder: nothing more can be done there
        pass
    finally:
        os.close(fd)


def sha256_of(path) -> str:
    """Hex SHA-256 of a file's bytes, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files_under(folder):
    """Relative paths (with ``/``) of every file under ``folder`` except ``state.json``, sorted."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel != STATE_FILE:
                found.append(rel)
    return sorted(found)


def manifest(folder) -> dict:
    """``{relative path: {"sha256": hex, "bytes": size}}`` of every file of a checkpoint folder."""
    return {rel: {"sha256": sha256_of(os.path.join(folder, rel)), "bytes": os.path.getsize(os.path.join(folder, rel))}
            for rel in _files_under(folder)}


def write_state(folder, state):
    """Write ``state.json`` with the manifest of the folder's files, then fsync it and the folders."""
    path = os.path.join(folder, STATE_FILE)
    with open(path, "w") as f:
        json.dump({**state, "files": manifest(folder)}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    for root, _, _ in os.walk(folder):
        fsync_dir(root)


def read_state(folder):
    """``(state dict, None)``, or ``(None, problem)`` when ``state.json`` is missing or not JSON."""
    path = os.path.join(folder, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 (was a UnicodeDecodeError traceback)
        return None, f"{STATE_FILE} is unreadable ({type(exc).__name__}: {exc})"
    if not isinstance(state, dict) or "step" not in state:
        return None, f"{STATE_FILE} holds no step"
    return state, None


def file_problem(folder, rel, expected) -> str:
    """Why file ``rel`` of a checkpoint does not match its manifest entry, or '' when it does."""
    path = os.path.join(folder, rel)
    if not os.path.isfile(path):
        return f"{rel} is missing"
    size = os.path.getsize(path)
    if size != expected["bytes"]:
        return f"{rel} has {size} bytes, {expected['bytes']} were written (truncated or replaced)"
    if sha256_of(path) != expected["sha256"]:
        return f"{rel} does not match its SHA-256 in {STATE_FILE} (altered after it was written)"
    return ""


def verify(folder, only=None) -> str:
    """'' when every file of the checkpoint (or the relative paths in ``only``) matches ``state.json``, else the
    first problem. A checkpoint written before checksums existed (no ``files`` entry) is accepted as it is."""
    state, problem = read_state(folder)
    if problem:
        return problem
    files = state.get("files")
    if files is None:
        return ""
    for rel in sorted(files if only is None else [r for r in only if r in files]):
        problem = file_problem(folder, rel, files[rel])
        if problem:
            return problem
    return ""
