"""DB-MTL: log-transformed losses and moving-average gradients rescaled to the largest norm (Lin et al. 2023)."""
import numpy as np

from mtl.core.errors import ConfigError, ParameterError
from mtl.core.registry import register_weighting
from mtl.weighting.base import check_range
from mtl.weighting.matrix_based import GradientMatrixWeighting

LOG_EPS = 1e-8  # log(L + eps), as in the authors' code


@register_weighting("db_mtl")
class DBMTL(GradientMatrixWeighting):
    """Dual-Balancing Multi-Task Learning (Lin, Jiang, Ye, Zhang, Chen, Chen, Liu, Tsang, Kwok 2023,
    "Dual-balancing for multi-task learning"), Algorithm 1.

    Loss-scale balancing: every task trains on log(L_t + 1e-8): its head's loss multiplier is
    loss_weight_t / (L_t + 1e-8) (the gradient of loss_weight_t log(L_t + eps)). Gradient-magnitude balancing: the
    shared parameters' gradient of that log loss, h_t = g_t / (L_t + eps) (g_t: the gradient of loss_weight_t L_t,
    a row of the [T, P] matrix), enters a moving average hhat_t <- beta_k hhat_t + (1 - beta_k) h_t (hhat = 0
    initially; beta_k = beta / k^sigma at the k-th update, ``beta_sigma`` = sigma), and the shared gradient is
    sum_t (max_s ||hhat_s|| / ||hhat_t||) hhat_t over the present tasks: every task's averaged gradient is rescaled
    to the largest norm (a zero hhat_t contributes nothing). Absent tasks keep their hhat_t.

    State and memory: hhat is T x P float64 (8 T P bytes, 2x the trainer's float32 gradient matrix; the trainer also
    keeps a copy of it during each step to undo a step whose gradient is not finite, and it is saved in every
    checkpoint's state.json, base64-encoded: about 11 T P bytes), plus the update count k.

    As LibMTL's implementation (by the paper's first author): hhat starts at 0 without bias correction, so the first
    updates are (1 - beta) times smaller. Defaults beta = 0.9 and sigma = 0 are LibMTL's.

    Parameters:
        beta (float): moving-average factor of the log losses' gradients
        beta_sigma (float): sigma of beta_k = beta / k^sigma (0: a constant beta)
    """

    description = "log losses, moving-average gradients rescaled to the largest norm (Lin et al. 2023)"

    def __init__(self, tasks, loss_weights, seed=0, beta=0.9, beta_sigma=0.0):
        super().__init__(tasks, loss_weights, seed)
        self.beta = check_range("beta", beta, 0.0, 1.0)
        if self.beta >= 1.0:
            raise ParameterError(f"parameter 'beta' must be a number >= 0.0 and < 1.0, got {beta!r}")
        self.beta_sigma = check_range("beta_sigma", beta_sigma, 0.0)
        self.state = {"average": np.zeros((self.num_tasks, 0)), "updates": 0}

    def weights(self, losses, present, step):
        """loss_weight_t / (L_t + eps) for present tasks: their heads train on the log of their loss."""
        losses, present = self._inputs(losses, present)
        return np.where(present, self.loss_weights / (np.where(present, losses, 0.0) + LOG_EPS), 0.0)

    def combine_matrix(self, matrix, losses, present, step):
        """Update hhat with this step's log-loss gradients; return sum_t (max ||hhat|| / ||hhat_t||) hhat_t."""
        losses, present, matrix = self._matrix_inputs(matrix, losses, present)
        average = self.state["average"]
        if average.shape[1] != matrix.shape[1]:
            if average.shape[1]:
                raise ValueError(f"weighting 'db_mtl': the saved moving average has {average.shape[1]} shared "
                                 f"parameters, the backbone {matrix.shape[1]}")
            average = np.zeros((self.num_tasks, matrix.shape[1]))
        self.state["updates"] = int(self.state["updates"]) + 1
        beta = self.beta / self.state["updates"] ** self.beta_sigma
        index = np.flatnonzero(present)
        for t in index:  # in place, row by row: no second T x P array
            average[t] *= beta
            average[t] += (1.0 - beta) / (losses[t] + LOG_EPS) * matrix[t].astype(np.float64)
        self.state["average"] = average
        norms = np.array([np.sqrt(float(average[t] @ average[t])) for t in index])
        if not np.all(np.isfinite(norms)):  # a non-finite gradient: pass it on to the trainer's guard (which undoes
            return np.full(matrix.shape[1], np.nan)  # this step's update of the average)
        combined = np.zeros(matrix.shape[1])
        for t, norm in zip(index, norms):
            if norm > 0.0:
                combined += (norms.max() / norm) * average[t]
        return combined

    def set_state_dict(self, state):
        """Restore a saved state; the moving average keeps the saved number of columns (the backbone's size)."""
        average = np.asarray(state.get("average", np.zeros((0, 0))), dtype=np.float64)
        if average.ndim != 2 or average.shape[0] != self.num_tasks:
            raise ConfigError(f"weighting 'db_mtl': saved state 'average' has shape {average.shape}, expected "
                              f"{self.num_tasks} rows (one per task: were tasks added or removed?)", key="weighting")
        self.state["average"] = np.zeros_like(average)
        super().set_state_dict({**state, "average": average})
