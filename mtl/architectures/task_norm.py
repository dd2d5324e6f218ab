"""Task-specific normalisation: every BatchNorm of the backbone becomes one BatchNorm per task (its running statistics
and its affine scale and shift), everything else stays shared.

Task t's rows are normalised with task t's own batch statistics in training and its own running statistics
outside it: ``y = gamma_t (x - mu_t) / sqrt(var_t + eps) + beta_t`` (the domain-specific BatchNorm of Rebuffi et
al., NeurIPS 2017, and of Bilen and Vedaldi, "Universal representations", 2017, without the adapters). The backbone
runs once per task (``per_task_backbone``) with the task selected. Each task's copy starts from the original
BatchNorm's values (a pretrained backbone's statistics and affine, or 1 and 0), and with ``distributed.sync_bn``
each copy is synchronised over the processes like any BatchNorm.
"""
import paddle

from mtl.architectures.base import Architecture
from mtl.core.errors import ConfigError
from mtl.core.registry import register_architecture

BATCH_NORMS = (paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D, paddle.nn.BatchNorm3D)


def copy_batchnorm(source):
    """A new BatchNorm of ``source``'s class and settings holding copies of its parameters and statistics."""
    affine = source.weight is not None
    layer = type(source)(int(source._mean.shape[0]), momentum=source._momentum, epsilon=source._epsilon,
                         weight_attr=None if affine else False, bias_attr=None if source.bias is not None else False,
                         data_format=source._data_format, use_global_stats=source._use_global_stats)
    for name in ("weight", "bias", "_mean", "_variance"):
        mine, theirs = getattr(layer, name), getattr(source, name)
        if theirs is not None:
            mine.set_value(theirs.numpy())
            mine.stop_gradient = theirs.stop_gradient
            if name in ("weight", "bias"):
                mine.optimize_attr = dict(theirs.optimize_attr)
    layer.training = source.training
    return layer


class TaskBatchNorm(paddle.nn.Layer):
    """One BatchNorm per task in place of one shared BatchNorm; ``active`` (a task index) picks the one used."""

    def __init__(self, source, count: int):
        super().__init__()
        self.by_task = paddle.nn.LayerList([copy_batchnorm(source) for _ in range(count)])
        self.active = 0

    def forward(self, x):
        return self.by_task[self.active](x)


def replace_layers(layer, wanted, make, prefix=""):
    """Replace every sub-layer of ``layer`` for which ``wanted(sub)`` by ``make(sub)``; return the new layers."""
    made = []
    for name, child in list(layer.named_children()):
        if wanted(child):
            new = make(child)
            layer.add_sublayer(name, new)
            made.append(new)
        else:
            made += replace_layers(child, wanted, make, f"{prefix}{name}.")
    return made


class TaskLayers(Architecture):
    """Base of architectures with task layers inside the backbone: it runs once per task, ``select`` names it."""

    per_task_backbone = True
    shares_backbone_output = False

    def __init__(self, feature_size: int, tasks, seed: int = 0, tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        self.switches = []  # the task layers inside the backbone (not sub-layers of the architecture: of the backbone)
        self.build_towers(self.input_size)

    def attach_norms(self, backbone):
        """Every BatchNorm of ``backbone`` as a :class:`TaskBatchNorm`; ConfigError when it has none."""
        norms = replace_layers(backbone, lambda sub: isinstance(sub, BATCH_NORMS),
                               lambda sub: TaskBatchNorm(sub, len(self.tasks)))
        if not norms:
            raise ConfigError(f"architecture '{self.registered_name}' makes the backbone's BatchNorms task-specific, "
                              f"but backbone '{backbone.registered_name}' has none (e.g. cnn, or mlp with "
                              f"batch_norm: true)", key="type")
        self.switches += norms

    @property
    def one_embedding(self) -> bool:
        """Every weight is shared but the task layers inside the backbone: one embedding unless towers follow."""
        return self.towers is None

    def select(self, task):
        """Every task layer of the backbone uses ``task``'s copy in the next pass."""
        index = self.index(task)
        for switch in self.switches:
            switch.active = index

    def mix(self, task, features):
        """The backbone's features (the task layers acted inside it)."""
        return features

    def backbone_task_parameters(self, backbone, task):
        """Task ``task``'s copies inside the backbone."""
        index = self.index(task)
        return [p for switch in self.switches for p in switch.by_task[index].parameters()]


@register_architecture("task_norm")
class TaskNorm(TaskLayers):
    """Every BatchNorm of the backbone per task (statistics and affine); everything else shared."""

    def attach(self, backbone):
        """Replace the backbone's BatchNorms by task BatchNorms."""
        self.attach_norms(backbone)
