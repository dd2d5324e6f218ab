"""LeNet as Sener and Koltun's MultiMNIST trunk (``MultiLeNetR`` of isl-org/MultiObjectiveOptimization,
``multi_task/models/multi_lenet.py``): the shared part of their LeNet; the task layers (fc 50 -> 50, ReLU, dropout,
then fc 50 -> 10) are a ``tower: [50]`` of the architecture and the softmax head.

    x [1, 28, 28] -> conv 5x5 (10) -> max-pool 2 -> ReLU -> conv 5x5 (20) -> channel dropout -> max-pool 2 -> ReLU
      -> flatten (320) -> fc 320 -> 50 -> ReLU
Dropout: Paddle's channel dropout (each channel of each sample kept with probability 1 - p and scaled by 1 / (1 - p);
theirs draws one channel mask per batch and does not rescale). ``batch_norm: true`` adds a BatchNorm after each
convolution (before pooling), for the architectures that make BatchNorms task-specific (``task_norm``, ``adapters``).
"""
import paddle
import paddle.nn.functional as F
from paddle import nn

from mtl.backbones.base import ImageBackbone, load_pretrained
from mtl.core.registry import register_backbone


@register_backbone("lenet")
class LeNet(ImageBackbone):
    """Sener and Koltun's shared LeNet trunk: conv-pool-conv-pool and one fully connected layer to 50 features.

    Parameters:
        channels (list): output channels of the two 5x5 convolutions (theirs: 10 and 20)
        dropout (float): rate in [0, 1) of the channel dropout after the second convolution (each channel of each
            sample dropped with probability p, the kept ones scaled by 1 / (1 - p); theirs: 0.5); 0: none
        batch_norm (bool): a BatchNorm after each convolution, before its pooling (not in their trunk: for the
            architectures that make BatchNorms task-specific, task_norm and adapters)
        pretrained (str): a .pdparams file loaded once the trunk is built (every parameter must match by name and
            shape); None: the initialisation. A job's backbone.pretrained is the job's own key, loaded the same way
            after construction, not passed here
    """

    def __init__(self, embedding_size: int = 50, channels=(10, 20), in_channels: int = 1, input_size: int = 28,
                 dropout: float = 0.5, batch_norm: bool = False, input_field: str = "image", pretrained: str = None):
        super().__init__()
        self.set_image_input(input_size, in_channels, input_field, embedding_size)
        if len(channels) != 2 or not all(isinstance(c, int) and c > 0 for c in channels):
            raise ValueError(f"channels must be two positive integers, got {channels!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        side = ((self.input_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"input_size {input_size} is too small for two 5x5 convolutions and pools (>= 16)")
        self.conv1 = nn.Conv2D(self.in_channels, channels[0], 5)
        self.conv2 = nn.Conv2D(channels[0], channels[1], 5)
        self.bn1 = nn.BatchNorm2D(channels[0]) if batch_norm else None
        self.bn2 = nn.BatchNorm2D(channels[1]) if batch_norm else None
        self.dropout = nn.Dropout2D(float(dropout)) if dropout else None
        self.fc = nn.Linear(channels[1] * side * side, self.feature_size)
        if pretrained:
            load_pretrained(self, pretrained, key="pretrained")

    def forward(self, inputs):
        """``inputs[input_field]`` [B, C, H, W] -> [B, embedding_size] (ReLU features, as their trunk's)."""
        x = inputs
        for stage in self.stages():
            x = stage(x)
        return x

    def stages(self):
        """conv1 block (inputs -> [B, 10, 12, 12]), conv2 block (-> [B, 20, 4, 4]), fc (-> [B, 50])."""
        return [self._block1, self._block2, self._head]

    def _block1(self, inputs):
        x = self.conv1(inputs[self.input_field])
        return F.relu(F.max_pool2d(self.bn1(x) if self.bn1 is not None else x, 2))

    def _block2(self, x):
        x = self.conv2(x)
        if self.bn2 is not None:
            x = self.bn2(x)
        if self.dropout is not None:
            x = self.dropout(x)
        return F.relu(F.max_pool2d(x, 2))

    def _head(self, x):
        return F.relu(self.fc(paddle.flatten(x, start_axis=1)))
