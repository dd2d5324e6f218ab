"""mtl.train.averaging against paddle.incubate.ModelAverage, a numpy reference of its kernel, and numpy EMA formulas."""
import os
import sys
import textwrap

import numpy as np
import paddle
import pytest

from mtl.core.errors import ConfigError
from mtl.core.safe_pickle import load_paddle_file
from mtl.train.averaging import EMA, WindowAverage, build_averager
from tests import warm_python
from tests.shared_runs import two_process_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(ROOT, "tests", "dist_scripts", "averaging_shards.py")


def window_reference(trajectory, rate, min_window, max_window):
    """Averages after every step, from Paddle's average_accumulates kernel written out in numpy float32."""
    s1 = np.zeros_like(trajectory[0], dtype=np.float32)
    s2, s3 = np.zeros_like(s1), np.zeros_like(s1)
    num_acc = old_acc = num_upd = 0
    out = []
    for value in trajectory:
        num_upd += 1
        num_acc += 1
        s1 = s1 + value.astype(np.float32)
        if num_upd % 16384 == 0:
            s2, s1 = s2 + s1, np.zeros_like(s1)
        threshold = min(max_window, int(np.float32(num_upd) * np.float32(rate)))
        if num_acc >= min_window and num_acc >= threshold:
            s3, s1, s2 = s1 + s2, np.zeros_like(s1), np.zeros_like(s1)
            old_acc, num_acc = num_acc, 0
        out.append((s1 + s2 + s3) / np.float32(num_acc + old_acc))
    return out


def ema_reference(trajectory, decay, warmup, bias_correction):
    """EMA averages after every step, in float64: d_n = min(decay, (1+n)/(10+n)), e_n = d e + (1-d) p."""
    shadow, product, out = None, 1.0, []
    for n, value in enumerate(trajectory):
        d = min(decay, (1 + n) / (10 + n)) if warmup else decay
        value = value.astype(np.float64)
        if shadow is None:
            shadow = (1 - d) * value if bias_correction else value.copy()
        else:
            shadow = d * shadow + (1 - d) * value
        product *= d
        out.append(shadow / (1 - product) if bias_correction else shadow.copy())
    return out


def snapshot(layer):
    return {name: p.numpy().copy() for name, p in layer.named_parameters()}


def train_step(model, optimizer, x, loss_fn):
    loss = loss_fn(model, x)
    loss.backward()
    optimizer.step()
    optimizer.clear_grad(set_to_zero=False)


@pytest.fixture(autouse=True)
def _seed():
    paddle.seed(7)
    np.random.seed(7)


def test_window_matches_paddle_through_restarts():
    layer = paddle.nn.Linear(5, 3)
    optimizer = paddle.optimizer.SGD(0.1, parameters=layer.parameters())
    stock = paddle.incubate.ModelAverage(0.15, parameters=layer.parameters(), min_average_window=3,
                                         max_average_window=8)
    ours = WindowAverage(layer, 0.15, min_average_window=3, max_average_window=8)
    offloaded = WindowAverage(layer.named_parameters(), 0.15, 3, 8, offload="cpu")
    restarts = 0
    for _ in range(60):
        x = paddle.randn([6, 5])
        loss = (layer(x) ** 2).mean()
        loss.backward()
        optimizer.step()
        stock.step()
        optimizer.clear_grad()
        ours.step()
        offloaded.step()
        restarts += ours.num_accumulates == 0
        live = snapshot(layer)
        with stock.apply():
            expected = snapshot(layer)
        for averager in (ours, offloaded):
            with averager.apply():
                got = snapshot(layer)
            for name in live:
                np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=0)
                np.testing.assert_array_equal(layer.state_dict()[name].numpy(), live[name])
    assert restarts >= 5  # the run went through several window restarts
    assert ours.nbytes()["device"] > 0 and offloaded.nbytes() == {"device": 0, "host": ours.nbytes()["device"]}


