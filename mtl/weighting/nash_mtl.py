"""Nash-MTL: the update as the Nash bargaining solution among the tasks (Navon et al., ICML 2022)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.allocation import fair_weights
from mtl.weighting.base import check_integer, check_range, on_present, within_norm
from mtl.weighting.gradient_based import GradientWeighting


@register_weighting("nash_mtl")
class NashMTL(GradientWeighting):
    """Nash-MTL (Navon, Shamsian, Achituve, Maron, Kawaguchi, Chechik, Fetaya, ICML 2022, "Multi-task learning as a
    bargaining game"), Algorithm 1.

    alpha > 0 solves G^T G alpha = 1 / alpha (element-wise) over the present tasks; the update is
    d = G alpha = sum_t alpha_t g_t, which maximises sum_t log <g_t, d> on the ball ||d||^2 <= T: every task gets
    <g_t, d> = 1 / alpha_t and ||d||^2 = T exactly, whatever the gradients' scale. Solved to rounding by damped
    Newton (:func:`mtl.weighting.allocation.fair_weights`, a = 1). A zero gradient gets alpha_t = 0; when no
    direction improves every task (the origin in the hull of the unit gradients, e.g. opposite gradients) the update
    is 0. ``update_weights_every`` k: alpha is solved at steps 0, k, 2k, ... and reused in between (state
    ``alpha``). ``max_norm`` > 0 scales d down to that norm when longer (0: off, the paper).

    Differences from the common implementations, where we follow the paper: the authors' code, LibMTL and TorchJD
    divide G^T G by its Frobenius norm N before solving (the update is then sqrt(N) times the paper's), run at most
    20 convex-concave steps of ECOS from the previous alpha and stop at a residual of 1e-3 (so alpha depends on the
    history), and clip the shared gradient to max_norm 1.0 by default.

    Parameters:
        max_norm (float): scale the update down to this norm when longer (0: off)
        update_weights_every (int): solve the bargaining weights every this many steps (reused in between)
    """

    description = "Nash bargaining solution G^T G alpha = 1/alpha, solved exactly (Navon et al. 2022)"

    def __init__(self, tasks, loss_weights, seed=0, max_norm=0.0, update_weights_every=1):
        super().__init__(tasks, loss_weights, seed)
        self.max_norm = check_range("max_norm", max_norm, 0.0)
        self.every = check_integer("update_weights_every", update_weights_every, 1)
        self.state = {"alpha": np.zeros(self.num_tasks)}

    def combine(self, gram, losses, present, step):
        """alpha of the bargaining solution (solved this step or reused), scaled to ``max_norm`` if set."""
        _, present, gram, index = self._combine_inputs(gram, losses, present)
        if int(step) % self.every == 0:
            self.state["alpha"] = on_present(lambda block: fair_weights(block, 1.0), gram, index)
        return within_norm(np.where(present, self.state["alpha"], 0.0), gram, self.max_norm)
