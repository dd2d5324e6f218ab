"""No test person in training, found from the faces alone (issue 52), and the same-person pairs a run needs.

Before a split trains, every identity of an outside dataset (numbered people, no names: Glint360K's class numbers)
that is one of the split's test people must be removed: training on a test person makes the test easier (Wu et al.
2024, arXiv 2405.09403: 46.9 % of LFW's people are in MS1MV2). Nothing says who they are, so they are found from the
images. Every outside class, test person and training person gets a template (:mod:`mtl.evaluation.identities`);
each outside class is compared with every person the split knows, and two thresholds, both calibrated on the data,
decide:

* ``same``: what one person's two halves of photographs reach, as ``mtl overlap`` calibrates it (the ``percentile``
  of the same-person half-template cosines of the training people and the outside classes);
* ``sure``: what strangers reach at most ``expected_false`` times over all the comparisons made: picking one person
  out of thousands, strangers above ``same`` are expected by the hundred (:func:`impostor_threshold`, from each
  training person's half-template against every other training person's template).

An outside class is **removed** when its nearest test person reaches ``same`` and is at least as near as its nearest
training person, or reaches ``sure`` whatever the training people do (removal errs on the side of removing: a
stranger removed costs some training data, a test person kept inflates the test). It is **the same person** as a
training person when its nearest training person reaches ``sure`` and it was not removed (a false pair merges two
people, so pairs need the strict threshold). Inside the outside data, two classes are one person when they are mutual
nearest neighbours at ``sure``.

What the rule cannot promise: a person whose photographs in the two datasets look unlike each other (another decade,
another alignment) can fall below both thresholds and be missed; two people who look alike can reach them. The model
matters most: a model that cannot pick one person out of thousands finds little (docs/lfw.md measures it).
"""
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from mtl.core.arrays import unit_rows
from mtl.evaluation.identities import (
    PERCENTILE,
    calibrated_threshold,
    half_templates,
    impostor_threshold,
    reader_templates,
    templates,
    within_matches,
)

EXPECTED_FALSE = 0.5  # strangers expected to reach the "sure" threshold over all the comparisons of one split


@dataclass
class Identities:
    """One dataset's classes as the rule sees them: a template, a half-template cosine and an even-half template
    per class, and names."""

    name: str
    templates: np.ndarray
    halves: np.ndarray
    names: List[str]
    half_templates: np.ndarray = None

    @classmethod
    def of_features(cls, name, features, labels, reader):
        """The templates of ``reader``'s classes from ``features`` [N, D] of its samples with ``labels`` (an embedder
        of one's own: an independent face matcher, descriptors computed elsewhere)."""
        found, halves = templates(features, labels, reader.num_classes)
        names = reader.label_names().get(reader.label_field) or [str(c) for c in range(len(found))]
        return cls(name, found, halves, list(names), half_templates(features, labels, reader.num_classes))

    @classmethod
    def of_reader(cls, name, embedder, input_names, reader, per_class, batch_size=256, flip=True):
        """The templates of every class of ``reader`` (its training images, augmentation off; each image with its
        mirror image, as the verification protocol embeds them)."""
        found, halves, evens = reader_templates(embedder, input_names, reader, per_class, batch_size, flip)
        names = reader.label_names().get(reader.label_field) or [str(c) for c in range(len(found))]
        return cls(name, found, halves, list(names), evens)


@dataclass
class Decision:
    """What the rule found: its two thresholds and how they were set, the removed outside classes (test people),
    the same-person pairs across and inside the datasets."""

    threshold: float
    how: str
    sure: float = None
    removed: List[dict] = field(default_factory=list)
    pairs: List[dict] = field(default_factory=list)
    within: Dict[str, List[dict]] = field(default_factory=dict)

    def removed_names(self) -> List[str]:
        """The names of the removed outside classes."""
        return [r["class"] for r in self.removed]


def thresholds(outside, test, training, percentile=PERCENTILE, expected_false=EXPECTED_FALSE):
    """``(same, sure, how)``: the two calibrated cosines (module docstring) and a sentence saying how."""
    same = calibrated_threshold([training.halves, outside.halves], percentile)
    rows = np.flatnonzero(np.isfinite(training.halves))
    comparisons = len(outside.names) * (len(test.names) + len(training.names))
    sure = max(same, impostor_threshold(training.half_templates[rows], training.templates, rows, comparisons,
                                        expected_false))
    how = (f"same person at {same:.3f}: the {percentile:g}th percentile of the same-person half-template cosines of "
           f"{len(rows)} {training.name} and {int(np.isfinite(outside.halves).sum())} {outside.name} identities; "
           f"sure at {sure:.3f}: what strangers reach {expected_false:g} times in the {comparisons} comparisons "
           f"(from {len(rows)} {training.name} identities' halves against every other)")
    return same, sure, how


def decide(outside: Identities, test: Identities, training: Identities, percentile=PERCENTILE,
           threshold=None, expected_false=EXPECTED_FALSE) -> Decision:
    """Find the outside classes that are test people, the outside-training same-person pairs and the pairs inside
    the outside data (module docstring); ``threshold`` fixes both thresholds at one cosine instead."""
    if threshold is None:
        same, sure, how = thresholds(outside, test, training, percentile, expected_false)
    else:
        same = sure = float(threshold)
        how = "fixed"
    decision = Decision(same, how, sure)
    to_test = unit_rows(outside.templates) @ unit_rows(test.templates).T
    to_train = unit_rows(outside.templates) @ unit_rows(training.templates).T
    for c, name in enumerate(outside.names):
        p, t = int(np.argmax(to_test[c])), int(np.argmax(to_train[c]))
        near, far = float(to_test[c, p]), float(to_train[c, t])
        if (near >= same and near >= far) or near >= sure:
            decision.removed.append({"class": name, "label": c, "person": test.names[p], "similarity": near})
        elif far >= sure:
            decision.pairs.append({"task_a": outside.name, "name_a": name, "task_b": training.name,
                                   "name_b": training.names[t], "similarity": far})
    gone = {r["label"] for r in decision.removed}
    kept = np.array([c not in gone for c in range(len(outside.names))])
    decision.within[outside.name] = [
        {"task_a": outside.name, "name_a": outside.names[m["class_a"]], "task_b": outside.name,
         "name_b": outside.names[m["class_b"]], "similarity": m["similarity"]}
        for m in within_matches(np.where(kept[:, None], outside.templates, 0.0), sure)]
    decision.removed.sort(key=lambda r: -r["similarity"])
    decision.pairs.sort(key=lambda r: -r["similarity"])
    return decision
