"""Loss-based weighting strategies: the weights depend on the global task losses only.

Every rank sees the same global losses, so every rank computes the same weights; scaling a task's loss scales its
head's and the backbone's gradients alike. The state is a few numbers per task.
"""
import numpy as np

from mtl.core.errors import ParameterError
from mtl.core.registry import register_weighting
from mtl.weighting.base import Weighting, check_range, masked_softmax, per_task

RLW_STREAM = 0x5217  # the third entry of RLW's generator key: (seed, step, RLW_STREAM)


@register_weighting("static")
class Static(Weighting):
    """Fixed weights: every present task's loss is multiplied by its ``loss_weight`` (the default)."""

    description = "fixed loss_weight per task (default)"
    uses_losses = False

    def weights(self, losses, present, step):
        """w_t = loss_weight_t for present tasks, 0 for absent ones."""
        return self._present_loss_weights(losses, present)


class LearnedLogScale(Weighting):
    """Base of a learned scale per task: the loss multiplier is loss_weight_t exp(sign s_t) (s_t initially 0) and
    s_t takes one SGD step of its own per step (learning rate ``lr``) on the per-task objective
    exp(sign s_t) L_t - sign s_t, whose derivative is sign (exp(sign s_t) L_t - 1) (L_t the raw task loss), after
    this step's weights are taken. Only present tasks are updated, so sample mode works. ``sign`` and the state's
    key are the subclass's: uncertainty (-1, ``log_variance``), IMTL-L (+1, ``log_scale``).

    The range: one step moves s_t by at most ``max_step`` and s_t stays in [-``bound``, ``bound``] (weights within
    exp(+-bound) of loss_weight_t). The derivative is unbounded on one side (a loss of 5e4 at lr 0.01 would move
    s_t by 500 and set that task's weight to exp(-500) = 0, and the way back is at most lr per step: 50,000 steps);
    with the defaults such a step moves s_t by 1 (the weight drops by exp(-1), never to 0) and the task is back
    within 10 % of its weight in about 300 steps at lr 0.01. Steps smaller than ``max_step`` (lr L_t < 1 for the
    usual losses) are the paper's exactly.

    Parameters:
        lr (float): learning rate of the scales' own SGD step
        max_step (float): the most one step moves a scale
        bound (float): the scales stay in [-bound, bound]
    """

    sign = 1.0
    state_key = "log_scale"

    def __init__(self, tasks, loss_weights, seed=0, lr=0.01, max_step=1.0, bound=10.0):
        super().__init__(tasks, loss_weights, seed)
        self.lr = check_range("lr", lr, 0.0, low_open=True)
        self.max_step = check_range("max_step", max_step, 0.0, low_open=True)
        self.bound = check_range("bound", bound, 0.0, low_open=True)
        self.state = {self.state_key: np.zeros(self.num_tasks)}

    def weights(self, losses, present, step):
        """w_t = loss_weight_t exp(sign s_t); then s_t <- clip(s_t - clip(lr sign (exp(sign s_t) L_t - 1),
        +-max_step), +-bound) for present tasks."""
        losses, present = self._inputs(losses, present)
        s = self.state[self.state_key]
        scale = np.exp(self.sign * s)
        gradient = self.sign * (scale * np.where(present, losses, 0.0) - 1.0)
        moved = np.clip(s - np.clip(self.lr * gradient, -self.max_step, self.max_step), -self.bound, self.bound)
        self.state[self.state_key] = np.where(present, moved, s)
        return np.where(present, self.loss_weights * scale, 0.0)


