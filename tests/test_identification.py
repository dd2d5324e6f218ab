"""1:N identification (mtl/evaluation/identification.py) and all held-out people together (mtl/evaluation/held_out.py,
``mtl eval RUN --all-people``), issue 53 items 25 and 26.

References: ranks from a loop over the probes that sorts every gallery score with Python's ``sorted`` (the FERET
protocol's cumulative match score), gallery templates built here by hand, a hand-computed example with ties, and
for the runs the held-out images embedded here by the run's backbone and scored by the same loop; the pooled people
counted from the task files' lists with csv-like parsing.
"""
import json
import os

import numpy as np
import pytest

from mtl.core.errors import DataError
from mtl.evaluation import identification as ident
from mtl.evaluation.held_out import pool_people
from tests.cli_run import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORL = os.path.join(ROOT, "examples", "data", "orl")


def reference(features, labels, gallery_images=1):
    """``(ranks, gallery people)``: gallery = each person's first ``gallery_images`` images in the given order (their
    unit vectors averaged and normalised), probes = the others; each probe's rank = 1 + its own person's position in
    all gallery scores sorted from the highest."""
    unit = [np.asarray(f, dtype=np.float64) / np.linalg.norm(f) for f in features]
    people, seen = [], {}
    for i, label in enumerate(labels):
        if label not in seen:
            seen[label] = []
            people.append(label)
        seen[label].append(i)
    templates = []
    for person in people:
        mean = np.sum([unit[i] for i in seen[person][:gallery_images]], axis=0)
        templates.append(mean / np.linalg.norm(mean))
    ranks = []
    for person in people:
        for probe in seen[person][gallery_images:]:
            scores = [(float(unit[probe] @ t), g) for g, t in enumerate(templates)]
            order = [g for _, g in sorted(scores, key=lambda s: -s[0])]
            ranks.append(order.index(people.index(person)) + 1)
    return np.array(ranks), len(people)


def clustered(rng, counts, dim=16, noise=0.9):
    """Features of people with ``counts`` images each (overlapping clusters: ranks spread), labels shuffled."""
    labels = np.repeat(np.arange(len(counts)) * 7 + 3, counts)  # labels that are not 0..P-1
    centres = rng.standard_normal((len(counts), dim))
    features = centres[np.repeat(np.arange(len(counts)), counts)] + noise * rng.standard_normal((len(labels), dim))
    order = rng.permutation(len(labels))
    return features[order], labels[order]


@pytest.mark.parametrize("gallery_images", [1, 3])
def test_rank_k_and_cmc_match_a_brute_force_sort(gallery_images, monkeypatch):
    """Rank-1, rank-5 and CMC(1..K) against the probe loop, people of 1 to 9 images in shuffled order; blocks of 7
    probes (the block boundary crossed)."""
    monkeypatch.setattr(ident, "BLOCK", 7)
    rng = np.random.default_rng(4)
    features, labels = clustered(rng, [5, 1, 9, 3, 4, 2, 6, 8, 1, 7, 3, 5, 4, 2, 6, 9, 3, 4, 5, 2, 7, 3, 4, 6, 5])
    ranks, people = reference(features, labels, gallery_images)
    found = ident.identification(features, labels, gallery_images=gallery_images, max_rank=12)
    assert found["probes"] == len(ranks) and found["gallery"] == people == 25
    assert 0.1 < found["rank1"] < 0.95  # not trivial either way: the ranks spread
    assert found["rank1"] == pytest.approx((ranks == 1).mean(), abs=1e-15)
    assert found["rank5"] == pytest.approx((ranks <= 5).mean(), abs=1e-15)
    assert found["cmc"] == pytest.approx([(ranks <= k).mean() for k in range(1, 13)], abs=1e-15)
    assert np.all(np.diff(found["cmc"]) >= 0)


