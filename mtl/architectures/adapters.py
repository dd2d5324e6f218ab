"""Residual adapters (Rebuffi, Bilen and Vedaldi, "Learning multiple visual domains with residual adapters",
NeurIPS 2017): the backbone's convolutions are shared, every task adds a 1x1 convolution after each of them, and
every BatchNorm is the task's own.

For a shared convolution w with kernel > 1 and task t (Rebuffi et al., eq. 2 and Fig. 2: the adapter
g(x; alpha) = x + alpha * x after the convolution, then the task's BatchNorm):
    y = w * x,    y_t = y + alpha_t * y    (alpha_t: [C, C, 1, 1], task t's own),    then BN_t(y_t).
alpha_t starts at zero, so every task starts from the shared network; its gradient is the outer product of the
output gradient and y over rows and positions, different for every unit, so the adapters diverge from the first
step (a constant start is harmful only where units receive equal gradients, as in an MLP layer). The backbone runs
once per task (``per_task_backbone``).
"""
import paddle

from mtl.architectures.task_norm import TaskLayers, replace_layers
from mtl.core.errors import ConfigError
from mtl.core.registry import register_architecture


class AdaptedConv(paddle.nn.Layer):
    """A shared convolution followed by one residual 1x1 adapter per task (``active`` picks it)."""

    def __init__(self, conv, count: int):
        super().__init__()
        self.conv = conv
        channels = int(conv.weight.shape[0])
        zero = paddle.ParamAttr(initializer=paddle.nn.initializer.Constant(0.0))
        self.by_task = paddle.nn.LayerList([paddle.nn.Conv2D(channels, channels, 1, weight_attr=zero, bias_attr=False,
                                                             data_format=conv._data_format) for _ in range(count)])
        self.active = 0

    def forward(self, x):
        y = self.conv(x)
        return y + self.by_task[self.active](y)


def _adaptable(layer) -> bool:
    return isinstance(layer, paddle.nn.Conv2D) and max(layer._kernel_size) > 1


@register_architecture("adapters")
class Adapters(TaskLayers):
    """Shared convolutions with a task's residual 1x1 adapter after each, and task BatchNorms."""

    def attach(self, backbone):
        """Adapters after every convolution of kernel > 1, task BatchNorms everywhere."""
        adapted = replace_layers(backbone, _adaptable, lambda conv: AdaptedConv(conv, len(self.tasks)))
        if not adapted:
            raise ConfigError(f"architecture 'adapters' adds a task's 1x1 convolution after every convolution of "
                              f"kernel > 1, but backbone '{backbone.registered_name}' has none (use cnn, lenet, "
                              f"iresnet, ...)", key="type")
        self.switches += adapted
        self.attach_norms(backbone)
