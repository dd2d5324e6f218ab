"""Convert face models trained elsewhere into this project's backbones: insightface's arcface_torch ``.pth``
state_dicts and PLSC's ``.pdparams``, for IResNet-18/34/50/100, MobileFaceNet and arcface_torch's ViT-T/S/B.

Our ``iresnet*``, ``mobilefacenet`` and ``vit_*`` have insightface's module tree (same layers, same order, same
names), so a tensor maps by its name; only the framework's conventions differ and are translated per layer type:

    BatchNorm   weight, bias, running_mean -> _mean, running_var -> _variance; num_batches_tracked dropped
    PReLU       weight -> _weight (one slope per channel in both)
    Linear      weight [out, in] (torch) -> [in, out] (Paddle), bias as is
    Conv2D      weight [out, in / groups, kh, kw] in both, as is
    LayerNorm, the ViT's pos_embed and mask_token: as is

PLSC's IResNet and MobileFaceNet are Paddle layers with the same names (plus its Partial FC head ``head.*``, which is
dropped): a renaming of nothing. Every tensor must find its place with the right shape and every weight of the
backbone must be given, else the conversion stops with one line naming the first tensor that does not fit.
"""
import collections
import json
import os
import zipfile

import numpy as np

from mtl.convert.torch_file import read_torch_file
from mtl.core.errors import DataError
from mtl.core.file_kinds import not_a_pickle
from mtl.core.safe_pickle import load_paddle_file

# arcface_torch's IResNets by name: residual blocks per stage (the iresnet backbones are built from this table, and a
# file's blocks per stage name its architecture in an error)
IRESNET_DEPTHS = {
    "iresnet18": (2, 2, 2, 2),
    "iresnet34": (3, 4, 6, 3),
    "iresnet50": (3, 4, 14, 3),
    "iresnet100": (3, 13, 30, 3),
}

ARCHS = ("iresnet18", "iresnet34", "iresnet50", "iresnet100", "mobilefacenet", "vit_t", "vit_s", "vit_b")
SOURCES = ("insightface", "plsc")
BATCH_NORM_NAMES = {"weight": "weight", "bias": "bias", "running_mean": "_mean", "running_var": "_variance",
                    "num_batches_tracked": None}
TRAINING_STATE_KEYS = ("state_dict_backbone", "state_dict", "model")  # arcface_torch's checkpoint_gpu_<rank>.pt


def _as_state_dict(obj, path):
    """A {name: array} mapping out of what the file holds (a state_dict, or a training checkpoint holding one)."""
    if isinstance(obj, dict):
        for key in TRAINING_STATE_KEYS:
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise DataError(f"'{path}' holds a {type(obj).__name__}, not a state_dict (a mapping of names to tensors)")
    out = collections.OrderedDict()
    for name, value in obj.items():
        if isinstance(value, np.ndarray):
            out[str(name)] = value
    if not out:
        raise DataError(f"'{path}' holds no tensor")
    if all(name.startswith("module.") for name in out):  # saved from a DistributedDataParallel wrapper
        out = collections.OrderedDict((name[len("module."):], value) for name, value in out.items())
    return out


def read_source(source: str, path: str):
    """{name: numpy array} of a ``source`` (insightface | plsc) weight file, without the classifier head."""
    if not os.path.isfile(path):
        raise DataError(f"weights '{path}' do not exist")
    if source == "insightface" and not zipfile.is_zipfile(path):
        kind = not_a_pickle(path, what="a torch.save archive")  # text, safetensors, ...: what it is
        if kind is not None:
            raise kind
    if source == "insightface":
        return _as_state_dict(read_torch_file(path), path)
    state = _as_state_dict(load_paddle_file(path, "a Paddle state_dict"), path)
    return collections.OrderedDict((n, v) for n, v in state.items() if not n.startswith("head."))


def other_source(source: str, src: str, dst: str, arch: str):
    """The DataError for a file of the other framework than ``source`` says (a PLSC ``.pdparams`` given to
    insightface, a ``torch.save`` archive given to plsc), with the command that converts it; None otherwise."""
    if source == "plsc" and zipfile.is_zipfile(src):
        return DataError(f"'{src}' is a torch.save archive, not a Paddle file: convert it with mtl convert insightface "
                         f"{src} {dst} --arch {arch}")
    if source == "insightface" and not zipfile.is_zipfile(src):
        try:
            _as_state_dict(load_paddle_file(src, "a Paddle state_dict"), src)
        except DataError:
            return None  # not Paddle's either (an old torch file, ...): the torch reader says what it is
        return DataError(f"'{src}' is a Paddle file (paddle.save), not a torch.save archive: convert it with "
                         f"mtl convert plsc {src} {dst} --arch {arch}")
    return None


