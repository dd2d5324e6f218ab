"""Generated face data for the face-pipeline tests: two RecordIO datasets whose identities overlap (3-5 are in both)
and a ``.bin`` verification set of the same identities; every image a noisy version of its identity's pattern."""
import numpy as np
from PIL import Image

from mtl.commands.data import pack
from mtl.data.verification_sets import encode_png, write_bin

SIZE = 24


def identity_images(identity, count, rng):
    """``count`` noisy versions of one identity's fixed pattern (uint8 RGB)."""
    base = np.random.RandomState(1000 + identity).randint(0, 256, (SIZE, SIZE, 3))
    return [np.clip(base + rng.randn(SIZE, SIZE, 3) * 12, 0, 255).astype(np.uint8) for _ in range(count)]


def make_dataset(folder, identities, rng, per_identity=6):
    """An image folder (one sub-folder per identity, ``per_identity`` PNGs each) packed into RecordIO beside it."""
    for label, identity in enumerate(identities):
        d = folder / f"id{label:03d}"
        d.mkdir(parents=True)
        for j, img in enumerate(identity_images(identity, per_identity, rng)):
            Image.fromarray(img).save(d / f"{j}.png")
    return pack(str(folder), str(folder.parent / (folder.name + "_rec") / "train"))


def make_bin(path, rng, identities=range(9), pairs=20):
    """An InsightFace ``.bin`` set of ``pairs`` pairs of the identities, same and different in turn."""
    images, issame = [], []
    for i in range(pairs):
        a = identities[i % len(identities)]
        same = i % 2 == 0
        b = a if same else identities[(i + 3) % len(identities)]
        images += [encode_png(identity_images(a, 1, rng)[0]), encode_png(identity_images(b, 1, rng)[0])]
        issame.append(same)
    write_bin(str(path), images, issame)


def make_face_data(root):
    """Datasets a (identities 0-5) and b (3-8) as RecordIO under ``root``, and ``root/pairs.bin``; ``root``."""
    rng = np.random.RandomState(0)
    make_dataset(root / "a", [0, 1, 2, 3, 4, 5], rng)   # identities 3-5 appear in both datasets
    make_dataset(root / "b", [3, 4, 5, 6, 7, 8], rng)
    make_bin(root / "pairs.bin", rng)
    return root
