"""Non-finite steps: every step checks the task losses and the global gradient norm, and all ranks decide alike.

Both numbers are global (a task's loss is the loss of its whole sub-batch, equal on every rank; the gradient norm
comes out of one all-reduce), so every rank reaches the same decision without another collective.
``on_nonfinite: stop`` (default) ends the job right after the first bad step, before its update, naming the step,
the task(s) whose loss is not finite (or "gradient") and the last good checkpoint; nothing is written from the bad
state. ``skip`` leaves weights, optimizer, averager and task weighting untouched for that step, counts it, and stops
after ``max_consecutive_nonfinite`` bad steps in a row.
"""
import math
from typing import Dict, List

from mtl.core.errors import MtlError


class NonFiniteError(MtlError):
    """A training step produced a non-finite loss or gradient and the job stops (exit status 2, one line)."""


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ..., ``11th``, ``12th``, ``13th``, ..., ``21st``, ``22nd``, ..."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class NonFiniteGuard:
    """Counts bad steps and decides, identically on every rank, whether the job goes on."""

    def __init__(self, action: str = "stop", max_consecutive: int = 10):
        self.action = action
        self.max_consecutive = int(max_consecutive)
        self.skipped = 0
        self.consecutive = 0

    @staticmethod
    def bad_losses(losses: Dict[str, float]) -> List[str]:
        """Tasks whose (global) loss is NaN or infinite."""
        return [task for task, value in losses.items() if not math.isfinite(value)]

    def good_step(self):
        """A step was applied: the run of bad steps is over."""
        self.consecutive = 0

    def bad_step(self, step: int, what: List[str], last_checkpoint):
        """Record a bad step (1-based ``step``); raise :class:`NonFiniteError` when the job must stop."""
        where = ("the gradient norm" if what == ["gradient"] else
                 "the loss of task(s) " + ", ".join(f"'{t}'" for t in what))
        resume = (f"the last good checkpoint is '{last_checkpoint}' (continue with --resume)" if last_checkpoint
                  else "no checkpoint was written yet")
        if self.action == "stop":
            raise NonFiniteError(f"step {step}: {where} is not finite; stopped before applying it (on_nonfinite: "
                                 f"stop); {resume}. A lower optimizer.lr, optimizer.clip_norm or on_nonfinite: skip "
                                 "may help")
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(f"step {step}: {where} is not finite for the {ordinal(self.consecutive)} step in a "
                                 f"row (max_consecutive_nonfinite {self.max_consecutive}); stopped; {resume}")

    def state_dict(self) -> dict:
        """Counts for the checkpoint."""
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def set_state_dict(self, state: dict):
        """Restore :meth:`state_dict` output."""
        self.skipped, self.consecutive = int(state["skipped"]), int(state["consecutive"])
