"""Head base class: turns (features, labels) into a loss and metrics; owns its own communication.

Contract used by the joint model and the runner:

* ``fields()`` lists the batch fields the head scores against (e.g. ``label`` int64 scalar per sample).
* ``forward(features, labels)`` gets this rank's rows of the task's sub-batch and returns a :class:`HeadOutput`.
  ``loss`` is the term to differentiate. Under data parallelism every head computes the loss of the *global*
  sub-batch: a model-parallel head gathers rows itself; a replicated head returns ``sum(local rows) / global rows``
  so that summing backbone gradients over ranks gives the gradient of the global mean.
  ``global_loss`` is the value to report (equal on every rank).
* ``evaluate(features, labels)`` gets the embeddings of the whole evaluation split (same on every rank) and returns a
  dict of floats; ``primary_metric`` names the one shown first, ``higher_is_better`` its direction.
* ``sharded``: True when the head's parameters differ per rank (class centres split over processes); the runner then
  never all-reduces their gradients.
"""
from dataclasses import dataclass, field
from typing import Dict, Optional

import paddle

from mtl.contracts import Field


@dataclass
class HeadOutput:
    """What a head returns for one step: the loss to differentiate, the loss to report, and metrics."""

    loss: paddle.Tensor
    metrics: Dict[str, paddle.Tensor] = field(default_factory=dict)
    global_loss: Optional[paddle.Tensor] = None
    logits: Optional[paddle.Tensor] = None

    def __post_init__(self):
        if self.global_loss is None:
            self.global_loss = self.loss


class Head(paddle.nn.Layer):
    """Base class of heads. Subclasses set ``label_field`` and implement ``forward`` and ``evaluate``."""

    sharded = False
    primary_metric = "loss"
    higher_is_better = False

    def __init__(self, feature_size: int, label_field: str = "label"):
        super().__init__()
        self.feature_size = int(feature_size)
        self.label_field = label_field

    def fields(self):
        """Batch fields this head needs (default: one int64 class label per sample)."""
        return [Field(self.label_field, (), "int64")]

    def set_step(self, step: int):
        """Called by the runner before each training forward with the global step (0-based).

        Heads whose randomness depends on the step (Partial FC's class sampling) derive it from this, so that a
        resumed run draws exactly what an uninterrupted one would. Default: nothing.
        """

    def check_eval_labels(self, labels):
        """Raise (any exception, with a sentence) when ``evaluate`` could not score a split with these labels.

        Called when the job is built, so that a split the head cannot evaluate fails before training. Default: fine.
        """

    def own_gradients(self):
        """Gradient-holding tensors of this step that the optimizer does not update (included in clipping)."""
        return []

    def apply_own_updates(self, lr: float, optimizer_cfg: dict):
        """Update what the head manages itself (Partial FC's sampled rows), after the optimizer step. Default: none."""

    def forward(self, features, labels) -> HeadOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, features, labels) -> Dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError
