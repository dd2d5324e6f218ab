"""Evaluation batch by batch, for heads whose samples differ in size (text): ``Head.evaluates_batches``.

Each batch of the split (padded as its fields declare) goes through the backbone as in training
(:mod:`mtl.backbones.rows`); the head turns the output it reads into one prediction per sample
(``Head.predict``), and scores the whole split from them, in sample order (``Head.score``). Nothing of size
[N, T, D] is kept. A reader that knows its samples' lengths is read shortest first
(:func:`mtl.data.steps.length_order`), so that a batch holds texts of about one length and little padding; the
predictions go back to sample order before the head scores them. Every sample's prediction is the one it gets in a
batch of its own, to float rounding (the encoders never let padding reach a real position).
"""
import paddle

from mtl.backbones import rows
from mtl.core.errors import PluginError
from mtl.core.low_precision import float32, inference_autocast
from mtl.data.steps import iterate_eval, length_order


def _tensors(batch):
    return {k: paddle.to_tensor(v) for k, v in batch.items()}


def backbone_output(backbone, batch, reads):
    """The backbone output a head reads for one batch ``{field: tensor}`` (groups and lengths as in training)."""
    fields = list(backbone.input_fields())
    with inference_autocast(backbone):
        outputs = backbone(rows.concat_rows(fields, [batch]))
    k = rows.group_size(fields, batch)
    count = int(batch[fields[0].name].shape[0]) * k
    out = rows.split_outputs(outputs, backbone.output_fields(), [count], [k], [rows.variable_size(fields, batch)])[0]
    return float32(rows.select(out, reads, backbone.default_output))


@paddle.no_grad()
def evaluate_batches(backbone, head, reader, batch_size: int, max_samples=None) -> dict:
    """``{metric: float}`` of ``head`` on the whole split of ``reader``, batch by batch."""
    was = backbone.training, head.training
    backbone.eval()
    head.eval()
    order = length_order(reader, max_samples)
    predictions = []
    try:
        for batch in iterate_eval(reader, batch_size, max_samples, order):
            tensors = _tensors(batch)
            got = head.predict(backbone_output(backbone, tensors, head.reads), head.labels_of(tensors))
            samples = len(next(iter(batch.values())))
            if len(got) != samples:
                raise PluginError(f"head '{head.registered_name}': predict returned {len(got)} predictions for an "
                                  f"evaluation batch of {samples} samples; Head.predict returns one per sample")
            predictions.extend(got)
    finally:
        if was[0]:
            backbone.train()
        if was[1]:
            head.train()
    if order is not None:  # back to sample order
        in_order = [None] * len(predictions)
        for position, index in enumerate(order):
            in_order[int(index)] = predictions[position]
        predictions = in_order
    return {k: float(v) for k, v in head.score(predictions, reader).items()}
