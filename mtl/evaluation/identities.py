"""Which classes of two (or one) sets of identities are the same people, from face templates: the rule of
``mtl overlap``, of the LFW report's de-duplication and of its test-person filter (issue 52).

A *template* is the mean of the unit embeddings of a class's images (up to ``IMAGES_PER_CLASS`` of them), made a unit
vector again; two classes are compared by the cosine of their templates. The decision is calibrated on the data
itself: every identity with two images or more is split into its even- and odd-numbered images, and the cosine of
the two half-templates is a same-person similarity; the threshold is the ``PERCENTILE``-th percentile of those.

* Across two sets (:func:`match_classes`): a pair (a, b) is kept when each is the other's nearest neighbour (mutual
  nearest neighbours) and their cosine reaches the threshold.
* Inside one set (:func:`within_matches`): the same, with a class's own template left out (a person given two
  class numbers, as Glint360K did for some).
* Test people (:func:`test_person_matches`): every outside class whose nearest test person reaches the threshold is
  listed, mutual or not: several outside classes may hold one test person, and each must go.

What it cannot promise: a person whose images in the two sets look unlike each other (age, pose, another
alignment) can fall below the threshold and be missed; two different people who look alike can reach it. The
percentile sets the trade (a lower one finds more and misjudges more); the LFW report measures both on people it
plants as duplicates.
"""
import numpy as np

from mtl.core.arrays import unit_rows
from mtl.core.errors import ConfigError

CENTRES_THRESHOLD = 0.5  # mtl overlap --centres without --threshold
PERCENTILE = 5.0
IMAGES_PER_CLASS = 20


def match_classes(centres_a, centres_b, threshold: float = CENTRES_THRESHOLD, all_mutual: bool = False):
    """Likely-same classes of two ``[C, D]`` centre (or template) sets: list of ``{class_a, class_b, similarity,
    mutual}``.

    Every mutual-nearest-neighbour pair is listed when ``all_mutual``; otherwise only those with similarity at
    least ``threshold`` (the decision). Sorted by decreasing similarity.
    """
    sim = unit_rows(centres_a) @ unit_rows(centres_b).T
    best_b = np.argmax(sim, axis=1)
    best_a = np.argmax(sim, axis=0)
    found = []
    for a, b in enumerate(best_b):
        mutual = bool(best_a[b] == a)
        if mutual and (all_mutual or sim[a, b] >= threshold):
            found.append({"class_a": int(a), "class_b": int(b), "similarity": float(sim[a, b]), "mutual": mutual})
    return sorted(found, key=lambda m: -m["similarity"])


def chosen_images(labels, per_class: int) -> np.ndarray:
    """Indices of the first ``per_class`` samples of every class, in sample order (deterministic)."""
    labels = np.asarray(labels).reshape(-1)
    order = np.argsort(labels, kind="stable")
    first = np.searchsorted(labels[order], labels[order], side="left")
    rank = np.arange(len(order)) - first
    return np.sort(order[rank < per_class])


def half_templates(features, labels, num_classes: int):
    """``[C, D]`` templates of each class's even-numbered images (NaN rows for classes with fewer than two)."""
    unit = unit_rows(features)
    labels = np.asarray(labels).reshape(-1)
    out = np.full((num_classes, unit.shape[1]), np.nan)
    for c in np.unique(labels):
        rows = unit[labels == c]
        if len(rows) >= 2:
            out[c] = unit_rows(rows[0::2].mean(axis=0, keepdims=True))[0]
    return out


def templates(features, labels, num_classes: int):
    """``(templates [C, D], halves [C])`` from the embeddings of one head's chosen training images.

    ``template_c = unit(mean of unit(f_i) over class c)``; ``halves_c`` is the cosine of the templates of class c's
    even- and odd-numbered images (NaN with fewer than two images): the same-person similarity the decision is
    calibrated on. A class without images keeps a zero template (it matches nothing)."""
    unit = unit_rows(features)
    labels = np.asarray(labels).reshape(-1)
    out = np.zeros((num_classes, unit.shape[1]))
    halves = np.full(num_classes, np.nan)
    for c in np.unique(labels):
        rows = unit[labels == c]
        out[c] = unit_rows(rows.mean(axis=0, keepdims=True))[0]
        if len(rows) >= 2:
            even = unit_rows(rows[0::2].mean(axis=0, keepdims=True))[0]
            odd = unit_rows(rows[1::2].mean(axis=0, keepdims=True))[0]
            halves[c] = float(even @ odd)
    return out, halves


