"""A small IJB-format set (insightface's release layout: ``loose_crop/`` images and the three ``meta/`` tables),
written from a seed with numpy and OpenCV only, so that the fixture maker (under torch, for insightface's
``eval_ijbc.py``) and the tests (under Paddle, for ``mtl eval --ijb``) write the same set; :func:`set_digest`
tells them whether they did."""
import hashlib
import os

import cv2
import numpy as np

# ArcFace's five-point template at 112x112 (insightface's published points, x shifted by 8): where the faces are put
TEMPLATE = np.array([[30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655],
                     [62.7299, 92.2041]], dtype=np.float32)
TEMPLATE[:, 0] += 8.0
# faces: (subject, template id, media id); 8 templates of 4 subjects, some with several medias and frames
FACES = [(0, 3, 1), (0, 3, 1), (0, 3, 2), (0, 8, 4), (1, 11, 5), (1, 11, 5), (1, 11, 5), (1, 20, 7),
         (2, 21, 8), (2, 21, 9), (2, 40, 10), (3, 41, 11), (3, 41, 12), (3, 41, 12), (3, 55, 13), (3, 55, 14)]
META = ("face_tid_mid", "template_pair_label", "name_5pts_score")


def similarity(scale, angle, shift):
    """3x3 matrix of x -> scale * R(angle) x + shift."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[scale * c, -scale * s, shift[0]], [scale * s, scale * c, shift[1]], [0, 0, 1]])


def write_ijb(root, target="ijbc", seed=0):
    """A small IJB-format set: per face a PNG of noise around a subject's random 'face' texture, placed by a random
    similarity; its landmarks are the template under that similarity plus up to 1.5 px of noise. Returns ``root``."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "loose_crop"))
    os.makedirs(os.path.join(root, "meta"))
    textures = rng.integers(0, 256, (4, 112, 112, 3), dtype=np.uint8)
    points, faces = [], []
    for i, (subject, template, media) in enumerate(FACES):
        forward = similarity(rng.uniform(0.9, 1.4), rng.uniform(-0.3, 0.3), rng.uniform(10, 30, 2))
        size = (170, 160)  # width, height
        image = cv2.warpAffine(textures[subject], forward[:2], size, borderValue=(40, 90, 160))
        image = np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)
        name = f"{i + 1}.png"
        cv2.imwrite(os.path.join(root, "loose_crop", name), image)
        marks = TEMPLATE @ forward[:2, :2].T + forward[:2, 2] + rng.uniform(-1.5, 1.5, (5, 2))
        points.append(f"{name} " + " ".join(f"{v:.3f}" for v in marks.ravel()) + f" {rng.uniform(0.5, 1):.4f}")
        faces.append(f"{name} {template} {media}")
    subjects = {t: s for s, t, _ in FACES}
    ids = sorted(subjects)
    pairs = [f"{a} {b} {int(subjects[a] == subjects[b])}" for i, a in enumerate(ids) for b in ids[i + 1:]]
    for name, lines in zip(META, (faces, pairs, points)):
        with open(os.path.join(root, "meta", f"{target}_{name}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return root


def set_digest(root, target="ijbc") -> str:
    """SHA-256 of the set's meta tables and decoded pixels (not the PNG bytes, which another encoder may write
    differently)."""
    digest = hashlib.sha256()
    for name in META:
        with open(os.path.join(root, "meta", f"{target}_{name}.txt"), "rb") as f:
            digest.update(f.read())
    for i in range(len(FACES)):
        digest.update(cv2.imread(os.path.join(root, "loose_crop", f"{i + 1}.png")).tobytes())
    return digest.hexdigest()
