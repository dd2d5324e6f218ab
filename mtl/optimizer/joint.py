"""The job's optimizer: learning-rate schedule, Paddle's dense optimizer, the row-sparse update, structured state."""
import warnings

import numpy as np
import paddle

from mtl.config.keys import resolve_milestones
from mtl.optimizer.sparse import RowSparseOptimizer, StepRows


def _decay(cfg: dict, total_steps: int):
    """The schedule after warm-up (``t`` counts from the end of the warm-up, ``T = steps - warmup``), or the
    constant ``lr``:

    cosine: lr_t = min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2;  linear: lr_t = (lr - min_lr) (1 - t / T) + min_lr
    (BERT's and transformers' get_linear_schedule_with_warmup);  step: lr gamma^floor(t / step_size);
    poly: lr_t = (lr - min_lr) (1 - min(t, T) / T)^power + min_lr (arcface_torch's PolynomialLRWarmup, PLSC's Poly
    with power 2); multistep: lr gamma^(number of milestones m <= warmup + t), milestones counted from step 0.
    """
    lr, warmup = cfg["lr"], cfg["warmup_steps"]
    decay_steps = max(1, total_steps - warmup)
    if cfg["decay"] == "cosine":
        return paddle.optimizer.lr.CosineAnnealingDecay(lr, T_max=decay_steps, eta_min=cfg["min_lr"])
    if cfg["decay"] == "step":
        return paddle.optimizer.lr.StepDecay(lr, step_size=cfg["step_size"], gamma=cfg["gamma"])
    if cfg["decay"] in ("poly", "linear"):
        return paddle.optimizer.lr.PolynomialDecay(lr, decay_steps=decay_steps, end_lr=cfg["min_lr"],
                                                   power=cfg["power"] if cfg["decay"] == "poly" else 1.0)
    if cfg["decay"] == "multistep":  # the inner scheduler counts from the end of the warm-up
        milestones = [m - warmup for m in resolve_milestones(cfg["milestones"], total_steps)]
        return paddle.optimizer.lr.MultiStepDecay(lr, milestones=milestones, gamma=cfg["gamma"])
    return lr


def build_lr(cfg: dict, total_steps: int):
    """Warm-up (linear from 0 over ``warmup_steps``: lr_t = lr t / warmup) followed by :func:`_decay`, as a
    ``paddle.optimizer.lr`` scheduler whose ``get_lr()`` before step t (0-based) is the rate of that step."""
    sched = _decay(cfg, total_steps)
    if cfg["warmup_steps"] > 0:
        sched = paddle.optimizer.lr.LinearWarmup(sched, warmup_steps=cfg["warmup_steps"], start_lr=0.0,
                                                 end_lr=cfg["lr"])
    elif not isinstance(sched, paddle.optimizer.lr.LRScheduler):
        sched = paddle.optimizer.lr.LambdaDecay(sched, lambda _: 1.0)
    return sched


def build_optimizer(cfg: dict, parameters, total_steps: int):
    """(Paddle optimizer, lr scheduler) for ``parameters``; clipping is the parallel strategy's (global norm)."""
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


_SEP = "::"
_SPARSE = "sparse_"  # <parameter>::sparse_<slot>: the row-sparse optimizer's state (sparse_velocity, ...)


def _param_names(model):
    """(runtime name, structured name) of every parameter, longest runtime name first (for prefix matching)."""
    pairs = [(p.name, n) for n, p in model.named_parameters()]
    return sorted(pairs, key=lambda x: -len(x[0]))


_MASTER = "master_weights"  # Paddle nests the float32 master weights of low-precision parameters (amp O2) here


def structured_optimizer_state(state, model):
    """Re-key optimizer state from Paddle's generated names (``linear_3.w_0_velocity_0``) to structured ones
    (``heads.a.weight::velocity_0``), so that a checkpoint loads in another process or next to other models. The
    master weights Paddle nests under ``master_weights`` (keyed by the parameter's name, the tensor named
    ``<param>_fp32_master_0``) become ``{"<structured>::fp32_master_0": tensor}``."""
    names = _param_names(model)
    out = {}
    for key, value in state.items():
        if key == _MASTER and isinstance(value, dict):
            out[key] = _structured_masters(value, dict(names))
            continue
        for runtime, structured in names:
            if isinstance(key, str) and key.startswith(runtime + "_"):
                key = structured + _SEP + key[len(runtime) + 1:]
                break
        out[key] = value
    return out


def _structured_masters(masters, structured_of):
    """``{parameter name: master tensor}`` -> ``{"<structured>::<the tensor's name after the parameter's>": tensor}``
    (the name's suffix is what Paddle names the master's own accumulators after)."""
    out = {}
    for runtime, tensor in masters.items():
        suffix = tensor.name[len(runtime) + 1:] if tensor.name.startswith(runtime + "_") else "fp32_master_0"
        out[structured_of.get(runtime, runtime) + _SEP + suffix] = tensor
    return out


