"""Vision Transformer for 112x112 faces (``vit_t``, ``vit_s``, ``vit_b``; ``vit`` takes every size parameter).

The architecture of insightface arcface_torch's ``backbones/vit.py`` (and PLSC's FaceViT), written for Paddle:

* patch embedding: a ``patch_size`` x ``patch_size`` convolution of stride ``patch_size`` (9: 112 -> 12 x 12 = 144
  tokens, the last 4 pixel rows and columns unused), plus a learned position embedding; no class token;
* in training, random token masking (``mask_ratio``: each sample keeps ``int(L (1 - mask_ratio))`` tokens in a random
  order; after the blocks the dropped places are filled with a learned mask token and the order is restored);
* ``depth`` pre-norm blocks ``x + DropPath(Attn(LN(x)))``, ``x + DropPath(MLP(LN(x)))``: multi-head attention
  without qkv bias (scale ``head_dim^-1/2``), MLP ``dim -> mlp_ratio dim -> dim`` with ReLU6; stochastic depth rising
  linearly from 0 to ``drop_path_rate`` over the blocks;
* a final LayerNorm, then the "feature" head over all tokens: ``Linear(L D -> D, no bias) - BN(eps 2e-5) -
  Linear(D -> embedding_size, no bias) - BN(eps 2e-5)``.

Sizes (arcface_torch ``get_model``): vit_t D=256, depth 12; vit_s D=512, depth 12; vit_b D=512, depth 24; 8 heads,
drop path 0.1, mask ratio 0.1. Initialisation as the peer's: linear weights, position embedding and mask token
~ N(0, 0.02^2) (the peer's ``trunc_normal_`` truncates at +-2 absolute, i.e. never at std 0.02), biases 0, the
patch convolution U(+-1/sqrt(fan_in)) (torch's default).

``recompute: true`` runs each block under Paddle's activation recomputation (``paddle.distributed.fleet.utils.
recompute``, the random state of the forward replayed): a block keeps only its input for the backward and computes
its activations again there; arcface_torch does the same with ``torch.utils.checkpoint`` (``using_checkpoint``, on
for vit_b). :meth:`VisionTransformer.activation_bytes` tells the memory plan what the activations take.
"""
import math

import paddle
import paddle.nn.functional as F
from paddle import nn

from mtl.backbones.base import ImageBackbone
from mtl.core.errors import ParameterError
from mtl.core.registry import register_backbone

INIT_STD = 0.02
FEATURE_BN_EPSILON = 2e-5
SAVED_PER_TOKEN = 20  # floats per token and embedding channel a block keeps for its backward (activation_bytes)


def _normal():
    return paddle.ParamAttr(initializer=nn.initializer.Normal(0.0, INIT_STD))


