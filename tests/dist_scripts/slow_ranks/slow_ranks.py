"""Heads that make one rank slower than the others on purpose (for the watchdog tests): rank 0's first evaluation
takes longer, as the verification sets that rank 0 alone evaluates do."""
import os
import time

from mtl.registry import plugin_class, register_head

SoftmaxHead = plugin_class("head", "softmax")


def rank() -> int:
    """This process's rank under the launcher (0 without one)."""
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


@register_head("slow_eval_softmax")
class SlowEvaluationSoftmax(SoftmaxHead):
    """The softmax head; rank 0 spends ``delay`` more seconds on its first evaluation, after the head's collectives.

    Args:
        delay (float): the seconds rank 0's first evaluation takes longer
    """

    def __init__(self, num_classes=None, feature_size=None, delay=8.0):
        super().__init__(num_classes=num_classes, feature_size=feature_size)
        self.delay, self.evaluated = float(delay), 0

    def evaluate(self, features, labels):
        metrics = super().evaluate(features, labels)
        self.evaluated += 1
        if self.evaluated == 1 and rank() == 0:
            time.sleep(self.delay)
        return metrics
