"""1:N identification on held-out people: rank-k accuracy and the CMC curve, beside 1:1 verification.

Closed-set identification asks, for a face of someone enrolled, whether the enrolled person it resembles most is the
right one. The protocol here:

* **Gallery** (the enrolled people): each person's first ``gallery_images`` images (default 1) in the order the
  images are given: an evaluation split's order, i.e. a label list's line order, an image folder's sorted file names
  (person folders sorted too), a RecordIO pack's record order. With more than one, the person's template is the mean
  of those images' unit embeddings, normalised again (a "mean template", as IJB's templates are pooled).
* **Probes**: every other image. A person with no image beyond the gallery's is enrolled only (a distractor for the
  others' probes); it adds no probe.
* **Score**: the cosine of unit embeddings (the same order as the squared L2 distance ``d = 2 - 2 cos`` of the
  verification protocol).
* **Rank** of a probe: 1 + the number of *other* people's gallery templates that score at least as high as its own
  person's. A tie counts against the probe (the pessimistic rank): an embedding that gives every face the same vector
  ranks every probe last, not first.
* **CMC(k)** (cumulative match characteristic): the share of probes of rank <= k, for k = 1 .. K; the rank-k
  accuracy is CMC(k), rank-1 the identification rate. CMC(k) = 1 for k >= the gallery's size.

These are the definitions of the FERET protocol's cumulative match score (P. J. Phillips, H. Moon, S. A. Rizvi,
P. J. Rauss, "The FERET evaluation methodology for face-recognition algorithms", IEEE TPAMI 22(10), 2000) and of
ISO/IEC 19795-1:2006 (biometric performance testing: identification rank, CMC); insightface's IJB-B/C 1:N and
MegaFace evaluations report the same rank-1 / rank-5 ("top-1", "top-5") figures on their own galleries.
"""
from dataclasses import dataclass

import numpy as np

from mtl.core.arrays import unit_rows
from mtl.core.errors import DataError

MAX_RANK = 20  # the CMC curve is kept for ranks 1..20 (or the gallery's size, if smaller)
BLOCK = 1024  # probes scored at a time (a [BLOCK, gallery] matrix)


@dataclass
class Gallery:
    """The split of a set of images into enrolled templates and probes: ``templates`` [G, D] unit rows,
    ``people`` [G] the person of each template, ``probes`` the indices of the probe images, ``probe_people``
    their persons' template rows."""

    templates: np.ndarray
    people: np.ndarray
    probes: np.ndarray
    probe_people: np.ndarray

    @classmethod
    def of(cls, features, labels, gallery_images: int = 1) -> "Gallery":
        """Gallery and probes of ``features`` [N, D] and person ``labels`` [N] (the module's rule)."""
        labels = np.asarray(labels).reshape(-1)
        if isinstance(gallery_images, bool) or not isinstance(gallery_images, (int, np.integer)) or \
                gallery_images < 1:
            raise DataError(f"identification: gallery_images must be a whole number >= 1, got {gallery_images!r}")
        unit = unit_rows(np.asarray(features, dtype=np.float64))
        if len(unit) != len(labels):
            raise DataError(f"identification: {len(unit)} embeddings for {len(labels)} labels")
        people, first_seen = np.unique(labels, return_index=True)
        people = people[np.argsort(first_seen, kind="stable")]  # templates in the order people first appear
        templates, probes, probe_people = [], [], []
        for row, person in enumerate(people):
            mine = np.flatnonzero(labels == person)  # in the given order
            templates.append(unit[mine[:gallery_images]].mean(axis=0))
            probes.append(mine[gallery_images:])
            probe_people.append(np.full(len(mine[gallery_images:]), row, dtype=np.int64))
        probes = np.concatenate(probes)
        if len(people) < 2 or len(probes) == 0:
            raise DataError(f"identification needs two people and one person with more than {gallery_images} "
                            f"image(s) (a probe beyond the gallery); got {len(labels)} images of {len(people)} "
                            "people")
        return cls(unit_rows(np.stack(templates)), people, probes, np.concatenate(probe_people))


def probe_ranks(features, gallery: Gallery) -> np.ndarray:
    """The rank (1 = the right person scores highest) of every probe of ``gallery`` (module docstring)."""
    unit = unit_rows(np.asarray(features, dtype=np.float64))
    ranks = np.empty(len(gallery.probes), dtype=np.int64)
    for start in range(0, len(ranks), BLOCK):
        rows = slice(start, start + BLOCK)
        scores = unit[gallery.probes[rows]] @ gallery.templates.T  # [block, G]
        own = scores[np.arange(scores.shape[0]), gallery.probe_people[rows]]
        # every template at least as close as the probe's own, its own excluded
        ranks[rows] = (scores >= own[:, None]).sum(axis=1)
    return ranks


def cmc_curve(ranks, gallery_size: int, max_rank: int = MAX_RANK) -> np.ndarray:
    """CMC(k) for k = 1 .. min(max_rank, gallery_size): the share of probes whose rank is at most k."""
    ranks = np.asarray(ranks)
    top = min(int(max_rank), int(gallery_size))
    return np.array([(ranks <= k).mean() for k in range(1, top + 1)], dtype=np.float64)


def identification(features, labels, gallery_images: int = 1, max_rank: int = MAX_RANK) -> dict:
    """``{"rank1", "rank5", "cmc": [CMC(1), ..., CMC(K)], "probes", "gallery", "gallery_images"}`` of ``features``
    [N, D] with person ``labels`` [N] (gallery and probes by the module's rule)."""
    gallery = Gallery.of(features, labels, gallery_images)
    ranks = probe_ranks(features, gallery)
    return {"rank1": float((ranks <= 1).mean()), "rank5": float((ranks <= 5).mean()),
            "cmc": cmc_curve(ranks, len(gallery.people), max_rank).tolist(), "probes": int(len(ranks)),
            "gallery": int(len(gallery.people)), "gallery_images": int(gallery_images)}


def identification_metrics(features, labels) -> dict:
    """The figures an evaluation split of held-out people reports beside verification (floats, as every metric):
    ``identification_rank1``, ``identification_rank5``, ``identification_gallery`` (people enrolled, one image
    each) and ``identification_probes``."""
    found = identification(features, labels)
    return {"identification_rank1": found["rank1"], "identification_rank5": found["rank5"],
            "identification_gallery": float(found["gallery"]), "identification_probes": float(found["probes"])}
