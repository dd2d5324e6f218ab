"""No test person in training, found from the faces alone (issue 52), and the same-person pairs a run needs.

Before a split trains, every identity of an outside dataset (numbered people, no names: Glint360K's class numbers)
that is one of the split's test people must be removed: training on a test person makes the test easier (Wu et al.
2024, arXiv 2405.09403: 46.9 % of LFW's people are in MS1MV2). Nothing says who they are, so they are found from the
images, with a model that never saw the outside data nor the test people (the split's own-data model):

* every outside class and every test person gets a template (:mod:`mtl.evaluation.identities`);
* the threshold is calibrated as ``mtl overlap``'s: the ``percentile`` of the same-person half-template cosines of
  the split's training people (and of the outside classes, whose own halves say how alike one person's images look
  there);
* an outside class is removed when its nearest test person reaches the threshold (:func:`test_person_matches`:
  mutual or not, since a person may hold several outside classes).

The same templates give the same-person pairs between the outside data and the training people (mutual nearest
neighbours at the threshold) and inside the outside data (a person with two class numbers).

What the rule cannot promise: a test person with one image (a third of LFW's) has a template of one photograph and
may fall below the threshold; the calibration assumes that an outside person's images are as alike across the two
datasets as inside one (another alignment or another decade of photographs makes them less alike). The LFW report
therefore measures the rule on planted copies of test people, and lists every removal with its score.
"""
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from mtl.evaluation.identities import (
    PERCENTILE,
    calibrated_threshold,
    match_classes,
    reader_templates,
    templates,
    test_person_matches,
    within_matches,
)


@dataclass
class Identities:
    """One dataset's classes as the rule sees them: a template and a half-template cosine per class, and names."""

    name: str
    templates: np.ndarray
    halves: np.ndarray
    names: List[str]

    @classmethod
    def of_features(cls, name, features, labels, reader):
        """The templates of ``reader``'s classes from ``features`` [N, D] of its samples with ``labels`` (an embedder
        of one's own: an independent face matcher, descriptors computed elsewhere)."""
        found, halves = templates(features, labels, reader.num_classes)
        names = reader.label_names().get(reader.label_field) or [str(c) for c in range(len(found))]
        return cls(name, found, halves, list(names))

    @classmethod
    def of_reader(cls, name, embedder, input_names, reader, per_class, batch_size=256, flip=True):
        """The templates of every class of ``reader`` (its training images, augmentation off; each image with its
        mirror image, as the verification protocol embeds them)."""
        found, halves = reader_templates(embedder, input_names, reader, per_class, batch_size, flip)
        names = reader.label_names().get(reader.label_field) or [str(c) for c in range(len(found))]
        return cls(name, found, halves, list(names))


@dataclass
class Decision:
    """What the rule found: the threshold and how it was set, the removed outside classes (test people), the
    same-person pairs across and inside the datasets."""

    threshold: float
    how: str
    removed: List[dict] = field(default_factory=list)
    pairs: List[dict] = field(default_factory=list)
    within: Dict[str, List[dict]] = field(default_factory=dict)

    def removed_names(self) -> List[str]:
        """The names of the removed outside classes."""
        return [r["class"] for r in self.removed]


def decide(outside: Identities, test: Identities, training: Identities, percentile=PERCENTILE,
           threshold=None) -> Decision:
    """Find the outside classes that are test people, the outside-training same-person pairs and the pairs inside
    each, with one threshold calibrated on the training people's and the outside classes' own halves (or the fixed
    cosine ``threshold``)."""
    if threshold is None:
        threshold = calibrated_threshold([training.halves, outside.halves], percentile)
        how = (f"calibrated: the {percentile:g}th percentile of the same-person half-template cosines of "
               f"{int(np.isfinite(training.halves).sum())} {training.name} and "
               f"{int(np.isfinite(outside.halves).sum())} {outside.name} identities")
    else:
        threshold, how = float(threshold), "fixed"
    decision = Decision(threshold, how)
    for m in test_person_matches(outside.templates, test.templates, threshold):
        decision.removed.append({"class": outside.names[m["class"]], "label": m["class"],
                                 "person": test.names[m["person"]], "similarity": m["similarity"]})
    gone = {r["label"] for r in decision.removed}
    kept = np.array([c not in gone for c in range(len(outside.names))])
    for m in match_classes(np.where(kept[:, None], outside.templates, 0.0), training.templates, threshold):
        decision.pairs.append({"task_a": outside.name, "name_a": outside.names[m["class_a"]],
                               "task_b": training.name, "name_b": training.names[m["class_b"]],
                               "similarity": m["similarity"]})
    for ids in (outside, training):
        kept_templates = ids.templates if ids is training else np.where(kept[:, None], ids.templates, 0.0)
        decision.within[ids.name] = [
            {"task_a": ids.name, "name_a": ids.names[m["class_a"]], "task_b": ids.name,
             "name_b": ids.names[m["class_b"]], "similarity": m["similarity"]}
            for m in within_matches(kept_templates, threshold)]
    return decision
