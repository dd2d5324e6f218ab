"""Row-sparse optimizer update for Partial FC: only the sampled class centres and their momentum change.

Paddle's optimizers update every row of a parameter that has a gradient, so a Partial FC head that let the optimizer
own its weight would (a) hold a dense [C_k, D] gradient and (b) keep moving rows that were not sampled, through their
momentum. Instead the head scores a detached copy of the sampled rows (its gradient is [K, D]) and applies, on those
rows only, the update Paddle's ``Momentum`` (L2 ``weight_decay``) / ``SGD`` would apply:

    g' = g + weight_decay * w;   v = momentum * v + g';   w = w - lr * v        (SGD: momentum 0, no v kept)
"""
import paddle


@paddle.no_grad()
def row_sparse_momentum_(weight, velocity, index, grad, lr, momentum=0.9, weight_decay=0.0):
    """Update rows ``index`` of ``weight`` (and of ``velocity``, if given) in place from their gradient ``grad``."""
    if index.shape[0] == 0:
        return
    rows = paddle.gather(weight, index)
    step = grad.astype(rows.dtype)
    if weight_decay:
        step = step + weight_decay * rows
    if velocity is not None and momentum:
        step = momentum * paddle.gather(velocity, index) + step
        paddle.scatter_(velocity, index, step, overwrite=True)
    paddle.scatter_(weight, index, rows - lr * step, overwrite=True)


def check_optimizer(cfg, what):
    """Partial FC supports the optimizers whose row-wise update is written above; say so at start-up otherwise."""
    from mtl.errors import ConfigError

    if cfg["type"] not in ("sgd", "momentum"):
        raise ConfigError(f"{what} uses Partial FC (sample_ratio < 1), which updates only the sampled class centres "
                          f"and supports optimizer.type sgd or momentum, not {cfg['type']!r}", key="optimizer.type")
