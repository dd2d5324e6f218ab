"""Head base class: turns (features, labels) into a loss and metrics; owns its own communication.

Contract used by the joint model and the runner:

* ``fields()`` lists the batch fields the head scores against (e.g. ``label`` int64 scalar per sample).
* ``forward(features, labels)`` gets this rank's rows of the task's sub-batch and returns a :class:`HeadOutput`.
  ``loss`` is the term to differentiate. Under data parallelism every head computes the loss of the *global*
  sub-batch: a model-parallel head gathers rows itself; a replicated head returns ``sum(local rows) / global rows``
  so that summing backbone gradients over ranks gives the gradient of the global mean.
  ``global_loss`` is the value to report (equal on every rank).
* ``evaluate(features, labels)`` gets the embeddings of the whole evaluation split (same on every rank) and returns a
  dict of floats. The tables print every metric with four digits, except the counts that
  :data:`mtl.evaluation.metrics.COUNT_METRICS` declares (printed whole).

Capabilities every head declares (generic code reads them, never probes):

* ``sharded``: the head's parameters differ per rank (class centres split over processes); the runner then never
  all-reduces their gradients and checkpoints them per rank.
* ``class_count()``: the number of classes when the labels are class ids (int64, one per sample), else None; the
  runner then checks label ranges.
* ``primary_metric`` and ``higher_is_better``: the metric shown first (and compared across runs) and its direction.
* ``row_sparse``: training hands the optimizer row gradients (the optimizer must support a row-sparse update):
  the head declares them in its output (``HeadOutput.rows``, :class:`mtl.headkit.row_gradients.RowGradient`) and
  the optimizer applies them to those rows only. A declaration's ``source`` (empty: the joint model names the
  head's task) is what the weighting rescales it by; its ``host_index`` (the rows as numpy ids, when the head drew
  them on the host) lets an accumulated step sum the micro-batches that declare the same rows in place. The
  optimizer lets the gradient go after the step (it may be a view of a buffer the head reuses);
* ``reader_sizes``: which constructor parameter takes which of the reader's sizes (``Reader.sizes()``) when the
  config does not give it, e.g. ``{"num_classes": "num_labels"}`` for a multi-label head;
* ``reads_people``: the constructor takes ``people``, who the classes of each source of the task's reader are
  (:meth:`mtl.readers.base.Reader.source_people`, given by the job): what a merged head resolves same-person
  pairs that name people by name or dataset label with;
* ``uses_step``: ``forward(features, labels, step)`` takes the global 0-based step of a training forward (Partial
  FC draws its class sample from it), given by the joint model; no head counts steps itself.
* ``prepare_step(step, labels, accumulate)``: called once per training step before its first micro-batch when the
  step is read as ``accumulate`` > 1 micro-batches (``schedule.accumulate``), or when a step hook reads the heads'
  samples (``StepHook.needs_step_samples``: cross-head negatives' ``rows: shared``), with this rank's labels of the
  whole step: Partial FC draws its one class sample of the step from them (the optimizer sums the sampled rows'
  gradient over the micro-batches; ``step_rows(step)`` gives it to the other heads).
* ``task`` (set by the joint model): the task the head scores, which its row declarations name as their source.
* ``equal_rows`` (set by the joint model): every rank passes the same number of rows to each forward, so a head that
  gathers rows need not exchange row counts first (the runner's batches guarantee it:
  ``mtl.data.steps.check_divisible``). False for a head used on its own.
* ``reads``: the backbone output the head scores when the backbone returns several (a text encoder's ``sequence``
  [B, T, D] or ``pooled`` [B, D]); None: the backbone's ``default_output`` (or its one tensor).
* ``labels_of(sub_batch)``: what the joint model passes as ``labels`` (default: the ``label_field`` tensor; a head
  that scores several fields, e.g. word positions and tags, returns ``{field: tensor}``).
* ``ties_input_embeddings`` / ``tie_input_embeddings(weight)``: the head's output layer is the backbone's input
  embedding matrix (masked LM), handed over when the job is built.
* ``evaluates_batches``: evaluation runs batch by batch (variable-length text): ``predict(features, labels)`` per
  batch returns one prediction per sample and ``score(predictions, reader)`` the metrics of the split.
* ``predicts_text`` / ``predict_text(features, inputs)``: what the head predicts for a batch of new texts, which
  have no labels (``mtl predict``, :mod:`mtl.serving.prediction_text`): one record per sample, ``{field: ids}`` (a
  class id, or a list of ids or word numbers per word) with ``probability`` / ``probabilities``, ``score`` as the head
  has them; ``inputs`` holds the text fields and the head's non-label fields (``word_index`` padded with 0).
* ``planned_bytes(options, global_rows, world_size, rank, optimizer_slots, accumulate=1)`` (class method): the memory
  the head will hold in one process, by part, computed from its options before it is built
  (``mtl.train.memory_plan``); ``global_rows`` are those of one micro-batch when a step is read as ``accumulate``.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import paddle

from mtl.core.contracts import Field


@dataclass
class HeadOutput:
    """What a head returns for one step: the loss to differentiate, the loss to report, metrics, and the rows it
    declares (:class:`mtl.headkit.row_gradients.RowGradient`: parameters the optimizer updates row-sparse; their
    ``grad`` is filled by the backward)."""

    loss: paddle.Tensor
    metrics: Dict[str, paddle.Tensor] = field(default_factory=dict)
    global_loss: Optional[paddle.Tensor] = None
    rows: List = field(default_factory=list)

    def __post_init__(self):
        if self.global_loss is None:
            self.global_loss = self.loss


def label_tensor(labels, field_name: str):
    """A head's label tensor, whether given alone or inside a batch dict ``{field: tensor}``."""
    return labels[field_name] if isinstance(labels, dict) else labels


