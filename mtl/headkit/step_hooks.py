"""Step hooks: what joins several heads inside a training step, seen by the loop and the weighting through one
interface (cross-head negatives, :mod:`mtl.headkit.cross_negatives`, is one).

The joint model holds a list of hooks (``JointModel.step_hooks``); the step, the weighting, the checkpoint and the
trainer iterate it and never ask which feature a hook is:

* ``begin_step(step)``: a training step starts (what an earlier step left unsettled, a skipped one, is dropped);
* ``needs_step_samples``: the hook reads the heads' class samples of the step before their forward, so the joint
  model has every head draw its sample first (``Head.prepare_step``) at every step, not only accumulated ones;
* ``rescale(task, factor)``: a weighting strategy scaled ``task``'s gradients by ``factor``; what the hook holds of
  that task's loss is scaled alike;
* ``settle()``: after the backward and the weighting, once per step: gradients the hook holds go where they belong
  (a dense ``weight.grad``), and the row declarations it returns
  (:class:`mtl.headkit.row_gradients.RowGradient`) go to the optimizer with the heads' own;
* ``state_dict()`` / ``set_state_dict(state)``: what a resumed run needs, saved under ``name`` in the checkpoint;
* ``describe()``: a line for the console and the log at the start (empty: nothing to say);
* ``finish(output_dir, gather_texts, is_main)``: at the end of training (every rank calls it; ``gather_texts(text)``
  returns every rank's text on the main one): a line for the console, or "".
"""
from typing import Callable, List


class StepHook:
    """Base of step hooks (module docstring): every method does nothing by default."""

    name = ""
    needs_step_samples = False

    def begin_step(self, step: int):
        """A training step starts."""

    def rescale(self, task: str, factor: float):
        """Scale what the hook holds of ``task``'s loss by ``factor``."""

    def settle(self) -> List:
        """Once per step, after the backward and the weighting: the row declarations for the optimizer."""
        return []

    def state_dict(self) -> dict:
        """What a resumed run needs (JSON-able, equal on every rank)."""
        return {}

    def set_state_dict(self, state: dict):
        """Restore :meth:`state_dict` output."""

    def describe(self) -> str:
        """A line on what the hook does, said at the start (empty: nothing)."""
        return ""

    def finish(self, output_dir: str, gather_texts: Callable[[str], list], is_main: bool) -> str:
        """At the end of training (every rank): a line for the console, or ""."""
        return ""
