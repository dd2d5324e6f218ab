"""The synthetic reader's memory does not grow with its class count (tools/gpu_check.py's 100k-class throughput run),
and its small readers keep the samples they always had."""
import tracemalloc

import numpy as np

from mtl.readers.synthetic import EAGER_ELEMENTS, SyntheticReader


def test_a_small_reader_draws_its_prototypes_from_the_seed_as_before():
    reader = SyntheticReader(num_samples=20, num_classes=5, shape=(1, 4, 4), seed=3, noise=0.5)
    prototypes = np.random.RandomState(3).randn(5, 1, 4, 4).astype(np.float32)  # the reference: one stream
    for index in (0, 7, 19):
        label = (index * 7919 + 3) % 5
        noise = np.random.RandomState((3 * 1_000_033 + index) % (2 ** 31)).randn(1, 4, 4).astype(np.float32)
        sample = reader[index]
        assert int(sample["label"]) == label
        np.testing.assert_array_equal(sample["image"], prototypes[label] + 0.5 * noise)


def test_a_100k_class_face_sized_reader_holds_no_prototype_and_reads_the_same_sample_twice():
    tracemalloc.start()
    reader = SyntheticReader(num_samples=1_000_000, num_classes=100_000, shape=(3, 112, 112), seed=1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 100_000 * 3 * 112 * 112 > EAGER_ELEMENTS
    assert peak < 8 * 2 ** 20, peak  # a float64 prototype per class would be 28 GiB
    a, b = reader[12345], reader[12345]
    np.testing.assert_array_equal(a["image"], b["image"])
    same_class = 12345 + 100_000  # label (i * 7919 + seed) % C repeats every C samples
    assert int(reader[same_class]["label"]) == int(a["label"])
    other = reader[12346]
    assert int(other["label"]) != int(a["label"])
    proto = reader.prototype(int(a["label"]))
    np.testing.assert_array_equal(proto, reader.prototype(int(a["label"])))
    assert abs(float(proto.mean())) < 0.02 and abs(float(proto.std()) - 1.0) < 0.02  # standard normal pixels
    # two samples of a class share its prototype: closer to each other than to another class's sample
    near = np.linalg.norm(a["image"] - reader[same_class]["image"])
    far = np.linalg.norm(a["image"] - other["image"])
    assert near < far
