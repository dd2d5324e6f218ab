"""Backbones: contracts and output shapes, pretrained loading, the MLP against numpy, sizes against the papers."""
import math
import re

import numpy as np
import paddle
import pytest

import mtl.backbones.iresnet as iresnet
import mtl.backbones.mobilefacenet as mobilefacenet
import mtl.backbones.small as small
from mtl.backbones.base import Backbone, load_pretrained
from mtl.core import registry
from mtl.core.contracts import Field
from mtl.core.errors import ConfigError

# Small configurations of every backbone these modules register: config, per-sample input shape, feature size.
SMALL_CONFIGS = {
    "iresnet18": ({"input_size": 32, "embedding_size": 32}, (3, 32, 32), 32),
    "iresnet34": ({"input_size": 32, "embedding_size": 32}, (3, 32, 32), 32),
    "iresnet50": ({"input_size": 32}, (3, 32, 32), 512),
    "iresnet100": ({"input_size": 32}, (3, 32, 32), 512),
    "mobilefacenet": ({"input_size": 32}, (3, 32, 32), 128),
    "cnn": ({}, (1, 8, 8), 64),
    "mlp": ({"input_shape": [2, 3, 4], "hidden": [16, 8]}, (2, 3, 4), 64),
    "identity": ({"input_shape": [2, 3, 4], "input_field": "image"}, (2, 3, 4), 24),
}
NO_FORWARD = {"iresnet100"}  # 65M parameters: built lazily (no weights allocated), not run


def build(name, **params):
    """Build backbone ``name`` through the registry, as a job config would."""
    return registry.build("backbone", {"type": name, **params})


def random_batch(shape, batch=2, seed=0):
    """A float32 batch of standard normal values with per-sample ``shape``."""
    return np.random.default_rng(seed).standard_normal((batch, *shape)).astype("float32")


def test_every_registered_backbone_is_covered():
    ours = {iresnet.__name__, mobilefacenet.__name__, small.__name__}
    names = {e.name for e in registry.entries("backbone") if e.cls.__module__ in ours}
    assert names == set(SMALL_CONFIGS)


@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_contract_and_output_shape(name):
    config, shape, feature_size = SMALL_CONFIGS[name]
    paddle.seed(0)
    if name in NO_FORWARD:
        with paddle.LazyGuard():
            model = build(name, **config)
    else:
        model = build(name, **config)
    assert isinstance(model, Backbone) and model.registered_name == name
    assert model.feature_size == feature_size
    assert model.input_fields() == [Field("image", shape, "float32")]
    if name in NO_FORWARD:
        return
    for mode in (model.train, model.eval):
        mode()
        out = model({"image": paddle.to_tensor(random_batch(shape))})
        assert tuple(out.shape) == (2, model.feature_size)
        assert out.dtype == paddle.float32
        assert np.isfinite(out.numpy()).all()


def test_input_field_name_is_configurable():
    model = build("cnn", input_field="pixels", channels=[4], embedding_size=3)
    assert [f.name for f in model.input_fields()] == ["pixels"]
    out = model({"pixels": paddle.to_tensor(random_batch((1, 8, 8)))})
    assert tuple(out.shape) == (2, 3)


@pytest.mark.parametrize(
    "name, config",
    [
        ("cnn", {"channels": [4, 8]}),
        ("mlp", {"hidden": [16], "batch_norm": True}),
        ("mobilefacenet", {"input_size": 16, "embedding_size": 8}),
        ("iresnet18", {"input_size": 16, "embedding_size": 8}),
    ],
)
def test_pretrained_round_trip(name, config, tmp_path):
    paddle.seed(1)
    source = build(name, **config)
    shape = source.input_fields()[0].shape
    source.train()
    source({"image": paddle.to_tensor(random_batch(shape, batch=4, seed=1))})  # moves BatchNorm running statistics
    path = str(tmp_path / f"{name}.pdparams")
    paddle.save(source.state_dict(), path)

    paddle.seed(2)
    loaded = build(name, **config)
    load_pretrained(loaded, path)
    fresh = build(name, **config)
    x = paddle.to_tensor(random_batch(shape, batch=2, seed=3))
    for model in (source, loaded, fresh):
        model.eval()
    expected = source({"image": x}).numpy()
    np.testing.assert_allclose(loaded({"image": x}).numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(fresh({"image": x}).numpy(), expected, atol=1e-3)  # loading did change the weights


def test_pretrained_mismatch_names_the_file(tmp_path):
    path = str(tmp_path / "cnn_4_8.pdparams")
    paddle.save(build("cnn", channels=[4, 8]).state_dict(), path)
    with pytest.raises(ConfigError, match=re.escape(path)) as wrong_shape:
        load_pretrained(build("cnn", channels=[4, 16]), path)
    assert "shape" in str(wrong_shape.value)
    with pytest.raises(ConfigError, match=re.escape(path)) as wrong_names:
        load_pretrained(build("mlp"), path)
    assert "missing" in str(wrong_names.value)
    missing = str(tmp_path / "nowhere.pdparams")
    with pytest.raises(ConfigError, match=re.escape(missing)):
        load_pretrained(build("mlp"), missing)


ACTIVATION_REFERENCE = {
    "relu": lambda h: np.maximum(h, 0.0),
    "tanh": np.tanh,
    "gelu": lambda h: 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0))),  # exact (erf) GELU
}


@pytest.mark.parametrize("activation", sorted(ACTIVATION_REFERENCE))
def test_mlp_matches_numpy(activation):
    paddle.seed(4)
    model = build("mlp", input_shape=[2, 3, 4], hidden=[16, 8], activation=activation, embedding_size=5)
    kinds = {type(layer).__name__ for layer in model.sublayers()}
    assert not kinds & {"BatchNorm1D", "Dropout"}, "the default mlp must be deterministic"
    linears = [layer for layer in model.sublayers() if isinstance(layer, paddle.nn.Linear)]
    assert [tuple(layer.weight.shape) for layer in linears] == [(24, 16), (16, 8), (8, 5)]

    x = random_batch((2, 3, 4), batch=3, seed=5)
    h = x.reshape(3, -1).astype("float64")
    for i, layer in enumerate(linears):
        h = h @ layer.weight.numpy().astype("float64") + layer.bias.numpy()  # Paddle's Linear: x @ W + b, W [in, out]
        if i < len(linears) - 1:
            h = ACTIVATION_REFERENCE[activation](h)
    model.train()  # no BatchNorm, no dropout: train and eval compute the same function
    np.testing.assert_allclose(model({"image": paddle.to_tensor(x)}).numpy(), h, rtol=1e-5, atol=1e-5)


def test_mlp_optional_layers_and_bad_activation():
    model = build("mlp", hidden=[8, 8], batch_norm=True, dropout=0.25)
    kinds = [type(layer).__name__ for layer in model.sublayers()]
    assert kinds.count("BatchNorm1D") == 2 and kinds.count("Dropout") == 2
    with pytest.raises(ConfigError, match="activation"):
        build("mlp", activation="sigmoidal")


def insightface_iresnet_parameters(depths, embedding_size=512, side=7):
    """Parameters of arcface_torch's IResNet, counted layer by layer from its definition (an independent tally).

    BatchNorm: scale + shift (2c); PReLU: one slope per channel; convs have no bias; the FC has a bias. The last
    BatchNorm1d keeps a scale frozen at 1.0 that arcface_torch still counts in ``parameters()``.
    """

    def bn(c):
        return 2 * c

    total = 3 * 64 * 9 + bn(64) + 64  # stem conv3x3, BN, PReLU
    in_channels = 64
    for width, depth in zip((64, 128, 256, 512), depths):
        for i in range(depth):
            a = in_channels if i == 0 else width
            total += bn(a) + a * width * 9 + bn(width) + width + width * width * 9 + bn(width)
            if i == 0:
                total += a * width + bn(width)  # downsample conv1x1 + BN
        in_channels = width
    return total + bn(512) + 512 * side * side * embedding_size + embedding_size + bn(embedding_size)


