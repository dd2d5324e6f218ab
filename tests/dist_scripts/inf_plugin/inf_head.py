"""Test plug-in: a softmax head whose feature gradient becomes inf on one rank at one step (an fp16 overflow)."""
from paddle.autograd import PyLayer

from mtl.core.registry import plugin_class, register_head
from mtl.parallel import distributed

SoftmaxHead = plugin_class("head", "softmax")


class _InfGradient(PyLayer):
    """Identity forward; backward multiplies the gradient by ``factor`` (inf to inject an overflow)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor


@register_head("inf_softmax")
class InfSoftmaxHead(SoftmaxHead):
    """Softmax head that injects an infinite feature gradient on rank ``inf_rank`` at step ``inf_step``."""

    uses_step = True  # forward(features, labels, step)

    def __init__(self, num_classes=None, feature_size=None, inf_step=5, inf_rank=1, seed=0):
        super().__init__(num_classes, feature_size, seed=seed)
        self.inf_step, self.inf_rank = int(inf_step), int(inf_rank)

    def forward(self, features, labels, step=None):
        hit = self.training and step == self.inf_step and distributed.rank() == self.inf_rank
        return super().forward(_InfGradient.apply(features, float("inf") if hit else 1.0), labels)

