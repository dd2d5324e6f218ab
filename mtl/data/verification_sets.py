"""Face verification sets: InsightFace ``.bin`` files (LFW, CFP-FP, AgeDB-30) and plain pairs lists.

``.bin`` = a pickle of ``(images, issame)``: ``images`` is a list of 2P encoded images (JPEG/PNG bytes), pair ``i``
being images ``2i`` and ``2i + 1``; ``issame`` is a list of P booleans. Pairs list = ``img1<TAB>img2<TAB>0|1`` lines,
paths relative to a root folder. Both load into a :class:`VerificationSet` of decoded uint8 pixels, which hands out
normalised float32 batches (optionally mirrored, for the ``f(x) + f(flip x)`` embedding of the protocol).
"""
import io
import os
import pickle  # writing .bin sets; they are read through mtl.core.safe_pickle

import numpy as np

from mtl.core import safe_pickle
from mtl.core.errors import DataError, absent
from mtl.core.utf8 import open_utf8
from mtl.data.transforms import DecodeError, FaceTransform, normalize


class ImageBatches:
    """Decoded images ``pixels`` uint8 [N, S, S, 3] handed out as normalised float32 batches (optionally mirrored).

    ``preprocess`` (:class:`mtl.data.preprocess.Preprocess`): the model's image preparation; its crop and
    equalisation were applied when the pixels were decoded, its standardisation is applied to every batch."""

    def __init__(self, pixels: np.ndarray, preprocess=None):
        self.pixels = pixels
        self.preprocess = preprocess

    def __len__(self) -> int:
        """Number of images."""
        return len(self.pixels)

    def images(self, start: int = 0, stop: int = None, flip: bool = False) -> np.ndarray:
        """Images ``start:stop`` as float32 [n, 3, S, S] scaled by (x / 255 - 0.5) / 0.5, mirrored when ``flip``."""
        chosen = self.pixels[start:stop]
        out = np.empty((len(chosen), 3) + chosen.shape[1:3], dtype=np.float32)
        for i, pixels in enumerate(chosen):
            out[i] = normalize(pixels, flip)
            if self.preprocess is not None:
                self.preprocess.finish(out[i])
        return out

    def batches(self, batch_size: int, flip: bool = False):
        """Yield consecutive float32 batches of at most ``batch_size`` images, in image order."""
        for start in range(0, len(self), int(batch_size)):
            yield self.images(start, start + int(batch_size), flip)


class VerificationSet(ImageBatches):
    """P image pairs: ``pixels`` uint8 [2P, S, S, 3] (pair i = rows 2i, 2i+1) and ``issame`` bool [P]."""

    def __init__(self, name: str, pixels: np.ndarray, issame: np.ndarray, source: str = "", preprocess=None,
                 pair_keys=None):
        super().__init__(pixels, preprocess)
        self.name = name
        self.issame = np.asarray(issame, dtype=bool)
        self.source = source
        # what identifies each pair whatever its place in the file (its two images, in either order): the
        # verification folds are drawn from these, so that a list in another order scores the same
        self.pair_keys = list(pair_keys) if pair_keys is not None else [str(i) for i in range(len(self.issame))]

    @property
    def num_pairs(self) -> int:
        """Number of pairs P."""
        return len(self.issame)


# what an InsightFace ``.bin`` set holds: bytes, lists, numpy arrays and booleans (mtl.core.safe_pickle)
BIN_ALLOWED = {**safe_pickle.BUILTINS, **safe_pickle.NUMPY,
               ("__builtin__", "bytes"): bytes, ("__builtin__", "bytearray"): bytearray, ("__builtin__", "bool"): bool}


def load_bin_content(path: str):
    """The ``(images, issame)`` pickle of a ``.bin`` set, read without running code from the file."""
    return safe_pickle.load_pickle(path, BIN_ALLOWED, "a verification .bin set", encoding="bytes")


def decode_all(encoded, image_size: int, describe, decoder: str = "auto", preprocess=None) -> np.ndarray:
    """uint8 [n, S, S, 3] of every encoded image: decoded, prepared (``preprocess``: crop, equalisation), resized."""
    pixels = np.empty((len(encoded), image_size, image_size, 3), dtype=np.uint8)
    transform = FaceTransform(image_size, decoder=decoder, preprocess=preprocess)
    for i, data in enumerate(encoded):
        try:
            pixels[i] = transform.pixels(data)
        except DecodeError as exc:
            raise DataError(f"{describe(i)}: {exc}") from None
    return pixels


def pair_key(first: str, second: str) -> str:
    """The key of a pair of images named ``first`` and ``second`` (paths or digests): the same in either order."""
    return "\t".join(sorted((first, second)))


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.blake2b(data, digest_size=16).hexdigest()


def as_bytes(item):
    if isinstance(item, np.ndarray):
        return item.tobytes()
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    return None


def read_bin(path: str, image_size: int = 112, name: str = None, decoder: str = "auto",
             preprocess=None) -> VerificationSet:
    """Load an InsightFace ``.bin`` verification set, decoding (and resizing if needed) every image."""
    images, issame = _bin_pairs(path)
    encoded = []
    for i, item in enumerate(images):
        data = as_bytes(item)
        if data is None:
            raise DataError(f"verification set '{path}' image {i}: expected encoded bytes, got {type(item).__name__}")
        encoded.append(data)
    pixels = decode_all(encoded, int(image_size), lambda i: f"verification set '{path}' image {i}", decoder,
                         preprocess)
    name = name or os.path.splitext(os.path.basename(path))[0]
    keys = [pair_key(_digest(encoded[2 * i]), _digest(encoded[2 * i + 1])) for i in range(len(issame))]
    return VerificationSet(name, pixels, issame.astype(bool), path, preprocess, keys)


