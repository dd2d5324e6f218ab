"""Issue 53, item 1: the verification folds do not depend on the order of the user's pairs list.

A list written with every positive pair first, scored with insightface's contiguous folds, gives a random model an
accuracy of 0 (each fold holds one kind). The folds are now stratified by kind and drawn from the pairs' own keys:
checked against a loop reference of the folds (tests/references/folds.py) and of the protocol, and by scoring the
same list in natural order, shuffled and with the two images of pairs swapped: the figures are identical."""
import os

import numpy as np
import paddle
import pytest

from mtl.core.errors import DataError
from mtl.data.verification_sets import encode_png, read_pairs
from mtl.evaluation import metrics
from mtl.evaluation.verify import evaluate_sets, set_folds
from tests.references.folds import stratified_splits
from tests.references.verification import noisy_pairs, reference_verification


@pytest.mark.parametrize("pairs,folds", [(300, 10), (203, 10), (47, 7)])
def test_stratified_folds_agree_with_the_loop_reference_and_the_protocol(pairs, folds):
    rng = np.random.RandomState(pairs)
    emb, issame = noisy_pairs(rng, pairs, dim=8, noise=1.0)
    keys = [f"person{rng.randint(1000)}/img{i}.jpg\tother{i}.jpg" for i in range(pairs)]
    splits = stratified_splits(issame, keys, folds)
    fold_of = metrics.stratified_folds(issame, folds, keys=keys)
    for k, (_, test) in enumerate(splits):
        assert set(np.flatnonzero(fold_of == k)) == set(test)
    got = metrics.verification(emb, issame, folds=folds, fold_of=fold_of)
    want = reference_verification(emb, issame, folds, metrics.DEFAULT_THRESHOLDS, 1e-3, splits=splits)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


@pytest.mark.parametrize("n_same,n_diff,folds", [(300, 300, 10), (31, 58, 10), (7, 3, 4)])
def test_every_fold_holds_its_share_of_each_kind(n_same, n_diff, folds):
    issame = np.r_[np.ones(n_same, bool), np.zeros(n_diff, bool)]  # positives first: the order that broke it
    fold_of = metrics.stratified_folds(issame, folds, keys=[f"k{i}" for i in range(len(issame))])
    same_counts = np.bincount(fold_of[issame], minlength=folds)
    diff_counts = np.bincount(fold_of[~issame], minlength=folds)
    assert same_counts.min() >= n_same // folds and same_counts.max() <= -(-n_same // folds)
    assert diff_counts.min() >= n_diff // folds and diff_counts.max() <= -(-n_diff // folds)
    totals = same_counts + diff_counts
    assert totals.max() - totals.min() <= 1


def test_positives_first_no_longer_gives_a_random_model_zero():
    """The defect reproduced with insightface's folds, and the same pairs with the stratified ones."""
    rng = np.random.RandomState(5)
    emb = rng.randn(400, 16)  # a "random model": distances say nothing about the pairs
    issame = np.r_[np.ones(100, bool), np.zeros(100, bool)]
    old = metrics.verification(emb, issame, fold_of=metrics.contiguous_folds(200, 10))
    assert old["accuracy"] < 0.1  # the defect: each fold holds one kind, the threshold learned elsewhere fails it
    new = metrics.verification(emb, issame)
    assert 0.35 < new["accuracy"] < 0.65


def write_images_and_list(folder, rng, people=12, per_person=3, size=8):
    """PNG images of ``people`` "people" (a colour each plus noise) and a list of every same pair first, then as
    many different pairs: the natural order of a list written by hand."""
    paths = {}
    for person in range(people):
        colour = rng.randint(0, 256, 3)
        for i in range(per_person):
            pixels = np.clip(colour + rng.randint(-60, 61, (size, size, 3)), 0, 255).astype(np.uint8)
            rel = f"p{person}/{i}.png"
            os.makedirs(folder / f"p{person}", exist_ok=True)
            (folder / rel).write_bytes(encode_png(pixels))
            paths[(person, i)] = rel
    same = [(paths[(p, i)], paths[(p, j)]) for p in range(people) for i in range(per_person)
            for j in range(i + 1, per_person)]
    diff = []
    while len(diff) < len(same):
        a, b = rng.choice(people, 2, replace=False)
        diff.append((paths[(a, rng.randint(per_person))], paths[(b, rng.randint(per_person))]))
    return [(x, y, 1) for x, y in same] + [(x, y, 0) for x, y in diff]


