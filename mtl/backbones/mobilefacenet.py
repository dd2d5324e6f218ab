"""MobileFaceNet (Chen et al., 2018): a ~1M-parameter face embedding network for mobile devices.

The module tree is insightface's (``arcface_torch/backbones/mobilefacenet.py``, itself cavaface's), layer for layer
and name for name, so that its weights convert by name (``mtl convert insightface ... --arch mobilefacenet``):

    layers.0    ConvBlock  conv3x3 s2 (3 -> 64 * scale)                                       112 -> 56
    layers.1    ConvBlock  conv3x3, 64 groups (blocks[0] == 1), else Residual of blocks[0] units, hidden 128
    layers.2    DepthWise  64 * scale -> 64 * scale, hidden 128, s2                            56 -> 28
    layers.3    Residual   blocks[1] units, 64 * scale, hidden 128
    layers.4    DepthWise  64 * scale -> 128 * scale, hidden 256, s2                           28 -> 14
    layers.5    Residual   blocks[2] units, 128 * scale, hidden 256
    layers.6    DepthWise  128 * scale -> 128 * scale, hidden 512, s2                          14 -> 7
    layers.7    Residual   blocks[3] units, 128 * scale, hidden 256
    conv_sep    ConvBlock  conv1x1 -> 512
    features    GDC: LinearBlock (global depthwise conv, kernel = the last map's side, 7 at 112x112),
                flatten, Linear(512, embedding_size, no bias), BatchNorm1D

ConvBlock = conv (no bias) - BN - PReLU; LinearBlock = conv - BN; DepthWise = ConvBlock 1x1 (to the hidden width) -
ConvBlock depthwise 3x3 (stride) - LinearBlock 1x1 (MobileNetV2's inverted residual), plus the input inside a Residual.
With ``scale: 1`` and ``blocks: [1, 4, 6, 2]`` (the defaults) this is the paper's Table 1 exactly (the hidden widths
128, 256, 256, 512, 256 are its expansions 2, 4, 2, 4, 2 of 64 and 128 channels): at 112x112 and 128-d 220.97M
multiply-adds (the paper: 221M) and 1,003,136 learnable values with BatchNorm and PReLU (the paper: 0.99M).
insightface's ``mbf`` is ``scale: 2, embedding_size: 512``; its ``mbf_large`` is ``scale: 4, blocks: [2, 8, 12, 4]``.
"""
from typing import Sequence

from paddle import nn

from mtl.backbones.base import ImageBackbone
from mtl.core.errors import ParameterError
from mtl.core.registry import register_backbone

LAST_CHANNELS = 512


def _conv_bn(in_channels, out_channels, kernel, stride, padding, groups):
    """Conv (no bias) and BatchNorm: the first two layers of both blocks."""
    return [nn.Conv2D(in_channels, out_channels, kernel, stride=stride, padding=padding, groups=groups,
                      bias_attr=False), nn.BatchNorm2D(out_channels, epsilon=1e-5)]


class ConvBlock(nn.Layer):
    """Conv (no bias) - BatchNorm - PReLU (``layers.0/1/2``)."""

    def __init__(self, in_channels, out_channels, kernel=1, stride=1, padding=0, groups=1):
        super().__init__()
        self.layers = nn.Sequential(*_conv_bn(in_channels, out_channels, kernel, stride, padding, groups),
                                    nn.PReLU(out_channels))

    def forward(self, x):
        """conv - BN - PReLU."""
        return self.layers(x)


class LinearBlock(nn.Layer):
    """Conv (no bias) - BatchNorm, no activation (``layers.0/1``)."""

    def __init__(self, in_channels, out_channels, kernel=1, stride=1, padding=0, groups=1):
        super().__init__()
        self.layers = nn.Sequential(*_conv_bn(in_channels, out_channels, kernel, stride, padding, groups))

    def forward(self, x):
        """conv - BN."""
        return self.layers(x)


