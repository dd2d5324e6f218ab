"""MobileFaceNet (Chen et al., 2018): a ~1M-parameter face embedding network for mobile devices.

The layer table of the paper (Table 1), input 112x112; t = expansion, c = output channels, n = repeats, s = stride:

    conv3x3                 c=64              s=2    112 -> 56
    depthwise conv3x3       c=64              s=1
    bottleneck   t=2        c=64   n=5        s=2    56 -> 28
    bottleneck   t=4        c=128  n=1        s=2    28 -> 14
    bottleneck   t=2        c=128  n=6        s=1
    bottleneck   t=4        c=128  n=1        s=2    14 -> 7
    bottleneck   t=2        c=128  n=2        s=1
    conv1x1                 c=512             s=1
    linear GDConv7x7        c=512                    global depthwise conv: one 7x7 filter per channel, no activation
    linear conv1x1          c=embedding_size         then BatchNorm, no activation

Every conv is followed by BatchNorm; the non-linearity is PReLU. A bottleneck is MobileNetV2's inverted residual:
conv1x1 (expand to t * c_in) - depthwise conv3x3 (stride s) - linear conv1x1 (project to c), with an identity shortcut
when s = 1 and c_in = c. The GDConv kernel equals the size of the last feature map (7 at 112x112), so other input
sizes work. At 112x112 and 128-d: 220.97M multiply-adds (the paper: 221M); 976,000 conv/FC weights, 995,584 with the
BatchNorm scales and shifts, 1,003,136 with the PReLU slopes too (the paper: 0.99M, not saying which it counts).
"""
import paddle
from paddle import nn

from mtl.backbones.base import ImageBackbone, load_pretrained
from mtl.registry import register_backbone

# (expansion t, output channels c, repeats n, stride s) of the bottleneck groups, from the paper's Table 1.
BOTTLENECKS = ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1))
STEM_CHANNELS = 64
LAST_CHANNELS = 512


class ConvBN(nn.Sequential):
    """Conv (no bias) + BatchNorm, followed by PReLU unless ``linear``."""

    def __init__(self, in_channels, out_channels, kernel_size=1, stride=1, groups=1, linear=False):
        layers = [
            nn.Conv2D(
                in_channels,
                out_channels,
                kernel_size,
                stride=stride,
                padding=(kernel_size - 1) // 2 if kernel_size == 3 else 0,
                groups=groups,
                bias_attr=False,
            ),
            nn.BatchNorm2D(out_channels),
        ]
        if not linear:
            layers.append(nn.PReLU(out_channels))
        super().__init__(*layers)


class Bottleneck(nn.Layer):
    """Inverted residual: expand 1x1 - depthwise 3x3 (stride) - linear project 1x1, plus identity if shapes agree."""

    def __init__(self, in_channels, out_channels, expansion, stride):
        super().__init__()
        hidden = in_channels * expansion
        self.residual = stride == 1 and in_channels == out_channels
        self.layers = nn.Sequential(
            ConvBN(in_channels, hidden, 1),
            ConvBN(hidden, hidden, 3, stride=stride, groups=hidden),
            ConvBN(hidden, out_channels, 1, linear=True),
        )

    def forward(self, x):
        """``layers(x) + x`` when the block keeps the shape, else ``layers(x)``."""
        out = self.layers(x)
        return out + x if self.residual else out


@register_backbone("mobilefacenet")
class MobileFaceNet(ImageBackbone):
    """MobileFaceNet: depthwise-separable bottlenecks and a global depthwise conv (GDConv) to the embedding."""

    def __init__(
        self,
        embedding_size: int = 128,
        input_size: int = 112,
        in_channels: int = 3,
        input_field: str = "image",
        pretrained: str = None,
    ):
        super().__init__()
        self.set_image_input(input_size, in_channels, input_field, embedding_size)

        layers = [
            ConvBN(self.in_channels, STEM_CHANNELS, 3, stride=2),
            ConvBN(STEM_CHANNELS, STEM_CHANNELS, 3, groups=STEM_CHANNELS),
        ]
        channels = STEM_CHANNELS
        side = (self.input_size + 1) // 2  # 3x3 conv, pad 1, stride 2: ceil(size / 2)
        for expansion, out_channels, repeats, stride in BOTTLENECKS:
            for i in range(repeats):
                layers.append(Bottleneck(channels, out_channels, expansion, stride if i == 0 else 1))
                channels = out_channels
            if stride == 2:
                side = (side + 1) // 2
        layers.append(ConvBN(channels, LAST_CHANNELS, 1))
        self.body = nn.Sequential(*layers)
        # GDConv: a depthwise conv whose kernel covers the whole side x side map, i.e. a learned weighted pooling.
        self.gdconv = nn.Sequential(
            nn.Conv2D(LAST_CHANNELS, LAST_CHANNELS, side, groups=LAST_CHANNELS, bias_attr=False),
            nn.BatchNorm2D(LAST_CHANNELS),
        )
        # Linear conv1x1 on a 1x1 map = a fully connected layer without bias, then BatchNorm.
        self.embedding = nn.Linear(LAST_CHANNELS, self.feature_size, bias_attr=False)
        self.features = nn.BatchNorm1D(self.feature_size)

        if pretrained:
            load_pretrained(self, pretrained, key="pretrained")

    def forward(self, inputs):
        """``inputs[input_field]`` [B, C, H, W] -> embeddings [B, embedding_size]."""
        x = self.gdconv(self.body(inputs[self.input_field]))
        return self.features(self.embedding(paddle.flatten(x, start_axis=1)))
