"""Batches of samples of different sizes: every array is padded at its end to the largest sample of the batch.

A field declares the value it pads with (``Field.pad``: the tokenizer's ``[PAD]`` id for token ids, 0 for segment
ids, -1 = "no label" for labels); a field without one must have the same shape in every sample of a batch.
"""
from typing import Dict, Optional

import numpy as np

from mtl.core.errors import DataError


def pad_stack(arrays, pad, name: str = "field") -> np.ndarray:
    """``[n, *max shape]``: the arrays stacked, each padded with ``pad`` at the end of every axis; plain stacking when
    they already agree. A DataError when they disagree and ``pad`` is None, or when their ranks differ."""
    arrays = [np.asarray(a) for a in arrays]
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1:
        return np.stack(arrays)
    ranks = {len(s) for s in shapes}
    if pad is None or len(ranks) != 1:
        sample = sorted(shapes)[:2]
        raise DataError(f"field '{name}' has samples of shapes {list(sample[0])} and {list(sample[1])} in one batch; "
                        "a field whose size varies must declare the value it is padded with (Field.pad)")
    size = tuple(max(s[k] for s in shapes) for k in range(ranks.pop()))
    out = np.full((len(arrays),) + size, pad, dtype=arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[(i,) + tuple(slice(0, d) for d in a.shape)] = a
    return out


def collate_padded(samples, fields: Optional[Dict[str, object]] = None):
    """``{field: [n, ...]}`` of a list of samples, padded as their fields declare (``fields``: name -> Field, or a
    function returning that mapping, called only when some field's samples differ in shape)."""
    out = {}
    for name in samples[0]:
        arrays = [s[name] for s in samples]
        if len({np.shape(a) for a in arrays}) == 1:
            out[name] = np.stack([np.asarray(a) for a in arrays])
            continue
        fields = fields() if callable(fields) else (fields or {})
        declared = fields.get(name)
        out[name] = pad_stack(arrays, declared.pad if declared is not None else None, name)
    return out
