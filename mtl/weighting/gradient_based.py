"""Gradient-based weighting: GradNorm and PCGrad, expressed through the Gram matrix of per-task gradients.

g_t is the gradient of loss_weight_t * L_t with respect to the shared (backbone) parameters, summed over the
processes; gram[i, j] = <g_i, g_j>. ``combine`` returns alpha with the applied shared gradient sum_t alpha_t g_t, so
the trainer never moves a T x |theta| matrix to numpy. Heads keep their own task gradient, scaled by ``weights``.
"""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import Weighting, check_range

PCGRAD_STREAM = 0x9C6  # the third entry of PCGrad's generator key: (seed, step, PCGRAD_STREAM)
WEIGHT_FLOOR = 1e-6  # GradNorm keeps every task weight at least this (a negative weight would flip a task)


class GradientWeighting(Weighting):
    """Base of the strategies that combine per-task shared gradients; loss multipliers stay ``loss_weight``."""

    needs_gradients = True
    sample_mode = False

    def weights(self, losses, present, step):
        """Heads are scaled by their static loss_weight (0 if absent); the backbone gets ``combine``'s result."""
        return self._present_loss_weights(losses, present)


@register_weighting("gradnorm")
class GradNorm(GradientWeighting):
    """GradNorm (Chen, Badrinarayanan, Lee, Rabinovich, ICML 2018): learned task weights w_t (initially 1).

    This step uses the current w for the heads (``weights``: loss_weight_t w_t) and the backbone (alpha = w).
    Then G_t = w_t ||g_t||, Gbar = mean_t G_t, Ltilde_t = L_t / L_t(0) (L_t(0): the task's first loss),
    r_t = Ltilde_t / mean_i Ltilde_i, target_t = Gbar r_t^alpha (held constant), and w takes one SGD step (``lr``)
    on L_grad = sum_t |G_t - target_t|:  dL_grad / dw_t = sign(G_t - target_t) ||g_t||; finally w is kept at least
    1e-6 and renormalised to sum_t w_t = T. Means run over the present tasks.
    Note: ||g_t|| = sqrt(gram_tt) is the norm over ALL shared parameters; the paper uses the last shared layer only.

    Parameters:
        alpha (float): strength of the pull towards equal training rates (0: equal gradient norms)
        lr (float): learning rate of the task weights
    """

    description = "learned weights balancing gradient norms by training rates (Chen et al. 2018)"

    def __init__(self, tasks, loss_weights, seed=0, alpha=1.5, lr=0.025):
        super().__init__(tasks, loss_weights, seed)
        self.alpha = check_range("alpha", alpha, 0.0)
        self.lr = check_range("lr", lr, 0.0, low_open=True)
        self.state = {"task_weights": np.ones(self.num_tasks), "initial_losses": np.full(self.num_tasks, np.nan)}

    def weights(self, losses, present, step):
        """loss_weight_t w_t for present tasks (w as of this step, before ``combine`` updates it)."""
        _, present = self._inputs(losses, present)
        return np.where(present, self.loss_weights * self.state["task_weights"], 0.0)

    def combine(self, gram, losses, present, step):
        """Return alpha = w (0 for absent tasks), then update w by one GradNorm step."""
        losses, present = self._inputs(losses, present)
        gram = self._gram(gram, present)
        w = self.state["task_weights"]
        alpha = np.where(present, w, 0.0)
        if not present.any():
            return alpha
        first = present & np.isnan(self.state["initial_losses"])
        self.state["initial_losses"] = np.where(first, losses, self.state["initial_losses"])
        norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
        grad_norms = w * norms  # G_t
        initial = self.state["initial_losses"]
        usable = present & (initial > 0)
        training_rate = np.where(usable, losses / np.where(usable, initial, 1.0), 1.0)  # Ltilde_t
        mean_rate = training_rate[present].mean()
        relative = training_rate / mean_rate if mean_rate > 0 else np.ones(self.num_tasks)  # r_t
        target = grad_norms[present].mean() * np.maximum(relative, 0.0) ** self.alpha
        step_w = np.where(present, w - self.lr * np.sign(grad_norms - target) * norms, w)
        step_w = np.maximum(step_w, WEIGHT_FLOOR)
        self.state["task_weights"] = step_w * (self.num_tasks / step_w.sum())
        return alpha


@register_weighting("pcgrad")
class PCGrad(GradientWeighting):
    """PCGrad, gradient surgery (Yu, Kumar, Gupta, Levine, Hausman, Finn, NeurIPS 2020), Algorithm 1.

    For every present task i: g_i' = g_i, then for each other present task j in a random order, if
    <g_i', g_j> < 0 (a conflict with the ORIGINAL g_j): g_i' <- g_i' - <g_i', g_j> / ||g_j||^2 g_j.
    The applied gradient is sum_i g_i'. Since every g_i' is a linear combination of the g_k, we track the T x T
    coefficients C (g_i' = sum_k C_ik g_k, C = I at the start; <g_i', g_j> = (C gram)_ij) and return
    alpha_k = sum_i C_ik. The order of the i does not matter (each g_i' only meets original g_j); the random order
    of the j does. It is drawn from ``np.random.default_rng([seed, step, 0x9C6])``: for i = 0..T-1 in task order,
    order_i = rng.permutation(T) (absent tasks and i itself are skipped). A zero g_j never projects.
    """

    description = "project away conflicting gradient components (Yu et al. 2020)"

    def combine(self, gram, losses, present, step):
        """alpha_k = sum_i C_ik after the projections of every present g_i."""
        _, present = self._inputs(losses, present)
        gram = self._gram(gram, present)
        rng = self._rng(step, PCGRAD_STREAM)
        orders = [rng.permutation(self.num_tasks) for _ in range(self.num_tasks)]
        coefficients = np.eye(self.num_tasks)
        for i in np.flatnonzero(present):
            for j in orders[i]:
                if j == i or not present[j]:
                    continue
                dot = float(coefficients[i] @ gram[:, j])  # <g_i', g_j>
                if dot < 0.0 and gram[j, j] > 0.0:
                    coefficients[i, j] -= dot / gram[j, j]
        return coefficients[present].sum(axis=0)
