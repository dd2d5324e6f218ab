"""IResNet: InsightFace's improved ResNet for face recognition (ArcFace's r18/r34/r50/r100 backbones).

Differences from the ImageNet ResNet (Duta et al., "Improved Residual Networks"; Deng et al., ArcFace):
- stem: a 3x3 stride-1 conv + BN + PReLU, no max-pool, so a 112x112 face keeps its resolution until stage 1;
- residual unit ``IBasicBlock``: BN - conv3x3 - BN - PReLU - conv3x3(stride) - BN, plus the shortcut (identity, or
  conv1x1(stride) + BN when the shape changes); no activation after the sum;
- four stages of widths 64/128/256/512, each starting with stride 2: 112 -> 56 -> 28 -> 14 -> 7;
- embedding ("output layer E"): BN - dropout - flatten - FC - BN without a learnable scale, to ``embedding_size``.

Parameter count (iresnet50, 512-d, 112x112): 43,590,336 learnable parameters, the "43.6M" that arcface_torch's model
zoo publishes. arcface_torch itself reports 43,590,848 when it sums ``parameters()``: the extra 512 are the scale of the
final BatchNorm, which it keeps as a parameter frozen at 1.0 (``requires_grad = False``); ours is fixed at 1.0 by a zero
learning rate, which also keeps the state_dict keys of converted insightface weights.
"""
import paddle
from paddle import nn

from mtl.backbones.base import ImageBackbone
from mtl.convert.weights import IRESNET_DEPTHS as DEPTHS
from mtl.core.errors import ParameterError
from mtl.core.registry import register_backbone

WIDTHS = (64, 128, 256, 512)
BN_EPSILON = 1e-5


def conv3x3(in_channels, out_channels, stride=1):
    """3x3 convolution, padding 1, no bias (a BatchNorm always follows)."""
    return nn.Conv2D(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias_attr=False)


def downsampled_size(size: int, stages: int = 4) -> int:
    """Spatial size after ``stages`` stride-2 convolutions (3x3 pad 1 or 1x1 pad 0): ``ceil(size / 2)`` each time."""
    for _ in range(stages):
        size = (size + 1) // 2
    return size


class IBasicBlock(nn.Layer):
    """Pre-activation-style residual unit: ``out = BN(conv(PReLU(BN(conv(BN(x)))))) + shortcut(x)``."""

    def __init__(self, in_channels, channels, stride=1):
        super().__init__()
        self.bn1 = nn.BatchNorm2D(in_channels, epsilon=BN_EPSILON)
        self.conv1 = conv3x3(in_channels, channels)
        self.bn2 = nn.BatchNorm2D(channels, epsilon=BN_EPSILON)
        self.prelu = nn.PReLU(channels)
        self.conv2 = conv3x3(channels, channels, stride)
        self.bn3 = nn.BatchNorm2D(channels, epsilon=BN_EPSILON)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2D(in_channels, channels, kernel_size=1, stride=stride, bias_attr=False),
                nn.BatchNorm2D(channels, epsilon=BN_EPSILON),
            )

    def forward(self, x):
        """Residual branch plus shortcut."""
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        shortcut = x if self.downsample is None else self.downsample(x)
        return out + shortcut


class IResNet(ImageBackbone):
    """Improved ResNet for faces; subclasses fix the depth (blocks per stage).

    Parameters:
        dropout (float): dropout before the fully connected layer to the embedding (arcface_torch's fp16 recipe: 0)
    """

    depths = (2, 2, 2, 2)

    def __init__(self, embedding_size: int = 512, dropout: float = 0.0, input_size: int = 112, in_channels: int = 3,
                 input_field: str = "image"):
        super().__init__()
        self.set_image_input(input_size, in_channels, input_field, embedding_size)
        if not 0.0 <= float(dropout) < 1.0:
            raise ParameterError(f"dropout must be in [0, 1), got {dropout}")

        self.conv1 = conv3x3(self.in_channels, WIDTHS[0])
        self.bn1 = nn.BatchNorm2D(WIDTHS[0], epsilon=BN_EPSILON)
        self.prelu = nn.PReLU(WIDTHS[0])
        stages = []
        channels_in = WIDTHS[0]
        for width, depth in zip(WIDTHS, self.depths):
            blocks = [IBasicBlock(channels_in, width, stride=2)]
            blocks += [IBasicBlock(width, width) for _ in range(depth - 1)]
            stages.append(nn.Sequential(*blocks))
            channels_in = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages

        # Embedding: BN - dropout - FC - BN. The FC reads the whole last feature map, so its width depends on the
        # input size: 512 * 7 * 7 at 112x112.
        side = downsampled_size(self.input_size)
        self.bn2 = nn.BatchNorm2D(WIDTHS[-1], epsilon=BN_EPSILON)
        self.dropout = nn.Dropout(p=float(dropout))
        self.fc = nn.Linear(WIDTHS[-1] * side * side, self.feature_size)
        # Scale fixed at 1.0 as in arcface_torch, through a zero learning rate (no update, no weight decay). Neither
        # weight_attr=False nor stop_gradient on the scale works: on Paddle 3.3 CPU the BatchNorm then gives its bias
        # no gradient at all (bias.grad stays None; tests/test_backbones.py checks this).
        self.features = nn.BatchNorm1D(self.feature_size, epsilon=BN_EPSILON, weight_attr=paddle.ParamAttr(
            learning_rate=0.0, initializer=nn.initializer.Constant(1.0)))

    def forward(self, inputs):
        """``inputs[input_field]`` [B, C, H, W] -> embeddings [B, embedding_size]."""
        x = self.prelu(self.bn1(self.conv1(inputs[self.input_field])))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = paddle.flatten(self.bn2(x), start_axis=1)
        return self.features(self.fc(self.dropout(x)))


def _variant(name: str, doc: str):
    """Register the IResNet of ``DEPTHS[name]`` blocks per stage as backbone ``name``."""
    return register_backbone(name)(type(f"IResNet{name[len('iresnet'):]}", (IResNet,),
                                        {"depths": DEPTHS[name], "__doc__": doc, "__module__": __name__}))


IResNet18 = _variant("iresnet18", "IResNet-18 (blocks per stage 2, 2, 2, 2).")
IResNet34 = _variant("iresnet34", "IResNet-34 (blocks per stage 3, 4, 6, 3).")
IResNet50 = _variant("iresnet50", "IResNet-50 (blocks per stage 3, 4, 14, 3); 43.6M parameters at 112x112 and 512-d.")
IResNet100 = _variant("iresnet100", "IResNet-100 (blocks per stage 3, 13, 30, 3); 65.16M parameters at 112x112 and "
                                    "512-d.")