class MeanColour(paddle.nn.Layer):
    """A fixed "backbone": a random projection of each image's mean colour and its pixels."""

    def __init__(self, size):
        super().__init__()
        rng = np.random.RandomState(0)
        self.weight = paddle.to_tensor(rng.randn(3 * size * size, 6).astype(np.float32))

    def forward(self, inputs):
        x = inputs["image"]
        return paddle.matmul(x.reshape([x.shape[0], -1]), self.weight)


def score(folder, lines, name, fold_order="stratified"):
    path = folder / f"{name}.txt"
    path.write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in lines))
    vset = read_pairs(str(path), image_size=8)
    return evaluate_sets(MeanColour(8), [vset], batch_size=7, flip=False, fold_order=fold_order), vset


def test_a_list_in_any_order_scores_the_same(tmp_path):
    rng = np.random.RandomState(2)
    natural = write_images_and_list(tmp_path, rng)
    shuffled = [natural[i] for i in rng.permutation(len(natural))]
    swapped = [(b, a, s) if i % 2 else (a, b, s) for i, (a, b, s) in enumerate(shuffled)]
    first, vset = score(tmp_path, natural, "natural")
    again, _ = score(tmp_path, shuffled, "shuffled")
    turned, _ = score(tmp_path, swapped, "swapped")
    strip = {key.split("/", 1)[1]: value for key, value in first.items()}
    assert 0.6 < strip["accuracy"] < 1.0  # neither degenerate nor trivial
    for other in (again, turned):
        assert {key.split("/", 1)[1]: value for key, value in other.items()} == pytest.approx(strip, abs=1e-12)
    with pytest.raises(DataError, match=r"natural\.txt'.*fold 1 of 10 in the file's order holds only same-person"):
        set_folds(vset, 10, "file")


def test_too_few_pairs_of_a_kind_is_said():
    assert metrics.small_folds_warning([True, False, True, False]).startswith("warning: 2 same-person and 2 ")
    assert metrics.small_folds_warning([True] * 20 + [False] * 19) is not None
    assert metrics.small_folds_warning([True] * 20 + [False] * 20) is None

def test_mtl_eval_says_when_a_list_is_too_small_for_its_folds(tmp_path):
    """``mtl eval`` on a 4-pair list (the issue's ``0.75000+-0.43301`` with no word) says that its folds are too
    small; a list of 20 pairs of each kind gets no such line."""
    from mtl.commands.evaluate import evaluate
    from tests.small_runs import train_run

    train_run(tmp_path, channels=3)
    rng = np.random.RandomState(3)
    lines = write_images_and_list(tmp_path, rng, people=2, per_person=2)  # 2 same-person pairs, then 2 others
    (tmp_path / "small.txt").write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in lines))
    said = []
    evaluate(str(tmp_path / "run"), [str(tmp_path / "small.txt")], console=said.append)
    assert [line for line in said if "too small" in line] == [
        "small: warning: 2 same-person and 2 different-person pairs: with fewer than 20 of either kind the 4 folds "
        "are too small for the accuracy and its std to mean much; add pairs"], said
    lines = write_images_and_list(tmp_path, rng, people=10, per_person=3)  # 30 same-person pairs, 30 others
    (tmp_path / "enough.txt").write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in lines))
    said = []
    evaluate(str(tmp_path / "run"), [str(tmp_path / "enough.txt")], console=said.append)
    assert not [line for line in said if "too small" in line], said
