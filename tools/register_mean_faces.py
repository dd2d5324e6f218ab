"""Find the crop that puts one face dataset's framing onto another's: register their mean faces.

    python tools/register_mean_faces.py ../shared/data/lfw/images ../shared/data/glint_subset/images

Averages the grey images of a random sample of each folder of person folders (3,000 by default, seed 0), then tries
every square box of the first mean face (sides from 60 pixels to the whole image, step 2) resized to the second's
size, and prints the boxes of highest normalised cross-correlation with the second mean face, as fractions of the
image ([left, top, right, bottom]: a ``preprocess.crop``). The LFW task of examples/configs/lfw_glint.yaml takes its
crop from this (docs/lfw.md): LFW's deep-funneled frame moved onto insightface's alignment of the Glint faces.
"""
import argparse
import os
import random

import numpy as np
from PIL import Image


def mean_face(folder, count, seed, size):
    """The mean of ``count`` grey images drawn from the person folders of ``folder``, resized to ``size``."""
    files = [os.path.join(folder, p, f) for p in sorted(os.listdir(folder)) if os.path.isdir(os.path.join(folder, p))
             for f in sorted(os.listdir(os.path.join(folder, p)))]
    chosen = random.Random(seed).sample(files, min(count, len(files)))
    total = np.zeros((size, size))
    for path in chosen:
        with Image.open(path) as image:
            total += np.asarray(image.convert("L").resize((size, size)), dtype=np.float64)
    return total / len(chosen)


def ncc(a, b) -> float:
    """Normalised cross-correlation of two images of one size."""
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def best_boxes(moving, fixed, smallest=60, step=2, compare=56):
    """``[(ncc, side, left, top)]`` of every square box of ``moving``, best first."""
    size = moving.shape[0]
    target = np.asarray(Image.fromarray(fixed.astype(np.float32)).resize((compare, compare), Image.BILINEAR))
    source = Image.fromarray(moving.astype(np.float32))
    found = []
    for side in range(smallest, size + 1, step):
        for left in range(0, size - side + 1, step):
            for top in range(0, size - side + 1, step):
                box = source.crop((left, top, left + side, top + side)).resize((compare, compare), Image.BILINEAR)
                found.append((ncc(np.asarray(box), target), side, left, top))
    return sorted(found, reverse=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("moving", help="the folder of person folders whose frame is moved")
    parser.add_argument("fixed", help="the folder of person folders whose frame is kept")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=112)
    args = parser.parse_args()
    moving = mean_face(args.moving, args.count, args.seed, args.size)
    fixed = mean_face(args.fixed, args.count, args.seed + 1, args.size)
    for score, side, left, top in best_boxes(moving, fixed)[:5]:
        box = [round(v / args.size, 3) for v in (left, top, left + side, top + side)]
        print(f"crop {box}: normalised cross-correlation {score:.4f} (a {side}-pixel box at {left}, {top})")


if __name__ == "__main__":
    main()
