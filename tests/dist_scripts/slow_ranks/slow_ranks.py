"""Heads that make one rank slower than the others on purpose (for the watchdog tests): rank 0's first evaluation
takes longer, as the verification sets that rank 0 alone evaluates do; or rank 1 writes its checkpoint files later,
as a rank with a larger part does."""
import faulthandler
import os
import signal
import time

from mtl.core.registry import plugin_class, register_head

SoftmaxHead = plugin_class("head", "softmax")
ArcFaceHead = plugin_class("head", "arcface")


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


@register_head("slow_save_arcface")
class SlowSaveArcFace(ArcFaceHead):
    """The ArcFace head; rank 1 spends ``delay`` more seconds on its first checkpoint (its shard's weights, asked for
    by the checkpoint alone). Every rank prints its threads' stacks on SIGUSR1 (where a waiting rank waits).

    Args:
        delay (float): the seconds rank 1's first checkpoint takes longer
        scale (float): the head's scale
    """

    def __init__(self, num_classes=None, feature_size=None, delay=5.0, scale=8.0):
        super().__init__(num_classes=num_classes, feature_size=feature_size, scale=scale)
        self.delay, self.saved = float(delay), 0
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def state_dict(self, *args, **kwargs):
        self.saved += 1
        if self.saved == 1 and rank() == 1:
            time.sleep(self.delay)
        return super().state_dict(*args, **kwargs)
