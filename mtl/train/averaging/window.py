"""Paddle's sliding-window model average (``paddle.incubate.ModelAverage``), with its dygraph pitfalls fixed.

Same constructor meaning and same averages as Paddle 3.3's ``average_accumulates`` kernel, step by step:

    num_updates += 1; num_accumulates += 1; sum_1 += param
    if num_updates % 16384 == 0:                        # precision fold
        sum_2 += sum_1; sum_1 = 0
    if num_accumulates >= min_window and num_accumulates >= min(max_window, int(float32(num_updates) * float32(rate))):
        sum_3 = sum_1 + sum_2; sum_1 = sum_2 = 0        # window restart
        old_num_accumulates = num_accumulates; num_accumulates = 0
    average = (sum_1 + sum_2 + sum_3) / (num_accumulates + old_num_accumulates)

The kernel runs in place, so the fold and the restart see ``sum_1`` with this step's value already added; the
threshold is a float32 product truncated to an integer (``std::min<int64_t>``). Both details matter for equality.

Memory (per tracked parameter, float32 sums): Paddle keeps sum_1, sum_2, sum_3 and a restore copy on the device
for the whole run (4 copies). Here the counters are Python integers shared by all tensors, sum_1 exists from the
first step, sum_3 from the first restart, and sum_2 only between a fold and the next restart (buffers are recycled:
a restart turns sum_1 into sum_3 and zeroes the old sum_3 as the new sum_1). So the device holds 2 copies in steady
state, 3 at most, plus 1 restore copy while ``apply()`` is active. With ``offload="cpu"`` all of it is host memory
and the device holds no extra copy; each step then moves the weights to the host.
"""
import numpy as np

from mtl.train.averaging.base import Averager, InvalidOption

FOLD_EVERY = 16384  # Paddle's kMaxNumAccumulates: sum_1 moves into sum_2 every this many updates


def restart_threshold(num_updates, rate, max_window) -> int:
    """``min(max_window, num_updates * rate)`` computed as Paddle's kernel does: float32 product, truncated."""
    return min(int(max_window), int(np.float32(num_updates) * np.float32(rate)))


class WindowAverage(Averager):
    """Sliding-window average of the weights with Paddle's semantics and none of its dygraph pitfalls.

    ``parameters``: a Layer, ``layer.named_parameters()`` or a dict name -> tensor (state is keyed by these
    names). ``average_window_rate``, ``min_average_window``, ``max_average_window``: as in
    ``paddle.incubate.ModelAverage``. ``offload``: None (sums next to the parameters) or "cpu" (sums and the
    restore copy in host memory). ``average_batchnorm``: average BatchNorm running statistics (and ``buffers``)
    too; by default they keep their live value. See ``Averager`` for what is tracked and ``apply()``.
    """

    peak_copies = 4  # sum_1, sum_2, sum_3 and the restore copy (mtl.train.memory_plan)
    # sum_1 and sum_3; sum_2 only from a precision fold (every FOLD_EVERY steps) to the next window restart, the
    # restore copy only while the averaged weights are applied (evaluation, saving): 4 needs both at once
    steady_copies = 2

    kind = "window"

    def __init__(self, parameters, average_window_rate, min_average_window=10000, max_average_window=10000,
                 offload=None, average_batchnorm=False, buffers=None):
        if isinstance(average_window_rate, bool) or not isinstance(average_window_rate, (int, float)) \
                or not average_window_rate >= 0:
            raise InvalidOption("average_window_rate", f"expected a number >= 0, got {average_window_rate!r}")
        for key, value in (("min_average_window", min_average_window), ("max_average_window", max_average_window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidOption(key, f"expected an integer >= 0, got {value!r}")
        if min_average_window > max_average_window:
            raise InvalidOption("min_average_window", f"{min_average_window} exceeds max_average_window "
                                                      f"{max_average_window}")
        super().__init__(parameters, offload=offload, average_batchnorm=average_batchnorm, buffers=buffers)
        self.average_window_rate = float(average_window_rate)
        self.min_average_window = int(min_average_window)
        self.max_average_window = int(max_average_window)
        self.num_updates = 0
        self.num_accumulates = 0
        self.old_num_accumulates = 0

    def _accumulate(self):
        store = self._store
        self.num_updates += 1
        self.num_accumulates += 1
        for slot in self._slots:  # sum_1 += param (created as a copy at the first step: 0 + p == p exactly)
            a = slot.arrays
            a["sum_1"] = store.copy(slot.param) if a.get("sum_1") is None else store.add_param_(a["sum_1"], slot.param)
        if self.num_updates % FOLD_EVERY == 0:  # sum_2 += sum_1; sum_1 = 0
            for slot in self._slots:
                a = slot.arrays
                if a.get("sum_2") is None:
                    a["sum_2"], a["sum_1"] = a["sum_1"], store.zeros(slot.param)
                else:
                    store.add_(a["sum_2"], a["sum_1"])
                    store.zero_(a["sum_1"])
        threshold = restart_threshold(self.num_updates, self.average_window_rate, self.max_average_window)
        if self.num_accumulates >= self.min_average_window and self.num_accumulates >= threshold:
            for slot in self._slots:  # sum_3 = sum_1 + sum_2; sum_1 = sum_2 = 0 (sum_2 is dropped until the next fold)
                a = slot.arrays
                if a.get("sum_2") is not None:
                    store.add_(a["sum_1"], a["sum_2"])
                old_sum_3 = a.get("sum_3")
                a["sum_3"] = a["sum_1"]
                a["sum_1"] = store.zeros(slot.param) if old_sum_3 is None else store.zero_(old_sum_3)
                a["sum_2"] = None
            self.old_num_accumulates = self.num_accumulates
            self.num_accumulates = 0

    def _average(self, slot):
        count = self.num_accumulates + self.old_num_accumulates
        if count == 0:
            return None
        a = slot.arrays
        # (sum_1 + sum_2 + sum_3) / (num_accumulates + old_num_accumulates); absent sums are zero
        return self._store.divide(self._store.total([a.get("sum_1"), a.get("sum_2"), a.get("sum_3")]), count)

    def _array_keys(self):
        return ("sum_1", "sum_2", "sum_3")

    def _counters(self):
        return {"num_updates": self.num_updates, "num_accumulates": self.num_accumulates,
                "old_num_accumulates": self.old_num_accumulates}

    def _set_counters(self, state):
        self.num_updates = int(state["num_updates"])
        self.num_accumulates = int(state["num_accumulates"])
        self.old_num_accumulates = int(state["old_num_accumulates"])
