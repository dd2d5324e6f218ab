"""IMTL-L: learned loss scales that drive every scaled loss to 1 (Liu et al., ICLR 2021)."""
import numpy as np

from mtl.registry import register_weighting
from mtl.weighting.base import Weighting, check_range


@register_weighting("imtl_l")
class IMTLL(Weighting):
    """IMTL-L, loss balance of Impartial Multi-Task Learning (Liu, Li, Kuang, Xue, Chen, Yang, Liao, Zhang, ICLR
    2021, "Towards impartial multi-task learning").

    Each task has a learned scale s_t (initially 0) and the objective exp(s_t) L_t - s_t: the network sees the loss
    multiplied by loss_weight_t exp(s_t); s_t then takes one SGD step of its own (learning rate ``lr``) on
    d/ds_t [exp(s_t) L_t - s_t] = exp(s_t) L_t - 1, with L_t the raw task loss, whose fixed point
    exp(s_t) L_t = 1 makes every scaled loss equal (the paper's aim, for any loss type). Only present tasks are
    updated, so sample mode works.

    The paper and LibMTL learn s with the network's optimizer (s is a parameter of the model); here it has its own
    plain SGD step, as ``uncertainty`` does, so that the network's optimizer settings (momentum, weight decay) do
    not act on it. With s -> -s these dynamics equal ``uncertainty``'s (Kendall et al.'s exp(-s) L + s); DB-MTL
    (Lin et al. 2023) notes that IMTL-L at its exact minimiser is the logarithm transform log L_t.
    """

    description = "learned scales s_t: loss exp(s_t) L_t - s_t, every scaled loss driven to 1 (Liu et al. 2021)"

    def __init__(self, tasks, loss_weights, seed=0, lr=0.01):
        super().__init__(tasks, loss_weights, seed)
        self.lr = check_range("lr", lr, 0.0, low_open=True)
        self.state = {"log_scale": np.zeros(self.num_tasks)}

    def weights(self, losses, present, step):
        """w_t = loss_weight_t exp(s_t); then s_t <- s_t - lr (exp(s_t) L_t - 1) for present tasks."""
        losses, present = self._inputs(losses, present)
        s = self.state["log_scale"]
        scale = np.exp(s)
        gradient = scale * np.where(present, losses, 0.0) - 1.0
        self.state["log_scale"] = np.where(present, s - self.lr * gradient, s)
        return np.where(present, self.loss_weights * scale, 0.0)