@pytest.mark.parametrize("rate,min_window,max_window", [(0.5, 20000, 30000), (0.5, 1000, 1000)])
def test_window_matches_paddle_and_numpy_through_the_fold(rate, min_window, max_window):
    weight = paddle.create_parameter([3], "float32")
    (weight * 1.0).sum().backward()  # Paddle's ModelAverage only steps parameters that hold a gradient
    stock = paddle.incubate.ModelAverage(rate, parameters=[weight], min_average_window=min_window,
                                         max_average_window=max_window)
    ours = WindowAverage({"w": weight}, rate, min_window, max_window)
    steps = 16384 + 700  # with windows of 1000 a restart at 17000 ends the window that folded at 16384
    trajectory = (100.0 + np.random.default_rng(3).standard_normal((steps, 3))).astype(np.float32)
    trajectory[:, 0] = 1 + 3 * 2.0**-12  # a constant whose low bits a float32 sum of ~16384 of them rounds away
    reference = window_reference(trajectory, rate, min_window, max_window)
    checked = 0
    for step, value in enumerate(trajectory, start=1):
        with paddle.no_grad():
            weight.set_value(value)
        stock.step()
        ours.step()
        if step in (16383, 16384, 16385, 16999, 17000, 17001) or step % 997 == 0 or step == steps:
            with stock.apply():
                expected = weight.numpy().copy()
            with ours.apply():
                got = weight.numpy().copy()
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
            np.testing.assert_allclose(got, reference[step - 1], rtol=1e-6, atol=0)
            state = ours.state_dict()
            for key in ("sum_1", "sum_2", "sum_3"):  # absent sums are zeros
                stock_sum = stock._get_accumulator(key, weight).numpy()
                np.testing.assert_allclose(state[key]["w"].numpy() if state[key] else 0 * stock_sum, stock_sum,
                                           rtol=1e-6, atol=0)
            for key in ("num_updates", "num_accumulates", "old_num_accumulates"):
                assert state[key] == int(stock._get_accumulator(key, weight).numpy()[0]), (key, step)
            checked += 1
    assert checked > 10 and ours.num_updates == steps


class _BatchNormNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 6)
        self.bn = paddle.nn.BatchNorm1D(6)
        self.out = paddle.nn.Linear(6, 2)

    def forward(self, x):
        return self.out(paddle.nn.functional.relu(self.bn(self.fc(x))))


@pytest.mark.parametrize("average_batchnorm", [False, True])
def test_batchnorm_net_has_no_nan(average_batchnorm):
    model = _BatchNormNet()
    optimizer = paddle.optimizer.SGD(0.05, parameters=model.parameters())
    averager = WindowAverage(model, 0.15, 3, 8, average_batchnorm=average_batchnorm)
    trajectories = {name: [] for name, _ in model.named_parameters()}
    for _ in range(14):
        train_step(model, optimizer, paddle.randn([8, 4]), lambda m, x: (m(x) ** 2).mean())
        averager.step()
        for name, value in snapshot(model).items():
            trajectories[name].append(value)
    live = snapshot(model)
    with averager.apply():
        got = snapshot(model)
    statistics = {"bn._mean", "bn._variance"}
    assert statistics <= set(got)
    for name, value in got.items():
        assert np.isfinite(value).all(), name
        if name in statistics and not average_batchnorm:
            np.testing.assert_array_equal(value, live[name])
        else:
            np.testing.assert_allclose(value, window_reference(trajectories[name], 0.15, 3, 8)[-1], rtol=1e-6)
    assert (set(averager.tracked_names) >= statistics) == average_batchnorm


