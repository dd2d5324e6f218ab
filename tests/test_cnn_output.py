"""The small CNN's ``output: flatten`` block (insightface's "E" output) against numpy on the body's feature map."""
import numpy as np
import paddle
import pytest

from mtl.backbones.small import SmallCNN


def test_flatten_output_is_bn_then_a_linear_layer_over_the_whole_map():
    paddle.seed(0)
    model = SmallCNN(embedding_size=6, channels=[4, 5], in_channels=3, input_size=9, output="flatten")
    model.eval()
    bn = model.output_bn
    bn._mean.set_value(paddle.to_tensor(np.linspace(-0.5, 0.5, 5).astype("float32")))
    bn._variance.set_value(paddle.to_tensor(np.linspace(0.5, 2.0, 5).astype("float32")))
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype("float32"))
    fmap = model.body(x).numpy()  # [2, 5, 5, 5]: 9 -> 9 (stride 1) -> 5 (stride 2)
    assert fmap.shape == (2, 5, 5, 5)
    mean, var = bn._mean.numpy(), bn._variance.numpy()
    gamma, beta = bn.weight.numpy(), bn.bias.numpy()
    normed = (fmap - mean[:, None, None]) / np.sqrt(var[:, None, None] + bn._epsilon) * gamma[:, None, None] \
        + beta[:, None, None]
    expected = normed.reshape(2, -1) @ model.fc.weight.numpy() + model.fc.bias.numpy()
    np.testing.assert_allclose(model({"image": x}).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_pool_output_averages_the_map_and_bad_options_are_refused():
    paddle.seed(0)
    model = SmallCNN(embedding_size=4, channels=[3], in_channels=1, input_size=6)
    model.eval()
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((2, 1, 6, 6)).astype("float32"))
    pooled = model.body(x).numpy().mean(axis=(2, 3))
    np.testing.assert_allclose(model({"image": x}).numpy(), pooled @ model.fc.weight.numpy() + model.fc.bias.numpy(),
                               rtol=1e-5, atol=1e-6)
    for bad, words in (({"output": "max"}, "output must be"), ({"dropout": 1.0}, "dropout must be")):
        with pytest.raises(ValueError, match=words):
            SmallCNN(**bad)
