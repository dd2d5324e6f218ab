"""Face-image transforms: decode to RGB, resize if needed, random horizontal flip, ``(x / 255 - 0.5) / 0.5``, CHW.

Decoding uses Pillow (OpenCV is not a dependency). The flip decision is a pure function of (seed, epoch, index), so
a sample looks the same whichever DataLoader worker (or process, or world size) produces it.
"""
from io import BytesIO

import numpy as np
from PIL import Image

# (x / 255 - 0.5) / 0.5 == x * (2 / 255) - 1, evaluated in float32 (within 1 ulp of the float64 value).
_SCALE = np.float32(2.0 / 255.0)

_MASK64 = (1 << 64) - 1


class DecodeError(ValueError):
    """The bytes are not an image Pillow can decode (the reader adds the file and record to the message)."""


def decode_rgb(data) -> Image.Image:
    """Decode encoded image bytes (JPEG, PNG, ...) into a fully loaded RGB Pillow image."""
    try:
        image = Image.open(BytesIO(data))
        image.load()
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types (OSError, SyntaxError, ValueError ...)
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {exc}") from None
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def to_pixels(image: Image.Image, image_size: int) -> np.ndarray:
    """uint8 array [H, W, 3], resized with bilinear filtering to ``image_size`` x ``image_size`` when it differs."""
    if image.size != (image_size, image_size):
        image = image.resize((image_size, image_size), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def normalize(pixels: np.ndarray, flip: bool = False) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W] with ``(x / 255 - 0.5) / 0.5``, mirrored left-right when ``flip``."""
    if flip:
        # numpy copies a mirrored, transposed uint8 view slowly; cast first, then read the mirrored view once
        hwc = pixels.astype(np.float32)
        out = np.empty((3,) + pixels.shape[:2], dtype=np.float32)
        np.multiply(hwc[:, ::-1].transpose(2, 0, 1), _SCALE, out=out)
    else:
        out = np.ascontiguousarray(pixels.transpose(2, 0, 1)).astype(np.float32)
        out *= _SCALE
    out -= 1.0
    return out


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def flip_coin(seed: int, epoch: int, index: int) -> bool:
    """Fair, reproducible coin for sample ``index`` in ``epoch``: hash(seed, epoch, index) has its top bit set."""
    h = _mix64(int(seed) & _MASK64)
    h = _mix64(h ^ (int(epoch) & _MASK64))
    h = _mix64(h ^ (int(index) & _MASK64))
    return bool(h >> 63)


class FaceTransform:
    """Bytes -> float32 [3, S, S]: decode, resize to ``image_size`` if needed, flip (when ``flip``), normalise."""

    def __init__(self, image_size: int = 112, flip: bool = False, seed: int = 0):
        self.image_size = int(image_size)
        self.flip = bool(flip)
        self.seed = int(seed)

    def __call__(self, data, index: int = 0, epoch: int = 0) -> np.ndarray:
        pixels = to_pixels(decode_rgb(data), self.image_size)
        return normalize(pixels, self.flip and flip_coin(self.seed, epoch, index))
