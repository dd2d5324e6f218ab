"""Exponential moving average of the weights, with the same API as the sliding-window ``WindowAverage``.

At update n = 1, 2, ... (``n - 1`` updates done before it) the decay is

    d_n = min(decay, (1 + (n - 1)) / (10 + (n - 1)))   with warmup   (0.1, 0.18, 0.25, ... up to ``decay``)
    d_n = decay                                         without

the shadow follows ``e_n = d_n * e_{n-1} + (1 - d_n) * p_n`` and so does the sum of its weights,
``W_n = d_n * W_{n-1} + (1 - d_n)``; the average is ``e_n / W_n``.

- ``bias_correction=True``: ``e_0 = 0``, ``W_0 = 0``, so ``W_n = 1 - prod_{i<=n} d_i`` (``1 - decay^n`` with a constant
  decay): the usual bias correction, exact while the decay warms up.
- ``bias_correction=False``: ``e_1 = p_1`` (the shadow starts as a copy of the weights) and ``W_1 = 1``, so
  ``W_n = 1``.

``W`` is tracked in float64 on the host with the factors the kernels really apply (``d_n`` and ``1 - d_n`` rounded
to float32), so dividing by it also cancels the drift that rounding would otherwise build up over ~1/(1 - decay)
steps (5e-5 relative at decay 0.999).

Memory: one float32 shadow per tracked parameter (on the device, or in host memory with ``offload="cpu"``), plus one
restore copy while ``apply()`` is active.
"""
from mtl.train.averaging.base import Averager, InvalidOption
from mtl.train.averaging.storage import accumulation_dtype


def warmed_decay(decay, updates_done, warmup=True) -> float:
    """Decay used by the next update after ``updates_done`` updates: ``min(decay, (1 + n) / (10 + n))`` if warmup."""
    if not warmup:
        return float(decay)
    return min(float(decay), (1.0 + updates_done) / (10.0 + updates_done))


class EMA(Averager):
    """Exponential moving average of the tracked weights (see the module docstring for the formulas).

    ``parameters``, ``offload``, ``average_batchnorm`` and ``buffers`` mean what they mean for ``WindowAverage``;
    ``decay`` must be in [0, 1).
    """

    peak_copies = 2  # the shadow and the restore copy (mtl.train.memory_plan)
    steady_copies = 1  # the shadow (the restore copy exists only while the averaged weights are applied)

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
        self.weight_sum = {}  # accumulation dtype -> W_n (float64)

    def _accumulate(self):
        d = warmed_decay(self.decay, self.num_updates, self.warmup)
        for slot in self._slots:
            shadow = slot.arrays.get("shadow")
            if shadow is None and not self.bias_correction:  # e_1 = p_1
                slot.arrays["shadow"] = self._store.copy(slot.param)
            elif shadow is None:  # e_1 = d * 0 + (1 - d) * p_1
                slot.arrays["shadow"] = self._store.blend_param_(self._store.zeros(slot.param), slot.param, d)
            else:  # e_n = d * e_{n-1} + (1 - d) * p_n
                self._store.blend_param_(shadow, slot.param, d)
        for dtype in {accumulation_dtype(slot.param) for slot in self._slots}:
            if self.num_updates == 0:
                self.weight_sum[dtype] = 0.0 if self.bias_correction else 1.0
            if self.num_updates > 0 or self.bias_correction:  # W_n = d * W_{n-1} + (1 - d), factors as applied
                kept, added = self._store.blend_factors(d, dtype)
                self.weight_sum[dtype] = kept * self.weight_sum[dtype] + added
        self.num_updates += 1

    def _average(self, slot):
        shadow = slot.arrays.get("shadow")
        if self.num_updates == 0 or shadow is None:
            return None
        return self._store.divide(shadow, self.weight_sum[accumulation_dtype(slot.param)])  # e_n / W_n

    def _array_keys(self):
        return ("shadow",)

    def _counters(self):
        return {"num_updates": self.num_updates, "weight_sum": dict(self.weight_sum)}

    def _set_counters(self, state):
        self.num_updates = int(state["num_updates"])
        self.weight_sum = {str(k): float(v) for k, v in state["weight_sum"].items()}
