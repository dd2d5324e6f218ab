"""The rows the optimizer's row-sparse update receives, recorded per step (tests/test_partial_fc_update.py,
tests/test_partial_fc_adamw.py): read at that seam, before the step lets its rows go."""
from mtl.headkit.row_gradients import dense_gradient


def recorded_updates(trainer) -> list:
    """Per step, ``{parameter name: dense gradient}`` of the rows ``trainer``'s row-sparse update receives."""
    seen, update = [], trainer.optimizer.sparse.step

    def recording(rows, lr):
        seen.append({r.parameter.name: dense_gradient(r.parameter, [r]) for r in rows if r.grad is not None})
        return update(rows, lr)

    trainer.optimizer.sparse.step = recording
    return seen
