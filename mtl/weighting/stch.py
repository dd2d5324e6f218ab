"""STCH: smooth Tchebycheff scalarization of the normalised log losses (Lin et al., ICML 2024)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import Weighting, check_integer, check_range, masked_softmax

TINY = 1e-20  # log(L / nadir + 1e-20), as in the authors' code


@register_weighting("stch")
class STCH(Weighting):
    """Smooth Tchebycheff scalarization (Lin, Zhang, Yang, Liu, Wang, Zhang, ICML 2024, "Smooth Tchebycheff
    scalarization for multi-objective optimization"), as the authors apply it to multi-task learning.

    g_mu = mu log sum_t exp(lambda_t (f_t - z_t) / mu), a smooth maximum of the preference-weighted objectives
    (mu -> 0: Tchebycheff's max), times the number m of present tasks, on f_t = log(L_t) with the ideal point
    z_t = log(nadir_t), i.e. on log(L_t / nadir_t + 1e-20); the preference lambda_t is the task's loss_weight. Its
    gradient gives the loss multipliers w_t = m softmax_t(lambda (f - z) / mu) lambda_t / (L_t + 1e-20 nadir_t).
    Schedule (steps, from 0): for ``warmup_steps`` steps, then ``nadir_steps`` more, the objective is
    sum_t lambda_t log(L_t + 1e-20) (w_t = lambda_t / (L_t + 1e-20)); during the second span each task's losses are
    averaged into nadir_t; from then on the STCH weights. Without a nadir span (``nadir_steps: 0``) nadir_t = 1.
    State: the loss sums and counts of the nadir span.

    The authors' code (also in LibMTL) counts the warm-up in epochs (4, then the nadir averaged over the 5th);
    here both spans are in steps, so set them to your epoch length. mu = 1 is their default.

    Parameters:
        mu (float): smoothing of the maximum (towards 0: Tchebycheff's max)
        warmup_steps (int): steps of the plain log-loss objective before the nadir span
        nadir_steps (int): steps whose losses are averaged into each task's nadir point (0: nadir 1)
    """

    description = "smooth max of the nadir-normalised log losses (Lin et al. 2024)"
    sample_mode = False

    def __init__(self, tasks, loss_weights, seed=0, mu=1.0, warmup_steps=0, nadir_steps=0):
        super().__init__(tasks, loss_weights, seed)
        self.mu = check_range("mu", mu, 0.0, low_open=True)
        self.warmup_steps = check_integer("warmup_steps", warmup_steps, 0)
        self.nadir_steps = check_integer("nadir_steps", nadir_steps, 0)
        self.state = {"loss_sums": np.zeros(self.num_tasks), "loss_counts": np.zeros(self.num_tasks)}

    def _nadir(self):
        """The mean loss of every task over the nadir span (1 where the span saw none of it)."""
        counts = self.state["loss_counts"]
        mean = self.state["loss_sums"] / np.maximum(counts, 1.0)
        return np.where((counts > 0) & (mean > 0), mean, 1.0)

    def weights(self, losses, present, step):
        """The log-loss multipliers during the warm-up (averaging the nadir in its second span), then STCH's."""
        losses, present = self._inputs(losses, present)
        observed = np.where(present, losses, 0.0)
        step = int(step)
        if step < self.warmup_steps + self.nadir_steps:
            if step >= self.warmup_steps:
                self.state["loss_sums"] = self.state["loss_sums"] + observed
                self.state["loss_counts"] = self.state["loss_counts"] + present
            return np.where(present, self.loss_weights / (observed + TINY), 0.0)
        nadir = self._nadir()
        normalised = np.log(observed / nadir + TINY)
        share = masked_softmax(self.loss_weights * normalised / self.mu, present)
        return present.sum() * share * self.loss_weights / (observed + TINY * nadir)
