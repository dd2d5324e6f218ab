"""Small backbones for tiny inputs (scikit-learn's 8x8 digits, synthetic data, the distributed equality tests).

``cnn``: conv3x3-BN-ReLU blocks (the first at stride 1, the others at stride 2), then ``output: pool`` (global average
pooling and a linear layer) or ``output: flatten`` (BatchNorm, optional dropout, and a linear layer over the whole
final feature map, keeping where each feature is: the "E" output block of insightface's IResNet, Deng et al.,
"ArcFace", CVPR 2019, which matters for aligned faces), and optionally a BatchNorm of the embedding ("BN-neck", Luo
et al., "Bag of Tricks and A Strong Baseline for Deep Person Re-identification", CVPRW 2019; the BN after the
embedding of insightface's IResNet): it centres and scales every embedding dimension, which helps cosine-margin
heads on small data. Defaults: ``pool``, no dropout, no BN-neck.
``identity``: the input field flattened (no parameters: the architecture is the whole model).
``mlp``: flatten, then ``Linear - [BN] - activation - [dropout]`` per hidden size, then a linear layer. By default it
has no BatchNorm and no dropout, so its output depends only on its weights and its input (what the tests that compare
a one-process run with a many-process run need).
"""
import functools
import math
from typing import Sequence

import paddle
from paddle import nn

from mtl.backbones.base import Backbone, ImageBackbone
from mtl.core.contracts import Field
from mtl.core.errors import ParameterError
from mtl.core.registry import register_backbone

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def _positive_ints(value, name) -> tuple:
    """``value`` as a tuple of positive ints (a single int becomes a 1-tuple); ValueError otherwise."""
    items = (value,) if isinstance(value, int) else tuple(value)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        raise ParameterError(f"{name} must be a list of positive integers, got {value!r}")
    return items


