"""Regression head: one linear layer to ``num_outputs`` real values, trained with MSE, L1 or smooth-L1."""
import numpy as np
import paddle

from mtl.core.arrays import to_numpy
from mtl.core.contracts import Field
from mtl.core.errors import ParameterError
from mtl.core.registry import register_head
from mtl.evaluation.metrics import regression_scores
from mtl.headkit.base import Head, HeadOutput, label_tensor
from mtl.parallel.distributed import all_reduce_sum, world_size

LOSSES = ("mse", "l1", "smooth_l1")



@register_head("regression")
class RegressionHead(Head):
    """Linear D -> num_outputs with an element-wise regression loss; replicated on every rank.

    ``loss``: ``mse`` (d^2), ``l1`` (|d|) or ``smooth_l1`` (Huber form with ``delta``: 0.5 d^2 when |d| < delta,
    else delta * (|d| - 0.5 delta)), where d = prediction - target. Targets are float32 vectors in field ``target``.

    Parameters:
        loss (str): mse, l1 or smooth_l1 (Huber: quadratic below delta, linear above)
        delta (float): where smooth_l1 turns from quadratic to linear, in the targets' units
    """

    reader_sizes = {"num_outputs": "num_outputs"}
    primary_metric = "rmse"
    higher_is_better = False

    def __init__(self, feature_size: int, num_outputs: int = 1, loss: str = "mse", delta: float = 1.0,
                 label_field: str = "target"):
        super().__init__(feature_size, label_field)
        if int(num_outputs) < 1:
            raise ParameterError(f"num_outputs must be a positive integer, got {num_outputs!r}")
        if loss not in LOSSES:
            raise ParameterError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if not float(delta) > 0:
            raise ParameterError(f"delta must be positive, got {delta!r}")
        self.num_outputs = int(num_outputs)
        self.loss_name = loss
        self.delta = float(delta)
        self.linear = paddle.nn.Linear(self.feature_size, self.num_outputs)

    def fields(self):
        """One float32 target vector of length ``num_outputs`` per sample."""
        return [Field(self.label_field, (self.num_outputs,), "float32")]

    def elementwise_loss(self, diff):
        """Loss of every cell from ``diff = prediction - target``."""
        if self.loss_name == "mse":
            return diff * diff
        if self.loss_name == "l1":
            return paddle.abs(diff)
        # Huber: with q = min(|d|, delta), 0.5 q^2 + delta (|d| - q) is 0.5 d^2 inside, delta |d| - 0.5 delta^2 outside
        magnitude = paddle.abs(diff)
        inside = paddle.clip(magnitude, max=self.delta)
        return 0.5 * inside * inside + self.delta * (magnitude - inside)

    def forward(self, features, labels) -> HeadOutput:
        """Loss of the global sub-batch, plus its MAE and RMSE.

        Per sample the mean of :meth:`elementwise_loss` over outputs; ``loss = sum(local samples) / (local rows *
        world size)``, so that summing over ranks gives the mean over the global sub-batch (equal-sized rank slices).
        """
        pred = self.linear(features)
        target = paddle.cast(label_tensor(labels, self.label_field), pred.dtype).reshape(pred.shape)
        diff = pred - target
        global_rows = pred.shape[0] * world_size()
        loss = paddle.sum(paddle.mean(self.elementwise_loss(diff), axis=1)) / max(global_rows, 1)
        return HeadOutput(loss=loss, metrics=self._errors(diff), global_loss=all_reduce_sum(loss))

    def _errors(self, diff):
        """MAE ``sum|d| / n`` and RMSE ``sqrt(sum d^2 / n)`` over the global sub-batch (sums taken over ranks)."""
        with paddle.no_grad():
            d = paddle.cast(diff, "float32")
            count = paddle.full([], float(d.size), "float32")
            sums = all_reduce_sum(paddle.stack([paddle.sum(paddle.abs(d)), paddle.sum(d * d), count]))
            n = paddle.clip(sums[2], min=1.0)
            return {"mae": sums[0] / n, "rmse": paddle.sqrt(sums[1] / n)}

    def evaluate(self, features, labels):
        """MAE and RMSE of the predictions on the whole evaluation split."""
        with paddle.no_grad():
            x = features if isinstance(features, paddle.Tensor) else paddle.to_tensor(np.asarray(features))
            pred = self.linear(paddle.cast(x, self.linear.weight.dtype)).numpy()
        target = label_tensor(labels, self.label_field)
        target = to_numpy(target)
        return regression_scores(pred, target)
