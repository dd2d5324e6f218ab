"""Everything a resume needs, saved and restored in one place.

A :class:`TrainingState` holds the pieces of a run whose state must come back for a resumed run to equal one that
never stopped: the joint model (backbone, heads, each rank's BatchNorm statistics), the optimizer (with the
learning-rate schedule and Partial FC's row state), the averager, the random state, the step schedule, the task
weighting, the non-finite guard, the fp16 loss scale and the model's step hooks. :meth:`save` writes a checkpoint of
a step (:mod:`mtl.store.checkpoint` lays out the files), :meth:`restore` reads one back; nothing else saves or
restores.
"""
import logging
from typing import NamedTuple, Optional

from mtl.core.errors import ConfigError
from mtl.store import checkpoint

log = logging.getLogger("mtl")


class Restored(NamedTuple):
    """What :meth:`TrainingState.restore` read: the checkpoint's step, the steps its run was to train (None in a
    checkpoint written before they were recorded) and the processes that wrote it."""

    step: int
    total_steps: Optional[int]
    world_size: int


class TrainingState:
    """The resumable state of a run (module docstring); ``keep``: checkpoints kept on disk."""

    def __init__(self, model, optimizer, schedule, strategy, balancer, guard, averager=None, scaler=None, keep=3,
                 total_steps=None):
        self.model, self.optimizer, self.schedule, self.strategy = model, optimizer, schedule, strategy
        self.balancer, self.guard, self.averager, self.scaler, self.keep = balancer, guard, averager, scaler, keep
        self.total_steps = total_steps  # the run's schedule.steps, recorded in every checkpoint

    def _small_state(self) -> dict:
        """The state equal on every rank, kept in ``state.json``: task weighting, guard, loss scale."""
        extra = {"weighting": self.balancer.state_dict(), "nonfinite": self.guard.state_dict()}
        if self.total_steps is not None:
            extra["total_steps"] = int(self.total_steps)
        if self.scaler is not None:
            extra["loss_scale"] = self.scaler.state_dict()
        for hook in self.model.step_hooks:
            extra[hook.name] = hook.state_dict()
        return extra

    def save(self, output_dir: str, step: int) -> str:
        """Write the checkpoint of ``step`` (collective: every rank calls it); its folder."""
        return checkpoint.save(output_dir, step, self.model, self.optimizer, self.schedule, self.strategy,
                               self.averager, keep=self.keep, extra=self._small_state())

    def restore(self, path: str, total_steps: int, source=None) -> Restored:
        """Read the checkpoint ``path`` back into every piece; the step it was written at and the steps its run was
        to train (a ConfigError when the step is beyond ``total_steps``, the job's ``schedule.steps``)."""
        state = checkpoint.load(path, self.model, self.optimizer, self.schedule, self.averager, self.strategy.rank,
                                self.strategy.world)
        if "weighting" in state:
            self.balancer.set_state_dict(state["weighting"])
        if "nonfinite" in state:
            self.guard.set_state_dict(state["nonfinite"])
        if "loss_scale" in state and self.scaler is not None:
            self.scaler.set_state_dict(state["loss_scale"])
        for hook in self.model.step_hooks:
            if hook.name in state:
                hook.set_state_dict(state[hook.name])
        if state["step"] > total_steps:
            raise ConfigError(f"the latest checkpoint '{path}' is at step {state['step']}, beyond this job's "
                              f"schedule.steps {total_steps}", source, "schedule.steps")
        return Restored(int(state["step"]), state.get("total_steps"), int(state.get("world_size", 1)))