def test_head_absent_from_steps_is_averaged_over_its_unchanged_value():
    model = paddle.nn.LayerDict({"backbone": paddle.nn.Linear(4, 5), "head_a": paddle.nn.Linear(5, 2),
                                 "head_b": paddle.nn.Linear(5, 2), "never": paddle.nn.Linear(5, 2)})
    optimizer = paddle.optimizer.Momentum(0.05, momentum=0.0, parameters=model.parameters())
    averager = WindowAverage(model, 0.15, 3, 8)
    trajectories = {name: [] for name, _ in model.named_parameters()}
    for step in range(30):
        feature = model["backbone"](paddle.randn([8, 4]))
        loss = (model["head_a"](feature) ** 2).mean()
        if step >= 5 and step % 3 == 0:  # head_b's task is in few steps, and not in the first ones
            loss = loss + (model["head_b"](feature) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)
        averager.step()
        for name, value in snapshot(model).items():
            trajectories[name].append(value)
    live = snapshot(model)
    with averager.apply():
        got = snapshot(model)
    for name, value in got.items():
        assert np.isfinite(value).all(), name
        np.testing.assert_allclose(value, window_reference(trajectories[name], 0.15, 3, 8)[-1], rtol=1e-6)
    np.testing.assert_allclose(got["never.weight"], live["never.weight"], rtol=1e-6)
    assert not np.allclose(got["head_b.weight"], live["head_b.weight"])  # it did move, and its average differs


def test_frozen_parameter_is_not_tracked_and_keeps_its_value():
    model = paddle.nn.Linear(3, 2)
    model.weight.stop_gradient = True
    averager = WindowAverage(model, 0.15, 3, 8)
    assert averager.tracked_names == ["bias"] and averager.kept_names == ["weight"]
    for _ in range(5):
        with paddle.no_grad():
            model.weight.set_value(np.random.standard_normal([3, 2]).astype("float32"))
        averager.step()
    live = model.weight.numpy().copy()
    with averager.apply():
        np.testing.assert_array_equal(model.weight.numpy(), live)


@pytest.mark.parametrize("factory", [lambda m: WindowAverage(m, 0.15, 3, 8), lambda m: EMA(m, 0.9),
                                     lambda m: WindowAverage(m, 0.15, 3, 8, offload="cpu")])
def test_apply_before_first_step_returns_live_weights(factory):
    model = paddle.nn.Linear(3, 2)
    averager = factory(model)
    live = snapshot(model)
    with averager.apply():
        for name, value in snapshot(model).items():
            np.testing.assert_array_equal(value, live[name])
    assert averager.nbytes() == {"device": 0, "host": 0}


@pytest.mark.parametrize("offload", [None, "cpu"])
def test_nested_apply_and_step_during_apply_raise_and_keep_live_weights(offload):
    model = paddle.nn.Linear(3, 2)
    averager = WindowAverage(model, 0.15, 3, 8, offload=offload)
    for _ in range(4):
        with paddle.no_grad():
            model.weight.set_value(np.random.standard_normal([3, 2]).astype("float32"))
        averager.step()
    live = snapshot(model)
    with averager.apply():
        averaged = snapshot(model)
        with pytest.raises(RuntimeError, match="already applied"):
            with averager.apply():
                pass
        with pytest.raises(RuntimeError, match="restore"):
            averager.step()
        np.testing.assert_array_equal(model.weight.numpy(), averaged["weight"])
    for name, value in snapshot(model).items():
        np.testing.assert_array_equal(value, live[name])
    assert not np.array_equal(averaged["weight"], live["weight"])
    averager.apply(need_restore=False)  # weights stay averaged until restore()
    np.testing.assert_array_equal(model.weight.numpy(), averaged["weight"])
    averager.restore()
    averager.restore()  # a second restore is a no-op
    np.testing.assert_array_equal(model.weight.numpy(), live["weight"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_weights_accumulate_in_float32_and_keep_their_dtype(dtype):
    weight = paddle.create_parameter([4, 3], dtype, default_initializer=paddle.nn.initializer.Constant(0.0))
    averager = WindowAverage({"head.weight": weight}, 0.15, 3, 8)
    trajectory = []
    for _ in range(20):
        value = paddle.to_tensor(np.random.standard_normal([4, 3]).astype("float32")).astype(dtype)
        with paddle.no_grad():
            weight.copy_(value, True)
        trajectory.append(value.astype("float32").numpy())
        averager.step()
    live_bits = weight.numpy().copy()
    expected = paddle.to_tensor(window_reference(trajectory, 0.15, 3, 8)[-1]).astype(dtype)
    with averager.apply():
        assert weight.dtype == getattr(paddle, dtype)
        np.testing.assert_array_equal(weight.numpy(), expected.numpy())
    assert weight.dtype == getattr(paddle, dtype)
    np.testing.assert_array_equal(weight.numpy(), live_bits)
    assert averager.state_dict()["sum_1"]["head.weight"].dtype == paddle.float32


_SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    import paddle
    from mtl.train.averaging import WindowAverage

    def trajectory_value(shape, step):
        return np.random.default_rng(1000 + step).standard_normal(shape).astype("float32")

    model = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 2))
    averager = WindowAverage(model, 0.15, 3, 8)
    for step in range(20):
        with paddle.no_grad():
            for index, param in enumerate(model.parameters()):
                param.set_value(trajectory_value(param.shape, 10 * step + index))
        averager.step()
        if step == 11:
            paddle.save(averager.state_dict(), sys.argv[1])
    with averager.apply():
        np.savez(sys.argv[2], **{name: p.numpy() for name, p in model.named_parameters()})