def _bin_pairs(path: str):
    """``(images, issame)`` of a ``.bin`` set, checked (:func:`_checked_pairs`), its images not decoded."""
    if not os.path.isfile(path):
        raise DataError(f"verification set '{path}' {absent(path)}")
    content = load_bin_content(path)
    if not isinstance(content, (tuple, list)) or len(content) != 2:
        raise DataError(f"verification set '{path}': expected a pickle of (images, issame)")
    return _checked_pairs(path, *content)


def _checked_pairs(path, images, issame):
    """``(images, issame as a 1-d array)`` of a ``.bin`` set's pickle, or a DataError naming the file: two
    sequences, 2 images per pair, issame of True/False (or 0/1), at least one pair (an int, a None, a ragged list
    or an empty set were numpy's and Python's tracebacks)."""
    if not isinstance(images, (list, tuple)) or not isinstance(issame, (list, tuple, np.ndarray)):
        raise DataError(f"verification set '{path}': expected a pickle of (list of images, list of issame), got "
                        f"({type(images).__name__}, {type(issame).__name__})")
    if not all(isinstance(v, (bool, int, np.bool_, np.integer)) for v in issame):
        raise DataError(f"verification set '{path}': issame holds values other than True/False")
    issame = np.asarray(list(issame))
    if len(issame) == 0:
        raise DataError(f"verification set '{path}' holds no pair")
    if len(images) != 2 * len(issame):
        raise DataError(f"verification set '{path}': {len(images)} images for {len(issame)} pairs, expected 2 per pair")
    if issame.dtype != bool and not np.isin(issame, (0, 1)).all():
        raise DataError(f"verification set '{path}': issame holds values other than True/False")
    return images, issame


def write_bin(path: str, encoded_images, issame):
    """Write a ``.bin`` verification set: a pickle of (list of 2P encoded images, list of P bools)."""
    encoded_images = [bytes(b) for b in encoded_images]
    issame = [bool(s) for s in issame]
    if len(encoded_images) != 2 * len(issame):
        raise ValueError(f"{len(encoded_images)} images for {len(issame)} pairs: need exactly 2 per pair")
    with open(path, "wb") as f:
        pickle.dump((encoded_images, issame), f, protocol=4)


def _pair_lines(pairs_path: str):
    """``(line number, first image, second image, same person)`` of every pair of a pairs list, its lines checked (a
    DataError naming the file and the line otherwise)."""
    if not os.path.isfile(pairs_path):
        raise DataError(f"pairs list '{pairs_path}' {absent(pairs_path)}")
    with open_utf8(pairs_path, "pairs list") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split("\t") if "\t" in line else line.split()
            if len(parts) != 3 or parts[2].strip() not in ("0", "1"):
                raise DataError(f"pairs list '{pairs_path}' line {lineno}: expected 'img1<TAB>img2<TAB>0|1'")
            yield lineno, parts[0].strip(), parts[1].strip(), parts[2].strip() == "1"


def read_pairs(pairs_path: str, root: str = None, image_size: int = 112, name: str = None,
               decoder: str = "auto", preprocess=None) -> VerificationSet:
    """Load a pairs list (``img1<TAB>img2<TAB>0|1`` per line, paths relative to ``root``, default its folder)."""
    root = root if root is not None else (os.path.dirname(pairs_path) or ".")
    encoded, issame, where, keys = [], [], [], []
    for lineno, first, second, same in _pair_lines(pairs_path):
        for rel in (first, second):
            full = os.path.join(root, rel)
            try:
                with open(full, "rb") as img:
                    encoded.append(img.read())
            except OSError as exc:
                raise DataError(f"pairs list '{pairs_path}' line {lineno}: cannot read '{full}': "
                                f"{exc.strerror}") from None
            where.append(lineno)
        issame.append(same)
        keys.append(pair_key(os.path.normpath(first), os.path.normpath(second)))
    if not issame:
        raise DataError(f"pairs list '{pairs_path}' holds no pair")
    pixels = decode_all(encoded, int(image_size), lambda i: f"pairs list '{pairs_path}' line {where[i]}", decoder,
                         preprocess)
    name = name or os.path.splitext(os.path.basename(pairs_path))[0]
    return VerificationSet(name, pixels, np.array(issame), pairs_path, preprocess, keys)


def pair_kinds(path: str) -> np.ndarray:
    """``issame`` bool [P] of a ``.bin`` set or a pairs list, read without decoding an image (what a run says of its
    sets at start-up); a DataError naming the file when it holds no pair or is malformed."""
    if str(path).endswith(".bin"):
        return _bin_pairs(path)[1].astype(bool)
    issame = np.array([same for *_, same in _pair_lines(path)], dtype=bool)
    if not len(issame):
        raise DataError(f"pairs list '{path}' holds no pair")
    return issame


def load_verification_set(path: str, root: str = None, image_size: int = 112, name: str = None,
                          decoder: str = "auto", preprocess=None) -> VerificationSet:
    """A ``.bin`` file or a pairs list, by extension (``decoder``: auto | opencv | pillow, see mtl.data.transforms),
    its images prepared as the model's were (``preprocess``, :class:`mtl.data.preprocess.Preprocess` or None)."""
    if str(path).endswith(".bin"):
        return read_bin(path, image_size, name, decoder, preprocess)
    return read_pairs(path, root, image_size, name, decoder, preprocess)


def encode_png(pixels: np.ndarray) -> bytes:
    """Lossless PNG bytes of a uint8 [H, W, 3] array (for writing test and demo sets)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()
