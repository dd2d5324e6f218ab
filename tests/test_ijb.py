"""IJB-B / IJB-C evaluation (``mtl eval ... --ijb ROOT``): reading the layout, the five-point alignment, template
pooling, pair scores and TAR at FAR.

References: plain numpy loops written here (the similarity transform's defining property, the pooling as the
protocol states it); and insightface's own eval_ijbc.py, run as a script under torch on a small IJB-format set
(random faces at landmarks chosen in tests/references/ijb_set.py), with its own model (a random-weight
MobileFaceNet, converted here) and on its own features, as the committed fixture
tests/fixtures/insightface_eval_ijbc.npz holds it (tests/references/make_peer_fixtures.py).
"""
import json
import os

import cv2
import numpy as np
import pytest

from mtl.cli import main as mtl_main
from mtl.core.errors import DataError
from mtl.evaluation.ijb import ARCFACE_TEMPLATE, align_face, read_ijb, similarity_transform
from mtl.evaluation.ijb_protocol import evaluate_variants, pair_scores, tar_at_far, template_features
from tests.references import peers
from tests.references.ijb_set import FACES, set_digest, similarity, write_ijb
from tests.references.torch_format import insightface_names, randomized, torch_layout, write_torch_file


def test_similarity_transform_recovers_a_known_similarity():
    truth = similarity(1.3, 0.4, (5.0, -7.0))
    src = np.random.default_rng(1).uniform(0, 100, (5, 2))
    dst = src @ truth[:2, :2].T + truth[:2, 2]
    np.testing.assert_allclose(similarity_transform(src, dst), truth, atol=1e-10)


def test_similarity_transform_is_the_least_squares_fit():
    """Among similarities, the estimate's squared error is a minimum: no small change of its four parameters
    (a, b, tx, ty of [[a, -b, tx], [b, a, ty]]) lowers it."""
    rng = np.random.default_rng(2)
    src, dst = rng.uniform(0, 100, (5, 2)), rng.uniform(0, 100, (5, 2))
    m = similarity_transform(src, dst)

    def error(a, b, tx, ty):
        mapped = src @ np.array([[a, b], [-b, a]]) + (tx, ty)
        return ((mapped - dst) ** 2).sum()

    best = (m[0, 0], m[1, 0], m[0, 2], m[1, 2])
    assert np.isclose(m[0, 0], m[1, 1]) and np.isclose(m[0, 1], -m[1, 0])
    for k in range(4):
        for step in (1e-4, -1e-4):
            moved = list(best)
            moved[k] += step
            assert error(*moved) > error(*best)


def test_alignment_puts_the_landmarks_on_the_template(tmp_path):
    """Warping a picture with dots at the landmarks puts the dots on ArcFace's template points."""
    image = np.zeros((160, 170, 3), dtype=np.uint8)
    forward = similarity(1.2, 0.25, (20.0, 15.0))
    marks = ARCFACE_TEMPLATE @ forward[:2, :2].T + forward[:2, 2]
    for x, y in marks:
        cv2.circle(image, (int(round(x)), int(round(y))), 2, (255, 255, 255), -1)
    aligned = align_face(image, marks.astype(np.float32))
    for x, y in ARCFACE_TEMPLATE:
        assert aligned[int(round(y)), int(round(x))].min() > 100


def test_pooling_and_scores_match_the_protocol_written_as_loops():
    rng = np.random.default_rng(3)
    feats = rng.standard_normal((len(FACES), 6)).astype(np.float32)
    templates = np.array([t for _, t, _ in FACES])
    medias = np.array([m for _, _, m in FACES])
    ids, pooled = template_features(feats, templates, medias)
    assert ids.tolist() == sorted(set(templates.tolist()))
    for row, template in zip(pooled, ids):
        total = sum(feats[(templates == template) & (medias == m)].astype(np.float64).mean(axis=0)
                    for m in sorted(set(medias[templates == template].tolist())))
        np.testing.assert_allclose(row, total / np.linalg.norm(total), rtol=1e-12)
    pairs = np.array([[3, 8], [55, 3], [40, 40]])
    scores = pair_scores(ids, pooled, pairs)
    lookup = dict(zip(ids.tolist(), pooled))
    np.testing.assert_allclose(scores, [lookup[a] @ lookup[b] for a, b in pairs], rtol=1e-12)