""")


@pytest.mark.subprocess
def test_state_saved_in_one_process_loads_in_a_fresh_one(tmp_path):
    state_path, averages_path = str(tmp_path / "averager.pdparams"), str(tmp_path / "averages.npz")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    warm_python.run([sys.executable, "-c", _SAVER, state_path, averages_path], check=True, env=env, cwd=ROOT,
                    capture_output=True)
    expected = np.load(averages_path)

    paddle.nn.Linear(7, 7)  # shifts Paddle's auto-generated parameter names away from the saving process's
    other = paddle.nn.Linear(2, 2)
    other_averager = WindowAverage(other, 0.15, 3, 8)  # a second averager in this process
    other_averager.step()
    for offload in (None, "cpu"):
        model = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 2))
        averager = WindowAverage(model, 0.15, 3, 8, offload=offload)
        averager.set_state_dict(load_paddle_file(state_path))
        assert averager.num_updates == 12
        for step in range(12, 20):
            with paddle.no_grad():
                for index, param in enumerate(model.parameters()):
                    value = np.random.default_rng(1000 + 10 * step + index).standard_normal(param.shape)
                    param.set_value(value.astype("float32"))
            averager.step()
        with averager.apply():
            for name, param in model.named_parameters():
                np.testing.assert_allclose(param.numpy(), expected[name], rtol=1e-6)
    with pytest.raises(ValueError, match="missing"):
        other_averager.set_state_dict(load_paddle_file(state_path))


def test_state_type_and_names_are_checked():
    model = paddle.nn.Linear(3, 2)
    window, ema = WindowAverage(model, 0.15, 3, 8), EMA(model, 0.9)
    window.step()
    ema.step()
    with pytest.raises(ValueError, match="type 'window'"):
        ema.set_state_dict(window.state_dict())
    state = window.state_dict()
    state["sum_1"] = {"weight": state["sum_1"]["weight"], "extra": state["sum_1"]["bias"]}
    with pytest.raises(ValueError, match=r"missing \['bias'\], unexpected \['extra'\]"):
        window.set_state_dict(state)
    with pytest.raises(TypeError, match="named_parameters"):
        WindowAverage(model.parameters(), 0.15)


@pytest.mark.parametrize("warmup,bias_correction", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("offload", [None, "cpu"])
def test_ema_matches_numpy_reference(warmup, bias_correction, offload):
    weight = paddle.create_parameter([5], "float32")
    averager = EMA({"w": weight}, decay=0.9, warmup=warmup, bias_correction=bias_correction, offload=offload)
    trajectory = list((3.0 + np.random.default_rng(5).standard_normal((40, 5))).astype(np.float32))
    reference = ema_reference(trajectory, 0.9, warmup, bias_correction)
    for step, value in enumerate(trajectory):
        with paddle.no_grad():
            weight.set_value(value)
        averager.step()
        with averager.apply():
            np.testing.assert_allclose(weight.numpy(), reference[step], rtol=2e-6, atol=1e-6)
        np.testing.assert_array_equal(weight.numpy(), value)
    restored = EMA({"w": weight}, decay=0.9, warmup=warmup, bias_correction=bias_correction)
    restored.set_state_dict(averager.state_dict())
    with restored.apply():
        np.testing.assert_allclose(weight.numpy(), reference[-1], rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("offload", [None, "cpu"])
def test_ema_does_not_drift_over_a_long_run(offload):
    weight = paddle.create_parameter([16], "float32")
    averager = EMA({"w": weight}, decay=0.999, warmup=False, offload=offload)
    trajectory = list((1.0 + 0.1 * np.random.default_rng(6).standard_normal((3000, 16))).astype(np.float32))
    for value in trajectory:
        with paddle.no_grad():
            weight.set_value(value)
        averager.step()
    with averager.apply():  # float32 rounding of 0.999 and 0.001 alone would bias the result by ~5e-5
        np.testing.assert_allclose(weight.numpy(), ema_reference(trajectory, 0.999, False, True)[-1], rtol=1e-5)


def test_shards_averaged_separately_equal_the_averaged_full_weight():
    full = paddle.create_parameter([6, 5], "float32")
    shards = [paddle.create_parameter([6, 3], "float32"), paddle.create_parameter([6, 2], "float32")]
    averagers = [WindowAverage({"head.weight": full}, 0.15, 3, 8)]
    averagers += [WindowAverage({"head.weight": shard}, 0.15, 3, 8) for shard in shards]
    for _ in range(25):
        value = np.random.standard_normal([6, 5]).astype("float32")
        with paddle.no_grad():
            full.set_value(value)
            shards[0].set_value(value[:, :3])
            shards[1].set_value(value[:, 3:])
        for averager in averagers:
            averager.step()
    for averager in averagers:
        averager.apply(need_restore=False)
    np.testing.assert_array_equal(np.concatenate([s.numpy() for s in shards], axis=1), full.numpy())


@two_process_run("averaging_shards")
def _two_processes(folder):
    return {"call": [SHARDS, "main", str(folder)]}, folder


@pytest.mark.distributed
@pytest.mark.two_process_runs("averaging_shards")
def test_two_process_shards_equal_one_process_average(two_process):
    """Each of 2 ranks averages its shard (tests/dist_scripts/averaging_shards.py, in the session's one launch of
    2-process runs): together they give what one process averaging the full weight gives."""
    folder = two_process["averaging_shards"]
    full = paddle.create_parameter([5, 3], "float32")
    averager = WindowAverage({"head.weight": full}, 0.15, 3, 8)
    for step in range(25):
        with paddle.no_grad():
            full.set_value(np.random.default_rng(step).standard_normal([5, 3]).astype("float32"))
        averager.step()
    with averager.apply():
        expected = full.numpy()
    got = np.concatenate([np.load(folder / f"rank{k}.npy") for k in range(2)], axis=0)
    np.testing.assert_array_equal(got, expected)


def test_build_averager_from_config():
    model = paddle.nn.Linear(3, 2)
    window = build_averager({"type": "window", "average_window_rate": 0.15, "min_average_window": 3,
                             "max_average_window": 8, "offload": "cpu"}, model)
    assert isinstance(window, WindowAverage) and window.offload == "cpu" and window.max_average_window == 8
    ema = build_averager({"type": "ema", "decay": 0.99, "warmup": False}, model.named_parameters())
    assert isinstance(ema, EMA) and ema.decay == 0.99 and not ema.warmup
    assert build_averager(None, model) is None and build_averager({"type": "none"}, model) is None
    bad = [({"type": "window", "average_window_rate": 0.1, "window": 3}, "averaging.window"),
           ({"type": "median"}, "averaging.type"),
           ({"type": "window"}, "averaging.average_window_rate"),
           ({"type": "window", "average_window_rate": 0.1, "min_average_window": 9, "max_average_window": 8},
            "averaging.min_average_window"),
           ({"type": "ema", "decay": 1.5}, "averaging.decay"),
           ({"type": "ema", "offload": "gpu"}, "averaging.offload"),
           ({"decay": 0.9}, "averaging.type")]
    for cfg, key in bad:
        with pytest.raises(ConfigError) as error:
            build_averager(cfg, model, source="job.yaml")
        assert error.value.key == key and str(error.value).startswith(f"job.yaml: {key}: "), cfg
