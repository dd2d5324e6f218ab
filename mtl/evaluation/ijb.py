"""IJB-B / IJB-C 1:1 template verification with insightface's protocol (``arcface_torch/eval_ijbc.py``).

Layout under ROOT (insightface's release of the sets): ``meta/<target>_face_tid_mid.txt`` (``image tid mid`` per
face), ``meta/<target>_template_pair_label.txt`` (``tid1 tid2 label`` per pair), ``meta/<target>_name_5pts_score.txt``
(``image x1 y1 ... x5 y5 detector_score`` per face, in the order of the first file), ``loose_crop/<image>``;
``<target>`` is ``ijbb`` or ``ijbc`` (lower case, as the peer reads it).

Per face, exactly as the peer prepares it:
    read with OpenCV (BGR) -> similarity transform (rotation, uniform scale, translation) of the five landmarks onto
    ArcFace's template, estimated by least squares (Umeyama 1991, what skimage's ``SimilarityTransform.estimate``
    computes) -> ``cv2.warpAffine`` to 112x112, border 0 -> RGB -> float32 ``((x / 255) - 0.5) / 0.5`` in that order,
    CHW; the mirrored face likewise. (A model of input size S != 112 gets the template scaled by S / 112.)
Features: ``f(x) + f(flip x)`` (flip test; ``f(x)`` alone without it), not normalised (the norm is a quality
signal), times the face's detector score when weighting by it. Templates: the mean of each media's faces, summed
over the template's medias, L2-normalised; a pair's score is the cosine of its two templates. TAR at FAR
1e-6 ... 1e-1 read off sklearn's ``roc_curve`` as the peer does (the ROC point whose FAR is nearest to each).
"""
import os
from dataclasses import dataclass

import numpy as np

from mtl.core.errors import DataError
from mtl.core.utf8 import open_utf8

# ArcFace's five-point template for 112x112 crops (eyes, nose tip, mouth corners), x shifted by 8 in float32 as the
# peer shifts it (96x112 template + 8)
ARCFACE_TEMPLATE = np.array([[30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655],
                             [62.7299, 92.2041]], dtype=np.float32)
ARCFACE_TEMPLATE[:, 0] += 8.0
FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
TARGETS = ("IJBB", "IJBC")
TEMPLATE_BLOCK = 512  # pair scores come from [512, templates] blocks of the similarity matrix (at most 95 MiB)


@dataclass
class IJBSet:
    """The meta data of one IJB set: per face its image, landmarks [5, 2], detector score, template and media; per
    pair its two templates and label."""

    root: str
    target: str
    images: list
    landmarks: np.ndarray
    scores: np.ndarray
    templates: np.ndarray
    medias: np.ndarray
    pairs: np.ndarray
    labels: np.ndarray


def _rows(path, columns, what):
    """Whitespace-separated rows of ``path`` with ``columns`` fields each (blank lines skipped), with line numbers."""
    if not os.path.isfile(path):
        raise DataError(f"IJB meta file '{path}' does not exist")
    rows = []
    with open_utf8(path, "IJB meta file") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != columns:
                raise DataError(f"'{path}' line {number}: expected {what} ({columns} fields), got {len(fields)}")
            rows.append((number, fields))
    if not rows:
        raise DataError(f"IJB meta file '{path}' holds no line")
    return rows


def _numbers(path, rows, start, kind, what):
    """The fields ``start:`` of every row as an array of ``kind`` (a DataError names the first line that is not)."""
    try:
        return np.array([[kind(v) for v in fields[start:]] for _, fields in rows])
    except ValueError:
        for number, fields in rows:
            try:
                [kind(v) for v in fields[start:]]
            except ValueError:
                raise DataError(f"'{path}' line {number}: expected {what}, got {' '.join(fields)!r}") from None
        raise


def _pair_table(path):
    """``template1 template2 label`` rows as int64 [P, 3], read by numpy's C parser (IJB-C has 15.6M pairs); a bad
    file is scanned line by line for the sentence that names its first bad line."""
    if not os.path.isfile(path):
        raise DataError(f"IJB meta file '{path}' does not exist")
    try:
        table = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except ValueError:
        table = None
    if table is None or table.shape[1:] != (3,) or not len(table):
        rows = _rows(path, 3, "'template1 template2 label'")
        return _numbers(path, rows, 0, int, "three integers")
    return table


def meta_path(root, target, name):
    """``ROOT/meta/<target>_<name>.txt`` (lower-case target, as the peer reads it; the given case as a fallback)."""
    lower = os.path.join(root, "meta", f"{target.lower()}_{name}.txt")
    given = os.path.join(root, "meta", f"{target}_{name}.txt")
    return given if not os.path.isfile(lower) and os.path.isfile(given) else lower