def impostor_threshold(halves_a, templates_, owners, comparisons: int, expected_false: float = 0.5) -> float:
    """The cosine that at most ``expected_false`` of ``comparisons`` different-person template pairs reach: the
    ``1 - expected_false / comparisons`` quantile of the cosines between each identity's half-template
    (``halves_a`` [H, D], the identity ``owners`` [H]) and every other identity's template (``templates_`` [C, D]).
    Picking one person out of thousands needs it: two strangers' templates above the same-person threshold are
    then expected by the hundred."""
    sim = unit_rows(halves_a) @ unit_rows(templates_).T
    sim[np.arange(len(owners)), owners] = np.nan  # an identity against its own template is not an impostor
    values = sim[np.isfinite(sim)]
    if values.size == 0:
        raise ConfigError("no identity has two images: the impostor threshold cannot be calibrated")
    return float(np.quantile(values, max(0.0, 1.0 - float(expected_false) / max(int(comparisons), 1))))


def calibrated_threshold(halves, percentile: float = PERCENTILE) -> float:
    """The ``percentile`` of the same-person half-template cosines of every identity that has them."""
    values = np.concatenate([np.asarray(h)[np.isfinite(h)] for h in halves])
    if len(values) == 0:
        raise ConfigError("no training identity has two images: the overlap threshold cannot be calibrated; pass "
                          "--threshold")
    return float(np.percentile(values, percentile))


def within_matches(templates_, threshold: float):
    """Likely-same pairs of classes of ONE set: ``[{class_a, class_b, similarity}]`` with ``class_a < class_b``,
    mutual nearest neighbours (a class's own template excluded; zero templates match nothing) at or above
    ``threshold``, by decreasing similarity."""
    unit = unit_rows(templates_)
    sim = unit @ unit.T
    empty = ~np.any(unit != 0, axis=1)
    sim[np.diag_indices_from(sim)] = -np.inf
    sim[empty, :] = -np.inf
    sim[:, empty] = -np.inf
    if len(sim) < 2:
        return []
    best = np.argmax(sim, axis=1)
    found = [{"class_a": int(a), "class_b": int(b), "similarity": float(sim[a, b])}
             for a, b in enumerate(best) if a < b and best[b] == a and sim[a, b] >= threshold]
    return sorted(found, key=lambda m: -m["similarity"])


def test_person_matches(outside, test, threshold: float):
    """Outside classes that are test people: ``[{class, person, similarity}]`` for every row of ``outside`` (class
    templates) whose nearest row of ``test`` (test people's templates) has cosine at least ``threshold``."""
    if len(outside) == 0 or len(test) == 0:
        return []
    sim = unit_rows(outside) @ unit_rows(test).T
    nearest = np.argmax(sim, axis=1)
    found = [{"class": int(c), "person": int(p), "similarity": float(sim[c, p])}
             for c, p in enumerate(nearest) if sim[c, p] >= threshold]
    return sorted(found, key=lambda m: -m["similarity"])


def embed_samples(embedder, input_names, reader, label_field="label", batch_size=256, indices=None, flip=False):
    """Embeddings [N, D] (numpy) and labels of the samples ``indices`` of ``reader`` (all by default), augmentation
    off: ``embedder({input name: batch})`` in inference mode; ``flip``: ``unit(f(x)) + unit(f(mirrored x))`` of
    image inputs (the verification protocol's embedding, :mod:`mtl.evaluation.verify`)."""
    import paddle

    from mtl.data.steps import collate

    reader.set_augmentation(False)
    indices = np.arange(len(reader)) if indices is None else np.asarray(indices)
    features, labels = [], []
    with paddle.no_grad():
        for start in range(0, len(indices), batch_size):
            batch = collate([reader[int(i)] for i in indices[start:start + batch_size]])
            found = np.asarray(embedder({n: paddle.to_tensor(batch[n]) for n in input_names}).numpy())
            if flip:
                mirrored = {n: paddle.to_tensor(np.ascontiguousarray(batch[n][..., ::-1])) for n in input_names}
                found = unit_rows(found) + unit_rows(np.asarray(embedder(mirrored).numpy()))
            features.append(found)
            labels.append(np.asarray(batch[label_field]).reshape(-1))
    return np.concatenate(features), np.concatenate(labels).astype(np.int64)


def reader_templates(embedder, input_names, reader, per_class=IMAGES_PER_CLASS, batch_size=256, flip=False):
    """``(templates [C, D], halves [C], even-half templates [C, D])`` of every class of ``reader`` from up to
    ``per_class`` of its images (``flip``: each image with its mirror image, as :func:`embed_samples`)."""
    picked = chosen_images(reader.labels(), per_class)
    features, labels = embed_samples(embedder, input_names, reader, reader.label_field, batch_size, picked, flip)
    return (*templates(features, labels, reader.num_classes), half_templates(features, labels, reader.num_classes))