class Head(paddle.nn.Layer):
    """Base class of heads. Subclasses set ``label_field`` and implement ``forward`` and ``evaluate``.

    Parameters:
        label_field (str): the batch field this head reads its labels (targets) from: the reader's name for them
    """

    sharded = False
    row_sparse = False
    uses_step = False  # forward(features, labels, step): the global step of a training forward
    cross_negatives = False  # can score other heads' classes as negatives (mtl.headkit.cross_negatives)
    reads_people = False  # takes ``people``: Reader.source_people of its task's reader
    reader_sizes = {"num_classes": "num_classes"}
    primary_metric = "loss"
    higher_is_better = False
    reads = None
    ties_input_embeddings = False
    evaluates_batches = False
    predicts_text = False

    def __init__(self, feature_size: int, label_field: str = "label"):
        super().__init__()
        self.feature_size = int(feature_size)
        self.label_field = label_field
        self.equal_rows = False
        self.task = ""  # the task it scores (set by the joint model)

    def fields(self):
        """Batch fields this head needs (default: one int64 class label per sample)."""
        return [Field(self.label_field, (), "int64")]

    def class_count(self) -> Optional[int]:
        """Number of classes when the labels are class ids in ``[0, C)``; None otherwise (the default)."""
        return None

    def labels_of(self, sub_batch):
        """The ``labels`` argument of :meth:`forward` from a task's sub-batch ``{field: tensor}`` (default: the
        ``label_field`` tensor)."""
        return sub_batch[self.label_field]

    def tie_input_embeddings(self, weight):
        """Use the backbone's input embedding matrix ``weight`` (heads with ``ties_input_embeddings``)."""
        raise NotImplementedError(f"head '{self.registered_name}' does not tie input embeddings")

    def predict(self, features, labels) -> list:
        """One prediction per sample of an evaluation batch (heads with ``evaluates_batches``)."""
        raise NotImplementedError

    def score(self, predictions: list, reader) -> Dict[str, float]:
        """Metrics of a whole evaluation split from :meth:`predict`'s predictions, in sample order."""
        raise NotImplementedError

    def predict_text(self, features, inputs) -> list:
        """One prediction record per sample of a batch of new texts (heads with ``predicts_text``)."""
        raise NotImplementedError(f"head '{type(self).__name__}' does not declare predicts_text")

    def prepare_step(self, step: int, labels, accumulate: int):
        """Before the first of ``accumulate`` micro-batches of training step ``step``; ``labels``: this rank's labels
        of all of them. Default: nothing (a head whose forward does not depend on the rest of the step)."""

    def attach_cross_negatives(self, cross, task: str):
        """Score the other heads' classes of ``cross`` (a :class:`mtl.headkit.cross_negatives.CrossNegatives`) as
        negatives of this task's samples; only heads that declare ``cross_negatives`` can (the job checks it)."""
        raise NotImplementedError(f"head '{type(self).__name__}' does not declare cross_negatives")

    def step_rows(self, step: int):
        """This rank's rows the head scores itself at training step ``step`` (sorted local row ids; None: every row
        of its shard; none when its task is not in the step), drawn before its forward by :meth:`prepare_step`;
        heads that declare ``cross_negatives`` (``cross_negatives.rows: shared`` scores them as the other heads'
        negatives)."""
        raise NotImplementedError(f"head '{type(self).__name__}' does not declare cross_negatives")

    def check_eval_labels(self, labels):
        """Raise a user error (:class:`mtl.core.errors.DataError` or ConfigError, a sentence) when ``evaluate``
        could not score a split with these labels.

        Called when the job is built, so that a split the head cannot evaluate fails before training. Default: fine.
        """

    @classmethod
    def planned_bytes(cls, options: dict, global_rows: int, world_size: int, rank: int,
                      optimizer_slots: int, accumulate: int = 1) -> Dict[str, int]:
        """Bytes this head will hold in process ``rank`` of ``world_size``, by part (``{"weight": n, ...}``), from its
        constructor ``options`` alone, before it is built; ``global_rows`` = rows of its sub-batch (of one
        micro-batch) over all ranks, ``optimizer_slots`` = float copies the optimizer keeps per parameter,
        ``accumulate`` = micro-batches per step. Default: {} (a small head)."""
        return {}

    def forward(self, features, labels) -> HeadOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, features, labels) -> Dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError
