"""Face-image transforms: decode to RGB, resize if needed, random horizontal flip, ``(x / 255 - 0.5) / 0.5``, CHW.

Two decoders give the same pixels for JPEG and PNG (both sit on libjpeg-turbo / libpng): OpenCV
(``opencv-python-headless``, used when installed: about twice as fast here, see ``bench/bench_recordio.py``) and
Pillow (always available). ``decoder: auto`` picks OpenCV when it imports. Resizing, when an image is not
``image_size`` square, is always Pillow's bilinear filter so that both decoders agree. The flip decision is a pure
function of (seed, epoch, index): a sample looks the same whichever DataLoader worker, process or world size makes it.

Optional training augmentation (:class:`Augment`, every part off by default, never applied to evaluation splits):
a random zoom / rotation / shift as one affine warp of the resized image, brightness and contrast, and random
erasing (Zhong et al., "Random Erasing Data Augmentation", AAAI 2020). Its draws come from
``default_rng([seed, epoch, index])``, like the flip coin a pure function of (seed, epoch, index).
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
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {' '.join(str(exc).split())}") from None
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def _decode_bgr(data) -> np.ndarray:
    """OpenCV decode to uint8 BGR [H, W, 3] (EXIF orientation ignored, as Pillow does)."""
    cv2 = opencv()
    try:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as exc:
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {' '.join(str(exc).split())}") from None
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


class Augment:
    """Random training augmentation of a uint8 RGB face image, drawn from (seed, epoch, index).

    ``crop_scale``: smallest kept area fraction of a random zoom (1 = none): the image is magnified by
    ``1 / sqrt(a)``, ``a ~ U[crop_scale, 1]``, around a random centre that keeps the view inside the image
    (a random resized crop at fixed aspect ratio); ``rotate``: largest rotation in degrees; ``translate``: largest
    shift as a fraction of the side; all three are one bilinear affine warp of the already resized image (so that
    nothing is downsampled without antialiasing). ``brightness`` / ``contrast``: ``x <- x * b`` and
    ``x <- (x - mean) * c + mean`` with ``b, c ~ U[1 - v, 1 + v]``. ``erase``: probability of filling one random
    rectangle (area fraction ~ U[erase_area], aspect ratio ~ log-U[0.3, 3.3]) with grey (0 after normalisation).
    """

    KEYS = ("crop_scale", "rotate", "translate", "brightness", "contrast", "erase", "erase_area")

    def __init__(self, crop_scale=1.0, rotate=0.0, translate=0.0, brightness=0.0, contrast=0.0, erase=0.0,
                 erase_area=(0.02, 0.2)):
        self.crop_scale = _number_in("crop_scale", crop_scale, 0.05, 1.0)
        self.rotate = _number_in("rotate", rotate, 0.0, 180.0)
        self.translate = _number_in("translate", translate, 0.0, 0.5)
        self.brightness = _number_in("brightness", brightness, 0.0, 1.0)
        self.contrast = _number_in("contrast", contrast, 0.0, 1.0)
        self.erase = _number_in("erase", erase, 0.0, 1.0)
        if not (isinstance(erase_area, (list, tuple)) and len(erase_area) == 2):
            raise ValueError(f"erase_area must be a pair [min, max] of area fractions, got {erase_area!r}")
        low, high = (_number_in("erase_area", v, 0.0, 1.0) for v in erase_area)
        if not 0.0 < low <= high:
            raise ValueError(f"erase_area must satisfy 0 < min <= max <= 1, got {erase_area!r}")
        self.erase_area = (low, high)

    @classmethod
    def from_config(cls, cfg):
        """An :class:`Augment` from a reader's ``augment`` mapping, or None when it is empty / None / false."""
        if not cfg:
            return None
        if not isinstance(cfg, dict):
            raise ValueError(f"augment must be a mapping of {', '.join(cls.KEYS)}, got {cfg!r}")
        from mtl.data.preprocess import check_option_keys

        check_option_keys(cfg, cls.KEYS)
        return cls(**cfg)

    @property
    def geometric(self) -> bool:
        """True when a zoom, rotation or shift is configured."""
        return self.crop_scale < 1.0 or self.rotate > 0.0 or self.translate > 0.0

    def warp(self, pixels: np.ndarray, rng) -> np.ndarray:
        """Zoom, rotate and shift ``pixels`` [S, S, 3] about their centre in one bilinear affine warp."""
        size = pixels.shape[0]
        zoom = 1.0 / np.sqrt(rng.uniform(self.crop_scale, 1.0))
        angle = np.deg2rad(rng.uniform(-self.rotate, self.rotate))
        room = 0.5 * size * (1.0 - 1.0 / zoom)  # how far the zoomed view can move and stay inside
        shift = rng.uniform(-1.0, 1.0, size=2) * (room + self.translate * size)
        # output pixel p maps to input q = c + R(angle) (p - c) / zoom + shift (c: the image centre)
        cos, sin = np.cos(angle) / zoom, np.sin(angle) / zoom
        c = size / 2.0  # Pillow samples pixel centres at (x + 0.5, y + 0.5): the image centre is size / 2
        a, b, d, e = cos, -sin, sin, cos
        coeffs = (a, b, c - a * c - b * c + shift[0], d, e, c - d * c - e * c + shift[1])
        image = Image.fromarray(pixels).transform((size, size), Image.AFFINE, coeffs, Image.BILINEAR,
                                                  fillcolor=(0, 0, 0))
        return np.asarray(image, dtype=np.uint8)

    def photometric(self, chw: np.ndarray, rng) -> np.ndarray:
        """Brightness and contrast on normalised pixels (in place), kept in [-1, 1]."""
        if self.brightness > 0.0:
            factor = rng.uniform(1.0 - self.brightness, 1.0 + self.brightness)
            chw += 1.0
            chw *= np.float32(factor)  # x * b on the [0, 255] scale is (y + 1) * b - 1 on the [-1, 1] scale
            chw -= 1.0
        if self.contrast > 0.0:
            factor = rng.uniform(1.0 - self.contrast, 1.0 + self.contrast)
            mean = np.float32(chw.mean())
            chw -= mean
            chw *= np.float32(factor)
            chw += mean
        np.clip(chw, -1.0, 1.0, out=chw)
        return chw

    def erase_rectangle(self, chw: np.ndarray, rng) -> np.ndarray:
        """With probability ``erase``, set one random rectangle of ``chw`` [3, S, S] to 0 (grey), in place."""
        if self.erase <= 0.0 or rng.uniform() >= self.erase:
            return chw
        size = chw.shape[1]
        area = rng.uniform(*self.erase_area) * size * size
        aspect = np.exp(rng.uniform(np.log(0.3), np.log(3.3)))
        height = int(min(size, max(1, round(np.sqrt(area * aspect)))))
        width = int(min(size, max(1, round(np.sqrt(area / aspect)))))
        top = int(rng.integers(0, size - height + 1))
        left = int(rng.integers(0, size - width + 1))
        chw[:, top:top + height, left:left + width] = 0.0
        return chw

    def __call__(self, pixels: np.ndarray, mirror: bool, seed: int, epoch: int, index: int, finish=None) -> np.ndarray:
        """uint8 [S, S, 3] -> augmented float32 [3, S, S] (mirrored when ``mirror``); ``finish`` (the reader's
        per-image standardisation) runs on the float image after brightness and contrast, before erasing."""
        rng = np.random.default_rng([int(seed) & _MASK64, int(epoch) & _MASK64, int(index) & _MASK64])
        if self.geometric:
            pixels = self.warp(pixels, rng)
        chw = self.photometric(normalize(pixels, mirror), rng)
        return self.erase_rectangle(chw if finish is None else finish(chw), rng)


def _number_in(name, value, low, high) -> float:
    """``value`` as a float in [low, high], or a ValueError naming the option."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not low <= number <= high:
        raise ValueError(f"augment.{name} must be a number in [{low:g}, {high:g}], got {value!r}")
    return number


class FaceTransform:
    """Bytes -> float32 [3, S, S]: decode, the reader's :class:`mtl.data.preprocess.Preprocess` (crop, equalise),
    resize to ``image_size`` if needed, flip (when ``flip``), normalise, standardise (when asked), and the random
    :class:`Augment` when one is given (training only)."""

    def __init__(self, image_size: int = 112, flip: bool = False, seed: int = 0, decoder: str = "auto",
                 augment: Augment = None, preprocess=None):
        self.image_size = int(image_size)
        self.flip = bool(flip)
        self.seed = int(seed)
        self.decoder = resolve_decoder(decoder)
        self.augment = augment
        self.preprocess = preprocess

    def pixels(self, data) -> np.ndarray:
        """Encoded bytes -> uint8 RGB [S, S, 3]: decoded, prepared (crop, equalisation) and resized."""
        if self.preprocess is None:
            return load_pixels(data, self.image_size, self.decoder)
        if self.decoder == "pillow":
            rgb = np.asarray(decode_rgb(data), dtype=np.uint8)
        else:
            rgb = np.ascontiguousarray(_decode_bgr(data)[:, :, ::-1])
        return to_pixels(Image.fromarray(self.preprocess.prepare(rgb)), self.image_size)

    def __call__(self, data, index: int = 0, epoch: int = 0) -> np.ndarray:
        mirror = self.flip and flip_coin(self.seed, epoch, index)
        finish = None if self.preprocess is None else self.preprocess.finish
        if self.augment is not None:
            return self.augment(self.pixels(data), mirror, self.seed, epoch, index, finish)
        if finish is not None:
            return finish(normalize(self.pixels(data), mirror))
        if self.decoder == "opencv":
            bgr = _decode_bgr(data)
            if bgr.shape[:2] == (self.image_size, self.image_size):
                return _normalize_bgr(bgr, mirror)
            return normalize(_rgb_from_bgr(bgr, self.image_size), mirror)
        return normalize(to_pixels(decode_rgb(data), self.image_size), mirror)