def _translations(backbone):
    """{(layer name, torch attribute): (our state_dict key or None to drop, transpose?)} for every layer."""
    import paddle

    table = {}
    for prefix, layer in backbone.named_sublayers():
        if isinstance(layer, paddle.nn.layer.norm._BatchNormBase):
            table.update({(prefix, torch_name): (f"{prefix}.{paddle_name}" if paddle_name else None, False)
                          for torch_name, paddle_name in BATCH_NORM_NAMES.items()})
        elif isinstance(layer, paddle.nn.PReLU):
            table[(prefix, "weight")] = (f"{prefix}._weight", False)
        elif isinstance(layer, (paddle.nn.Linear, paddle.nn.Conv2D)):
            table[(prefix, "weight")] = (f"{prefix}.weight", isinstance(layer, paddle.nn.Linear))
            table[(prefix, "bias")] = (f"{prefix}.bias", False)
    return table


def map_tensors(state, backbone, path, framework="torch"):
    """{our state_dict key: array} for ``backbone`` from ``state``; a DataError names the first misfit."""
    own = {name: tuple(t.shape) for name, t in backbone.state_dict().items()}
    table = _translations(backbone) if framework == "torch" else {}
    arch = backbone.registered_name
    out = {}
    for name, value in state.items():
        layer, _, attr = name.rpartition(".")
        target, transpose = table.get((layer, attr), (name, False)) if framework == "torch" else (name, False)
        if target is None:  # num_batches_tracked
            continue
        value = value.T if transpose and value.ndim == 2 else value
        if target not in own:
            raise DataError(f"'{path}': tensor '{name}' {list(value.shape)} has no place in {arch} "
                            f"({describe_layout(state)})")
        if tuple(value.shape) != own[target]:
            raise DataError(f"'{path}': tensor '{name}' has shape {list(value.shape)} where {arch} "
                            f"({describe(backbone)}) expects {list(own[target])}")
        out[target] = np.ascontiguousarray(value, dtype=np.float32)
    missing = [name for name in own if name not in out]
    if missing:
        raise DataError(f"'{path}' has no tensor for '{missing[0]}' of {arch} ({len(missing)} missing; "
                        f"{describe_layout(state)})")
    return out


def describe(backbone) -> str:
    """``input_size 112, embedding_size 512`` (what a shape mismatch may come from)."""
    return f"input_size {backbone.input_size}, embedding_size {backbone.feature_size}"


def describe_layout(state) -> str:
    """What the file looks like: its IResNet blocks per stage, or that it is a MobileFaceNet, or its first names."""
    stages = [len({n.split(".")[1] for n in state if n.startswith(f"layer{k}.")}) for k in range(1, 5)]
    if all(stages):
        arch = next((name for name, depths in IRESNET_DEPTHS.items() if depths == tuple(stages)), None)
        return f"the file's blocks per stage are {tuple(stages)}" + (f", an {arch}" if arch else "")
    if any(n.startswith("conv_sep.") for n in state):
        return "the file holds a MobileFaceNet"
    if "patch_embed.proj.weight" in state:  # arcface_torch's VisionTransformer
        width, depth = int(np.shape(state["patch_embed.proj.weight"])[0]), _units(state, "blocks.")
        preset = {(256, 12): "vit_t", (512, 12): "vit_s", (512, 24): "vit_b"}.get((width, depth))
        give = f"--arch {preset}" if preset else "--arch vit_t, vit_s or vit_b (its sizes are read from the file)"
        return f"the file holds a ViT (width {width}, depth {depth}): give {give}"
    return f"the file's first tensors are {list(state)[:3]}"


def _units(state, prefix) -> int:
    """How many numbered sub-modules ``<prefix>.<k>.`` the file has."""
    return len({n[len(prefix):].split(".")[0] for n in state if n.startswith(prefix)})


def _shape(state, name, path, ndim):
    """The shape of tensor ``name`` of the file, of ``ndim`` dimensions; a DataError if it has none by that name, or
    one of another rank (a 1-d ``fc.weight`` was an IndexError)."""
    if name not in state:
        raise DataError(f"'{path}' has no tensor '{name}', which every such model has ({describe_layout(state)})")
    shape = tuple(np.shape(state[name]))
    if len(shape) != ndim:
        raise DataError(f"'{path}': tensor '{name}' has shape {shape}, but in every such model it has {ndim} "
                        f"dimension(s)")
    return shape


def _vit_options(state, path) -> dict:
    """A ViT's sizes from its tensors: width and patch from the patch convolution, input side from the number of
    position embeddings (side = patch x sqrt(tokens)), depth from the numbered blocks, embedding from the last
    BatchNorm. The number of attention heads leaves no trace in the shapes: the preset's (8) is kept."""
    width, channels, patch, _ = _shape(state, "patch_embed.proj.weight", path, 4)
    tokens = _shape(state, "pos_embed", path, 3)[1]
    return {"embedding_size": int(_shape(state, "feature.3.weight", path, 1)[0]),
            "input_size": int(patch * round(np.sqrt(tokens))), "in_channels": int(channels),
            "patch_size": int(patch), "embed_dim": int(width), "depth": _units(state, "blocks.")}


