"""IJB-B / IJB-C evaluation (``mtl eval ... --ijb ROOT``): reading the layout, the five-point alignment, template
pooling, pair scores and TAR at FAR.

References: plain numpy loops written here (the similarity transform's defining property, the pooling as the
protocol states it); and insightface's own eval_ijbc.py, run as a script under the torch interpreter by
tests/peer_harness.py on a small IJB-format set written here (random faces at landmarks chosen here), both with its
own model (a converted random-weight MobileFaceNet) and with our features.
"""
import json
import os

import cv2
import numpy as np
import pytest

from mtl.cli import main as mtl_main
from mtl.errors import DataError
from mtl.evaluation.ijb import ARCFACE_TEMPLATE, align_face, read_ijb, similarity_transform
from mtl.evaluation.ijb_protocol import pair_scores, tar_at_far, template_features
from tests.peer_util import run_harness

# faces: (subject, template id, media id); 8 templates of 4 subjects, some with several medias and frames
FACES = [(0, 3, 1), (0, 3, 1), (0, 3, 2), (0, 8, 4), (1, 11, 5), (1, 11, 5), (1, 11, 5), (1, 20, 7),
         (2, 21, 8), (2, 21, 9), (2, 40, 10), (3, 41, 11), (3, 41, 12), (3, 41, 12), (3, 55, 13), (3, 55, 14)]


def similarity(scale, angle, shift):
    """3x3 matrix of x -> scale * R(angle) x + shift."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[scale * c, -scale * s, shift[0]], [scale * s, scale * c, shift[1]], [0, 0, 1]])


def write_ijb(root, target="ijbc", seed=0):
    """A small IJB-format set: per face a PNG of noise around a subject's random 'face' texture, placed by a random
    similarity; its landmarks are the template under that similarity plus up to 1.5 px of noise."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "loose_crop"))
    os.makedirs(os.path.join(root, "meta"))
    textures = rng.integers(0, 256, (4, 112, 112, 3), dtype=np.uint8)
    points, faces = [], []
    for i, (subject, template, media) in enumerate(FACES):
        forward = similarity(rng.uniform(0.9, 1.4), rng.uniform(-0.3, 0.3), rng.uniform(10, 30, 2))
        size = (170, 160)  # width, height
        image = cv2.warpAffine(textures[subject], forward[:2], size, borderValue=(40, 90, 160))
        image = np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)
        name = f"{i + 1}.png"
        cv2.imwrite(os.path.join(root, "loose_crop", name), image)
        marks = ARCFACE_TEMPLATE @ forward[:2, :2].T + forward[:2, 2] + rng.uniform(-1.5, 1.5, (5, 2))
        points.append(f"{name} " + " ".join(f"{v:.3f}" for v in marks.ravel()) + f" {rng.uniform(0.5, 1):.4f}")
        faces.append(f"{name} {template} {media}")
    subjects = {t: s for s, t, _ in FACES}
    ids = sorted(subjects)
    pairs = [f"{a} {b} {int(subjects[a] == subjects[b])}" for i, a in enumerate(ids) for b in ids[i + 1:]]
    for name, lines in (("face_tid_mid", faces), ("template_pair_label", pairs), ("name_5pts_score", points)):
        with open(os.path.join(root, "meta", f"{target}_{name}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return root


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
    from tests.references.torch_format import insightface_names, randomized, torch_layout, write_torch_file

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
    assert "needs either --sets FILE ... (verification sets) or --ijb ROOT" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.subprocess
def test_ijb_evaluation_equals_insightface_eval_ijbc(tmp_path, capsys):
    """On one small IJB-format set: insightface's eval_ijbc.py (its alignment, flip test, model forward, pooling,
    scores and TAR table) against ``mtl eval MODEL.pdparams --ijb``: aligned faces identical, features
    within 1e-4 (relative; the model converted from the peer's .pth), and, on the same features, scores within 1e-6
    and the same ROC and TAR at every FAR for each variant."""
    root = write_ijb(str(tmp_path / "ijb"))
    run_harness("backbone", "mbf", tmp_path / "model", "--batch", 1)
    pth, weights = str(tmp_path / "model" / "model.pth"), str(tmp_path / "mbf.pdparams")
    run_harness("ijb", root, tmp_path / "peer_model.npz", "--model", pth, "--network", "mbf", "--batch-size", 5)
    mtl_main(["convert", "insightface", pth, weights, "--arch", "mobilefacenet"])
    from mtl.commands.evaluate import evaluate_ijb

    ours = evaluate_ijb(weights, root, "IJBC", batch_size=3, out_dir=str(tmp_path / "out"), console=print)
    plain, flipped = ours["features"]
    peer = np.load(tmp_path / "peer_model.npz")
    ijb = read_ijb(root, "IJBC")
    aligned = np.stack([align_face(cv2.imread(os.path.join(root, "loose_crop", n)), m)
                        for n, m in zip(ijb.images, ijb.landmarks)]).transpose(0, 3, 1, 2)
    diff = np.abs(aligned.astype(int) - peer["aligned"][:, 0].astype(int))
    print(f"aligned faces: {np.mean(diff > 0):.2e} of the values differ, by at most {diff.max()}")
    assert diff.max() == 0  # the same transform to the last bit (float32, as skimage computes it), the same warp
    np.testing.assert_array_equal(peer["aligned"][:, 1], peer["aligned"][:, 0][..., ::-1])
    reference = peer["img_feats"]
    relative = np.abs(np.concatenate([plain, flipped], axis=1) - reference).max() / np.abs(reference).max()
    print(f"features: largest difference {relative:.2e} of the largest value")
    assert relative < 1e-4
    np.savez(tmp_path / "ours.npz", plain=plain, flipped=flipped, scores=ijb.scores)
    run_harness("ijb", root, tmp_path / "peer_features.npz", "--features", tmp_path / "ours.npz")
    compare_variants(ours["variants"], np.load(tmp_path / "peer_features.npz"))
    report = json.load(open(tmp_path / "out" / "ijb_ijbc.json"))
    assert report["pairs"] == 28 and report["templates"] == 8 and report["faces"] == len(FACES)
    assert os.path.getsize(tmp_path / "out" / "roc_ijbc.png") > 0


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
