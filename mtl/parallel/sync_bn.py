"""Synchronised BatchNorm composed from Paddle ops: in training, the statistics are those of the global batch.

Paddle 3.3's CPU build has no ``sync_batch_norm`` kernel, so ``paddle.nn.SyncBatchNorm`` cannot run under gloo; this
module is the reference that runs on every device. :func:`convert_sync_batchnorm` swaps every BatchNorm of a layer
tree for a :class:`SyncBatchNorm` that shares the original's parameters and running statistics (same attribute names,
so the structured ``state_dict`` keys do not change and checkpoints load either way).

Training forward, per channel, over the N rows (and spatial positions) of all ranks:
    one all-gather of every rank's (count n_r, mean m_r, M2_r = sum (x - m_r)^2), then (Chan et al.)
    n = sum_r n_r,  mean = sum_r n_r m_r / n,  var = (sum_r M2_r + n_r (m_r - mean)^2) / n   (biased)
    x_hat = (x - mean) / sqrt(var + eps),  y = weight * x_hat + bias
This is as exact as the two-pass variance on one process, where sum(x^2)/n - mean^2 would lose digits when
|mean| >> std; it is still one collective per layer.
Backward of x_hat (a PyLayer; the affine part is ordinary autograd, so dweight = sum(dy * x_hat) and
dbias = sum(dy) stay local and the runner sums them over ranks), with g = dL/dx_hat = dy * weight:
    dx = (g - mean_global(g) - x_hat * mean_global(g * x_hat)) / sqrt(var + eps)
    (one all-reduce SUM of the per-channel sums of g and g * x_hat).
Running statistics follow Paddle's BatchNorm (checked on Paddle 3.3 CPU against ``paddle.nn.BatchNorm2D``):
    running = momentum * running + (1 - momentum) * batch_statistic, with the *biased* batch variance (divided by
    N, not N - 1 as in PyTorch); ``momentum`` is the weight of the old value (0.9 by default).
At world size 1 nothing communicates and the layer equals Paddle's BatchNorm. Outside training (or with
``use_global_stats=True``) the layer calls Paddle's own kernel exactly as the original layer would, without any
communication (evaluation need not run in lockstep on every rank).

Every rank must run the same BatchNorm layers in the same order, forward and backward (the collectives pair up by
order): several independent backbone passes in one step are only safe if their backward runs pass by pass.
"""
import math

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle.autograd import PyLayer

from mtl.core import activity
from mtl.parallel import distributed

BATCH_NORM_TYPES = (paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D, paddle.nn.BatchNorm3D, paddle.nn.BatchNorm,
                    paddle.nn.SyncBatchNorm)
LOW_PRECISION = (paddle.float16, paddle.bfloat16)
STATISTIC_SUFFIXES = ("_mean", "_variance")  # BatchNorm's running statistics: non-trainable Paddle parameters
# the prefix of an architecture's BatchNorm statistics (its backbone copies') among a run's per-rank statistics
# (``ParallelStrategy.statistics``, a checkpoint's ``statistics.rank<k>``); the backbone's keep its state_dict names
ARCHITECTURE_STATISTIC = "architecture."


def is_running_statistic(name: str, tensor) -> bool:
    """True for a BatchNorm running mean or variance (``<layer>._mean`` / ``._variance``, no gradient)."""
    return bool(tensor.stop_gradient) and name.rsplit(".", 1)[-1] in STATISTIC_SUFFIXES


def _channel_shape(x, axis):
    """``[1, .., C, .., 1]``: broadcasts a per-channel vector against ``x``."""
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return shape


