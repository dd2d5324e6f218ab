"""Evaluation batch by batch, for heads whose samples differ in size (text): ``Head.evaluates_batches``.

Each batch of the split (in order, padded as its fields declare) goes through the backbone as in training
(:mod:`mtl.backbones.rows`); the head turns the output it reads into one prediction per sample
(``Head.predict``), and scores the whole split from them (``Head.score``). Nothing of size [N, T, D] is kept.
"""
import paddle

from mtl.backbones import rows
from mtl.data.steps import iterate_eval
from mtl.low_precision import float32, inference_autocast


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
    predictions = []
    try:
        for batch in iterate_eval(reader, batch_size, max_samples):
            tensors = _tensors(batch)
            predictions.extend(head.predict(backbone_output(backbone, tensors, head.reads), head.labels_of(tensors)))
    finally:
        if was[0]:
            backbone.train()
        if was[1]:
            head.train()
    return {k: float(v) for k, v in head.score(predictions, reader).items()}