@register_backbone("cnn")
class SmallCNN(ImageBackbone):
    """A few conv3x3-BN-ReLU blocks, global average pooling and a linear layer to the embedding.

    Parameters:
        channels (list): output channels of each conv3x3-BN-ReLU block (every block but the first halves the map)
        batch_norm (bool): BatchNorm after each convolution
        embedding_bn (bool): a BatchNorm on the embedding (as face backbones have)
        output (str): pool (global average of the last map) or flatten (all of it, for small inputs)
        dropout (float): dropout before the linear layer to the embedding
    """

    def __init__(
        self,
        embedding_size: int = 64,
        channels: Sequence[int] = (32, 64),
        in_channels: int = 1,
        input_size: int = 8,
        batch_norm: bool = True,
        input_field: str = "image",
        embedding_bn: bool = False,
        output: str = "pool",
        dropout: float = 0.0,
    ):
        super().__init__()
        channels = _positive_ints(channels, "channels")
        self.set_image_input(input_size, in_channels, input_field, embedding_size)
        if output not in ("pool", "flatten"):
            raise ParameterError(f"output must be 'pool' or 'flatten', got {output!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ParameterError(f"dropout must be in [0, 1), got {dropout!r}")
        layers = []
        previous = self.in_channels
        for i, width in enumerate(channels):
            # With BatchNorm the conv bias is redundant (BN subtracts the mean).
            layers.append(nn.Conv2D(previous, width, 3, stride=1 if i == 0 else 2, padding=1, bias_attr=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2D(width))
            layers.append(nn.ReLU())
            previous = width
        self.body = nn.Sequential(*layers)
        self._channels = channels
        self.output = output
        side = self.input_size
        for _ in channels[1:]:
            side = (side + 1) // 2  # a 3x3 convolution at stride 2 with padding 1
        flat = previous * side * side
        # E block: y = FC(dropout(BN(x).flatten())); the pooled form averages over the map first
        self.output_bn = nn.BatchNorm2D(previous) if output == "flatten" else None
        self.dropout = nn.Dropout(float(dropout)) if dropout else None
        self.fc = nn.Linear(flat if output == "flatten" else previous, self.feature_size)
        # BN-neck: y = (e - mean) / sqrt(var + eps) * gamma + beta per embedding dimension
        self.neck = nn.BatchNorm1D(self.feature_size) if embedding_bn else None

    def forward(self, inputs):
        """``inputs[input_field]`` [B, C, H, W] -> [B, embedding_size]; ``pool``: the mean over H and W,
        ``flatten``: BatchNorm of the map, then all of it (C x h x w values) into the linear layer."""
        x = inputs
        for stage in self.stages():
            x = stage(x)
        return x

    def stages(self):
        """One stage per conv-[BN-]ReLU block (the first reads the inputs dict), then the output block."""
        per_block = len(self.body) // len(self._channels)
        return ([functools.partial(self._block, 0, per_block)]
                + [functools.partial(self._block, lo, lo + per_block) for lo in range(per_block, len(self.body),
                                                                                    per_block)]
                + [self._output])

    def _block(self, lo, hi, x):
        x = x[self.input_field] if lo == 0 else x
        for i in range(lo, hi):
            x = self.body[i](x)
        return x

    def _output(self, x):
        x = paddle.mean(x, axis=[2, 3]) if self.output_bn is None else paddle.flatten(self.output_bn(x), start_axis=1)
        if self.dropout is not None:
            x = self.dropout(x)
        embedding = self.fc(x)
        return embedding if self.neck is None else self.neck(embedding)


@register_backbone("mlp")
class MLP(Backbone):
    """Flatten the input field; ``h = act(h @ W + b)`` per hidden size, then ``h @ W + b`` to the embedding.

    Parameters:
        embedding_size (int): width of the features (the embedding) the backbone returns: the last linear layer's
            outputs
        hidden (list): widths of the hidden layers
        activation (str): the hidden layers' activation: relu, tanh or gelu
        input_shape (list): shape of the input field of a sample (flattened)
        batch_norm (bool): BatchNorm after each hidden layer
        dropout (float): dropout after each hidden layer
        input_field (str): the sample field the backbone reads (e.g. features, of a table reader)
    """

    def __init__(
        self,
        embedding_size: int = 64,
        hidden: Sequence[int] = (128,),
        activation: str = "relu",
        input_shape: Sequence[int] = (1, 8, 8),
        batch_norm: bool = False,
        dropout: float = 0.0,
        input_field: str = "image",
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ParameterError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ParameterError(f"dropout must be in [0, 1), got {dropout}")
        hidden = _positive_ints(hidden, "hidden") if hidden else ()
        self.input_shape = _positive_ints(input_shape, "input_shape")
        (self.feature_size,) = _positive_ints(embedding_size, "embedding_size")
        self.input_field = input_field
        layers = []
        previous = math.prod(self.input_shape)
        for width in hidden:
            layers.append(nn.Linear(previous, width))
            if batch_norm:
                layers.append(nn.BatchNorm1D(width))
            layers.append(ACTIVATIONS[activation]())
            if dropout:
                layers.append(nn.Dropout(float(dropout)))
            previous = width
        layers.append(nn.Linear(previous, self.feature_size))
        self.layers = nn.Sequential(*layers)

    def input_fields(self):
        """One field of shape ``input_shape`` float32."""
        return [Field(self.input_field, self.input_shape, "float32")]

    def forward(self, inputs):
        """``inputs[input_field]`` [B, *input_shape] -> [B, embedding_size]."""
        return self.layers(paddle.flatten(inputs[self.input_field], start_axis=1))


@register_backbone("identity")
class Identity(Backbone):
    """The input field itself, flattened: ``[B, *input_shape] -> [B, prod(input_shape)]`` (no parameters).

    For tabular inputs whose whole model is the architecture's (Ma et al.'s synthetic benchmark: the experts, or the
    shared bottom, read the input features directly).

    Parameters:
        input_shape (list): shape of the input field of a sample; the backbone's feature_size (what the
            architecture reads) is its product
        input_field (str): the sample field the backbone reads (e.g. features, of mmoe_synthetic or a table reader)
    """

    def __init__(self, input_shape: Sequence[int] = (100,), input_field: str = "features"):
        super().__init__()
        self.input_shape = _positive_ints(input_shape, "input_shape")
        self.feature_size = math.prod(self.input_shape)
        self.input_field = input_field

    def input_fields(self):
        """One float32 field of shape ``input_shape``."""
        return [Field(self.input_field, self.input_shape, "float32")]

    def forward(self, inputs):
        """``inputs[input_field]`` flattened to [B, prod(input_shape)]."""
        return paddle.flatten(inputs[self.input_field], start_axis=1)
