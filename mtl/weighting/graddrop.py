"""GradDrop: gradient sign dropout, keep one sign per shared coordinate at random (Chen et al., NeurIPS 2020)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import per_task
from mtl.weighting.matrix_based import GradientMatrixWeighting

GRADDROP_STREAM = 0x6D0  # the third entry of GradDrop's generator key: (seed, step, GRADDROP_STREAM)


@register_weighting("graddrop")
class GradDrop(GradientMatrixWeighting):
    """Gradient sign dropout (Chen, Ngiam, Huang, Luong, Kretzschmar, Chai, Anguelov, NeurIPS 2020, "Just pick a
    sign: optimizing deep multitask models with gradient sign dropout"), Algorithm 1 with f the identity.

    Per shared coordinate k: the positive sign purity P_k = 1/2 (1 + sum_i g_ik / sum_i |g_ik|) (1/2 where every
    g_ik = 0), a uniform draw U_k, and task i keeps its g_ik when (P_k > U_k and g_ik > 0) or (P_k < U_k and
    g_ik < 0): M_ik in {0, 1}. The shared gradient is sum_i (l_i + (1 - l_i) M_i) * g_i, with l_i the task's
    ``leak`` (one number, or one per task, in [0, 1]; 0 by default). So where all tasks agree in sign nothing is
    dropped, and where they conflict the sign with more mass survives more often. U = ``np.random.default_rng(
    [seed, step, 0x6D0]).random(P)`` (float64), the same on every rank and after a resume; no state.

    Memory: the [T, P] gradient matrix the trainer passes, plus three float64 vectors of P (purity, U, result).

    Where we differ: the paper applies GradDrop to the gradient of the last shared activation A, with the per-task
    signal sign(A) * dL_i/dA summed over the batch; in this project each task scores its own rows, so tasks never
    share an activation, and the rule is applied to the shared parameters' per-task gradients instead (as TorchJD's
    aggregator does on the Jacobian; LibMTL implements only the activation form).

    Parameters:
        leak (list|float): the share of each task's gradient never dropped, in [0, 1] (one number, or one per task)
    """

    description = "keep one gradient sign per shared coordinate, drawn by sign purity (Chen et al. 2020)"

    def __init__(self, tasks, loss_weights, seed=0, leak=0.0):
        super().__init__(tasks, loss_weights, seed)
        self.leak = per_task("leak", leak, self.num_tasks, 0.0, 1.0)

    def combine_matrix(self, matrix, losses, present, step):
        """sum_i (l_i + (1 - l_i) M_i) * g_i over the present tasks, M from the purity and this step's draw."""
        _, present, matrix = self._matrix_inputs(matrix, losses, present)
        index = np.flatnonzero(present)
        total = np.zeros(matrix.shape[1])
        mass = np.zeros(matrix.shape[1])
        for i in index:
            row = matrix[i].astype(np.float64)
            total += row
            mass += np.abs(row)
        purity = 0.5 * (1.0 + np.divide(total, mass, out=np.zeros_like(total), where=mass > 0.0))
        draw = self._rng(step, GRADDROP_STREAM).random(matrix.shape[1])
        positive, negative = purity > draw, purity < draw
        combined = np.zeros(matrix.shape[1])
        for i in index:
            row = matrix[i].astype(np.float64)
            keep = (positive & (row > 0.0)) | (negative & (row < 0.0))
            combined += (self.leak[i] + (1.0 - self.leak[i]) * keep) * row
        return combined
