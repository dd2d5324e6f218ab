"""GradVac: gradient vaccine, pull each task gradient towards a running target similarity (Wang et al., ICLR 2021)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import check_range
from mtl.weighting.gradient_based import GradientWeighting

GRADVAC_STREAM = 0x6FAC  # the third entry of GradVac's generator key: (seed, step, GRADVAC_STREAM)


def _vaccinated(norm_i, cosine, target, norm_j):
    """The multiple of g_j that lifts cos(g_i', g_j) from ``cosine`` to ``target``:
    ||g_i'|| (target sqrt(1 - cosine^2) - cosine sqrt(1 - target^2)) / (||g_j|| sqrt(1 - target^2))."""
    return norm_i * (target * np.sqrt(1.0 - cosine ** 2) - cosine * np.sqrt(1.0 - target ** 2)) / (
        norm_j * np.sqrt(1.0 - target ** 2))


@register_weighting("gradvac")
class GradVac(GradientWeighting):
    """Gradient Vaccine (Wang, Tsvetkov, Firat, Cao, ICLR 2021, "Gradient vaccine: investigating and improving
    multi-task optimization in massively multilingual models"), Algorithm 1, on the whole shared gradient.

    For every present task i: g_i' = g_i; for each other present task j in a random order, with
    phi = cos(g_i', g_j) and the target phihat_ij (a moving average, initially 0): if phi < phihat_ij,
    g_i' <- g_i' + ||g_i'|| (phihat sqrt(1 - phi^2) - phi sqrt(1 - phihat^2)) / (||g_j|| sqrt(1 - phihat^2)) g_j,
    which sets cos(g_i', g_j) = phihat; then phihat_ij <- (1 - beta) phihat_ij + beta phi (with the phi measured
    before the change). The update is sum_i g_i'. As in PCGrad, g_i' = sum_k C_ik g_k is tracked through the T x T
    coefficients C on the Gram matrix and alpha_k = sum_i C_ik. The order draw is
    ``np.random.default_rng([seed, step, 0x6FAC])``: for i = 0..T-1 in task order, order_i = rng.permutation(T).
    State: phihat (T x T). With phihat = 0 (the first step) the correction is PCGrad's projection.

    Where we differ: a zero g_i' or g_j has no angle, so the pair is skipped (no change, phihat kept); LibMTL adds
    1e-8 to the denominators instead (its phihat then decays towards 0 on such pairs). A target of exactly 1 is
    skipped too (the formula divides by sqrt(1 - phihat^2) = 0). Granularity: the whole shared gradient (LibMTL's
    default ``group_type`` 0); the paper also applies it per layer.

    Parameters:
        beta (float): moving-average factor of the target cosines
    """

    description = "pull each gradient towards a moving-average target cosine (Wang et al. 2021)"

    def __init__(self, tasks, loss_weights, seed=0, beta=0.5):
        super().__init__(tasks, loss_weights, seed)
        self.beta = check_range("beta", beta, 0.0, 1.0, low_open=True)
        self.state = {"targets": np.zeros((self.num_tasks, self.num_tasks))}

    def combine(self, gram, losses, present, step):
        """alpha_k = sum_i C_ik after vaccinating every present g_i; updates phihat."""
        _, present, gram, index = self._combine_inputs(gram, losses, present)
        rng = self._rng(step, GRADVAC_STREAM)
        orders = [rng.permutation(self.num_tasks) for _ in range(self.num_tasks)]
        coefficients = np.eye(self.num_tasks)
        targets = self.state["targets"].copy()
        for i in index:
            for j in orders[i]:
                if j == i or not present[j]:
                    continue
                norm_i = np.sqrt(max(float(coefficients[i] @ gram @ coefficients[i]), 0.0))
                norm_j = np.sqrt(max(float(gram[j, j]), 0.0))
                if norm_i == 0.0 or norm_j == 0.0:
                    continue
                cosine = min(max(float(coefficients[i] @ gram[:, j]) / (norm_i * norm_j), -1.0), 1.0)
                if cosine < targets[i, j] < 1.0:
                    coefficients[i, j] += _vaccinated(norm_i, cosine, targets[i, j], norm_j)
                targets[i, j] = (1.0 - self.beta) * targets[i, j] + self.beta * cosine
        self.state["targets"] = targets
        return coefficients[present].sum(axis=0)