def test_tar_at_far_reads_the_nearest_roc_point():
    labels = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    scores = np.array([0.9, 0.8, 0.3, 0.1, 0.85, 0.2, 0.15, 0.12, 0.05, 0.04, 0.03, 0.02, 0.01, 0.0])
    table, _, _, area = tar_at_far(labels, scores, fars=(1e-6, 0.1, 0.4))
    # by hand, 4 positives and 10 negatives: accepting >= 0.9 gives FAR 0, TAR 1/4; >= 0.3 FAR 1/10 (0.85), TAR 3/4;
    # >= 0.1 FAR 4/10, TAR 4/4. At a FAR several points share, the largest TAR is read (the peer's choice).
    assert table == {1e-6: 0.25, 0.1: 0.75, 0.4: 1.0}
    assert 0 < area < 1


def test_meta_files_that_disagree_are_named(tmp_path):
    root = write_ijb(str(tmp_path / "ijb"))
    points = os.path.join(root, "meta", "ijbc_name_5pts_score.txt")
    lines = open(points).read().splitlines()
    lines[2] = lines[2].replace("3.png", "x.png")
    open(points, "w").write("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"ijbc_name_5pts_score.txt' line 3 names 'x.png' where .* names '3.png'"):
        read_ijb(root, "IJBC")
    lines[2] = "3.png 1 2 3"
    open(points, "w").write("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 3: expected 'image x1 y1 ... x5 y5 score' \(12 fields\), got 4"):
        read_ijb(root, "IJBC")


def test_mtl_eval_ijb_on_converted_weights_prints_a_table_or_json(tmp_path, capsys):
    """``mtl eval WEIGHTS.pdparams --ijb ROOT``: converted weights evaluate directly (their backbone config is written
    beside them); four protocol variants, TAR at the six FARs; --json prints the record it also writes."""
    root = write_ijb(str(tmp_path / "ijb"))
    model = randomized({"type": "mobilefacenet", "input_size": 32, "embedding_size": 16})
    state, storages = torch_layout(insightface_names(model))
    write_torch_file(str(tmp_path / "m.pth"), state, storages)
    weights = str(tmp_path / "m.pdparams")
    mtl_main(["convert", "insightface", str(tmp_path / "m.pth"), weights, "--arch", "mobilefacenet"])
    capsys.readouterr()
    mtl_main(["eval", weights, "--ijb", root, "--out", str(tmp_path / "out")])
    table = capsys.readouterr().out
    assert "| IJBC (TAR %)" in table and "FAR=1e-06" in table and "| no flip + detector score" in table
    mtl_main(["eval", weights, "--ijb", root, "--out", str(tmp_path / "out"), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.load(open(tmp_path / "out" / "ijb_ijbc.json"))
    assert list(printed["variants"]) == ["flip + detector score", "flip", "no flip + detector score", "no flip"]
    assert list(printed["variants"]["flip"]["tar_at_far"]) == ["1e-06", "1e-05", "1e-04", "1e-03", "1e-02", "1e-01"]
    with pytest.raises(SystemExit):
        mtl_main(["eval", weights])
    assert "mtl eval needs --sets FILE ... (verification sets) or --ijb ROOT" in capsys.readouterr().err


def converted_peer_model(folder, capsys):
    """The peer's mbf that eval_ijbc.py ran (its weights regenerated from the backbone fixture), written as a torch.save
    archive without torch and converted by ``mtl convert insightface``: the weights file."""
    path, weights = str(folder / "mbf.pth"), str(folder / "mbf.pdparams")
    tensors = peers.network_tensors(peers.load("insightface_backbones.npz"), peers.IJB_NETWORK)
    write_torch_file(path, *torch_layout(tensors))
    mtl_main(["convert", "insightface", path, weights, "--arch", peers.NETWORKS[peers.IJB_NETWORK][0]])
    capsys.readouterr()
    return weights


def test_alignment_and_features_equal_insightfaces_eval_ijbc(tmp_path, capsys):
    """insightface's eval_ijbc.py run as a script on the set of tests/references/ijb_set.py with its own
    MobileFaceNet (random weights; tests/fixtures/insightface_eval_ijbc.npz, made under torch) against ``mtl eval
    MODEL.pdparams --ijb`` on the same set with that model converted: every aligned face identical (its
    Embedding.get: similarity transform, warp, colour order), the flip-test features within 1e-4 (relative)."""
    fixture = peers.load("insightface_eval_ijbc.npz")
    root = write_ijb(str(tmp_path / "ijb"))
    assert set_digest(root) == str(fixture["set_digest"]), "the set written here is not the one the peer read"
    ijb = read_ijb(root, "IJBC")
    np.testing.assert_array_equal(ijb.scores, fixture["faceness_scores"])
    aligned = np.stack([align_face(cv2.imread(os.path.join(root, "loose_crop", n)), m)
                        for n, m in zip(ijb.images, ijb.landmarks)]).transpose(0, 3, 1, 2)
    diff = np.abs(aligned.astype(int) - fixture["aligned"].astype(int))
    print(f"aligned faces: {np.mean(diff > 0):.2e} of the values differ, by at most {diff.max()}")
    assert diff.max() == 0  # the same transform to the last bit (float32, as skimage computes it), the same warp
    from mtl.commands.evaluate import evaluate_ijb

    ours = evaluate_ijb(converted_peer_model(tmp_path, capsys), root, "IJBC", batch_size=3,
                        out_dir=str(tmp_path / "out"), console=print)
    reference = fixture["img_feats"]
    relative = np.abs(np.concatenate(ours["features"], axis=1) - reference).max() / np.abs(reference).max()
    print(f"features: largest difference {relative:.2e} of the largest value")
    assert relative < 1e-4
    report = json.load(open(tmp_path / "out" / "ijb_ijbc.json"))
    assert report["pairs"] == 28 and report["templates"] == 8 and report["faces"] == len(FACES)
    assert os.path.getsize(tmp_path / "out" / "roc_ijbc.png") > 0


def test_protocol_on_the_same_features_equals_insightfaces_eval_ijbc(tmp_path):
    """eval_ijbc.py's pooling, scores, ROC and TAR table on its own features (the fixture: run once per variant,
    flip test on/off x detector-score weighting on/off) against ours on those features: scores within 1e-6, the
    same ROC points, the same TAR at every FAR and the same AUC."""
    fixture = peers.load("insightface_eval_ijbc.npz")
    ijb = read_ijb(write_ijb(str(tmp_path / "ijb")), "IJBC")
    feats = fixture["img_feats"]
    compare_variants(evaluate_variants(ijb, feats[:, :512], feats[:, 512:]), fixture)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_committed_ijb_fixture_is_what_insightfaces_eval_ijbc_gives_now(tmp_path):
    """The live check: the fixture maker run again under ``$MTL_TORCH_PYTHON`` writes the committed fixture."""
    if peers.torch_python() is None:
        pytest.skip(peers.LIVE_SKIP_REASON)
    fresh = peers.load("insightface_eval_ijbc.npz", peers.make_live(["ijb"], tmp_path))
    peers.assert_same_fixture(fresh, peers.load("insightface_eval_ijbc.npz"))
def compare_variants(ours, peer):
    """Each protocol variant: scores within 1e-6, the same ROC points, the same TAR at each FAR and AUC."""
    names = {"11": "flip + detector score", "10": "flip", "01": "no flip + detector score", "00": "no flip"}
    for key, name in names.items():
        got = ours[name]
        largest = np.abs(got["scores"] - peer[f"{key}_score"]).max()
        print(f"{name}: scores within {largest:.1e}, TAR at FAR 1e-6..1e-1 {list(got['tar'].values())}")
        assert largest < 1e-6, name
        np.testing.assert_allclose(got["fpr"], peer[f"{key}_fpr"], atol=1e-12, err_msg=name)
        np.testing.assert_allclose(got["tpr"], peer[f"{key}_tpr"], atol=1e-12, err_msg=name)
        np.testing.assert_allclose(list(got["tar"].values()), peer[f"{key}_tar"], atol=1e-12, err_msg=name)
        assert abs(got["auc"] - float(peer[f"{key}_auc"])) < 1e-12, name
