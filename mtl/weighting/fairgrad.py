"""FairGrad: the update as an alpha-fair allocation of improvement among the tasks (Ban & Ji, ICML 2024)."""

from mtl.core.registry import register_weighting
from mtl.weighting.allocation import fair_weights
from mtl.weighting.base import check_range, on_present, within_norm
from mtl.weighting.gradient_based import GradientWeighting


@register_weighting("fairgrad")
class FairGrad(GradientWeighting):
    """FairGrad (Ban & Ji, ICML 2024, "Fair resource allocation in multi-task learning").

    The update d = G w = sum_t w_t g_t maximises the alpha-fair utility sum_t <g_t, d>^(1-alpha) / (1-alpha)
    (sum_t log <g_t, d> for alpha = 1) on a ball; its weights w > 0 solve G^T G w = w^(-1/alpha) (element-wise),
    so task t gets the improvement <g_t, d> = w_t^(-1/alpha). alpha = 1 is Nash-MTL's bargaining solution,
    alpha -> infinity approaches max-min fairness. Solved to rounding by damped Newton
    (:func:`mtl.weighting.allocation.fair_weights`); a zero gradient gets w_t = 0 and Pareto-stationary tasks
    (no direction improves all of them) get no update. The update's length is not normalised:
    ||d||^2 = sum_t w_t^(1 - 1/alpha) (one task: ||d|| = ||g||^((1 - alpha)/(1 + alpha))), so alpha > 1 lengthens
    it as the gradients shrink; ``max_norm`` > 0 scales d down to that norm when longer (0: off, the paper).

    Differences from the common implementations, where we follow the paper: the authors' code and LibMTL solve the
    system with scipy's ``least_squares`` from w = 1/T at its default tolerances (about 1e-8 relative, and bounded
    by w >= 0 rather than w > 0), and the authors' code multiplies the update by T "to match the sum loss"; here
    the system is solved exactly and the update is d = G w as in the paper.

    Parameters:
        alpha (float): fairness: 1 is Nash-MTL's bargaining solution, larger approaches max-min fairness
        max_norm (float): scale the update down to this norm when longer (0: off)
    """

    description = "alpha-fair allocation G^T G w = w^(-1/alpha), solved exactly (Ban & Ji 2024)"

    def __init__(self, tasks, loss_weights, seed=0, alpha=1.0, max_norm=0.0):
        super().__init__(tasks, loss_weights, seed)
        self.alpha = check_range("alpha", alpha, 0.0, low_open=True)
        self.max_norm = check_range("max_norm", max_norm, 0.0)

    def combine(self, gram, losses, present, step):
        """w of the alpha-fair allocation over the present tasks (0 for absent ones), scaled to ``max_norm``."""
        _, _, gram, index = self._combine_inputs(gram, losses, present)
        weights = on_present(lambda block: fair_weights(block, self.alpha), gram, index)
        return within_norm(weights, gram, self.max_norm)
