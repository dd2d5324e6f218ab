"""Face-image transforms: decode to RGB, resize if needed, random horizontal flip, ``(x / 255 - 0.5) / 0.5``, CHW.

Two decoders give the same pixels for JPEG and PNG (both sit on libjpeg-turbo / libpng): OpenCV
(``opencv-python-headless``, used when installed: about twice as fast here, see ``bench/bench_recordio.py``) and
Pillow (always available). ``decoder: auto`` picks OpenCV when it imports. Resizing, when an image is not
``image_size`` square, is always Pillow's bilinear filter so that both decoders agree. The flip decision is a pure
function of (seed, epoch, index): a sample looks the same whichever DataLoader worker, process or world size makes it.
"""
from io import BytesIO

import numpy as np
from PIL import Image

DECODERS = ("auto", "opencv", "pillow")

# (x / 255 - 0.5) / 0.5 == (x - 127.5) * (2 / 255), evaluated in float32 (within 1 ulp of the float64 value).
_SCALE = np.float32(2.0 / 255.0)
_MEAN = 127.5

_MASK64 = (1 << 64) - 1
_CV2 = []  # cached import: [module or None]


class DecodeError(ValueError):
    """The bytes are not an image the decoder can read (the reader adds the file and record to the message)."""


def opencv():
    """The ``cv2`` module, or None when OpenCV is not installed (imported once)."""
    if not _CV2:
        try:
            import cv2
        except ImportError:
            cv2 = None
        _CV2.append(cv2)
    return _CV2[0]


def resolve_decoder(decoder: str = "auto") -> str:
    """``auto`` -> ``opencv`` when cv2 imports, else ``pillow``; ValueError for an unknown or unavailable decoder."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if decoder == "auto":
        return "opencv" if opencv() is not None else "pillow"
    if decoder == "opencv" and opencv() is None:
        raise ValueError("decoder 'opencv' needs the opencv-python-headless package, which is not installed")
    return decoder


def decode_rgb(data) -> Image.Image:
    """Decode encoded image bytes (JPEG, PNG, ...) with Pillow into a fully loaded RGB image."""
    try:
        image = Image.open(BytesIO(data))
        image.load()
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types (OSError, SyntaxError, ValueError ...)
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {exc}") from None
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def _decode_bgr(data) -> np.ndarray:
    """OpenCV decode to uint8 BGR [H, W, 3] (EXIF orientation ignored, as Pillow does)."""
    cv2 = opencv()
    try:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as exc:
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {exc}") from None
    if bgr is None:
        raise DecodeError(f"cannot decode image ({len(data)} bytes): OpenCV does not recognise the data")
    return bgr


def to_pixels(image: Image.Image, image_size: int) -> np.ndarray:
    """uint8 array [H, W, 3], resized with bilinear filtering to ``image_size`` x ``image_size`` when it differs."""
    if image.size != (image_size, image_size):
        image = image.resize((image_size, image_size), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def load_pixels(data, image_size: int, decoder: str = "auto") -> np.ndarray:
    """Encoded bytes -> uint8 RGB [image_size, image_size, 3] with the chosen decoder (Pillow resize if needed)."""
    if resolve_decoder(decoder) == "pillow":
        return to_pixels(decode_rgb(data), image_size)
    return _rgb_from_bgr(_decode_bgr(data), image_size)


def _rgb_from_bgr(bgr: np.ndarray, image_size: int) -> np.ndarray:
    rgb = np.ascontiguousarray(bgr[:, :, ::-1])
    if rgb.shape[:2] != (image_size, image_size):
        return to_pixels(Image.fromarray(rgb), image_size)
    return rgb


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


def _normalize_bgr(bgr: np.ndarray, flip: bool) -> np.ndarray:
    """OpenCV path of :func:`normalize` from BGR: flip, (x - 127.5) * 2/255, BGR->RGB and HWC->CHW in one C++ pass."""
    cv2 = opencv()
    if flip:
        bgr = cv2.flip(bgr, 1)
    return cv2.dnn.blobFromImage(bgr, float(_SCALE), None, (_MEAN, _MEAN, _MEAN), swapRB=True)[0]


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

    def __init__(self, image_size: int = 112, flip: bool = False, seed: int = 0, decoder: str = "auto"):
        self.image_size = int(image_size)
        self.flip = bool(flip)
        self.seed = int(seed)
        self.decoder = resolve_decoder(decoder)

    def __call__(self, data, index: int = 0, epoch: int = 0) -> np.ndarray:
        mirror = self.flip and flip_coin(self.seed, epoch, index)
        if self.decoder == "opencv":
            bgr = _decode_bgr(data)
            if bgr.shape[:2] == (self.image_size, self.image_size):
                return _normalize_bgr(bgr, mirror)
            return normalize(_rgb_from_bgr(bgr, self.image_size), mirror)
        return normalize(to_pixels(decode_rgb(data), self.image_size), mirror)
