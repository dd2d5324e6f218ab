"""Non-face readers on bundled real data: digit attributes and properties, sklearn tables, CSV files, conversions."""
import functools

import numpy as np
import pytest

from mtl.core.contracts import Field, check_task, conversion_problem, convert
from mtl.core.errors import ConfigError, ContractError, DataError
from mtl.readers.csv_reader import CsvReader
from mtl.readers.digits import DigitsReader, load_digits_arrays
from mtl.readers.numpy_reader import NumpyReader
from mtl.readers.table import SklearnTableReader
from tests.lazy import LazyModule

datasets, preprocessing = LazyModule("sklearn.datasets"), LazyModule("sklearn.preprocessing")  # the references


@functools.lru_cache(maxsize=None)
def digits():
    """scikit-learn's own load_digits (the reference)."""
    return datasets.load_digits()


def reference_properties(image):
    """ink, row/col centre of mass, stroke width of one 8x8 image (values 0..16), by explicit loops."""
    total = row_moment = col_moment = 0.0
    area = perimeter = 0
    for r in range(8):
        for c in range(8):
            v = float(image[r, c])
            total += v
            row_moment += v * r
            col_moment += v * c
            if image[r, c] >= 8:
                area += 1
                for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                    rr, cc = r + dr, c + dc
                    if not (0 <= rr < 8 and 0 <= cc < 8) or image[rr, cc] < 8:
                        perimeter += 1
    return [total / 64 / 16, row_moment / total / 7, col_moment / total / 7, 2 * area / perimeter]


def is_prime(d):
    return d > 1 and all(d % k for k in range(2, d))


def test_digits_read_without_scikit_learn_equal_its_load_digits():
    images, targets = load_digits_arrays()
    np.testing.assert_array_equal(images, digits().images)
    np.testing.assert_array_equal(targets, digits().target)
    assert images.shape == (1797, 8, 8) and not images.flags.writeable


def test_digit_properties_match_a_loop_reference_on_a_few_digits():
    reader = DigitsReader(split="eval")
    for i in (0, 7, 100, 333):
        source = digits().images[reader.source_indices[i]]
        np.testing.assert_allclose(reader[i]["target"], reference_properties(source), rtol=1e-5)
    assert reader.num_outputs == 4 and reader.property_names == ["ink", "row_centre", "col_centre", "stroke_width"]


def test_digit_attributes_follow_the_documented_table():
    reader = DigitsReader(attributes=["even", "prime", "at_least_5", "closed_loop", "vertical_stroke"])
    assert reader.num_labels == 5
    for i in range(0, len(reader), 97):
        digit = int(digits().target[reader.source_indices[i]])
        labels = reader[i]["labels"]
        assert labels.dtype == np.float32
        assert list(labels[:3]) == [digit % 2 == 0, is_prime(digit), digit >= 5]
        assert labels[3] == (digit in (0, 6, 8, 9)) and labels[4] == (digit in (1, 4))
    # the fields a head may ask for are all declared, with the lengths the options chose
    fields = {f.name: f for f in reader.fields()}
    assert fields["labels"].shape == (5,) and fields["target"].shape == (4,) and fields["label"].dtype == "int64"


def test_digit_options_are_checked():
    with pytest.raises(ConfigError, match="unknown name 'round'; known: even"):
        DigitsReader(attributes=["round"])
    with pytest.raises(ConfigError, match="non-empty list"):
        DigitsReader(properties=[])


@pytest.mark.parametrize("name,stratified", [("iris", True), ("wine", True), ("breast_cancer", True),
                                             ("diabetes", False), ("linnerud", False)])
