"""Base of the strategies that need the [T, P] per-task gradient matrix itself, not only its Gram matrix.

GradDrop (an element-wise sign dropout) and DB-MTL (an exponential moving average of the per-task gradient vectors)
cannot be written as sum_t alpha_t g_t of this step's gradients. The trainer hands them the matrix that
``ParallelStrategy.task_gradients`` already builds and sums over the processes (row t: the gradient of
loss_weight_t L_t with respect to the shared parameters; rows of absent tasks are zero), as float32 numpy, equal on
every rank; they return the shared gradient [P]. Their random draws come from (seed, step) and their state is
float64 numpy, so every rank computes the same vector. Memory: the trainer's T x P float32 buffer, its numpy copy,
and whatever state the strategy keeps (documented per strategy).
"""
import numpy as np

from mtl.weighting.base import Weighting


class GradientMatrixWeighting(Weighting):
    """Base of the strategies that combine the per-task gradient matrix; loss multipliers stay ``loss_weight``."""

    needs_gradients = True
    needs_gradient_matrix = True
    sample_mode = False

    def weights(self, losses, present, step):
        """Heads are scaled by their static loss_weight (0 if absent); the backbone gets ``combine_matrix``'s."""
        return self._present_loss_weights(losses, present)

    def _matrix_inputs(self, matrix, losses, present):
        """``(losses, present, matrix)`` validated: the matrix has one row per task. Non-finite entries are passed
        on (the trainer skips a step whose gradient is not finite and restores the strategy's state)."""
        losses, present = self._inputs(losses, present)
        matrix = np.asarray(matrix)
        if matrix.ndim != 2 or matrix.shape[0] != self.num_tasks:
            raise ValueError(f"weighting '{self.name}': expected a gradient matrix with {self.num_tasks} rows, "
                             f"got shape {matrix.shape}")
        return losses, present, matrix
