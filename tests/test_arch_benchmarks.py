"""The benchmarks' data: MultiMNIST built as Sener and Koltun's loader builds it (checked against a direct numpy +
PIL build of a few pairs, their loader's lines), its parts and the kept-back test split; Ma et al.'s synthetic
generator (orthogonal unit vectors, the cosine of the task weights, the labels' Pearson correlation against its
closed-form expectation); the LeNet trunk's shapes."""
import gzip
import os

import numpy as np
import pytest
from PIL import Image

from mtl.core.errors import ConfigError, DataError
from mtl.readers.mmoe_synthetic import MMoESyntheticReader
from mtl.readers.multimnist import MultiMNISTReader, read_idx
from tests.dist_util import ROOT

MNIST = os.path.join(ROOT, "examples", "data", "mnist")


def raw_digits():
    with gzip.open(os.path.join(MNIST, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(MNIST, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


def their_image(lim, rim):
    """multi_mnist_loader.py's read_image_file for one pair, with PIL's nearest-neighbour resize."""
    new_im = np.zeros((36, 36))
    new_im[0:28, 0:28] = lim
    new_im[6:34, 6:34] = rim
    new_im[6:28, 6:28] = np.maximum(lim[6:28, 6:28], rim[0:22, 0:22])
    return np.asarray(Image.fromarray(new_im.astype(np.uint8)).resize((28, 28), Image.NEAREST))


@pytest.fixture(scope="module")
def readers():
    return {(digit, split): MultiMNISTReader(MNIST, digit=digit, split=split, val_size=10000, seed=0)
            for digit in ("left", "right") for split in ("train", "eval")}


def test_the_vendored_digits_are_the_mnist_training_files():
    images, labels = raw_digits()
    assert images.shape == (60000, 28, 28) and np.bincount(labels).min() > 5000
    assert np.array_equal(read_idx(os.path.join(MNIST, "train-labels-idx1-ubyte.gz"), 2049), labels)


def test_multimnist_images_are_their_loaders_pairs(readers):
    images, labels = raw_digits()
    left, right = readers[("left", "train")], readers[("right", "train")]
    rng = np.random.RandomState(1)
    for i in rng.randint(0, len(left), size=25):
        a, b = left.first[i], left.second[i]
        expected = their_image(images[a], images[b])
        pixels = np.rint((left[i]["image"][0] * 0.3081 + 0.1307) * 255).astype(np.int64)
        np.testing.assert_array_equal(pixels, expected)
        np.testing.assert_array_equal(left[i]["image"], right[i]["image"])  # one image, two tasks
        assert left[i]["label"] == labels[a] and right[i]["label"] == labels[b]
    assert np.array_equal(left.labels(), labels[left.first]) and np.array_equal(right.labels(), labels[left.second])


def test_multimnist_parts_are_disjoint_and_partners_stay_in_their_part(readers):
    train, val = readers[("left", "train")], readers[("left", "eval")]
    assert len(train) == 50000 and len(val) == 10000
    assert np.intersect1d(train.first, val.first).size == 0
    assert np.union1d(train.first, val.first).size == 60000
    assert np.isin(train.second, train.first).all() and np.isin(val.second, val.first).all()
    counts = np.bincount(np.searchsorted(train.first, train.second), minlength=len(train))
    assert 0.5 < counts.mean() <= 1.0 and counts.max() < 10  # uniform draws with replacement, not a permutation
    again = MultiMNISTReader(MNIST, digit="left", split="eval", seed=0)
    assert np.array_equal(again.second, val.second)  # fixed seeds
    assert not np.array_equal(MultiMNISTReader(MNIST, split="eval", seed=1).first, val.first)


def write_idx(path, array, magic):
    with gzip.open(path, "wb") as f:
        f.write(magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape) +
                array.astype(np.uint8).tobytes())


def test_the_test_split_reads_t10k_files_and_is_an_error_where_they_are_kept_back(tmp_path):
    with pytest.raises(DataError, match=r"no t10k-images-idx3-ubyte\[.gz\].*kept back"):
        MultiMNISTReader(MNIST, split="eval", eval_split="test")
    images, labels = raw_digits()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        os.symlink(os.path.join(MNIST, stem + ".gz"), tmp_path / (stem + ".gz"))
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images[:30], 2051)  # a stand-in for the test digits
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels[:30], 2049)
    test = MultiMNISTReader(str(tmp_path), digit="right", split="eval", eval_split="test")
    assert len(test) == 30 and np.isin(test.second, np.arange(30)).all()
    i = 7
    expected = their_image(images[test.first[i]], images[test.second[i]])
    np.testing.assert_array_equal(np.rint((test[i]["image"][0] * 0.3081 + 0.1307) * 255), expected)
    train = MultiMNISTReader(str(tmp_path), split="train", eval_split="test")
    assert len(train) == 50000  # training reads the training digits whatever the evaluation split
    everything = MultiMNISTReader(str(tmp_path), split="train", eval_split="test", val_size=0)
    assert len(everything) == 60000 and np.array_equal(everything.first, np.arange(60000))  # every training digit