def test_table_split_and_standardisation_use_the_training_split_only(name, stratified):
    train, held = SklearnTableReader(name), SklearnTableReader(name, split="eval")
    bunch = getattr(datasets, f"load_{name}")()
    n = len(bunch.data)
    assert len(np.intersect1d(train.rows, held.rows)) == 0 and len(train) + len(held) == n
    np.testing.assert_array_equal(held.rows, SklearnTableReader(name, split="eval").rows)  # deterministic
    scaler = preprocessing.StandardScaler().fit(bunch.data[train.rows])
    np.testing.assert_allclose(held[:]["features"], scaler.transform(bunch.data[held.rows]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(train[:]["features"], scaler.transform(bunch.data[train.rows]), rtol=1e-4, atol=1e-5)
    if stratified:
        for c in np.unique(bunch.target):  # every class held out in proportion (+-1 row)
            assert abs(np.sum(bunch.target[held.rows] == c) - 0.25 * np.sum(bunch.target == c)) <= 1
        np.testing.assert_array_equal(held.labels(), bunch.target[held.rows])
        np.testing.assert_array_equal(held[:]["labels"].argmax(1), bunch.target[held.rows])
    else:
        target = bunch.target.reshape(n, -1)
        reference = preprocessing.StandardScaler().fit(target[train.rows]).transform(target[held.rows])
        np.testing.assert_allclose(held[:]["target"], reference, rtol=1e-4, atol=1e-5)
        assert held.num_outputs == target.shape[1]


def test_table_padding_and_errors():
    padded = SklearnTableReader("iris", pad_to=30)
    assert padded.fields()[0].shape == (30,) and not padded[:]["features"][:, 4:].any()
    with pytest.raises(ConfigError, match="did you mean 'iris'"):
        SklearnTableReader("iriss")
    with pytest.raises(ConfigError, match="pad_to must be an integer >= the table's 13"):
        SklearnTableReader("wine", pad_to=4)


def write(path, text):
    path.write_text(text)
    return str(path)


def test_csv_reader_matches_the_table_it_was_written_from(tmp_path):
    iris = datasets.load_iris()
    names = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    lines = [",".join(names + ["species"])]
    lines += [",".join([f"{v:g}" for v in row] + [iris.target_names[t]]) for row, t in zip(iris.data, iris.target)]
    path = write(tmp_path / "iris.csv", "\n".join(lines) + "\n")
    mine, bundled = CsvReader(path, label="species", split="eval"), SklearnTableReader("iris", split="eval")
    assert mine.class_names == sorted(iris.target_names)  # setosa, versicolor, virginica: ids as sklearn's
    np.testing.assert_array_equal(mine.rows, bundled.rows)
    np.testing.assert_allclose(mine[:]["features"], bundled[:]["features"], rtol=1e-5, atol=1e-6)
    both = CsvReader(path, label="species", target=["petal_width"], features=names[:3])
    assert [f.name for f in both.fields()] == ["features", "label", "labels", "target"]
    assert both.fields()[0].shape == (3,)


def test_csv_reader_errors_name_file_line_and_column(tmp_path):
    path = write(tmp_path / "t.csv", "a,b,y\n1,2,3\n4,x,6\n7,8,9\n")
    with pytest.raises(DataError, match=r"t.csv' line 3 column 'b': expected a finite number, got 'x'"):
        CsvReader(path, target=["y"])
    with pytest.raises(ConfigError, match=r"has no column 'yy' \(did you mean 'y'\?\); its columns: a, b, y"):
        CsvReader(path, target=["yy"])
    with pytest.raises(DataError, match=r"line 3: 2 cells, the header names 3"):
        CsvReader(write(tmp_path / "r.csv", "a,b,y\n1,2,3\n4,5\n"), target=["y"])
    with pytest.raises(DataError, match=r"'missing.csv' does not exist \(resolved to '/.*missing.csv' from the "
                                        r"working directory"):
        CsvReader("missing.csv", target=["y"])


def test_safe_conversions_and_refusals():
    assert convert(np.array([[True, False]]), "float32", "x").dtype == np.float32
    assert convert(np.array([1, 2], dtype=np.int32), "int64", "x").dtype == np.int64
    assert conversion_problem("float64", "float32") is None
    assert "fraction" in conversion_problem("float32", "int64")
    with pytest.raises(DataError, match="not exact in float32"):
        convert(np.array([2 ** 25 + 1]), "float32", "array 'y'")
    with pytest.raises(ContractError, match=r"provides label\[\] float32 \(a float32 value cannot become int64"):
        check_task("t", "numpy", [Field("x", (2,)), Field("label", (), "float32")], "mlp", [Field("x", (2,))],
                   "softmax", [Field("label", (), "int64")])


def test_numpy_reader_converts_multi_hot_and_float64_and_refuses_float_labels(tmp_path):
    x = np.random.RandomState(0).randn(6, 3)  # float64
    hot = np.array([[1, 0, 1]] * 6, dtype=bool)
    np.savez(tmp_path / "d.npz", x=x, labels=hot, counts=hot.astype(np.int8), label=np.arange(6) % 2)
    reader = NumpyReader(path=str(tmp_path / "d.npz"))
    fields = {f.name: f.dtype for f in reader.fields()}
    assert fields == {"x": "float32", "labels": "float32", "counts": "float32", "label": "int64"}
    np.testing.assert_array_equal(reader[2]["labels"], [1.0, 0.0, 1.0])
    np.testing.assert_allclose(reader[2]["x"], x[2].astype(np.float32))
    np.savez(tmp_path / "f.npz", x=x, label=np.arange(6) * 0.5)
    with pytest.raises(ConfigError, match=r"dtypes.label: array 'label' is float64: a float64 value cannot become "
                                          r"int64 without losing information"):
        NumpyReader(path=str(tmp_path / "f.npz"), dtypes={"label": "int64"})


def test_plugins_table_describes_the_new_readers():
    from mtl.core import registry

    registry.load_builtin()
    described = {e.name: e.description for e in registry.entries("reader")}
    assert described["table"].startswith("scikit-learn's bundled tables (iris, wine")
    assert described["csv"].startswith("Your own table from a CSV file")
    assert "attributes" in described["digits"]