@register_weighting("uncertainty")
class Uncertainty(LearnedLogScale):
    """Homoscedastic uncertainty weighting (Kendall, Gal, Cipolla, CVPR 2018).

    Each task has a learned log-variance s_t (initially 0); the per-task objective is exp(-s_t) L_t + s_t, so the
    loss weight is loss_weight_t * exp(-s_t). After this step's weights are taken, s_t makes one SGD step of its own
    (learning rate ``lr``) on d/ds_t [exp(-s_t) L_t + s_t] = 1 - exp(-s_t) L_t, with L_t the raw task loss; its fixed
    point is s_t = log L_t (:class:`LearnedLogScale` with sign -1).
    """

    description = "learned log-variances s_t: weight exp(-s_t) (Kendall et al. 2018)"
    sign = -1.0
    state_key = "log_variance"


@register_weighting("dwa")
class DynamicWeightAverage(Weighting):
    """Dynamic Weight Average (Liu, Johns, Davison, CVPR 2019, "End-to-end multi-task learning with attention").

    w_t(k) = T exp(r_t(k-1) / temperature) / sum_i exp(r_i(k-1) / temperature),  r_t(k-1) = Lbar_t(k-1) / Lbar_t(k-2)

    where Lbar_t(k) is the mean loss of task t over window k (steps [k W, (k+1) W), W = ``window``; W = 1 compares
    single steps, the paper's window is an epoch). The weights are 1 in windows 0 and 1 (no ratio yet). The softmax
    runs over the tasks present in the step (T is then their number); a ratio that cannot be formed (a task absent
    for a whole window, a zero mean loss) counts as 1. Final weight: loss_weight_t * w_t.

    Parameters:
        temperature (float): softmax temperature of the loss-descent ratios (larger: weights closer to 1)
        window (int): steps per window whose mean losses are compared (the paper: an epoch)
    """

    description = "softmax of loss-descent ratios over windows (Liu et al. 2019)"
    sample_mode = False

    def __init__(self, tasks, loss_weights, seed=0, temperature=2.0, window=1):
        super().__init__(tasks, loss_weights, seed)
        self.temperature = check_range("temperature", temperature, 0.0, low_open=True)
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ParameterError(f"parameter 'window' must be an integer >= 1 (steps per window), got {window!r}")
        self.window = int(window)
        nan = np.full(self.num_tasks, np.nan)
        self.state = {"window_index": 0, "sums": np.zeros(self.num_tasks), "counts": np.zeros(self.num_tasks),
                      "last_mean": nan.copy(), "before_last_mean": nan.copy()}

    def _advance(self, index):
        """Close the windows before ``index``: shift the window means (empty windows give NaN)."""
        state = self.state
        gap = index - state["window_index"]
        if gap < 0:
            raise ValueError(f"weighting 'dwa': step went back to window {index} after window {state['window_index']}")
        if gap == 0:
            return
        counts = state["counts"]
        mean = np.where(counts > 0, state["sums"] / np.maximum(counts, 1), np.nan)
        nan = np.full(self.num_tasks, np.nan)
        state["before_last_mean"], state["last_mean"] = {1: (state["last_mean"], mean), 2: (mean, nan)}.get(
            gap, (nan, nan))
        state["window_index"] = index
        state["sums"], state["counts"] = np.zeros(self.num_tasks), np.zeros(self.num_tasks)

    def weights(self, losses, present, step):
        """The weights of window step // W from the two previous windows; this step's losses join the window."""
        losses, present = self._inputs(losses, present)
        self._advance(int(step) // self.window)
        last, before = self.state["last_mean"], self.state["before_last_mean"]
        valid = np.isfinite(last) & np.isfinite(before) & (before > 0)
        ratio = np.where(valid, last / np.where(valid, before, 1.0), 1.0)
        w = present.sum() * masked_softmax(ratio / self.temperature, present)
        self.state["sums"] = self.state["sums"] + np.where(present, losses, 0.0)
        self.state["counts"] = self.state["counts"] + present
        return self.loss_weights * w


@register_weighting("rlw")
class RandomLossWeighting(Weighting):
    """Random loss weighting (Lin et al., TMLR 2022, "Reasonable effectiveness of random weighting").

    Every step draws z ~ N(0, I_T) from ``np.random.default_rng([seed, step, 0x5217])`` (the same on every rank and
    after a resume; one draw per task whether present or not) and uses w = softmax(z) over the present tasks, so
    the weights sum to 1 as in the paper (one task present: weight 1). Final weight: loss_weight_t * w_t. No state.
    """

    description = "softmax of a normal draw from (seed, step) (Lin et al. 2022)"
    uses_losses = False

    def weights(self, losses, present, step):
        """w = softmax(z) over present tasks, z ~ N(0, I) drawn from (seed, step)."""
        _, present = self._inputs(losses, present)
        z = self._rng(step, RLW_STREAM).standard_normal(self.num_tasks)
        return self.loss_weights * masked_softmax(z, present)


@register_weighting("famo")
class FastAdaptiveMultitask(Weighting):
    """FAMO (Liu, Liu, Stone, Liu, NeurIPS 2023, "FAMO: Fast adaptive multitask optimization"), Algorithm 1.

    Logits xi (initially 0), z = softmax(xi), D_i = max(L_i - b_i, 0) + 1e-8 with b = ``min_losses`` (the 1e-8 as in
    the authors' code). The step follows the gradient of sum_i z_i log D_i, rescaled: loss weights
    c z_i / D_i with c = (sum_i z_i / D_i)^-1 (they sum to 1), times loss_weight_i.
    Logit update, once per step and before this step's weights: delta_i = log D_i(previous step) - log D_i(this
    step), xi <- xi - w_lr (J_z^T delta + gamma xi), J_z = diag(z) - z z^T the softmax Jacobian at the current xi.
    The paper measures delta with an extra forward pass on the same batch after the update; we use the O(1) form
    with a one-step lag instead: the losses of the next step (another batch) measure the effect of the previous
    update, so no extra forward is needed. Tasks not present in both steps get delta 0; the softmax of the weights
    runs over the present tasks.

    Parameters:
        w_lr (float): learning rate of the weight logits
        gamma (float): decay of the weight logits (regularisation towards equal weights)
        min_losses (list|float): b_t, the lowest loss each task can reach (one number for all, or one per task)
    """

    description = "adaptive log-loss weights, O(1) per step (Liu et al. 2023)"
    sample_mode = False

    def __init__(self, tasks, loss_weights, seed=0, w_lr=0.025, gamma=0.001, min_losses=0.0):
        super().__init__(tasks, loss_weights, seed)
        self.w_lr = check_range("w_lr", w_lr, 0.0, low_open=True)
        self.gamma = check_range("gamma", gamma, 0.0)
        self.min_losses = per_task("min_losses", min_losses, self.num_tasks)
        self.state = {"logits": np.zeros(self.num_tasks), "previous_log_loss": np.full(self.num_tasks, np.nan)}

    def weights(self, losses, present, step):
        """Update xi from the previous step's log-losses, then w_i = c z_i / D_i over the present tasks."""
        losses, present = self._inputs(losses, present)
        shifted = np.maximum(np.where(present, losses, 1.0) - self.min_losses, 0.0) + 1e-8  # D_i
        log_loss = np.where(present, np.log(shifted), np.nan)
        previous = self.state["previous_log_loss"]
        both = np.isfinite(previous) & present
        if both.any():
            xi = self.state["logits"]
            z = masked_softmax(xi, np.ones(self.num_tasks, dtype=bool))
            delta = np.where(both, previous - np.where(both, log_loss, 0.0), 0.0)
            jacobian_t_delta = z * (delta - np.dot(z, delta))  # (diag(z) - z z^T) delta
            self.state["logits"] = xi - self.w_lr * (jacobian_t_delta + self.gamma * xi)
        self.state["previous_log_loss"] = log_loss
        if not present.any():
            return np.zeros(self.num_tasks)
        inverse_loss = masked_softmax(self.state["logits"], present) / shifted  # z_i / D_i (0 where absent)
        return self.loss_weights * inverse_loss / inverse_loss.sum()
