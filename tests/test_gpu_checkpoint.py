"""Checkpoints of GPU runs, decided on CPU: the float32 master weights of amp_level O2 in
the optimizer state. Reference: Paddle's own optimizer tables, restored from what it saved (the random state of
another device is tests/test_gpu_determinism.py's)."""
import numpy as np
import paddle
import pytest
from paddle.amp.auto_cast import amp_initialize

from mtl.core.safe_pickle import load_paddle_file
from mtl.optimizer.joint import JointOptimizer

CFG = {"type": "momentum", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, "warmup_steps": 0, "decay": "none"}


def _o2_model(shift=0):
    """A backbone-like model cast as O2 (bfloat16 weights, BatchNorm float32); ``shift`` layers are built first, so
    that Paddle's generated parameter names differ as they do in another process."""
    for _ in range(shift):
        paddle.nn.Linear(1, 1)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3))
    amp_initialize(models=[model], dtype="bfloat16", excluded_layers=None)
    return model


def _o2_optimizer(model):
    """The job's optimizer with master weights (what ``paddle.amp.decorate(..., master_weight=True)`` sets), its
    accumulators created as the first step would (``_create_accumulators``: the step itself has no bfloat16 CPU
    kernel)."""
    optimizer = JointOptimizer(CFG, model, total_steps=10)
    optimizer.dense._multi_precision = True
    return optimizer


def _materialise(optimizer, model):
    block = paddle.static.default_main_program().global_block()
    optimizer.dense._create_accumulators(block, [p for p in model.parameters() if not p.stop_gradient])


def _masters_and_velocities(optimizer, model):
    """``{structured name: (master weight or None, velocity)}`` read from the optimizer's own tables."""
    velocities = optimizer.dense._accumulators["velocity"]
    out = {}
    for name, param in model.named_parameters():
        if param.stop_gradient:
            continue
        master = optimizer.dense._master_weights.get(param.name)
        owner = master if master is not None else param
        out[name] = (None if master is None else master.numpy(), velocities[owner.name].numpy())
    return out


def test_master_weights_and_their_velocities_resume_in_another_process(tmp_path):
    """Root cause: Paddle nests the master weights under ``master_weights`` keyed by the parameter's generated
    name, and names the master's velocity after the master tensor's own name: both are runtime names. Saved by
    one model and loaded by one whose names differ, every master weight and velocity must come back exactly."""
    model = _o2_model()
    optimizer = _o2_optimizer(model)
    _materialise(optimizer, model)
    rng = np.random.default_rng(0)
    for tensor in list(optimizer.dense._master_weights.values()) + list(optimizer.dense._accumulators["velocity"]
                                                                         .values()):
        tensor.set_value(rng.standard_normal(tensor.shape).astype(np.float32))
    saved = _masters_and_velocities(optimizer, model)
    state = optimizer.state_dict()
    assert all("::" in key for key in state["master_weights"])  # structured, not runtime names
    paddle.save(state, str(tmp_path / "optimizer.pdopt"))

    other = _o2_model(shift=3)
    assert [p.name for p in other.parameters()] != [p.name for p in model.parameters()]
    restored = _o2_optimizer(other)
    restored.set_state_dict(load_paddle_file(str(tmp_path / "optimizer.pdopt")))
    _materialise(restored, other)
    got = _masters_and_velocities(restored, other)
    assert got.keys() == saved.keys() and sum(m is not None for m, _ in saved.values()) == 2
    for name, (master, velocity) in saved.items():
        np.testing.assert_array_equal(got[name][1], velocity)
        if master is not None:
            np.testing.assert_array_equal(got[name][0], master)


def test_paddles_own_state_does_not_load_under_other_names(tmp_path):
    """The control: the optimizer's raw state (runtime names) cannot be restored by a model named otherwise."""
    model = _o2_model()
    optimizer = _o2_optimizer(model)
    _materialise(optimizer, model)
    raw = optimizer.dense.state_dict()
    other = _o2_model(shift=2)
    restored = _o2_optimizer(other)
    restored.dense.set_state_dict(raw)
    with pytest.raises(AssertionError, match="should in state dict"):
        _materialise(restored, other)