def read_ijb(root: str, target: str) -> IJBSet:
    """Read the three meta files of ``target`` (IJBB | IJBC) under ``root``, checking that they agree."""
    if target not in TARGETS:
        raise DataError(f"--target must be IJBB or IJBC, got {target!r}")
    faces_path = meta_path(root, target, "face_tid_mid")
    faces = _rows(faces_path, 3, "'image template_id media_id'")
    ids = _numbers(faces_path, faces, 1, int, "integer template and media ids")
    pairs_path = meta_path(root, target, "template_pair_label")
    pairs = _pair_table(pairs_path)
    points_path = meta_path(root, target, "name_5pts_score")
    points = _rows(points_path, 12, "'image x1 y1 ... x5 y5 score'")
    values = _numbers(points_path, points, 1, float, "ten landmark coordinates and a score")
    if len(points) != len(faces):
        raise DataError(f"'{points_path}' lists {len(points)} faces, '{faces_path}' {len(faces)}: they must list "
                        "the same faces in the same order")
    for (number, a), (_, b) in zip(points, faces):
        if a[0] != b[0]:
            raise DataError(f"'{points_path}' line {number} names '{a[0]}' where '{faces_path}' names '{b[0]}'")
    unknown = np.flatnonzero(~np.isin(pairs[:, :2], ids[:, 0]).all(axis=1))
    if len(unknown):
        raise DataError(f"'{pairs_path}' pair {unknown[0] + 1} names a template without faces: "
                        f"{pairs[unknown[0], :2].tolist()}")
    return IJBSet(root, target, [f[0] for _, f in faces], values[:, :10].reshape(-1, 5, 2).astype(np.float32),
                  values[:, 10].astype(np.float32), ids[:, 0], ids[:, 1], pairs[:, :2], pairs[:, 2])


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 3x3 similarity (rotation, uniform scale, translation) that maps ``src`` [n, 2] onto ``dst`` [n, 2] with
    the least squared error (Umeyama, "Least-squares estimation of transformation parameters between two point
    patterns", PAMI 1991, eqs. 38-43, with scaling).

    The arithmetic runs in the points' own dtype, step for step as skimage's ``SimilarityTransform.estimate``
    (``_umeyama``) runs it: the peer passes float32 landmarks and template, and a last-bit difference in the matrix
    moves a few warped pixels by one grey level."""
    src, dst = np.asarray(src), np.asarray(dst)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    cov = dst_c.T @ src_c / len(src)  # eq. 38
    signs = np.ones(2, dtype=np.float64)
    if np.linalg.det(cov) < 0:  # eq. 39
        signs[1] = -1
    u, s, vt = np.linalg.svd(cov)
    rank = np.count_nonzero(s > s.max() * 2 * np.finfo(float).eps)
    if rank == 0:
        raise ValueError("the landmarks are all one point")
    out = np.eye(3, dtype=np.float64)
    if rank == 1 and np.linalg.det(u) * np.linalg.det(vt) <= 0:  # eq. 43
        out[:2, :2] = u @ np.diag([1.0, -1.0]) @ vt
    elif rank == 1:
        out[:2, :2] = u @ vt
    else:
        out[:2, :2] = u @ np.diag(signs) @ vt  # eq. 40
    scale = 1.0 / src_c.var(axis=0).sum() * (s @ signs)  # eqs. 41, 42
    out[:2, 2] = dst_mean - scale * (out[:2, :2] @ src_mean.T)
    out[:2, :2] *= scale
    return out


def align_face(bgr: np.ndarray, landmarks: np.ndarray, size: int = 112) -> np.ndarray:
    """The face warped onto ArcFace's template at ``size`` x ``size``, as RGB uint8 [size, size, 3]."""
    import cv2

    template = ARCFACE_TEMPLATE * np.float32(size / 112.0) if size != 112 else ARCFACE_TEMPLATE
    matrix = similarity_transform(landmarks, template)[:2]
    warped = cv2.warpAffine(bgr, matrix, (size, size), borderValue=0.0)
    return cv2.cvtColor(warped, cv2.COLOR_BGR2RGB)


def to_input(rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB [n, S, S, 3] -> float32 [n, 3, S, S] as ``((x / 255) - 0.5) / 0.5``, the peer's order of operations."""
    x = rgb.astype(np.float32).transpose(0, 3, 1, 2)
    x /= np.float32(255)
    x -= np.float32(0.5)
    x /= np.float32(0.5)
    return np.ascontiguousarray(x)


def load_face(ijb: IJBSet, index: int, size: int) -> np.ndarray:
    """Face ``index`` read from ``loose_crop/`` and aligned (RGB uint8 [size, size, 3]); a DataError names the file
    and its line of the landmarks file when it cannot be read."""
    import cv2

    path = os.path.join(ijb.root, "loose_crop", ijb.images[index])
    bgr = cv2.imread(path)
    if bgr is None:
        where = os.path.basename(meta_path(ijb.root, ijb.target, "name_5pts_score"))
        raise DataError(f"IJB image '{path}' (face {index + 1} of {where}) is missing or not a readable image")
    return align_face(bgr, ijb.landmarks[index], size)


def embed_faces(model, field: str, size: int, ijb: IJBSet, batch_size: int = 64, progress=None):
    """(f(x), f(flip x)) float32 [N, D] each for every face of ``ijb``, the model in eval mode, ``batch_size`` faces
    (and their mirror images) per forward pass; images are read and aligned on a few threads (OpenCV releases the
    GIL); ``progress(n)`` after each batch."""
    from concurrent.futures import ThreadPoolExecutor

    import paddle

    plain, flipped = [], []
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool, paddle.no_grad():
        for start in range(0, len(ijb.images), batch_size):
            indices = range(start, min(start + batch_size, len(ijb.images)))
            rgb = np.stack(list(pool.map(lambda i: load_face(ijb, i, size), indices)))
            x = to_input(np.concatenate([rgb, rgb[:, :, ::-1]]))
            out = model({field: paddle.to_tensor(x)}).numpy().astype(np.float32)
            plain.append(out[:len(rgb)])
            flipped.append(out[len(rgb):])
            if progress is not None:
                progress(len(rgb))
    return np.concatenate(plain), np.concatenate(flipped)