def _runtime_masters(masters, lookup):
    """Inverse of :func:`_structured_masters` for this process: keyed by the parameter's name, each tensor named
    ``<param>_<suffix>`` (renamed on a copy when it had another name), so that the velocity or moments Paddle
    creates for it are found under the re-keyed names of :func:`runtime_optimizer_state`."""
    out = {}
    for key, tensor in masters.items():
        structured, suffix = key.split(_SEP, 1) if _SEP in key else (key, "fp32_master_0")
        runtime = lookup.get(structured, structured)
        name = f"{runtime}_{suffix}"
        if tensor.name != name:
            tensor = tensor.clone()
            tensor.name = name
        out[runtime] = tensor
    return out


def _as_tensors(value):
    """A state read from a file (numpy arrays: :mod:`mtl.core.safe_pickle`) with tensors in their place, as Paddle's
    optimizer wants them (its master weights are kept as the tensors given)."""
    if isinstance(value, dict):
        return {k: _as_tensors(v) for k, v in value.items()}
    return paddle.to_tensor(value) if isinstance(value, np.ndarray) else value


def runtime_optimizer_state(state, model):
    """Inverse of :func:`structured_optimizer_state` for this process's parameter names."""
    lookup = {n: p.name for n, p in model.named_parameters()}
    out = {}
    for key, value in state.items():
        if key == _MASTER and isinstance(value, dict):
            out[key] = _runtime_masters(value, lookup)
            continue
        if isinstance(key, str) and _SEP in key:
            structured, acc = key.split(_SEP, 1)
            if structured in lookup:
                key = f"{lookup[structured]}_{acc}"
        elif isinstance(key, str) and key in lookup:
            key = lookup[key]
        out[key] = value
    return out


class JointOptimizer:
    """The job's optimizer: Paddle's for dense gradients, :class:`RowSparseOptimizer` for the rows heads declare.

    It owns the step's row declarations (``rows``, a :class:`mtl.optimizer.sparse.StepRows`: ``add_rows`` per
    micro-batch and from the step hooks, summed and merged once). One ``step()`` applies both with the same learning
    rate, clears the gradients and the rows and advances the schedule. Its state (``state_dict``) is keyed by
    structured parameter names and includes the row velocities.
    """

    def __init__(self, cfg: dict, model, total_steps: int):
        self.model = model
        # frozen (stop_gradient) parameters are left out: Paddle would skip them anyway, and so they hold no state
        trainable = [p for p in model.parameters() if not p.stop_gradient]
        self.dense, self.lr = build_optimizer(cfg, trainable, total_steps)
        self.sparse = RowSparseOptimizer(cfg)
        self.rows = StepRows()

    def add_rows(self, rows, summed: bool = False):
        """Take row declarations of this step (:meth:`mtl.optimizer.sparse.StepRows.add`)."""
        self.rows.add(rows, summed)

    def get_lr(self) -> float:
        """Learning rate of the next step."""
        return self.dense.get_lr()

    def step(self):
        """Update every parameter with a gradient (rows only for the declared rows), clear gradients, next lr."""
        lr = self.dense.get_lr()
        self.dense.step()
        self.sparse.step(self.rows.merged(), lr)
        self.dense.clear_grad(set_to_zero=False)
        self.rows.clear()
        self.lr.step()

    def discard(self):
        """Drop this step's gradients without updating anything (a skipped step: the schedule does not advance)."""
        self.dense.clear_grad(set_to_zero=False)
        self.rows.clear()

    def state_dict(self) -> dict:
        """Dense state with structured keys, plus ``<parameter>::sparse_<slot>`` for the row-sparse state (velocity;
        moment1, moment2, steps)."""
        state = structured_optimizer_state(self.dense.state_dict(), self.model)
        names = {p.name: n for n, p in self.model.named_parameters()}
        for runtime, slots in self.sparse.slots.items():
            for slot, value in slots.items():
                state[f"{names[runtime]}{_SEP}{_SPARSE}{slot}"] = value
        return state

    def set_state_dict(self, state: dict):
        """Restore :meth:`state_dict` output (written by this process count)."""
        params = dict(self.model.named_parameters())
        dense = {}
        for key, value in state.items():
            structured, _, accumulator = key.partition(_SEP) if isinstance(key, str) else (key, "", "")
            if accumulator.startswith(_SPARSE) and structured in params:
                slot = accumulator[len(_SPARSE):]
                self.sparse.slots.setdefault(params[structured].name, {})[slot] = \
                    value if isinstance(value, paddle.Tensor) else paddle.to_tensor(value)
            else:
                dense[key] = value
        with warnings.catch_warnings():
            # LinearWarmup nests its inner scheduler's state under 'LinearWarmup_LR' and restores it, yet Paddle 3.3
            # still warns "unused values in state_dict"; the restored learning rate is exact (tested by the resume
            # test)
            warnings.filterwarnings("ignore", message="There are some unused values in state_dict")
            self.dense.set_state_dict(runtime_optimizer_state(_as_tensors(dense), self.model))
