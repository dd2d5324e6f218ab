"""Read a ``.safetensors`` file without the safetensors package: an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the raw little-endian bytes
of every tensor (offsets relative to the end of the header). Nothing in the file is executed."""
import json
import struct

import numpy as np

from mtl.core.errors import DataError
from mtl.core.file_kinds import looks_like_safetensors  # the one test of the format (mtl.convert.bert's too)

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "BF16": "bfloat16"}


def _tensor(raw, spec, name, path):
    kind = DTYPES.get(spec.get("dtype"))
    if kind is None:
        raise DataError(f"safetensors file '{path}': tensor '{name}' has dtype {spec.get('dtype')!r}, which is not "
                        f"one of {', '.join(DTYPES)}")
    begin, end = spec["data_offsets"]
    data = raw[begin:end]
    if kind == "bfloat16":  # the upper half of a float32
        bits = np.frombuffer(data, "<u2").astype(np.uint32) << 16
        array = bits.view(np.float32)
    else:
        array = np.frombuffer(data, np.dtype(kind).newbyteorder("<"))
    count = int(np.prod(spec["shape"])) if spec["shape"] else 1
    if array.size != count:
        raise DataError(f"safetensors file '{path}': tensor '{name}' has {array.size} values for shape "
                        f"{spec['shape']}")
    return array.reshape(spec["shape"]).astype(array.dtype.newbyteorder("="))


def read_safetensors(path: str) -> dict:
    """``{name: numpy array}`` of a safetensors file; a DataError saying that the file is not one (a file of
    something else: no JSON header after the 8-byte length), or naming what is wrong in a truncated or malformed
    one."""
    with open(path, "rb") as f:
        blob = f.read()
    if not looks_like_safetensors(blob):
        raise DataError(f"'{path}' is not a safetensors file (it does not start with an 8-byte length and a JSON "
                        "header); give the checkpoint's model.safetensors, pytorch_model.bin or .pdparams")
    (size,) = struct.unpack("<Q", blob[:8])
    if 8 + size > len(blob):
        raise DataError(f"safetensors file '{path}' is truncated: its header says {size} bytes, the file has "
                        f"{len(blob) - 8} after the length")
    try:
        header = json.loads(blob[8:8 + size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"'{path}' is not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict) or not all(isinstance(v, dict) and "data_offsets" in v and "shape" in v
                                               for k, v in header.items() if k != "__metadata__"):
        raise DataError(f"'{path}' is not a safetensors file: its header does not describe tensors (dtype, shape, "
                        "data_offsets)")
    raw = blob[8 + size:]
    return {name: _tensor(raw, spec, name, path) for name, spec in header.items() if name != "__metadata__"}