def count_learnable(model):
    """Number of learnable scalars (BatchNorm running statistics are stop_gradient parameters in Paddle; a parameter
    with a zero learning rate, iresnet's fixed final BatchNorm scale, is not learnable either)."""
    return sum(int(np.prod(p.shape)) for p in model.parameters()
               if not p.stop_gradient and p.optimize_attr.get("learning_rate", 1.0) != 0.0)


def count_all(model):
    """What arcface_torch sums over ``parameters()``: everything but BatchNorm running statistics."""
    return sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)


@pytest.mark.parametrize("name, published_millions", [("iresnet50", 43.6), ("iresnet100", None)])
def test_iresnet_parameter_count(name, published_millions):
    with paddle.LazyGuard():  # shapes only; 43-65M weights are never allocated
        model = build(name, embedding_size=512, input_size=112)
    reference = insightface_iresnet_parameters(iresnet.DEPTHS[name])
    # arcface_torch's parameters() tally includes the final BatchNorm's frozen scale (512); so does ours
    assert count_all(model) == reference
    assert count_learnable(model) == reference - 512
    if published_millions is not None:
        assert round(reference / 1e6, 1) == published_millions  # arcface_torch's model zoo: r50 has 43.6M
    assert tuple(model.fc.weight.shape) == (512 * 7 * 7, 512)


@pytest.mark.parametrize("size, side", [(112, 7), (56, 4), (32, 2), (7, 1)])
def test_iresnet_fc_width_follows_input_size(size, side):
    with paddle.LazyGuard():
        model = build("iresnet18", input_size=size, embedding_size=8)
    # Four stride-2 stages: side = ceil(size / 16), step by step ceil(s / 2).
    assert tuple(model.fc.weight.shape) == (512 * side * side, 8)


def test_mobilefacenet_matches_the_paper():
    """MobileFaceNet paper, Table 1 / section 3: 0.99M parameters and 221M multiply-adds at 112x112, 128-d."""
    paddle.seed(0)
    model = build("mobilefacenet")
    assert 0.97e6 <= count_learnable(model) <= 1.01e6
    madds = []

    def count_madds(layer, inputs, output):
        # Conv2D: every output value takes (in_channels / groups) * kh * kw multiply-adds.
        madds.append(int(np.prod(output.shape[1:])) * int(np.prod(layer.weight.shape[1:])))

    hooks = [
        layer.register_forward_post_hook(count_madds)
        for layer in model.sublayers()
        if isinstance(layer, paddle.nn.Conv2D)
    ]
    model.eval()
    out = model({"image": paddle.to_tensor(random_batch((3, 112, 112), batch=1))})
    for hook in hooks:
        hook.remove()
    total = sum(madds) + 512 * 128  # plus the final linear 1x1 conv (512 -> 128)
    assert tuple(out.shape) == (1, 128)
    assert abs(total / 1e6 - 221) < 0.5


def test_iresnet_final_batchnorm_bias_trains_and_scale_stays_frozen():
    """Paddle 3.3 CPU gives a scale-less (or frozen-scale) BatchNorm's bias no gradient; ours must train it, and its
    scale must stay 1.0 through an optimizer step with weight decay."""
    import numpy as np
    import paddle

    from mtl.backbones.iresnet import IResNet18

    net = IResNet18(embedding_size=8, input_size=16)
    x = paddle.to_tensor(np.random.RandomState(0).randn(2, 3, 16, 16).astype("float32"))
    out = net({"image": x})
    (out * paddle.to_tensor(np.arange(16, dtype="float32").reshape(2, 8))).sum().backward()
    assert net.features.bias.grad is not None and float(paddle.abs(net.features.bias.grad).sum()) > 0
    opt = paddle.optimizer.Momentum(0.1, parameters=net.parameters(), weight_decay=0.1)
    opt.step()
    np.testing.assert_array_equal(net.features.weight.numpy(), np.ones(8, dtype="float32"))
