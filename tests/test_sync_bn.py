"""Synchronised BatchNorm (mtl/parallel/sync_bn.py).

One process: the converted layer against Paddle's own BatchNorm1D/2D/3D and paddle.nn.BatchNorm (forward in training
and evaluation, gradients of x, weight and bias, running statistics), Paddle's running-statistics convention against
numpy, the gradient against central finite differences, and the conversion of a whole backbone (parameters shared,
state_dict keys unchanged). Two processes: a `cnn` job with ``distributed.sync_bn`` at 2 processes trains exactly like
the same job at 1 process (the statistics are those of the global batch); the 2-process run is in the session's one
launch, the 1-process run trains in this process (tests/shared_runs.py).
"""
import json
import os

import numpy as np
import paddle
import pytest

from mtl.backbones.small import SmallCNN
from mtl.core.safe_pickle import load_paddle_file
from mtl.parallel.sync_bn import SyncBatchNorm, convert_sync_batchnorm
from mtl.store.layout import merged_head_state
from tests.dist_util import ROOT
from tests.shared_runs import train_here, two_process_run

JOB = os.path.join(ROOT, "tests", "dist_scripts", "sync_bn_job.yaml")


def close(actual, expected, rtol=1e-6):
    """Element-wise ``rtol``, with an absolute floor of ``rtol`` times the largest magnitude of ``expected``."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(float(np.abs(expected).max()), 1e-30))


def twin(make):
    """(Paddle layer with random affine parameters, converted copy of it with the same state)."""
    reference, copy = make(), make()
    with paddle.no_grad():
        if reference.weight is not None:
            reference.weight.set_value(paddle.rand(reference.weight.shape) + 0.5)
        if reference.bias is not None:
            reference.bias.set_value(paddle.rand(reference.bias.shape) - 0.5)
    copy.set_state_dict(reference.state_dict())
    return reference, convert_sync_batchnorm(copy)


LAYERS = {
    "1d_rows": (lambda: paddle.nn.BatchNorm1D(3), [8, 3]),
    "1d_ncl_momentum": (lambda: paddle.nn.BatchNorm1D(3, momentum=0.7, epsilon=1e-3), [4, 3, 5]),
    "1d_nlc_no_scale": (lambda: paddle.nn.BatchNorm1D(3, data_format="NLC", weight_attr=False), [4, 5, 3]),
    "2d": (lambda: paddle.nn.BatchNorm2D(3), [4, 3, 5, 5]),
    "2d_nhwc": (lambda: paddle.nn.BatchNorm2D(3, data_format="NHWC"), [4, 5, 5, 3]),
    "2d_global_stats": (lambda: paddle.nn.BatchNorm2D(3, use_global_stats=True), [4, 3, 2, 2]),
    "3d": (lambda: paddle.nn.BatchNorm3D(3), [2, 3, 2, 3, 2]),
    "legacy_relu": (lambda: paddle.nn.BatchNorm(3, act="relu", momentum=0.8), [4, 3, 3, 3]),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_matches_paddle_batchnorm(name):
    make, shape = LAYERS[name]
    paddle.seed(11)
    reference, ours = twin(make)
    assert isinstance(ours, SyncBatchNorm)
    assert list(ours.state_dict()) == list(reference.state_dict())
    for _ in range(3):  # three training steps: running statistics accumulate
        x = paddle.randn(shape) * 2.0 + 1.0
        upstream = paddle.randn(shape)
        xa, xb = x.clone(), x.clone()
        xa.stop_gradient = xb.stop_gradient = False
        ya, yb = reference(xa), ours(xb)
        close(yb.numpy(), ya.numpy())
        (ya * upstream).sum().backward()
        (yb * upstream).sum().backward()
        close(xb.grad.numpy(), xa.grad.numpy())
        if reference.weight is not None:
            close(ours.weight.grad.numpy(), reference.weight.grad.numpy())
            close(ours.bias.grad.numpy(), reference.bias.grad.numpy())
        else:  # Paddle 3.3 (CPU) gives the bias no gradient when the layer has no scale; dbias = sum(dy)
            assert reference.bias.grad is None
            channel = len(shape) - 1 if name.startswith("1d_nlc") else 1
            axes = tuple(a for a in range(len(shape)) if a != channel)
            close(ours.bias.grad.numpy(), upstream.numpy().sum(axis=axes), rtol=1e-5)
        reference.clear_gradients()
        ours.clear_gradients()
        close(ours._mean.numpy(), reference._mean.numpy())
        close(ours._variance.numpy(), reference._variance.numpy())
    reference.eval()
    ours.eval()
    x = paddle.randn(shape)
    close(ours(x).numpy(), reference(x).numpy())


def test_running_statistics_convention_against_numpy():
    """Paddle: running = momentum * running + (1 - momentum) * batch, with the biased (divide by N) variance."""
    paddle.seed(3)
    layer = convert_sync_batchnorm(paddle.nn.BatchNorm1D(2, momentum=0.8))
    mean, variance = np.zeros(2), np.ones(2)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.normal(1.0, 2.0, size=(4, 2)).astype("float32")
        layer(paddle.to_tensor(x))
        mean = 0.8 * mean + 0.2 * x.mean(axis=0)
        variance = 0.8 * variance + 0.2 * x.var(axis=0)  # ddof=0; with N=4 the unbiased value is 4/3 of it
    close(layer._mean.numpy(), mean, rtol=1e-5)
    close(layer._variance.numpy(), variance, rtol=1e-5)


def test_gradient_against_finite_differences():
    """d/d(x, weight, bias) of sum(r * tanh(y)) in float64 against central differences."""
    previous = paddle.get_default_dtype()
    paddle.set_default_dtype("float64")
    try:
        rng = np.random.default_rng(0)
        layer = convert_sync_batchnorm(paddle.nn.BatchNorm2D(2))
        with paddle.no_grad():
            layer.weight.set_value(rng.uniform(0.5, 1.5, 2))
            layer.bias.set_value(rng.uniform(-0.5, 0.5, 2))
        x0 = rng.normal(0.5, 1.5, size=(3, 2, 2, 2))
        r = paddle.to_tensor(rng.normal(size=x0.shape))
        params = {"weight": layer.weight, "bias": layer.bias}

        def loss(x):
            return paddle.sum(r * paddle.tanh(layer(x)))

        x = paddle.to_tensor(x0, stop_gradient=False)
        loss(x).backward()
        analytic = {"x": x.grad.numpy(), **{k: p.grad.numpy() for k, p in params.items()}}
        h = 1e-6
        numeric = {"x": np.zeros_like(x0)}
        for i in np.ndindex(x0.shape):
            plus, minus = x0.copy(), x0.copy()
            plus[i] += h
            minus[i] -= h
            numeric["x"][i] = (float(loss(paddle.to_tensor(plus))) - float(loss(paddle.to_tensor(minus)))) / (2 * h)
        for key, p in params.items():
            base = p.numpy().copy()
            numeric[key] = np.zeros_like(base)
            for i in range(base.size):
                for sign in (1, -1):
                    value = base.copy()
                    value[i] += sign * h
                    with paddle.no_grad():
                        p.set_value(value)
                    numeric[key][i] += sign * float(loss(paddle.to_tensor(x0))) / (2 * h)
            with paddle.no_grad():
                p.set_value(base)
        for key in analytic:
            close(analytic[key], numeric[key], rtol=1e-6)
        assert np.abs(analytic["x"]).max() > 1e-2  # not trivially zero
    finally:
        paddle.set_default_dtype(previous)


def test_convert_backbone_shares_parameters_and_keys():
    paddle.seed(1)
    plain = SmallCNN(embedding_size=8, channels=(4, 6))
    paddle.seed(1)
    converted = SmallCNN(embedding_size=8, channels=(4, 6))
    before = {k: id(v) for k, v in converted.state_dict().items()}
    assert convert_sync_batchnorm(converted) is converted
    assert convert_sync_batchnorm(converted) is converted  # idempotent
    assert sum(isinstance(m, SyncBatchNorm) for m in converted.sublayers()) == 2
    assert not any(isinstance(m, paddle.nn.BatchNorm2D) for m in converted.sublayers())
    assert {k: id(v) for k, v in converted.state_dict().items()} == before  # same keys, same tensors
    x = paddle.randn([6, 1, 8, 8])
    ya, yb = plain({"image": x}), converted({"image": x})
    close(yb.numpy(), ya.numpy())
    upstream = paddle.randn(ya.shape)
    (ya * upstream).sum().backward()
    (yb * upstream).sum().backward()
    for pa, pb in zip(plain.parameters(), converted.parameters()):
        if pa.grad is not None:
            close(pb.grad.numpy(), pa.grad.numpy(), rtol=1e-5)  # two BatchNorms and two convolutions deep
    # checkpoints load either way
    plain.set_state_dict(converted.state_dict())
    converted.set_state_dict(plain.state_dict())
    for k, v in plain.state_dict().items():
        np.testing.assert_array_equal(converted.state_dict()[k].numpy(), v.numpy())


def test_converts_paddle_sync_batchnorm_and_half_precision_inputs():
    """paddle.nn.SyncBatchNorm (no CPU kernel) converts too; float16 inputs are normalised in float32."""
    paddle.seed(2)
    ours = convert_sync_batchnorm(paddle.nn.SyncBatchNorm(3))
    reference = paddle.nn.BatchNorm2D(3)
    x = paddle.randn([4, 3, 2, 2])
    close(ours(x).numpy(), reference(x).numpy())
    close(ours._variance.numpy(), reference._variance.numpy())
    half = x.astype("float16")
    half.stop_gradient = False
    y = ours(half)
    assert y.dtype == paddle.float16
    y.astype("float32").sum().backward()
    assert half.grad.dtype == paddle.float16
    np.testing.assert_allclose(y.astype("float32").numpy(), reference(x).numpy(), atol=3e-3)


def test_rejects_other_layers():
    with pytest.raises(TypeError, match="BatchNorm"):
        SyncBatchNorm(paddle.nn.Linear(2, 2))


# ---- two processes ------------------------------------------------------------------------------------------------
def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def final_weights(out, steps):
    ckpt = os.path.join(out, "checkpoints", f"step_{steps}")
    state = {f"backbone.{k}": v for k, v in load_paddle_file(os.path.join(ckpt, "backbone.pdparams")).items()}
    for task in ("arc5", "soft3"):
        state.update({f"{task}.{k}": v for k, v in merged_head_state(ckpt, task).items()})
    return state


@two_process_run("sync_bn")
def _two_processes(folder):
    return {"train": [JOB, "--set", f"output_dir={folder}"]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("sync_bn")
def test_two_processes_with_sync_bn_match_one_process(two_process, tmp_path):
    one = str(tmp_path / "one")
    train_here(JOB, "--set", f"output_dir={one}", "distributed.sync_bn=false")
    two = two_process["sync_bn"]
    a, b = losses(one), losses(two)
    steps = len(a)
    assert steps >= 10 and [r["step"] for r in b] == [r["step"] for r in a] == list(range(1, steps + 1))
    worst = 0.0
    for ra, rb in zip(a, b):
        keys = {k for k in ra if k.startswith("loss")}
        assert keys == {k for k in rb if k.startswith("loss")} and len(keys) == 3
        for k in keys:
            assert np.isfinite(ra[k]) and np.isfinite(rb[k])
            worst = max(worst, abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8))
    assert worst <= 1e-4, f"largest relative loss difference {worst:.3g}"
    wa, wb = final_weights(one, steps), final_weights(two, steps)
    assert wa.keys() == wb.keys()
    assert sum(k.endswith(("._mean", "._variance")) for k in wa) == 4  # both BatchNorms' running statistics
    for k in wa:
        np.testing.assert_allclose(wb[k], wa[k], rtol=1e-4, atol=1e-5, err_msg=k)