def test_gallery_rule_is_the_first_image_of_each_person_in_the_given_order():
    """A hand example. Enrolled: a [1, 0], b [0, 1], c [-1, 0] (each person's first image). Probes: a's [0.6, 0.8]
    scores 0.6 with a, 0.8 with b: rank 2; b's [0.28, 0.96] scores 0.96 with b: rank 1; c's [-0.8, 0.6] scores 0.8
    with c, 0.6 with b: rank 1. CMC = [2/3, 1, 1]. With a's images the other way round a [0.6, 0.8] is enrolled:
    a's probe [1, 0] scores 0.6 with a, 0 with b (rank 1); b's probe 0.936 with a, 0.96 with b (rank 1); c's
    0 with a, 0.8 with c (rank 1): CMC = [1, 1, 1]."""
    features = [[1, 0], [0, 1], [0.6, 0.8], [0.28, 0.96], [-1, 0], [-0.8, 0.6]]
    labels = ["a", "b", "a", "b", "c", "c"]
    found = ident.identification(features, labels)
    assert found["gallery"] == 3 and found["probes"] == 3
    assert found["cmc"] == pytest.approx([2 / 3, 1.0, 1.0], abs=1e-15) and found["rank5"] == 1.0
    swapped = ident.identification([features[2], features[1], features[0], *features[3:]], labels)
    assert swapped["cmc"] == pytest.approx([1.0, 1.0, 1.0], abs=1e-15)


def test_ties_count_against_the_probe():
    """Every face the same vector: every probe ties with every template, so it ranks last (rank G), not first."""
    labels = np.repeat([0, 1, 2, 3], 3)
    found = ident.identification(np.ones((12, 4)), labels)
    assert found["rank1"] == 0.0 and found["cmc"] == [0.0, 0.0, 0.0, 1.0]


def test_too_few_people_or_probes_are_one_sentence():
    with pytest.raises(DataError, match="identification needs two people"):
        ident.identification(np.eye(3), [0, 0, 0])
    with pytest.raises(DataError, match="identification needs two people"):
        ident.identification(np.eye(3), [0, 1, 2])
    with pytest.raises(DataError, match="gallery_images must be a whole number"):
        ident.identification(np.eye(3), [0, 0, 1], gallery_images=0)


def test_pooled_people_count_a_shared_image_once_and_join_its_people():
    """Task x holds files f1-f4 (people 0, 0, 1, 1), task y files f3, f5, f6 (its people 0, 1, 1): f3 is one image,
    so y's person 0 is x's person 1, and y's person 1 (f5, f6) is a third person. Pooled: f1, f2, f3, f4, f5, f6 of
    people 0, 0, 1, 1, 2, 2, one image shared, its features those of the first task."""
    fx, fy = np.arange(8.0).reshape(4, 2), 100 + np.arange(6.0).reshape(3, 2)
    embedded = {"x": (fx, np.array([0, 0, 1, 1])), "y": (fy, np.array([0, 1, 1]))}
    files = {"x": ["f1", "f2", "f3", "f4"], "y": ["f3", "f5", "f6"]}
    pooled = pool_people(embedded, files)
    assert pooled.labels.tolist() == [0, 0, 1, 1, 2, 2] and pooled.shared_images == 1 and pooled.people == 3
    assert np.array_equal(pooled.features, np.vstack([fx, fy[1:]]))
    assert pooled.take({"x": np.array([5, 6, 7, 8]), "y": None}, -1).tolist() == [5, 6, 7, 8, -1, -1]
    apart = pool_people(embedded)  # no files known: nothing shared, the tasks' people kept apart
    assert apart.labels.tolist() == [0, 0, 1, 1, 2, 3, 3] and apart.shared_images == 0


# ----------------------------------------------------------------------------------------------- on a run
def orl_job(tmp_path, steps=2):
    """The ORL recipe (two tasks holding out the same ten people, the same 100 image files) on a 16-pixel CNN."""
    from mtl.config.loading import load_job

    config = os.path.join(ROOT, "examples", "configs", "faces_orl.yaml")
    return load_job(config, [f"output_dir={tmp_path / 'run'}", f"schedule.steps={steps}", "backbone.input_size=16",
                             "backbone.channels=[4, 8]", "backbone.embedding_size=8", "schedule.batch_size=8",
                             "log.progress=false", "log.plot=false", "averaging.type=none", "data.num_workers=0"])


def held_out_images():
    """(files, person) of the held-out people 21-30 of orl_a.txt, read here from the list."""
    rows = [line.rstrip("\n").split("\t") for line in open(os.path.join(ORL, "orl_a.txt"))
            if line.strip() and not line.startswith("#")]
    return [(os.path.join(ORL, path), int(label)) for path, label in rows if int(label) >= 20]


@pytest.fixture(scope="module")
def orl_run(tmp_path_factory):
    """A 2-step run of the ORL recipe: (run folder, its summary)."""
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    folder = tmp_path_factory.mktemp("orl")
    summary = Trainer(build_job(orl_job(folder)), console=lambda *a: None).run()
    return str(folder / "run"), summary


