"""amp_level O2 outside training and with the project's SyncBatchNorm, decided on CPU.

Paddle's CPU build makes ``auto_cast`` and ``amp.decorate`` no-ops (``amp_guard``/``amp_decorate`` check the place
first), so the tests call what those functions do after that check: ``amp_initialize`` (the O2 cast of a model's
weights) directly, and a recording stand-in for ``auto_cast``. References: numpy, and the dtypes Paddle gives.
"""
import contextlib

import numpy as np
import paddle
import pytest
from paddle.amp.auto_cast import amp_initialize

from mtl.core import low_precision as precision  # running, reading, saving low-precision weights
from mtl.core.arrays import to_numpy
from mtl.evaluation.evaluator import embed
from mtl.parallel.sync_bn import SyncBatchNorm, convert_sync_batchnorm


def _o2(layer, dtype="bfloat16"):
    """What ``paddle.amp.decorate(level='O2')`` does to a model on a GPU."""
    amp_initialize(models=[layer], dtype=dtype, excluded_layers=None)
    return layer


def test_bfloat16_numpy_is_bit_patterns_and_to_numpy_gives_numbers():
    """Root cause: ``.numpy()`` of a bfloat16 tensor returns its uint16 bit patterns."""
    values = np.array([-1.484375, 0.9921875, 3.0], dtype=np.float32)  # exact in bfloat16
    t = paddle.to_tensor(values).astype("bfloat16")
    assert t.numpy().dtype == np.uint16 and not np.array_equal(t.numpy(), values)
    assert to_numpy(t).dtype == np.float32 and np.array_equal(to_numpy(t), values)
    assert np.array_equal(precision.float32(t).numpy(), values)


class _Recorder:
    """Stands in for ``paddle.amp.auto_cast``: records its arguments and whether a forward ran inside it."""

    def __init__(self):
        self.calls, self.active = [], False

    def __call__(self, **kwargs):
        self.calls.append(kwargs)

        @contextlib.contextmanager
        def context():
            self.active = True
            try:
                yield
            finally:
                self.active = False
        return context()


def test_an_o2_backbone_runs_under_auto_cast_o2_in_its_own_dtype(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(paddle.amp, "auto_cast", recorder)
    plain = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3))
    assert precision.low_precision_dtype(plain) is None
    with precision.inference_autocast(plain):
        pass
    assert recorder.calls == []
    for dtype in ("bfloat16", "float16"):
        decorated = _o2(paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)), dtype)
        assert precision.low_precision_dtype(decorated) == dtype  # the BatchNorm stays float32, the Linear not
        with precision.inference_autocast(decorated):
            assert recorder.active
        assert recorder.calls[-1] == {"enable": True, "level": "O2", "dtype": dtype}


class _O2Backbone(paddle.nn.Layer):
    """A backbone with bfloat16 weights whose forward must run under auto_cast and returns bfloat16 features."""

    def __init__(self, recorder):
        super().__init__()
        self.scale = self.create_parameter([1], dtype="bfloat16")
        self.recorder = recorder

    def input_fields(self):
        from mtl.core.contracts import Field

        return [Field("image", (2,), "float32")]

    def forward(self, inputs):
        assert self.recorder.active, "the backbone ran outside auto_cast"
        return inputs["image"].astype("bfloat16")


class _Reader:
    open_set = False

    def __len__(self):
        return 3

    def __getitem__(self, index):
        return {"image": np.array([index + 0.5, -index], np.float32), "label": np.int64(index)}


def test_evaluation_embeds_an_o2_backbone_under_auto_cast_and_returns_float32(monkeypatch):
    """The evaluator's embedding (and so the ArcFace evaluation's numpy) gets numbers, not bit patterns."""
    recorder = _Recorder()
    monkeypatch.setattr(paddle.amp, "auto_cast", recorder)
    feats, rest = embed(_O2Backbone(recorder), _Reader(), batch_size=2)
    assert feats.dtype == paddle.float32
    np.testing.assert_array_equal(feats.numpy(), [[0.5, 0.0], [1.5, -1.0], [2.5, -2.0]])
    assert np.array_equal(rest["label"], [0, 1, 2]) and len(recorder.calls) == 2