@pytest.mark.parametrize("kwargs, key", [({"digit": "middle"}, "digit"), ({"eval_split": "validation"}, "eval_split"),
                                         ({"mnist_dir": "/nonexistent"}, "mnist_dir"), ({"val_size": 0}, "val_size"),
                                         ({"val_size": -1, "eval_split": "test"}, "val_size"),
                                         ({"val_size": 60000}, "val_size"), ({"val_size": 0.5}, "val_size")])
def test_multimnist_bad_keys_are_one_sentence(kwargs, key):
    with pytest.raises(ConfigError) as caught:
        MultiMNISTReader(**{"mnist_dir": MNIST, **kwargs})
    assert caught.value.key == key


def test_a_file_that_is_not_idx_is_named(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 20)
    with pytest.raises(DataError, match="magic number 2049, expected 2051"):
        read_idx(str(path), 2051)


def expected_correlation(p, alpha, beta, c, sigma):
    """Pearson correlation of y1, y2 for (s1, s2) = (w1^T x, w2^T x) ~ N(0, c^2 [[1, p], [p, 1]]),
    y_k = s_k + sum_i sin(a_i s_k + b_i) + eps_k: E sin(a s + b) = sin b e^{-a^2 v / 2}; Stein's lemma
    E[s1 sin(a s2 + b)] = Cov(s1, s2) a cos b e^{-a^2 v / 2}; the product of two sines as half the difference of two
    cosines, E cos(u + k) = cos k e^{-Var(u) / 2}."""
    v = c * c

    def cross(q):
        total = q * v + 2 * q * v * np.sum(alpha * np.cos(beta) * np.exp(-alpha ** 2 * v / 2))
        a_i, a_j = alpha[:, None], alpha[None, :]
        b_i, b_j = beta[:, None], beta[None, :]
        total += 0.5 * np.sum(np.cos(b_i - b_j) * np.exp(-v * (a_i ** 2 + a_j ** 2 - 2 * a_i * a_j * q) / 2) -
                              np.cos(b_i + b_j) * np.exp(-v * (a_i ** 2 + a_j ** 2 + 2 * a_i * a_j * q) / 2))
        return total

    mean = np.sum(np.sin(beta) * np.exp(-alpha ** 2 * v / 2))
    return (cross(p) - mean ** 2) / (cross(1.0) - mean ** 2 + sigma ** 2)


@pytest.mark.parametrize("p", [0.5, 0.9, 1.0, -0.3])
def test_synthetic_labels_correlate_as_the_formula_expects(p):
    first = MMoESyntheticReader(p, task=0, seed=3, num_samples=100000)
    second = MMoESyntheticReader(p, task=1, seed=3, num_samples=100000)
    np.testing.assert_array_equal(first.inputs, second.inputs)
    w1, w2 = first.weights
    assert abs(np.linalg.norm(w1) - 1.0) < 1e-12 and abs(np.linalg.norm(w2) - 1.0) < 1e-12  # c = 1
    assert abs(w1 @ w2 - p) < 1e-12  # the cosine is the correlation score
    empirical = np.corrcoef(first.labels()[:, 0], second.labels()[:, 0])[0, 1]
    expected = expected_correlation(p, first.alpha, first.beta, 1.0, 0.1)
    assert abs(empirical - expected) < 0.01, (empirical, expected)
    assert expected < p or p == -0.3  # the sines lower the label correlation below the cosine


def test_synthetic_runs_differ_in_data_but_share_the_sines():
    a, b = MMoESyntheticReader(0.9, seed=0), MMoESyntheticReader(0.9, seed=1)
    assert np.array_equal(a.alpha, b.alpha) and not np.allclose(a.weights, b.weights)
    train, held = MMoESyntheticReader(0.9, seed=0), MMoESyntheticReader(0.9, seed=0, split="eval")
    assert len(held) == 2000 and not np.allclose(train.inputs[:5], held.inputs[:5])
    with pytest.raises(ConfigError):
        MMoESyntheticReader(1.5)


def test_lenet_is_their_trunk():
    import paddle

    from mtl.backbones.lenet import LeNet

    net = LeNet()
    assert [tuple(p.shape) for p in net.parameters()] == [(10, 1, 5, 5), (10,), (20, 10, 5, 5), (20,), (320, 50),
                                                          (50,)]
    net.eval()
    out = net({"image": paddle.randn([3, 1, 28, 28])})
    assert out.shape == [3, 50] and float(out.min()) >= 0.0  # ReLU features
