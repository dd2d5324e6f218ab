"""Where fetched models live and how a job's ``backbone.pretrained`` finds them.

The cache is ``$MTL_HOME`` (default: ``$XDG_CACHE_HOME/mtl``, else ``~/.cache/mtl``); model NAME is the folder
``pretrained/NAME`` in it, with ``manifest.json`` (written last by ``mtl pretrained fetch``: a folder without it is
no model). ``backbone.pretrained`` names a model of :data:`mtl.pretrained.catalogue.CATALOGUE`, a checkpoint folder
(a Hugging Face BERT folder: ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``; or word vectors:
``vectors.npy`` and ``words.txt``), or a ``.pdparams`` file of the backbone's own weights (loaded after
construction, :func:`mtl.backbones.base.load_pretrained`). A model or folder becomes the backbone's own keys
(``weights``, ``tokenizer``, ``model_config``; ``word_vectors``), which the backbone type says
(``Backbone.pretrained_kind``, ``Backbone.pretrained_options``).
"""
import json
import os
from dataclasses import dataclass
from typing import Optional

from mtl.core.errors import ConfigError
from mtl.pretrained.catalogue import BERT, CATALOGUE, KIND_NAMES, WORD_VECTORS

MANIFEST = "manifest.json"


def home() -> str:
    """The cache folder: ``$MTL_HOME``, else ``$XDG_CACHE_HOME/mtl``, else ``~/.cache/mtl``."""
    if os.environ.get("MTL_HOME"):
        return os.path.abspath(os.path.expanduser(os.environ["MTL_HOME"]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "mtl")


def model_dir(name: str, root: Optional[str] = None) -> str:
    """The cache folder of model ``name``."""
    return os.path.join(root or home(), "pretrained", name)


@dataclass
class Checkpoint:
    """A pretrained model on disk: its kind (``bert`` or ``word_vectors``) and folder."""

    kind: str
    folder: str
    name: str


def read_manifest(folder: str) -> Optional[dict]:
    """The ``manifest.json`` of a fetched model's folder, or None when there is none."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def damage(folder: str, manifest: dict) -> Optional[str]:
    """What is wrong with a fetched model's files (one missing, or of another size than when it was fetched), or
    None."""
    for name, size in manifest.get("sizes", {}).items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"'{name}' is missing"
        if os.path.getsize(path) != size:
            return f"'{name}' has {os.path.getsize(path)} bytes, {size} when it was fetched"
    return None


def _folder_kind(folder: str) -> Optional[str]:
    """The kind of a checkpoint folder that no fetch wrote, from its files."""
    has = set(os.listdir(folder))
    if "config.json" in has and has & {"model.safetensors", "pytorch_model.bin"}:
        return BERT
    if {"vectors.npy", "words.txt"} <= has:
        return WORD_VECTORS
    return None


def _named(name: str, source, key) -> Checkpoint:
    folder = model_dir(name)
    manifest = read_manifest(folder)
    if manifest is None:
        raise ConfigError(f"pretrained model '{name}' is not in the cache '{folder}': fill it with `mtl pretrained "
                          f"fetch {name}` (MTL_HOME sets the cache folder)", source, key)
    problem = damage(folder, manifest)
    if problem:
        raise ConfigError(f"pretrained model '{name}' in '{folder}' is damaged ({problem}): fetch it again with "
                          f"`mtl pretrained fetch {name} --force`", source, key)
    return Checkpoint(manifest["kind"], folder, name)


def resolve(value: str, source=None, key=None) -> Optional[Checkpoint]:
    """The checkpoint ``backbone.pretrained: value`` names (a model of the catalogue, or a checkpoint folder), or
    None for a weights file (a ``.pdparams`` the backbone loads after construction); a ConfigError in one sentence
    for a model missing from the cache, a damaged one, or a value that is none of these."""
    if value in CATALOGUE:
        return _named(value, source, key)
    if os.path.isfile(value):
        return None
    if os.path.isdir(value):
        manifest = read_manifest(value)
        kind = manifest["kind"] if manifest else _folder_kind(value)
        if kind is None:
            raise ConfigError(f"folder '{value}' is no checkpoint: it holds neither a BERT checkpoint (config.json "
                              "and model.safetensors or pytorch_model.bin) nor word vectors (vectors.npy and "
                              "words.txt)", source, key)
        return Checkpoint(kind, os.path.abspath(value), os.path.basename(os.path.normpath(value)))
    raise ConfigError(f"'{value}' is neither a pretrained model ({', '.join(CATALOGUE)}: `mtl pretrained list`) nor "
                      "an existing checkpoint folder or weights file", source, key)


def _same(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str) and os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return a == b


def expand_backbone(cfg: dict, source=None, key: str = "backbone"):
    """(backbone mapping, whether its constructor loads the pretrained weights): ``pretrained: minilm`` (or a
    checkpoint folder) adds the keys the backbone type reads it with (``Backbone.pretrained_options``); idempotent.
    A ``.pdparams`` file is left to :func:`mtl.backbones.base.load_pretrained` (False). A backbone type that reads
    no such checkpoint, or a key the job gives that the checkpoint gives otherwise, is a ConfigError."""
    from mtl.core import registry

    value = cfg.get("pretrained")
    if not value:
        return cfg, False
    checkpoint = resolve(value, source, f"{key}.pretrained")
    if checkpoint is None:
        return cfg, False
    entry = registry.get("backbone", cfg["type"], source, f"{key}.type")
    if entry.cls.pretrained_kind != checkpoint.kind:
        readers = sorted(e.name for e in registry.entries("backbone") if e.cls.pretrained_kind == checkpoint.kind)
        raise ConfigError(f"pretrained '{value}' holds {KIND_NAMES[checkpoint.kind]}, which backbone "
                          f"'{cfg['type']}' does not read (type: {' or '.join(readers)} does)", source,
                          f"{key}.pretrained")
    options = entry.cls.pretrained_options(checkpoint.folder)
    for name, given in options.items():
        if name in cfg and not _same(cfg[name], given):
            raise ConfigError(f"pretrained '{value}' gives {name} ({given}); leave {name} out of the job",
                              source, f"{key}.{name}")
    return {**cfg, **options}, True


def cached_models(root: Optional[str] = None):
    """``[(name, folder, manifest or None, problem or None)]`` of every catalogue model and every other folder of
    the cache, for ``mtl pretrained list``."""
    base = os.path.join(root or home(), "pretrained")
    names = list(CATALOGUE) + sorted(n for n in (os.listdir(base) if os.path.isdir(base) else [])
                                     if n not in CATALOGUE and os.path.isdir(os.path.join(base, n)))
    out = []
    for name in names:
        folder = model_dir(name, root)
        manifest = read_manifest(folder) if os.path.isdir(folder) else None
        out.append((name, folder, manifest, damage(folder, manifest) if manifest else None))
    return out
