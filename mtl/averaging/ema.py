"""Exponential moving average of the weights, with the same API as the sliding-window ``ModelAverage``.

At update n = 1, 2, ... (``n - 1`` updates done before it) the decay is

    d_n = min(decay, (1 + (n - 1)) / (10 + (n - 1)))   with warmup   (0.1, 0.18, 0.25, ... up to ``decay``)
    d_n = decay                                         without

and the shadow ``e`` follows ``e_n = d_n * e_{n-1} + (1 - d_n) * p_n``.

- ``bias_correction=True``: ``e_0 = 0`` and the average is ``e_n / (1 - prod_{i<=n} d_i)``; with a constant decay
  the denominator is the usual ``1 - decay^n``, and the product form stays exact while the decay warms up.
  The weights of the ``p_i`` then sum to one for every n.
- ``bias_correction=False``: ``e_1 = p_1`` (the shadow starts as a copy of the weights) and the average is ``e_n``.

Memory: one float32 shadow per tracked parameter (on the device, or in host memory with ``offload="cpu"``), plus one
restore copy while ``apply()`` is active.
"""
from .base import Averager, InvalidOption


def warmed_decay(decay, updates_done, warmup=True) -> float:
    """Decay used by the next update after ``updates_done`` updates: ``min(decay, (1 + n) / (10 + n))`` if warmup."""
    if not warmup:
        return float(decay)
    return min(float(decay), (1.0 + updates_done) / (10.0 + updates_done))


class EMA(Averager):
    """Exponential moving average of the tracked weights (see the module docstring for the formulas).

    ``parameters``, ``offload``, ``average_batchnorm`` and ``buffers`` mean what they mean for ``ModelAverage``;
    ``decay`` must be in [0, 1).
    """

    kind = "ema"

    def __init__(self, parameters, decay=0.999, warmup=True, bias_correction=True, offload=None,
                 average_batchnorm=False, buffers=None):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise InvalidOption("decay", f"expected a number in [0, 1), got {decay!r}")
        super().__init__(parameters, offload=offload, average_batchnorm=average_batchnorm, buffers=buffers)
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.bias_correction = bool(bias_correction)
        self.num_updates = 0
        self.decay_product = 1.0  # prod_{i<=n} d_i, kept in float64 on the host

    def _accumulate(self):
        d = warmed_decay(self.decay, self.num_updates, self.warmup)
        for slot in self._slots:
            shadow = slot.arrays.get("shadow")
            if shadow is None:
                if self.bias_correction:  # e_1 = d * 0 + (1 - d) * p_1
                    shadow = self._store.blend_param_(self._store.zeros(slot.param), slot.param, d)
                else:  # e_1 = p_1
                    shadow = self._store.copy(slot.param)
                slot.arrays["shadow"] = shadow
            else:  # e_n = d * e_{n-1} + (1 - d) * p_n
                self._store.blend_param_(shadow, slot.param, d)
        self.num_updates += 1
        self.decay_product *= d

    def _average(self, slot):
        shadow = slot.arrays.get("shadow")
        if self.num_updates == 0 or shadow is None:
            return None
        if not self.bias_correction:
            return self._store.total([shadow])
        return self._store.divide(shadow, 1.0 - self.decay_product)  # e_n / (1 - prod d_i)

    def _array_keys(self):
        return ("shadow",)

    def _counters(self):
        return {"num_updates": self.num_updates, "decay_product": self.decay_product}

    def _set_counters(self, state):
        self.num_updates = int(state["num_updates"])
        self.decay_product = float(state["decay_product"])