def test_an_o2_state_is_written_in_float32_and_loads_into_either_precision():
    """Root cause: ``set_state_dict`` refuses another dtype ("Variable dtype not match"); the files are float32
    (exact for bfloat16 values) and loading casts to the layer's own dtypes, bit for bit."""
    trained = _o2(paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)))
    raw = trained.state_dict()
    with pytest.raises(AssertionError, match="dtype not match"):
        paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)).set_state_dict(raw)
    written = precision.portable_state(raw)
    assert {str(v.dtype) for v in written.values()} == {"paddle.float32"}
    fresh32 = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3))
    fresh32.set_state_dict(precision.state_for(fresh32, written))
    fresh16 = _o2(paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)))
    fresh16.set_state_dict(precision.state_for(fresh16, written))
    for key, value in raw.items():
        np.testing.assert_array_equal(fresh32.state_dict()[key].numpy(), to_numpy(value))
        assert fresh16.state_dict()[key].dtype == value.dtype
        np.testing.assert_array_equal(to_numpy(fresh16.state_dict()[key]), to_numpy(value))


def test_export_of_an_o2_run_reads_float32_weights(tmp_path):
    """A run whose backbone was cast as O2 casts it (checkpoint written by the trainer), then ``mtl export``."""
    from mtl.config.loading import load_job
    from mtl.serving.export import export
    from mtl.serving.inference import open_run
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    data = {"seed": 0, "output_dir": str(tmp_path / "run"),
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 4},
                       "head": {"type": "arcface", "scale": 8.0}}],
            "backbone": {"type": "mlp", "hidden": [8], "embedding_size": 4}, "schedule": {"batch_size": 8, "steps": 2},
            "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}}
    job = build_job(load_job(data=data), announce_plan=False)
    trainer = Trainer(job, console=lambda *a: None)
    _o2(job.model.backbone)
    assert precision.low_precision_dtype(job.model.backbone) == "bfloat16"
    trainer._save(2)
    cast = {k: to_numpy(v) for k, v in job.model.backbone.state_dict().items()}
    backbone = open_run(str(tmp_path / "run")).backbone()
    for key, value in backbone.state_dict().items():
        assert value.dtype == paddle.float32
        np.testing.assert_array_equal(value.numpy(), cast[key])
    assert export(str(tmp_path / "run"), str(tmp_path / "export"))["step"] == 2


def test_o2_keeps_the_synchronised_batchnorm_in_float32():
    """Root cause: ``need_keep_fp32`` keeps Paddle's own BatchNorm classes only; without the layer's
    ``_cast_to_low_precision = False`` its statistics would be cast (shown by clearing the flag)."""
    model = convert_sync_batchnorm(paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)))
    bn = model[1]
    assert isinstance(bn, SyncBatchNorm)
    _o2(model, "float16")
    assert model[0].weight.dtype == paddle.float16
    assert [t.dtype for t in (bn.weight, bn.bias, bn._mean, bn._variance)] == [paddle.float32] * 4
    control = convert_sync_batchnorm(paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)))
    control[1]._cast_to_low_precision = True
    _o2(control, "float16")
    assert control[1]._mean.dtype == paddle.float16


def test_a_float16_batch_of_70000_rows_keeps_float32_statistics():
    """The row count and the moments are float32 (float16 holds at most 65504: the count would be inf)."""
    assert np.isinf(paddle.full([1], 70000, dtype="float16").numpy()).all()
    model = _o2(convert_sync_batchnorm(paddle.nn.Sequential(paddle.nn.BatchNorm1D(3))), "float16")
    model.train()
    x = (np.random.default_rng(0).standard_normal((70000, 3)) * 2 + 5).astype(np.float16)
    y = model(paddle.to_tensor(x))
    assert y.dtype == paddle.float16
    reference = x.astype(np.float64)
    np.testing.assert_allclose(model[0]._mean.numpy(), 0.1 * reference.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(model[0]._variance.numpy(), 0.9 + 0.1 * reference.var(axis=0), rtol=1e-5)
