"""A ``torch.save`` archive written without torch, from torch's documented layout (zip of ``data.pkl`` + raw storages),
and our backbones' weights under insightface's names: the torch-free side of the conversion tests."""
import collections
import io
import pickle
import zipfile

import numpy as np
import paddle

from mtl.core import registry


# ---- torch.save's archive --------------------------------------------------------------------
class Global:
    """A global the pickle names (``torch._utils._rebuild_tensor_v2``), written as a GLOBAL opcode."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # save_reduce wants a callable
        raise NotImplementedError


class Storage:
    """One storage: ``data/<key>`` holds its raw little-endian elements."""

    def __init__(self, key, array, type_name):
        self.key, self.array, self.type_name = key, array, type_name


class Tensor:
    """A strided view of a storage, pickled as ``_rebuild_tensor_v2(storage, offset, size, stride, False, {})``."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class TorchPickler(pickle._Pickler):
    """torch.save's pickle (protocol 2, storages as persistent ids), from its documented layout."""

    dispatch = dict(pickle._Pickler.dispatch)

    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", Global("torch", obj.type_name), obj.key, "cpu", obj.array.size)
        return None

    def save_fake_global(self, obj):
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def save_tensor(self, obj):
        args = (obj.storage, obj.offset, tuple(obj.size), tuple(obj.stride), False, collections.OrderedDict())
        self.save_reduce(Global("torch._utils", "_rebuild_tensor_v2"), args, obj=obj)

    dispatch[Global] = save_fake_global
    dispatch[Tensor] = save_tensor


TYPE_NAMES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.int64): "LongStorage",
              np.dtype(np.float16): "HalfStorage"}


def write_torch_file(path, obj, storages):
    """``obj`` (holding :class:`Tensor` s) and its storages as ``archive/data.pkl`` + ``archive/data/<key>``."""
    buffer = io.BytesIO()
    TorchPickler(buffer, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        archive.writestr("archive/byteorder", "little")
        for storage in storages:
            archive.writestr(f"archive/data/{storage.key}", storage.array.astype(storage.array.dtype.newbyteorder(
                "<")).tobytes())
        archive.writestr("archive/version", "3\n")


def torch_layout(arrays):
    """An OrderedDict of contiguous :class:`Tensor` s over one storage each (what state_dict() saves)."""
    storages, out = [], collections.OrderedDict()
    for i, (name, array) in enumerate(arrays.items()):
        storage = Storage(str(i), np.ascontiguousarray(array).ravel(), TYPE_NAMES[array.dtype])
        stride = [int(np.prod(array.shape[k + 1:])) for k in range(array.ndim)]
        storages.append(storage)
        out[name] = Tensor(storage, 0, array.shape, stride)
    return out, storages


def insightface_names(backbone):
    """Our backbone's weights under insightface's names and layouts (the inverse of the conversion, written out)."""
    arrays = collections.OrderedDict()
    layers = dict(backbone.named_sublayers())
    for name, value in backbone.state_dict().items():
        layer, _, attr = name.rpartition(".")
        array = value.numpy()
        if isinstance(layers[layer], paddle.nn.Linear) and attr == "weight":
            array = array.T
        attr = {"_mean": "running_mean", "_variance": "running_var", "_weight": "weight"}.get(attr, attr)
        arrays[f"{layer}.{attr}"] = array
        if attr == "running_var":
            arrays[f"{layer}.num_batches_tracked"] = np.array(3, dtype=np.int64)
    return arrays


def randomized(cfg, seed=0):
    """A backbone with random weights and BatchNorm statistics (numpy's generator, seed)."""
    registry.load_builtin()
    paddle.seed(seed)
    model = registry.build("backbone", cfg)
    rng = np.random.default_rng(seed)
    model.set_state_dict({k: paddle.to_tensor((0.5 + rng.random(v.shape) if k.endswith("_variance") else
                                               0.1 * rng.standard_normal(v.shape)).astype("float32"))
                          for k, v in model.state_dict().items()})
    return model.eval()