class DepthWise(nn.Layer):
    """Inverted residual: 1x1 to ``hidden`` - depthwise 3x3 (stride) - linear 1x1 to ``out``, plus x if ``residual``."""

    def __init__(self, in_channels, out_channels, hidden, stride=1, residual=False):
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(
            ConvBlock(in_channels, hidden),
            ConvBlock(hidden, hidden, 3, stride=stride, padding=1, groups=hidden),
            LinearBlock(hidden, out_channels),
        )

    def forward(self, x):
        """``layers(x) + x`` in a Residual, else ``layers(x)``."""
        out = self.layers(x)
        return out + x if self.residual else out


class Residual(nn.Layer):
    """``count`` shape-keeping DepthWise units with identity shortcuts (``layers.k``)."""

    def __init__(self, channels, count, hidden):
        super().__init__()
        self.layers = nn.Sequential(*[DepthWise(channels, channels, hidden, residual=True) for _ in range(count)])

    def forward(self, x):
        """The units in order."""
        return self.layers(x)


class GDC(nn.Layer):
    """Global depthwise conv (a learned weighted pooling of the ``side x side`` map) - BN - flatten - Linear - BN."""

    def __init__(self, side, embedding_size):
        super().__init__()
        self.layers = nn.Sequential(
            LinearBlock(LAST_CHANNELS, LAST_CHANNELS, side, groups=LAST_CHANNELS),
            nn.Flatten(),
            nn.Linear(LAST_CHANNELS, embedding_size, bias_attr=False),
            nn.BatchNorm1D(embedding_size, epsilon=1e-5),
        )

    def forward(self, x):
        """[B, 512, side, side] -> [B, embedding_size]."""
        return self.layers(x)


def _check_blocks(blocks, scale):
    """``blocks`` as four positive ints and ``scale`` as a positive int, or a ValueError sentence."""
    values = list(blocks) if isinstance(blocks, (list, tuple)) else []
    if len(values) != 4 or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in values):
        raise ParameterError(f"blocks must be four positive integers, got {blocks!r}")
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ParameterError(f"scale must be a positive integer, got {scale!r}")
    return values


@register_backbone("mobilefacenet")
class MobileFaceNet(ImageBackbone):
    """MobileFaceNet: depthwise-separable bottlenecks and a global depthwise conv (GDConv) to the embedding.

    Parameters:
        scale (int): width multiplier of every stage (mbf: 1, mbf_large: 2)
        blocks (list): bottleneck units of the four stages (mbf: [1, 4, 6, 2], mbf_large: [2, 8, 12, 4])
    """

    def __init__(self, embedding_size: int = 128, input_size: int = 112, in_channels: int = 3,
                 input_field: str = "image", scale: int = 1,
                 blocks: Sequence[int] = (1, 4, 6, 2)):
        super().__init__()
        self.set_image_input(input_size, in_channels, input_field, embedding_size)
        blocks = _check_blocks(blocks, scale)
        wide, wider = 64 * scale, 128 * scale
        first = (ConvBlock(wide, wide, 3, padding=1, groups=64) if blocks[0] == 1 else Residual(wide, blocks[0], 128))
        self.layers = nn.LayerList([
            ConvBlock(self.in_channels, wide, 3, stride=2, padding=1), first,
            DepthWise(wide, wide, 128, stride=2), Residual(wide, blocks[1], 128),
            DepthWise(wide, wider, 256, stride=2), Residual(wider, blocks[2], 256),
            DepthWise(wider, wider, 512, stride=2), Residual(wider, blocks[3], 256),
        ])
        self.conv_sep = ConvBlock(wider, LAST_CHANNELS)
        side = self.input_size
        for _ in range(4):  # four 3x3 stride-2 convs, padding 1: ceil(size / 2) each
            side = (side + 1) // 2
        self.features = GDC(side, self.feature_size)

    def forward(self, inputs):
        """``inputs[input_field]`` [B, C, H, W] -> embeddings [B, embedding_size]."""
        x = inputs[self.input_field]
        for layer in self.layers:
            x = layer(x)
        return self.features(self.conv_sep(x))
