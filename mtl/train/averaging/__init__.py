"""Weight averaging for evaluation and export: Paddle's sliding window (``WindowAverage``, with the averages of
``paddle.incubate.ModelAverage``) and an ``EMA``.

Both share one API, made to be wired into a training loop::

    averager = build_averager(job["averaging"], model)      # or WindowAverage(model, 0.15, 3, 8)
    for batch in batches:
        loss.backward(); optimizer.step(); optimizer.clear_grad()
        averager.step()                                      # every tracked tensor, gradient or not
    with averager.apply():                                   # averaged weights inside, live ones restored after
        evaluate(model)
    checkpoint["averaging"] = averager.state_dict()          # keyed by structured parameter name

What differs from ``paddle.incubate.ModelAverage`` (same averages otherwise): state is keyed by the structured
parameter names, not auto-generated ones; ``apply()`` before any step, and a tensor with nothing accumulated, keep
the live weights (no 0/0 NaN); a nested ``apply()`` raises instead of losing the live weights; BatchNorm running
statistics keep their live value unless ``average_batchnorm=True``; float16/bfloat16 weights accumulate in float32
and get their own dtype back; the sums can live in host memory (``offload="cpu"``) and the restore copy exists
only while ``apply()`` is active. Averaging needs no communication: each rank averages its own head shard.
"""
from mtl.train.averaging.base import Averager, InvalidOption, collect_tensors
from mtl.train.averaging.config import build_averager
from mtl.train.averaging.ema import EMA
from mtl.train.averaging.window import WindowAverage

__all__ = ["Averager", "EMA", "InvalidOption", "WindowAverage", "build_averager", "collect_tensors"]
