"""Small runs and files the newcomer tests share (tests/test_newcomer.py, tests/test_predict.py,
tests/test_label_names.py): random face images in identity folders, a trained RGB face-and-class run with its export
and a verification set."""
import os

import numpy as np


def write_images(folder, count=6, size=8, corrupt=(), people="ab"):
    """``count`` random PNG images of ``size`` px spread over identity folders ``people`` (one letter each), plus
    the ``corrupt`` relative paths holding garbage; the relative paths of the good images, in order."""
    from PIL import Image

    rng = np.random.RandomState(0)
    written = []
    for i in range(count):
        rel = os.path.join(people[i % len(people)], f"{i}.png")
        os.makedirs(os.path.join(folder, os.path.dirname(rel)), exist_ok=True)
        Image.fromarray(rng.randint(0, 255, (size, size, 3)).astype(np.uint8)).save(os.path.join(folder, rel))
        written.append(rel)
    for rel in corrupt:
        os.makedirs(os.path.join(folder, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(folder, rel), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n not an image at all")
    return written


def verification_set(path, pairs=10, size=16, seed=3):
    """A ``.bin`` verification set of ``pairs`` random RGB pairs (even pairs: the same image, lightly noised)."""
    from mtl.data.verification_sets import encode_png, write_bin

    rng = np.random.RandomState(seed)
    images, issame = [], []
    for i in range(pairs):
        a = rng.randint(0, 255, (size, size, 3))
        b = np.clip(a + rng.randint(-10, 11, a.shape), 0, 255) if i % 2 == 0 else rng.randint(0, 255, a.shape)
        images += [encode_png(a.astype(np.uint8)), encode_png(b.astype(np.uint8))]
        issame.append(i % 2 == 0)
    write_bin(str(path), images, issame)
    return str(path)


def face_run(tmp_path):
    """A trained 3-channel 16 px face-and-class run (tests/small_runs.py), its export and a verification set:
    (run folder, export folder, set path)."""
    from mtl.serving.export import export
    from tests.small_runs import train_run

    train_run(tmp_path, averaging=True, channels=3, size=16)
    export(str(tmp_path / "run"), str(tmp_path / "export"))
    return str(tmp_path / "run"), str(tmp_path / "export"), verification_set(tmp_path / "pairs.bin")
