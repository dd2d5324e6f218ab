"""Mixed precision: the backbone in bf16/fp16 through ``paddle.amp``, heads and class centres in float32, and a
dynamic loss scaler whose overflow decision every rank takes alike.

* ``precision: fp32 | bf16 | fp16``: the backbone's forward runs under ``paddle.amp.auto_cast`` (``amp_level`` O1:
  white-listed ops in low precision; O2: the whole backbone, with float32 master weights kept by the optimizer).
  Its features are cast to float32 before the heads: the margin, the cross-shard softmax and the class centres
  stay in float32.
* Paddle's CPU build has no bf16/fp16 matmul kernel (``auto_cast`` leaves CPU math in float32), so on the CPU the job
  runs in float32 and says so in one line. The loss scaler does not depend on the device and runs as configured.
* fp16 loss scaling (Micikevicius et al. 2018): losses are multiplied by ``s`` before the backward and gradients by
  ``1/s`` after it. An overflow is a non-finite global gradient norm, which every rank already computes from the
  same all-reduce: all ranks skip the same steps and lower the same scale (per-rank ``found_inf`` is how
  insightface issue 2200 and PLSC issue 112 on GitHub ended with different weights per rank). ``s`` is multiplied by
  ``backoff`` on an overflow and by ``growth`` after ``growth_interval`` good steps in a row.
"""
import contextlib

from mtl.core.errors import ConfigError

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def compute_dtype(precision: str, device: str):
    """``(paddle dtype name or None for float32, notice or None)`` for ``precision`` on ``device`` (``cpu``,
    ``gpu:N``)."""
    if precision == "fp32":
        return None, None
    if not device.startswith("gpu"):
        return None, (f"precision {precision}: Paddle's CPU build has no {DTYPES[precision]} matmul kernel, so this "
                      f"job runs in float32" + (" (loss scaling stays on)" if precision == "fp16" else ""))
    import paddle

    supported = paddle.amp.is_bfloat16_supported() if precision == "bf16" else paddle.amp.is_float16_supported()
    if not supported:
        return None, f"precision {precision}: this GPU does not support {DTYPES[precision]}; running in float32"
    return DTYPES[precision], None


class Autocast:
    """The context the backbone's forward runs in (a no-op in float32)."""

    def __init__(self, dtype=None, level="O1"):
        self.dtype, self.level = dtype, level

    def prepare(self, backbones, optimizer):
        """O2: cast the weights of ``backbones`` (the backbone and an architecture's copies of it) to the low
        precision, with float32 master weights in ``optimizer`` (Paddle's optimizer over every parameter of the
        job). Nothing to do in float32 or O1."""
        if self.dtype is not None and self.level == "O2":
            import paddle

            paddle.amp.decorate(models=list(backbones), optimizers=optimizer, level="O2", dtype=self.dtype,
                                master_weight=True)

    def __call__(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        import paddle

        return paddle.amp.auto_cast(enable=True, level=self.level, dtype=self.dtype)


class LossScaler:
    """Dynamic loss scale, agreed by every rank because its only input is the global gradient norm."""

    def __init__(self, init=32768.0, growth=2.0, backoff=0.5, growth_interval=1000, minimum=1.0):
        if not (init > 0 and growth > 1 and 0 < backoff < 1 and growth_interval >= 1 and minimum > 0):
            raise ConfigError("loss_scale needs init > 0, growth > 1, 0 < backoff < 1, growth_interval >= 1 and "
                              "min > 0", key="loss_scale")
        self.scale = float(init)
        self.growth, self.backoff, self.minimum = float(growth), float(backoff), float(minimum)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0
        self.overflows = 0

    def overflow(self) -> bool:
        """A non-finite gradient: lower the scale; True when the step is an overflow to skip, False when the scale
        is already at its minimum (the non-finite value is real: the non-finite guard decides)."""
        if self.scale <= self.minimum:
            return False
        self.scale = max(self.minimum, self.scale * self.backoff)
        self.good_steps = 0
        self.overflows += 1
        return True

    def good_step(self):
        """An applied step: grow the scale after ``growth_interval`` of them in a row."""
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict:
        """Scale and counters for the checkpoint."""
        return {"scale": self.scale, "good_steps": self.good_steps, "overflows": self.overflows}

    def set_state_dict(self, state: dict):
        """Restore :meth:`state_dict` output."""
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
        self.overflows = int(state["overflows"])


def build_precision(cfg: dict, device: str, console=print):
    """``(Autocast, LossScaler or None)`` from the job's ``precision``, ``amp_level`` and ``loss_scale`` keys."""
    dtype, notice = compute_dtype(cfg["precision"], device)
    if notice:
        console(notice)
    scaler = None
    if cfg["precision"] == "fp16":
        s = cfg["loss_scale"]
        scaler = LossScaler(s["init"], s["growth"], s["backoff"], s["growth_interval"], s["min"])
    return Autocast(dtype, cfg["amp_level"]), scaler
