"""A regression head that raises on rank 1 at its third step (for the failure test)."""
from mtl.core.registry import plugin_class, register_head
from mtl.parallel import distributed

RegressionHead = plugin_class("head", "regression")


@register_head("failing_regression")
class FailingRegression(RegressionHead):
    """Raises RuntimeError on rank 1 at the third forward."""

    calls = 0

    def forward(self, features, labels):
        FailingRegression.calls += 1
        if distributed.rank() == 1 and FailingRegression.calls == 3:
            raise RuntimeError("deliberate failure on rank 1")
        return super().forward(features, labels)
