"""Backbone inputs of several sub-batches as one batch of rows, and the backbone's outputs back per sub-batch.

Used by the joint model (one backbone pass per input signature) and by evaluation, so that both feed a backbone
alike:

* a sample may hold a group of K rows of a backbone input (``Field.group_size``: a pairwise matching sample is
  query + positive and query + negative); the backbone sees the B K rows, and each output comes back as
  ``[B, K, ...]``;
* inputs whose declared shape has ``None`` axes (token ids ``[T]``) are padded with the field's ``pad`` value to the
  largest sub-batch before they are concatenated, and every ``None`` axis of an output (sequence features
  ``[T, D]``) is cut back to the sub-batch's own size, so a head sees exactly the positions of its own batch;
* a backbone returns one tensor, or a dict of named outputs (``Backbone.output_fields()``: ``sequence`` and
  ``pooled`` for text); a head reads the one it names (``Head.reads``), by default the backbone's
  ``default_output``.
"""
from typing import Dict, List

import paddle


def input_signature(fields, sub_batch) -> tuple:
    """(name, per-row shape with the declared variable axes as None, dtype) of every backbone input."""
    out = []
    for f in fields:
        value = sub_batch[f.name]
        shape = tuple(value.shape[len(value.shape) - len(f.shape):])
        out.append((f.name, tuple(None if d is None else s for d, s in zip(f.shape, shape)), str(value.dtype)))
    return tuple(out)


def group_size(fields, sub_batch) -> int:
    """Rows per sample of a sub-batch: 1, or K when its inputs hold groups of K rows."""
    f = fields[0]
    value = sub_batch[f.name]
    return int(value.shape[1]) if len(value.shape) == len(f.shape) + 2 else 1


def variable_size(fields, sub_batch):
    """The size of the first variable axis of the inputs (the token length of a text batch), or None."""
    for f in fields:
        value = sub_batch[f.name]
        for axis, d in enumerate(f.shape):
            if d is None:
                return int(value.shape[len(value.shape) - len(f.shape) + axis])
    return None


def _pad_to(value, shape, pad):
    """``value`` padded at the end of every axis to ``shape`` with ``pad``."""
    if tuple(value.shape) == tuple(shape):
        return value
    for axis, size in enumerate(shape):
        missing = size - int(value.shape[axis])
        if missing > 0:
            filler_shape = list(value.shape)
            filler_shape[axis] = missing
            value = paddle.concat([value, paddle.full(filler_shape, pad, value.dtype)], axis=axis)
    return value


def concat_rows(fields, sub_batches: List[dict]) -> Dict[str, paddle.Tensor]:
    """The inputs of several sub-batches as one batch of rows: groups flattened, variable axes padded to the
    largest, concatenated in order."""
    inputs = {}
    for f in fields:
        values = []
        for sub in sub_batches:
            v = sub[f.name]
            values.append(v.reshape([-1] + list(v.shape[len(v.shape) - len(f.shape):])))
        if len(values) == 1:
            inputs[f.name] = values[0]
            continue
        shape = [max(int(v.shape[a]) for v in values) for a in range(len(values[0].shape))]
        inputs[f.name] = paddle.concat([_pad_to(v, [int(v.shape[0])] + shape[1:], f.pad or 0) for v in values], 0)
    return inputs


def _crop(value, declared, size):
    """Cut every declared variable axis of one output (per-row shape ``declared``) to ``size``."""
    if size is None or declared is None:
        return value
    index = [slice(None)] * len(value.shape)
    lead = len(value.shape) - len(declared.shape)
    for axis, d in enumerate(declared.shape):
        if d is None:
            index[lead + axis] = slice(0, size)
    return value[tuple(index)]


def _split_one(value, declared, rows, groups, sizes):
    parts = paddle.split(value, rows, axis=0) if len(rows) > 1 else [value]
    out = []
    for part, k, size in zip(parts, groups, sizes):
        if k > 1:
            part = part.reshape([-1, k] + list(part.shape[1:]))
        out.append(_crop(part, declared, size))
    return out


def split_outputs(outputs, declared, rows, groups, sizes) -> list:
    """Per sub-batch: the backbone's output(s) of its rows (a tensor, or ``{name: tensor}``), groups back as
    ``[B, K, ...]``, variable axes cut to the sub-batch's own ``sizes``."""
    if not isinstance(outputs, dict):
        return _split_one(outputs, None, rows, groups, sizes)
    per_name = {name: _split_one(v, (declared or {}).get(name), rows, groups, sizes) for name, v in outputs.items()}
    return [{name: per_name[name][i] for name in outputs} for i in range(len(rows))]


def select(outputs, name, default):
    """The output a head reads: the tensor itself, or ``outputs[name or default]``; a ValueError naming them."""
    if not isinstance(outputs, dict):
        return outputs
    key = name or default
    if key not in outputs:
        raise ValueError(f"the backbone returns {sorted(outputs)}, not {key!r}")
    return outputs[key]


def to_float32(outputs):
    """Low-precision outputs as float32 (heads, margins and class centres stay in float32)."""
    def cast(v):
        return v.astype("float32") if v.dtype in (paddle.float16, paddle.bfloat16) else v

    return {k: cast(v) for k, v in outputs.items()} if isinstance(outputs, dict) else cast(outputs)
