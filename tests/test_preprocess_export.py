"""A model trained on prepared images (crop, equalisation, standardisation) sees new images prepared the same way:
verification sets, ``mtl embed`` and ``mtl eval`` take the tasks' ``preprocess``, recorded in ``export.json``.
References: the face reader's own output for the same file, and numpy standardisation."""
import os

import numpy as np
import pytest

from mtl.data.preprocess import Preprocess, choose, task_preprocessing
from mtl.data.verification_sets import read_pairs
from mtl.readers.image_list import ImageListReader
from mtl.serving.export import read_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YALE = os.path.join(ROOT, "examples", "data", "faces", "yale")
PREPARE = {"crop": [0.1, 0.1, 0.9, 0.9], "equalize": True, "standardize": True}


def test_pairs_and_image_inputs_are_prepared_like_the_training_images():
    reader = ImageListReader(os.path.join(YALE, "yale.txt"), image_size=16, preprocess=PREPARE)
    reader.set_augmentation(False)
    first = os.path.relpath(reader.sample_files()[0], YALE)  # s1/1.png
    vset = read_pairs(os.path.join(YALE, "pairs_s1_s2_s12.txt"), image_size=16,
                      preprocess=Preprocess.from_config(PREPARE))
    assert vset.images(0, 1)[0].shape == (3, 16, 16)
    index = next(i for i, line in enumerate(row for row in open(os.path.join(YALE, "pairs_s1_s2_s12.txt"))
                                            if not row.startswith("#")) if line.startswith(first + "\t"))
    np.testing.assert_allclose(vset.images(2 * index, 2 * index + 1)[0], reader[0]["image"], atol=1e-5)
    inputs = read_inputs([os.path.join(YALE, first)], [3, 16, 16], Preprocess.from_config(PREPARE))
    np.testing.assert_allclose(inputs[0], reader[0]["image"], atol=1e-5)
    image = inputs[0].astype(np.float64)
    assert abs(image.mean()) < 1e-5 and abs(image.std() - 1.0) < 1e-4
    plain = read_inputs([os.path.join(YALE, first)], [3, 16, 16])
    assert not np.allclose(plain, inputs)


def test_the_preprocessing_of_several_tasks_is_chosen_explicitly():
    tasks = [{"name": "a", "reader": {"preprocess": PREPARE}}, {"name": "b", "reader": {"preprocess": PREPARE}},
             {"name": "c", "reader": {}}]
    record = task_preprocessing(tasks)
    assert record == {"a": PREPARE, "b": PREPARE, "c": None}
    with pytest.raises(ValueError, match="--preprocess TASK"):
        choose(record)
    assert choose(record, "c") is None and choose(record, "a").crop == tuple(PREPARE["crop"])
    assert choose({"a": PREPARE, "b": dict(PREPARE)}).equalize  # the same mapping twice is one way
    with pytest.raises(ValueError, match="no task 'd'"):
        choose(record, "d")
