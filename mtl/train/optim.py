"""Optimizer, learning-rate schedule and gradient clipping from the job's ``optimizer`` section."""
import math

import paddle

from mtl.parallel import distributed


def build_lr(cfg: dict, total_steps: int):
    """Warm-up (linear from 0) followed by cosine / step / constant decay, as a ``paddle.optimizer.lr`` scheduler.

    cosine: lr_t = min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2 over the T = steps - warmup steps after warm-up.
    """
    lr = cfg["lr"]
    decay_steps = max(1, total_steps - cfg["warmup_steps"])
    if cfg["decay"] == "cosine":
        sched = paddle.optimizer.lr.CosineAnnealingDecay(lr, T_max=decay_steps, eta_min=cfg["min_lr"])
    elif cfg["decay"] == "step":
        sched = paddle.optimizer.lr.StepDecay(lr, step_size=cfg["step_size"], gamma=cfg["gamma"])
    else:
        sched = lr
    if cfg["warmup_steps"] > 0:
        sched = paddle.optimizer.lr.LinearWarmup(sched, warmup_steps=cfg["warmup_steps"], start_lr=0.0, end_lr=lr)
    elif not isinstance(sched, paddle.optimizer.lr.LRScheduler):
        sched = paddle.optimizer.lr.LambdaDecay(lr, lambda _: 1.0)
    return sched


def build_optimizer(cfg: dict, parameters, total_steps: int):
    """(optimizer, lr scheduler) for ``parameters``; clipping is done by :func:`clip_grad_global_norm`."""
    sched = build_lr(cfg, total_steps)
    kind = cfg["type"]
    wd = cfg["weight_decay"]
    if kind == "sgd":
        opt = paddle.optimizer.SGD(sched, parameters=parameters, weight_decay=wd or None)
    elif kind == "momentum":
        opt = paddle.optimizer.Momentum(sched, momentum=cfg["momentum"], parameters=parameters,
                                        weight_decay=wd or None)
    else:
        opt = paddle.optimizer.AdamW(sched, beta1=cfg["betas"][0], beta2=cfg["betas"][1], parameters=parameters,
                                     weight_decay=wd)
    return opt, sched


@paddle.no_grad()
def clip_grad_global_norm(replicated, sharded, max_norm: float) -> float:
    """Scale all gradients so that the global norm over every rank's parameters is at most ``max_norm``.

    norm^2 = sum over replicated grads (identical on every rank after the gradient sync) + all-reduce SUM over
    ranks of the sharded grads' squares; scale = max_norm / max(norm, max_norm). Returns the norm before clipping.
    """
    def sq(params):
        total = paddle.zeros([], dtype="float32")
        for p in params:
            if p.grad is not None:
                total += paddle.sum(paddle.square(p.grad.astype("float32")))
        return total

    norm_sq = sq(replicated) + distributed.all_reduce_sum(sq(sharded))
    norm = float(paddle.sqrt(norm_sq))
    if norm > max_norm and math.isfinite(norm):
        scale = max_norm / norm
        for p in list(replicated) + list(sharded):
            if p.grad is not None:
                p.grad.scale_(scale)
    return norm
