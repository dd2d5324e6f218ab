"""Write the inputs the README's ``mtl predict`` lines use: ``python tools/make_predict_inputs.py``.

* ``examples/data/digits/<d>.png``: for each digit d, the first image of the digits demo's ``digits_classify``
  evaluation split (never trained on by that task) as an 8x8 grey PNG, ink bright as scikit-learn stores it
  (pixel = round(value * 255 / 16)).
* ``examples/data/tables/iris.csv``: the first two rows of each species in the ``iris`` task's evaluation split
  (``tasks/iris.yaml``), raw measurements in centimetres under scikit-learn's column names, the true species last.
"""
import csv
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def digits(folder):
    from PIL import Image

    from mtl.readers.digits import DigitsReader, load_digits_arrays

    images, _ = load_digits_arrays()
    held = DigitsReader(split="eval")  # digits_classify's reader: all ten digits, eval_fraction 0.3, seed 0
    for digit in range(10):
        index = int(held.source_indices[np.flatnonzero(held.labels() == digit)[0]])
        Image.fromarray(np.round(images[index] * 255 / 16).astype(np.uint8)).save(os.path.join(folder, f"{digit}.png"))


def iris(path):
    import sklearn.datasets

    from mtl.readers.table import SklearnTableReader

    bunch = sklearn.datasets.load_iris()
    held = SklearnTableReader("iris", split="eval", pad_to=30)
    rows = [int(r) for species in range(3) for r in held.rows[bunch.target[held.rows] == species][:2]]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(list(bunch.feature_names) + ["species"])
        for r in rows:
            out.writerow([f"{v:g}" for v in bunch.data[r]] + [bunch.target_names[bunch.target[r]]])


if __name__ == "__main__":
    digits(os.path.join(ROOT, "examples", "data", "digits"))
    iris(os.path.join(ROOT, "examples", "data", "tables", "iris.csv"))