def embedded_by(run_dir, files):
    """The run's embeddings of the image files, computed here: decoded as the reader decodes, one forward pass."""
    import paddle

    from mtl.data.transforms import FaceTransform
    from mtl.serving.inference import open_run

    backbone = open_run(run_dir).backbone()
    transform = FaceTransform(16)
    images = np.stack([transform(open(f, "rb").read(), i, 0) for i, f in enumerate(files)])
    with paddle.no_grad():
        return backbone({"image": paddle.to_tensor(images)}).numpy().astype(np.float64)


def test_a_runs_held_out_people_report_identification_in_its_summary(orl_run):
    """The end-of-run evaluation of held-out people carries rank-1 and rank-5 beside verification, equal to the probe
    loop on the embeddings of the held-out images (list order: each person's image 1 is enrolled)."""
    run_dir, summary = orl_run
    images = held_out_images()
    ranks, people = reference(embedded_by(run_dir, [f for f, _ in images]), [p for _, p in images])
    for task in ("orl_a", "orl_b"):
        metrics = summary["tasks"][task]["eval"]
        assert metrics["identification_gallery"] == people == 10 and metrics["identification_probes"] == 90
        assert metrics["identification_rank1"] == pytest.approx((ranks == 1).mean(), abs=1e-9)
        assert metrics["identification_rank5"] == pytest.approx((ranks <= 5).mean(), abs=1e-9)
        assert "verification_accuracy" in metrics


def test_eval_all_people_scores_every_held_out_person_once(orl_run, tmp_path, capsys):
    """``mtl eval RUN --all-people``: the two tasks hold out the same 100 files, which are 100 images of 10 people
    (not 200 of 20, whose copies would be negatives at cosine 1); every pair of them (4950); identification as the
    probe loop on the images embedded here."""
    run_dir, _ = orl_run
    code, err = cli(["eval", run_dir, "--all-people", "--out", tmp_path], capsys)
    assert code == 0, err
    found = json.loads((tmp_path / "eval_all_people.json").read_text())
    assert (found["images"], found["people"], found["pairs"], found["shared_images"]) == (100, 10, 4950, 100)
    assert found["positive_pairs"] == 10 * 45
    images = held_out_images()
    ranks, _ = reference(embedded_by(run_dir, [f for f, _ in images]), [p for _, p in images])
    assert found["identification"]["rank1"] == pytest.approx((ranks == 1).mean(), abs=1e-9)
    assert found["identification"]["cmc"] == pytest.approx([(ranks <= k).mean() for k in range(1, 11)], abs=1e-9)
    assert 0.0 <= found["accuracy"] <= 1.0 and found["tasks"] == ["orl_a", "orl_b"]


def test_eval_all_people_refusals(tmp_path, capsys):
    code, err = cli(["eval", tmp_path, "--all-people", "--sets", "x.txt"], capsys)
    assert code != 0 and "--all-people" in err and "takes no --sets" in err
    code, err = cli(["eval", tmp_path, "--all-people"], capsys)
    assert code != 0 and "not a training run" in err


def test_eval_all_people_of_a_run_without_held_out_people_is_one_sentence(tmp_path, capsys):
    from tests.small_runs import train_run

    train_run(tmp_path, averaging=False)
    code, err = cli(["eval", tmp_path / "run", "--all-people"], capsys)
    assert code != 0 and "holds out no people" in err and "holdout_classes" in err


def test_a_task_files_pairs_list_scores_what_the_run_scored(orl_run, tmp_path, capsys):
    """``mtl data pairs TASK`` with its defaults writes the pairs the run verified its held-out people on at its
    end: ``mtl eval RUN --sets LIST --folds file`` (the file's contiguous tenths, as the run's folds) gives the
    run's own figure, through the other path (a pairs list read from disk, not the task's reader)."""
    run_dir, summary = orl_run
    task = os.path.join(ROOT, "examples", "configs", "faces_orl", "orl_a.yaml")
    assert cli(["data", "pairs", task, tmp_path / "orl.txt"], capsys)[0] == 0
    code, err = cli(["eval", run_dir, "--sets", tmp_path / "orl.txt", "--folds", "file", "--out", tmp_path], capsys)
    assert code == 0, err
    scored = json.loads((tmp_path / "eval_orl.json").read_text())
    own = summary["tasks"]["orl_a"]["eval"]
    assert scored["pairs"] == own["verification_pairs"] == 900
    assert scored["accuracy"] == pytest.approx(own["verification_accuracy"], abs=1e-9)
    assert scored["std"] == pytest.approx(own["verification_std"], abs=1e-9)
