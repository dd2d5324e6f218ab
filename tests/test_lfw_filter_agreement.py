"""tools/lfw_filter_agreement.py: the matcher's identification of outside classes (nearest LFW person, clearly ahead
of the next) and the counts of the filter's decisions that agree with it, on the vendored subset's people files with
planted descriptors and decisions."""
import json
import os
import sys

import numpy as np

from mtl.data.lfw import read_people
from tests.dist_util import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import lfw_filter_agreement as tool  # noqa: E402

SUBSET = os.path.join(ROOT, "examples", "data", "lfw_subset")


def test_identification_and_agreement_counts(tmp_path):
    test = read_people(os.path.join(SUBSET, "peopleDevTest.txt"))[0][0].name
    train = [p.name for p in read_people(os.path.join(SUBSET, "peopleDevTrain.txt"))[0] if p.images >= 2][:2]
    rng = np.random.default_rng(0)
    people = {name: rng.standard_normal(8) for name in [test, *train, "Other_Person"]}
    paths, rows = [], []
    for name, vector in people.items():  # LFW images, 3 each
        for k in range(3):
            paths.append(f"/lfw/images/{name}/{name}_{k:04d}.jpg")
            rows.append(5.0 + vector + 0.05 * rng.standard_normal(8))
    copies = {"901": test, "902": train[0], "903": train[1], "904": None}  # 904: nobody of LFW
    for cls, name in copies.items():
        vector = people[name] if name else rng.standard_normal(8)
        for k in range(3):
            paths.append(f"/glint/images/{cls}/{k}.jpg")
            rows.append(5.0 + vector + 0.05 * rng.standard_normal(8))
    report = tmp_path / "report"
    (report / "filter" / "seed0").mkdir(parents=True)
    np.savez(report / "filter" / "embeddings_dlib.npz", paths=np.array(paths), features=np.array(rows))
    decision = {"removed": [{"class": "901", "person": test}, {"class": "904", "person": "Other_Person"}],
                "pairs": [{"name_a": "902", "name_b": train[0]}, {"name_a": "904", "name_b": train[1]}]}
    (report / "filter" / "seed0" / "decision.json").write_text(json.dumps(decision))
    found, nearest = tool.identify(str(report / "filter" / "embeddings_dlib.npz"), "glint", 0.7, 0.05)
    assert found == {"901": test, "902": train[0], "903": train[1]} and set(nearest) == set(copies)
    [row] = tool.agreement(SUBSET, str(report), found)
    assert (row["unit"], row["test_people"], row["removed_of_them"], row["removed"]) == ("view1", 1, 1, 2)
    assert (row["pairs"], row["pairs_agreeing"], row["pairable"], row["paired_of_them"]) == (2, 1, 2, 1)
    assert row["not_paired"] == ["903"] and row["pairs_with_a_test_person"] == []