def infer_options(arch, state, path, framework="torch") -> dict:
    """The backbone options that give ``arch`` the file's shapes: embedding size, input size (from the width of the
    last layer: 16 x the final map's side), MobileFaceNet's scale and blocks, the ViT's sizes."""
    if arch.startswith("vit"):
        return _vit_options(state, path)
    if arch.startswith("iresnet"):
        embedding, fc = _shape(state, "features.bias", path, 1)[0], _shape(state, "fc.weight", path, 2)
        side = int(round(np.sqrt((fc[1] if framework == "torch" else fc[0]) / 512)))
        return {"embedding_size": int(embedding), "input_size": 16 * side,
                "in_channels": int(_shape(state, "conv1.weight", path, 4)[1])}
    first = _shape(state, "layers.0.layers.0.weight", path, 4)
    blocks = [1 if "layers.1.layers.0.weight" in state else _units(state, "layers.1.layers.")]
    blocks += [_units(state, f"layers.{k}.layers.") for k in (3, 5, 7)]
    side = int(_shape(state, "features.layers.0.layers.0.weight", path, 4)[-1])
    return {"embedding_size": int(_shape(state, "features.layers.3.bias", path, 1)[0]), "scale": int(first[0]) // 64,
            "blocks": blocks, "input_size": 16 * side,
            "in_channels": int(first[1])}


def check_destination(dst: str, overwrite: bool = False):
    """ConfigError (key ``DST``) unless ``dst`` is a ``.pdparams`` path (its folder created if needed) whose weights
    and config (``sidecar_path``) may be written: a ``model.json`` destination had its weights replaced by their own
    config, and an existing ``r50.pdparams`` or ``r50.json`` was replaced without a word (``overwrite`` allows it)."""
    from mtl.core.errors import ConfigError

    folder = os.path.dirname(os.path.abspath(dst))
    if not dst.endswith(".pdparams") or os.path.isdir(dst):
        raise ConfigError(f"the converted weights go into a file ending in .pdparams (their config goes beside it, "
                          f"as .json), got '{dst}'", key="DST")
    above = folder
    while not os.path.exists(above):  # a missing folder is made when the files are written (models/ of models/x)
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise ConfigError(f"cannot write '{dst}': '{above}' is a file, not a folder", key="DST")
    for path in (dst, sidecar_path(dst)):
        if os.path.isdir(path) or (os.path.exists(path) and not overwrite):
            raise ConfigError(f"'{path}' already exists; give another DST, or --overwrite to replace it", key="DST")


def _save(backbone, config: dict, src: str, source: str, dst: str):
    """The weights and their config, each written under a temporary name and renamed into place once both are
    complete (a failure leaves neither)."""
    import paddle

    temps = [f"{p}.partial-{os.getpid()}" for p in (dst, sidecar_path(dst))]
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    try:
        paddle.save(backbone.state_dict(), temps[0])
        with open(temps[1], "w") as f:  # what mtl eval DST.pdparams builds the backbone from
            json.dump({"backbone": config, "converted_from": os.path.abspath(src), "source": source}, f, indent=1)
        os.replace(temps[0], dst)
        os.replace(temps[1], sidecar_path(dst))
    finally:
        for temp in temps:
            if os.path.exists(temp):
                os.remove(temp)


def convert(source: str, src: str, dst: str, arch: str, overwrite: bool = False) -> dict:
    """Convert ``src`` (an insightface ``.pth`` or a PLSC ``.pdparams``) to ``dst``, the state_dict of our ``arch``
    that ``backbone: {type: arch, pretrained: dst, ...}`` loads; return that backbone config (without pretrained).
    ``dst`` is checked first (:func:`check_destination`)."""
    import paddle

    from mtl.core import registry

    if arch not in ARCHS:
        raise DataError(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    check_destination(dst, overwrite)
    mismatch = other_source(source, src, dst, arch) if os.path.isfile(src) else None
    if mismatch is not None:
        raise mismatch
    framework = "torch" if source == "insightface" else "paddle"
    state = read_source(source, src)
    options = infer_options(arch, state, src, framework)
    registry.load_builtin()
    backbone = registry.build("backbone", {"type": arch, **options})
    converted = map_tensors(state, backbone, src, framework)
    backbone.set_state_dict({name: paddle.to_tensor(value).astype(backbone.state_dict()[name].dtype)
                             for name, value in converted.items()})
    config = {"type": arch, **options}
    _save(backbone, config, src, source, dst)
    return config


def sidecar_path(weights: str) -> str:
    """``models/r50.json`` beside ``models/r50.pdparams``: the backbone config of converted weights."""
    return os.path.splitext(weights)[0] + ".json"
