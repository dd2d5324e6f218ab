"""Rows a head declares: the rows of a parameter that the optimizer updates row-sparse (Partial FC's sampled class
centres, and the rows of another head's centres that a loss gave a gradient under cross-head negatives).

A head puts its declarations in its :class:`mtl.headkit.base.HeadOutput` (``rows``); its backward fills their
``grad``; the optimizer takes them (``mtl.optimizer.sparse.StepRows``), sums a step's micro-batches, merges the
declarations of one parameter (:func:`merge_rows`) and updates those rows only. Nothing of a step's rows is kept
in a head.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle

from mtl.core.arrays import tensor_from


@dataclass
class RowGradient:
    """Rows of ``parameter`` that a loss scored this step, at local row ids ``index [K]``, and their gradient
    ``grad [K, D]`` (set by the backward; None before it, or for a step whose backward did not run). ``source``: the
    task whose loss the gradient is of (a weighting strategy that rescales that task rescales it; the joint model
    names the head's task when the head leaves it empty). ``host_index``: ``index`` as a numpy array when the head
    drew the rows on the host (the micro-batches of an accumulated step that declare the same rows are summed in
    place; others are merged as a union). Only these rows (and their optimizer state) change."""

    parameter: paddle.Tensor
    index: paddle.Tensor
    grad: Optional[paddle.Tensor] = None
    source: str = ""
    host_index: Optional[np.ndarray] = None


def merge_rows(row_gradients) -> list:
    """One :class:`RowGradient` per parameter: declarations of the same parameter (a Partial FC head's sampled rows
    and the rows other heads' losses gave it, ``cross_negatives.update: both``) become one over the union of their
    rows (sorted), the gradients of a row summed in declaration order, so that the optimizer updates every row once.
    Order: first appearance; a declaration without gradient is left out of its parameter's merge."""
    groups = {}
    for row in row_gradients:
        groups.setdefault(id(row.parameter), []).append(row)
    out = []
    for rows in groups.values():
        given = [r for r in rows if r.grad is not None]
        if len(given) <= 1:
            out.append(given[0] if given else rows[0])
            continue
        index = paddle.concat([r.index.astype("int64") for r in given])
        union, where = np.unique(index.numpy(), return_inverse=True)
        summed = paddle.zeros([len(union), given[0].grad.shape[1]], dtype=given[0].grad.dtype)
        summed.index_add_(tensor_from(where.reshape(-1), dtype="int64"), 0,
                          paddle.concat([r.grad.astype(summed.dtype) for r in given]))
        out.append(RowGradient(given[0].parameter, tensor_from(union, dtype="int64"), summed, given[0].source))
    return out


def dense_gradient(parameter, rows) -> np.ndarray:
    """``parameter``'s gradient as a dense array, for inspection and tests: the declared ``rows`` of it (the others
    zero) when a declaration of it has a gradient, else ``parameter.grad``."""
    declared = [r for r in merge_rows([r for r in rows if r.parameter is parameter]) if r.grad is not None]
    if not declared:
        return parameter.grad.numpy()
    grad = declared[0].grad.numpy()
    dense = np.zeros(parameter.shape, dtype=grad.dtype)
    dense[declared[0].index.numpy()] = grad
    return dense
