"""IMTL-L: learned loss scales that drive every scaled loss to 1 (Liu et al., ICLR 2021)."""
from mtl.core.registry import register_weighting
from mtl.weighting.loss_based import LearnedLogScale


@register_weighting("imtl_l")
class IMTLL(LearnedLogScale):
    """IMTL-L, loss balance of Impartial Multi-Task Learning (Liu, Li, Kuang, Xue, Chen, Yang, Liao, Zhang, ICLR
    2021, "Towards impartial multi-task learning").

    Each task has a learned scale s_t (initially 0) and the objective exp(s_t) L_t - s_t: the network sees the loss
    multiplied by loss_weight_t exp(s_t); s_t then takes one SGD step of its own (learning rate ``lr``) on
    d/ds_t [exp(s_t) L_t - s_t] = exp(s_t) L_t - 1, with L_t the raw task loss, whose fixed point
    exp(s_t) L_t = 1 makes every scaled loss equal (the paper's aim, for any loss type)
    (:class:`~mtl.weighting.loss_based.LearnedLogScale` with sign +1).

    The paper and LibMTL learn s with the network's optimizer (s is a parameter of the model); here it has its own
    plain SGD step, as ``uncertainty`` does, so that the network's optimizer settings (momentum, weight decay) do
    not act on it. With s -> -s these dynamics equal ``uncertainty``'s (Kendall et al.'s exp(-s) L + s); DB-MTL
    (Lin et al. 2023) notes that IMTL-L at its exact minimiser is the logarithm transform log L_t.
    """

    description = "learned scales s_t: loss exp(s_t) L_t - s_t, every scaled loss driven to 1 (Liu et al. 2021)"
    sign = 1.0
    state_key = "log_scale"
