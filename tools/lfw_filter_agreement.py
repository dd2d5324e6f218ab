"""How the LFW report's filter decisions agree with the independent matcher's own identification of the outside people.

    python tools/lfw_filter_agreement.py --lfw ../shared/data/lfw --report runs/lfw_view2 [--report runs/lfw_view1]

The outside data has no names, and no list says which of its people are LFW people, so the filter's removals and
same-person pairs cannot be scored against a truth here. This checks them against the next best thing: each outside
class's nearest LFW person by the matcher's descriptors (``REPORT/filter/embeddings_dlib.npz``, centred, templates of
up to 20 images), taken as that class's identity when it is at least ``--identified`` near and ``--gap`` nearer than the
next LFW person. For every split the report filtered (``REPORT/filter/UNIT/decision.json``) it counts the identified
outside people who are test people of the split and were removed (contamination), the pairs whose LFW person is the
identified one (precision) and the identified training people with two images or more that were paired (recall).
This is agreement between two uses of one matcher, not accuracy: a person the matcher cannot tell apart is missing
from both. LFW's names are read only from LFW's own people files.
"""
import argparse
import collections
import glob
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mtl.data.lfw import Split  # noqa: E402
from mtl.evaluation.identities import chosen_images  # noqa: E402
from mtl.evaluation.identities import templates as identity_templates  # noqa: E402
from mtl.readers.image_folder import chosen_people  # noqa: E402

TEMPLATE_IMAGES = 20  # as the filter's templates (examples/lfw_filter.py's per_class)


def templates(paths, features, keep):
    """``{person folder: template}`` of the paths ``keep`` accepts: the descriptors centred over every image, each
    person's first :data:`TEMPLATE_IMAGES` images (``chosen_images``), ``identities.templates``' unit mean."""
    folders = np.array([os.path.basename(os.path.dirname(p)) for p in paths])
    kept = np.array([bool(keep(p)) for p in paths])
    names, labels = np.unique(folders[kept], return_inverse=True)
    rows = (features - features.mean(axis=0))[kept]
    chosen = chosen_images(labels, TEMPLATE_IMAGES)
    found, _ = identity_templates(rows[chosen], labels[chosen], len(names))
    return dict(zip(names.tolist(), found))


def identify(cache, outside_marker, identified, gap):
    """``{outside class: LFW person}`` for the classes the matcher places clearly, and every class's two nearest."""
    with np.load(cache, allow_pickle=False) as saved:
        paths, features = saved["paths"], saved["features"].astype(np.float64)
    outside = templates(paths, features, lambda p: outside_marker in p)
    lfw = templates(paths, features, lambda p: outside_marker not in p)
    names = sorted(lfw)
    matrix = np.stack([lfw[n] for n in names])
    found, nearest = {}, {}
    for cls, template in sorted(outside.items()):
        scores = matrix @ template
        first, second = np.argsort(-scores)[:2]
        nearest[cls] = (names[first], float(scores[first]), names[second], float(scores[second]))
        if scores[first] >= identified and scores[first] - scores[second] >= gap:
            found[cls] = names[first]
    return found, nearest


def split_people(lfw_dir, split):
    """``(test people, training people with 2+ images)`` of ``split`` by name, as its readers choose them."""
    def names(options, least=1):
        people = chosen_people(options["people"], options.get("sets"), options.get("exclude_sets"))
        return {p.name for p in people if p.images >= least}
    return names(split.test_people(lfw_dir)), names(split.train_people(lfw_dir), 2)


def unit_split(name):
    """The split of a filter folder's unit name (``view1``, ``seed0`` of View 1, or ``set3``)."""
    return Split(2, int(name[3:])) if name.startswith("set") else Split(1)


def agreement(lfw_dir, folder, found):
    """One row per filtered split: counts of the identified people removed, paired and missed."""
    rows, seen = [], set()
    for path in sorted(glob.glob(os.path.join(folder, "filter", "*", "decision.json"))):
        unit = os.path.basename(os.path.dirname(path))
        split = unit_split(unit)
        if split.name in seen:  # View 1's seeds filter one split alike
            continue
        seen.add(split.name)
        test, train = split_people(lfw_dir, split)
        with open(path) as f:
            decision = json.load(f)
        removed = {r["class"] for r in decision["removed"]}
        pairs = {p["name_a"]: p["name_b"] for p in decision["pairs"]}
        should = {c for c, person in found.items() if person in test}
        could = {c for c, person in found.items() if person in train}
        rows.append({"unit": split.name, "test_people": len(should), "removed_of_them": len(should & removed),
                     "removed": len(removed), "pairs": len(pairs),
                     "pairs_agreeing": sum(found.get(c) == person for c, person in pairs.items()),
                     "pairable": len(could), "paired_of_them": len(could & set(pairs)),
                     "not_paired": sorted(could - set(pairs)),
                     "pairs_with_a_test_person": sorted(c for c, person in pairs.items() if person in test)})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lfw", required=True, help="LFW's folder (its people files)")
    parser.add_argument("--report", nargs="+", required=True, help="lfw_report.py --out folders")
    parser.add_argument("--outside", default="glint", help="a word in the outside images' paths (default glint)")
    parser.add_argument("--identified", type=float, default=0.7, help="least cosine of an identification")
    parser.add_argument("--gap", type=float, default=0.05, help="least margin over the next LFW person")
    args = parser.parse_args(argv)
    cache = os.path.join(args.report[0], "filter", "embeddings_dlib.npz")
    if not os.path.isfile(cache):
        parser.error(f"{cache} does not exist: run the report with --filter-model dlib first")
    found, nearest = identify(cache, args.outside, args.identified, args.gap)
    print(f"the matcher identifies {len(found)} of {len(nearest)} outside classes (cosine >= {args.identified}, "
          f">= {args.gap} above the next LFW person):")
    for cls, (first, s1, second, s2) in nearest.items():
        print(f"  {cls}: {first} {s1:.3f}, then {second} {s2:.3f}{'' if cls in found else '  (not identified)'}")
    totals = collections.Counter()
    for folder in args.report:
        for row in agreement(args.lfw, folder, found):
            print(json.dumps(row))
            totals.update({k: v for k, v in row.items() if isinstance(v, int)})
    print(f"contamination: {totals['removed_of_them']} of {totals['test_people']} identified test people removed; "
          f"pairs: {totals['pairs_agreeing']} of {totals['pairs']} agree (precision), "
          f"{totals['paired_of_them']} of {totals['pairable']} identified training people paired (recall)")


if __name__ == "__main__":
    main()