def global_moments(x, axis):
    """Per-channel (mean, biased variance, row count) of ``x`` over all ranks, without gradient.

    Local two-pass moments, one all-gather of ``[n_r, m_r, M2_r]``, Chan's combination (see the module docstring).
    ``n`` is a ``[1]`` tensor of ``x``'s dtype (kept on the device: no host sync).
    """
    with paddle.no_grad():
        axes = [a for a in range(x.ndim) if a != axis]
        channels = x.shape[axis]
        count = paddle.full([1], math.prod(x.shape) // max(channels, 1), dtype=x.dtype)
        mean = paddle.sum(x, axis=axes) / paddle.clip(count, min=1.0)  # n_r = 0: mean 0, weight 0
        m2 = paddle.sum(paddle.square(x - mean.reshape(_channel_shape(x, axis))), axis=axes)
        if not distributed.is_distributed():
            return mean, m2 / paddle.clip(count, min=1.0), count
        parts = []
        with activity.collective("the all-gather of synchronised BatchNorm's moments"):
            dist.all_gather(parts, paddle.concat([count, mean, m2]))
        gathered = paddle.stack(parts)  # [W, 1 + 2C], rank order: identical arithmetic on every rank
        counts, means, m2s = gathered[:, :1], gathered[:, 1:1 + channels], gathered[:, 1 + channels:]
        total = paddle.sum(counts, axis=0)
        mean = paddle.sum(counts * means, axis=0) / total
        m2 = paddle.sum(m2s + counts * paddle.square(means - mean), axis=0)
        return mean, m2 / total, total


class _GlobalNormalize(PyLayer):
    """``x_hat = (x - mean) * inv_std`` with global-batch statistics; backward with the exact global gradient."""

    @staticmethod
    def forward(ctx, x, mean, inv_std, count, axis):
        shape = _channel_shape(x, axis)
        x_hat = (x - mean.reshape(shape)) * inv_std.reshape(shape)
        ctx.axis = axis
        ctx.save_for_backward(x_hat, inv_std, count)
        return x_hat

    @staticmethod
    def backward(ctx, g):
        x_hat, inv_std, count = ctx.saved_tensor()
        axis = ctx.axis
        axes = [a for a in range(g.ndim) if a != axis]
        shape = _channel_shape(g, axis)
        sums = paddle.concat([paddle.sum(g, axis=axes), paddle.sum(g * x_hat, axis=axes)])
        if distributed.is_distributed():
            with activity.collective("the all-reduce of synchronised BatchNorm's gradients"):
                dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        means = sums / count  # [mean_global(g), mean_global(g * x_hat)]
        channels = g.shape[axis]
        mean_g, mean_gx = means[:channels].reshape(shape), means[channels:].reshape(shape)
        # dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + eps)
        dx = (g - mean_g - x_hat * mean_gx) * inv_std.reshape(shape)
        return dx, None, None, None


class SyncBatchNorm(paddle.nn.Layer):
    """The synchronised version of a Paddle BatchNorm layer ``source``, sharing its parameters and statistics.

    Attributes keep Paddle's names (``weight``, ``bias``, ``_mean``, ``_variance``; ``weight``/``bias`` are None
    when the source has none), so ``state_dict`` keys are those of the source.
    """

    def __init__(self, source):
        super().__init__()
        if not isinstance(source, BATCH_NORM_TYPES):
            raise TypeError(f"expected a Paddle BatchNorm layer, got {type(source).__name__}")
        # amp_level O2 (paddle.amp.decorate) keeps only Paddle's own BatchNorm classes in float32 (need_keep_fp32):
        # this flag keeps ours too, so the running statistics and the row count stay float32 (float16 overflows
        # past 65504 rows per channel)
        self._cast_to_low_precision = False
        self.weight = source.weight
        self.bias = source.bias
        self._mean = source._mean
        self._variance = source._variance
        self._momentum = float(source._momentum)
        self._epsilon = float(source._epsilon)
        self._num_features = int(source._mean.shape[0])
        if isinstance(source, paddle.nn.BatchNorm):
            layout, self._act = source._data_layout, source._act
            # paddle.nn.BatchNorm's (use_global_stats, trainable_statistics) in F.batch_norm's one-flag convention
            self._use_global_stats = (True if source._use_global_stats
                                      else False if source._trainable_statistics else None)
        else:
            layout, self._act = source._data_format, None
            self._use_global_stats = None if isinstance(source, paddle.nn.SyncBatchNorm) else source._use_global_stats
        self._channel_last = layout[1] != "C"  # NC, NCL, NCHW, NCDHW vs NLC, NHWC, NDHWC
        self.training = source.training

    def extra_repr(self):
        return (f"num_features={self._num_features}, momentum={self._momentum}, epsilon={self._epsilon}"
                + (", channel_last" if self._channel_last else ""))

    def forward(self, x):
        """Training: global-batch statistics (:func:`global_moments`). Otherwise Paddle's kernel, as the source."""
        if self.training and self._use_global_stats is not True:
            y = self._synchronised(x)
        else:
            y = F.batch_norm(x, self._mean, self._variance, self.weight, self.bias, training=self.training,
                             momentum=self._momentum, epsilon=self._epsilon,
                             data_format="NHWC" if self._channel_last else "NCHW",
                             use_global_stats=self._use_global_stats)
        return getattr(F, self._act)(y) if self._act else y

    def _synchronised(self, x):
        if x.ndim < 2:
            raise ValueError(f"BatchNorm expects at least 2 dimensions (rows, channels), got shape {x.shape}")
        axis = x.ndim - 1 if self._channel_last else 1
        dtype = x.dtype
        if dtype in LOW_PRECISION:  # statistics and normalisation in the parameters' precision
            x = x.astype(self._mean.dtype)
        with paddle.amp.auto_cast(enable=False):  # O2 would run these ops in the low precision again
            return self._normalize(x, axis, dtype)

    def _normalize(self, x, axis, dtype):
        mean, var, count = global_moments(x, axis)
        inv_std = 1.0 / paddle.sqrt(var + self._epsilon)
        with paddle.no_grad():  # running = momentum * running + (1 - momentum) * batch (biased variance)
            paddle.assign(self._mean * self._momentum + mean * (1.0 - self._momentum), output=self._mean)
            paddle.assign(self._variance * self._momentum + var * (1.0 - self._momentum), output=self._variance)
        y = _GlobalNormalize.apply(x, mean, inv_std, count, axis)
        shape = _channel_shape(x, axis)
        if self.weight is not None:
            y = y * self.weight.reshape(shape)
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        return y.astype(dtype) if dtype in LOW_PRECISION else y


def convert_sync_batchnorm(layer):
    """Replace every Paddle BatchNorm (1D/2D/3D, ``paddle.nn.BatchNorm``, ``paddle.nn.SyncBatchNorm``) in ``layer``'s
    tree by a :class:`SyncBatchNorm` sharing its parameters; returns ``layer`` (or the replacement if ``layer`` is
    itself a BatchNorm). Idempotent; sub-layer names, order and ``state_dict`` keys are unchanged."""
    if isinstance(layer, BATCH_NORM_TYPES):
        return SyncBatchNorm(layer)
    for name, child in list(layer.named_children()):
        converted = convert_sync_batchnorm(child)
        if converted is not child:
            layer.add_sublayer(name, converted)
    return layer
