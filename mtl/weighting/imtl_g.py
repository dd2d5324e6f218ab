"""IMTL-G: the update with equal projections on every task's unit gradient (Liu et al., ICLR 2021)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import check_representation, on_present, unit_gram
from mtl.weighting.gradient_based import GradientWeighting

RANK_TOLERANCE = 1e-10  # eigenvalues of the unit gradients' Gram matrix below this times the largest are dropped


def equal_projection_weights(gram):
    """alpha (summing to 1) with sum_t alpha_t g_t projecting equally on every unit gradient u_t = g_t / ||g_t||.

    With n_t = ||g_t|| and C = [<u_i, u_j>], the condition <g, u_t> = c for all t reads C beta = c 1 with
    beta_t = n_t alpha_t, so beta = C^+ 1 (pseudo-inverse: linearly dependent gradients, as in TorchJD's
    generalisation) and alpha = (beta / n) / s, s = sum_t beta_t / n_t. Zero gradients get 0; s = 0 (no common
    direction: opposite gradients) gives all 0.
    """
    norms, usable, correlation = unit_gram(gram, unit_diagonal=False)
    alpha = np.zeros(gram.shape[0])
    if usable.size == 0:
        return alpha
    n = norms[usable]
    values, vectors = np.linalg.eigh(correlation)
    keep = values > RANK_TOLERANCE * values.max()
    beta = vectors[:, keep] @ ((vectors[:, keep].T @ np.ones(usable.size)) / values[keep])
    ratio = beta / n
    total = float(ratio.sum())
    if abs(total) <= 1e-12 * float(np.abs(ratio).sum()):
        return alpha
    alpha[usable] = ratio / abs(total)
    return alpha


@register_weighting("imtl_g")
class IMTLG(GradientWeighting):
    """IMTL-G, gradient balance of Impartial Multi-Task Learning (Liu, Li, Kuang, Xue, Chen, Yang, Liao, Zhang,
    ICLR 2021, "Towards impartial multi-task learning").

    alpha with sum_t alpha_t = 1 such that g = sum_t alpha_t g_t has the same projection on every unit gradient
    u_t: the paper's closed form alpha_{2:T} = g_1 U^T (D U^T)^-1 with D = [g_1 - g_t], U = [u_1 - u_t]
    (t = 2..T), computed here as its equivalent C^+ 1 on the unit gradients (see
    :func:`equal_projection_weights`), which also covers linearly dependent gradients: two identical directions of
    norms a and b get alpha = (b, a) / (a + b), the limit of the closed form.

    Where we differ: (1) when sum_t beta_t / n_t < 0 the paper's normalisation sum_t alpha_t = 1 flips the
    direction so that every task's loss would increase (g projects to c < 0 on every u_t); we divide by |s|
    instead, keeping the direction of equal positive projections. (2) The paper computes the gradients with respect
    to the shared feature for efficiency (LibMTL offers both, ``rep_grad``); here they are by default those of the
    shared parameters: in this project every task scores its own rows (unless ``schedule.same_rows``), so the
    feature's Gram matrix would be diagonal and IMTL-G would reduce to alpha_t proportional to 1 / ||g_t||.
    ``representation: true`` takes the paper's: under ``schedule.same_rows`` (one encoder pass for every task, the
    text recipes) the feature's Gram matrix pairs the tasks, and the step costs one backbone backward instead of one
    per task. (3) TorchJD's generalisation uses K^+ n on the unscaled Gram matrix, which for identical directions of
    norms a and b gives (a, b) / (a + b), not the closed form's limit.

    Parameters:
        representation (bool): the gradients of the shared features (the backbone's output), not parameters (the
            paper's; with schedule.same_rows)
    """

    description = "equal projection of the update on every unit task gradient (Liu et al. 2021)"

    def __init__(self, tasks, loss_weights, seed=0, representation=False):
        super().__init__(tasks, loss_weights, seed)
        self.uses_representation = check_representation(representation)

    def combine(self, gram, losses, present, step):
        """alpha of IMTL-G over the present tasks (0 for absent ones)."""
        _, _, gram, index = self._combine_inputs(gram, losses, present)
        return on_present(equal_projection_weights, gram, index)