class DropPath(nn.Layer):
    """Stochastic depth: in training, each sample's branch is dropped with probability ``p`` and kept ones are
    scaled by ``1 / (1 - p)`` (timm's ``drop_path``)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x):
        """``x`` or ``x * floor(1 - p + U) / (1 - p)`` per sample."""
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = paddle.floor(keep + paddle.rand([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype))
        return x / keep * mask


class Attention(nn.Layer):
    """Multi-head self-attention: ``softmax(q k^T / sqrt(d_h)) v`` per head, then a projection."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False, attn_drop: float = 0.0, drop: float = 0.0):
        super().__init__()
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, weight_attr=_normal(), bias_attr=None if qkv_bias else False)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, weight_attr=_normal())
        self.proj_drop = nn.Dropout(drop)

    def forward(self, x):
        """``x [B, L, D]`` -> ``[B, L, D]``."""
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape([batch, tokens, 3, self.num_heads, dim // self.num_heads]).transpose([2, 0, 3, 1, 4])
        attn = F.softmax(paddle.matmul(qkv[0], qkv[1], transpose_y=True) * self.scale, axis=-1)
        out = paddle.matmul(self.attn_drop(attn), qkv[2]).transpose([0, 2, 1, 3]).reshape([batch, tokens, dim])
        return self.proj_drop(self.proj(out))


class Mlp(nn.Layer):
    """``fc2(drop(ReLU6(fc1(x))))`` then dropout."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1, self.act = nn.Linear(dim, hidden, weight_attr=_normal()), nn.ReLU6()
        self.fc2, self.drop = nn.Linear(hidden, dim, weight_attr=_normal()), nn.Dropout(drop)

    def forward(self, x):
        """The two-layer MLP of a block."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Layer):
    """``x + DropPath(Attn(LN(x)))``, then ``x + DropPath(MLP(LN(x)))``."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False, drop=0.0, attn_drop=0.0, drop_path=0.0):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.drop_path = DropPath(drop_path)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def forward(self, x):
        """The pre-norm residual block."""
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Layer):
    """``[B, C, H, W]`` -> ``[B, (H // p) (W // p), D]`` by a convolution of kernel and stride ``p``."""

    def __init__(self, input_size: int, patch_size: int, in_channels: int, dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_channels * patch_size * patch_size)
        uniform = paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound))
        self.num_patches = (input_size // patch_size) ** 2
        self.proj = nn.Conv2D(in_channels, dim, patch_size, stride=patch_size, weight_attr=uniform,
                              bias_attr=paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound)))

    def forward(self, x):
        """The patch tokens."""
        return self.proj(x).flatten(2).transpose([0, 2, 1])


@register_backbone("vit")
class VisionTransformer(ImageBackbone):
    """Face ViT (module docstring): patch tokens, masking, pre-norm blocks, a linear head over all tokens.

    Parameters:
        patch_size (int): side of a patch: a token per patch_size x patch_size square (9: 144 tokens at 112)
        embed_dim (int): token width (None: the variant's; vit_t 256, vit_s and vit_b 512; required for vit)
        depth (int): transformer blocks (None: the variant's; vit_t, vit_s 12, vit_b 24)
        num_heads (int): attention heads (None: the variant's, 8)
        mlp_ratio (float): hidden width of a block's MLP, as a multiple of embed_dim
        qkv_bias (bool): biases in the attention's query, key and value projections
        drop_rate (float): dropout after the position embedding and in the blocks
        attn_drop_rate (float): dropout of the attention weights
        drop_path_rate (float): stochastic depth of the last block, rising linearly from 0 (None: the variant's, 0.1)
        mask_ratio (float): fraction of the tokens masked at random in training (None: the variant's, 0.1)
        recompute (bool): recompute each block's activations in the backward instead of keeping them (None: on
            for vit_b)
    """

    defaults = {}

    def __init__(self, embedding_size: int = 512, input_size: int = 112, in_channels: int = 3, patch_size: int = 9,
                 embed_dim: int = None, depth: int = None, num_heads: int = None, mlp_ratio: float = 4.0,
                 qkv_bias: bool = False, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = None, mask_ratio: float = None, recompute: bool = None,
                 input_field: str = "image"):
        super().__init__()
        self.set_image_input(input_size, in_channels, input_field, embedding_size)
        size = self._sizes(embed_dim=embed_dim, depth=depth, num_heads=num_heads, drop_path_rate=drop_path_rate,
                           mask_ratio=mask_ratio, recompute=recompute, patch_size=patch_size)
        self.embed_dim, self.depth, self.num_heads = size["embed_dim"], size["depth"], size["num_heads"]
        self.mask_ratio, self.recompute = size["mask_ratio"], size["recompute"]
        self.patch_embed = PatchEmbed(self.input_size, size["patch_size"], self.in_channels, self.embed_dim)
        self.num_patches = self.patch_embed.num_patches
        self.pos_embed = self.create_parameter([1, self.num_patches, self.embed_dim],
                                               default_initializer=nn.initializer.Normal(0.0, INIT_STD))
        self.pos_drop = nn.Dropout(drop_rate)
        rates = [size["drop_path_rate"] * i / max(1, self.depth - 1) for i in range(self.depth)]
        self.blocks = nn.LayerList([Block(self.embed_dim, self.num_heads, mlp_ratio, qkv_bias, drop_rate,
                                          attn_drop_rate, rate) for rate in rates])
        self.norm = nn.LayerNorm(self.embed_dim)
        self.feature = nn.Sequential(
            nn.Linear(self.embed_dim * self.num_patches, self.embed_dim, weight_attr=_normal(), bias_attr=False),
            nn.BatchNorm1D(self.embed_dim, epsilon=FEATURE_BN_EPSILON),
            nn.Linear(self.embed_dim, self.feature_size, weight_attr=_normal(), bias_attr=False),
            nn.BatchNorm1D(self.feature_size, epsilon=FEATURE_BN_EPSILON))
        self.mask_token = self.create_parameter([1, 1, self.embed_dim],
                                                default_initializer=nn.initializer.Normal(0.0, INIT_STD))

    def _sizes(self, **given) -> dict:
        """The size options: given ones over the variant's ``defaults``; every one must end up set and valid."""
        size = {k: (self.defaults.get(k) if v is None else v) for k, v in given.items()}
        size.update({k: v for k, v in {"drop_path_rate": 0.0, "mask_ratio": 0.0, "recompute": False}.items()
                     if size[k] is None})
        for name in ("embed_dim", "depth", "num_heads", "patch_size"):
            value = size[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"{name} must be a positive integer, got {value!r}")
        if size["embed_dim"] % size["num_heads"]:
            raise ParameterError(f"embed_dim {size['embed_dim']} must be a multiple of num_heads {size['num_heads']}")
        if size["patch_size"] > self.input_size:
            raise ParameterError(f"patch_size {size['patch_size']} is larger than input_size {self.input_size}")
        for name in ("drop_path_rate", "mask_ratio"):
            if not 0.0 <= float(size[name]) < 1.0:
                raise ParameterError(f"{name} must be in [0, 1), got {size[name]!r}")
        return size

    def activation_bytes(self, rows: int) -> int:
        """Estimated bytes of the activations one training forward of ``rows`` samples keeps for its backward
        (float32): per block ``SAVED_PER_TOKEN L' D + H L'^2`` floats per sample (LayerNorm inputs and outputs,
        q, k, v, attention probabilities, the MLP's hidden layer before and after ReLU6, ...), ``L'`` the tokens kept
        by the masking, plus ``4 L D`` around the blocks. With ``recompute`` a block keeps only its input
        (``L' D``) and one block's activations exist at a time, in its backward."""
        tokens = int(self.num_patches * (1.0 - self.mask_ratio))
        block = SAVED_PER_TOKEN * tokens * self.embed_dim + self.num_heads * tokens * tokens
        kept = self.depth * tokens * self.embed_dim + block if self.recompute else self.depth * block
        return 4 * int(rows) * (kept + 4 * self.num_patches * self.embed_dim)

    def _mask(self, x):
        """Keep ``int(L (1 - mask_ratio))`` tokens of each sample in a random order; ``(kept, restoring order)``."""
        batch, tokens, dim = x.shape
        keep = int(tokens * (1.0 - self.mask_ratio))
        shuffle = paddle.argsort(paddle.rand([batch, tokens]), axis=1)
        kept = paddle.take_along_axis(x, shuffle[:, :keep].unsqueeze(-1).expand([batch, keep, dim]), axis=1)
        return kept, paddle.argsort(shuffle, axis=1)

    def _unmask(self, x, restore):
        """Mask tokens in the dropped places, the tokens back in their order."""
        batch, keep, dim = x.shape
        tokens = restore.shape[1]
        x = paddle.concat([x, self.mask_token.expand([batch, tokens - keep, dim])], axis=1)
        return paddle.take_along_axis(x, restore.unsqueeze(-1).expand([batch, tokens, dim]), axis=1)

    def forward(self, inputs):
        """``inputs[input_field]`` [B, C, H, W] -> embeddings [B, embedding_size]."""
        x = self.pos_drop(self.patch_embed(inputs[self.input_field]) + self.pos_embed)
        restore = None
        if self.training and self.mask_ratio > 0:
            x, restore = self._mask(x)
        for block in self.blocks:
            if self.recompute and self.training and not x.stop_gradient:
                from paddle.distributed.fleet.utils import recompute

                x = recompute(block, x)
            else:
                x = block(x)
        x = self.norm(x)
        if restore is not None:
            x = self._unmask(x, restore)
        return self.feature(x.reshape([x.shape[0], self.num_patches * self.embed_dim]))


def _variant(name: str, doc: str, **defaults):
    """Register a preset of :class:`VisionTransformer` as backbone ``name`` (arcface_torch's ``get_model`` sizes)."""
    return register_backbone(name)(type(f"ViT_{name[4:].upper()}", (VisionTransformer,),
                                        {"defaults": dict(defaults, patch_size=9), "__doc__": doc,
                                         "__module__": __name__}))


_PEER = {"num_heads": 8, "drop_path_rate": 0.1, "mask_ratio": 0.1}
ViT_T = _variant("vit_t", "ViT-T: 256 channels, 12 blocks, 8 heads (arcface_torch vit_t).", embed_dim=256, depth=12,
                 **_PEER)
ViT_S = _variant("vit_s", "ViT-S: 512 channels, 12 blocks, 8 heads (arcface_torch vit_s).", embed_dim=512, depth=12,
                 **_PEER)
ViT_B = _variant("vit_b", "ViT-B: 512 channels, 24 blocks, 8 heads, recompute on (arcface_torch vit_b).",
                 embed_dim=512, depth=24, recompute=True, **_PEER)
