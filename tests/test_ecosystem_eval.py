"""``mtl eval``: a run and its export give the verification numbers a numpy re-computation of the protocol gives."""
import json
import os
import re
import sys

import numpy as np
import paddle
import pytest

from mtl.commands.evaluate import evaluate
from mtl.core.errors import ConfigError
from mtl.data.verification_sets import encode_png, write_bin
from mtl.serving.export import export
from tests import warm_python
from tests.references.folds import stratified_splits
from tests.small_runs import train_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIRS, SIZE = 30, 16


def make_set(path):
    """30 pairs of 16x16 RGB images of 2x2 coloured blocks ("identities"): 'same' pairs are an identity and a
    lightly noised copy, the others two random identities (distinct enough for a few-step backbone to tell apart,
    so that the accuracy is not a degenerate constant); returns pixels, issame."""
    rng = np.random.RandomState(3)

    def identity():
        return np.kron(rng.randint(0, 2, (2, 2, 3)) * 255, np.ones((SIZE // 2, SIZE // 2, 1)))

    pixels, issame = [], []
    for i in range(PAIRS):
        a = identity()
        same = i % 2 == 0
        b = np.clip(a + rng.randint(-20, 21, a.shape), 0, 255) if same else identity()
        pixels += [a.astype(np.uint8), b.astype(np.uint8)]
        issame.append(same)
    write_bin(path, [encode_png(p) for p in pixels], issame)
    return np.stack(pixels), np.array(issame)


def reference(model, pixels, issame, flip, folds=10, splits=None):
    """The protocol in plain numpy: (x/255 - 0.5)/0.5, [flip], normalise, squared L2, 10 folds (``splits``: the
    test indices of each fold; default contiguous tenths, insightface's)."""
    x = ((pixels.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(0, 3, 1, 2)
    emb = model(paddle.to_tensor(np.ascontiguousarray(x))).numpy().astype(np.float64)
    if flip:
        emb = emb + model(paddle.to_tensor(np.ascontiguousarray(x[..., ::-1]))).numpy()
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    dist = ((emb[0::2] - emb[1::2]) ** 2).sum(1)
    thresholds = np.arange(0.0, 4.0, 0.01)
    accs = []
    for test in splits if splits is not None else np.array_split(np.arange(len(dist)), folds):
        train = np.setdiff1d(np.arange(len(dist)), test)
        best = thresholds[int(np.argmax([((dist[train] < t) == issame[train]).mean() for t in thresholds]))]
        accs.append(((dist[test] < best) == issame[test]).mean())
    return float(np.mean(accs)), float(np.std(accs))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    train_run(tmp, averaging=True, channels=3, size=SIZE)
    export(str(tmp / "run"), str(tmp / "export"))
    pixels, issame = make_set(str(tmp / "pairs.bin"))
    return tmp, pixels, issame


def image_keys(pixels):
    """Each pair's key as a .bin set's is: its two PNG images' blake2b digests, sorted (independently computed)."""
    import hashlib

    digests = [hashlib.blake2b(encode_png(p), digest_size=16).hexdigest() for p in pixels]
    return ["\t".join(sorted(digests[2 * i:2 * i + 2])) for i in range(len(pixels) // 2)]


@pytest.mark.parametrize("flip,folds", [(True, "stratified"), (False, "stratified"), (True, "file")])
def test_export_eval_matches_numpy_protocol(trained, flip, folds):
    tmp, pixels, issame = trained
    out = tmp / f"out_export_{flip}_{folds}"
    results = evaluate(str(tmp / "export"), [str(tmp / "pairs.bin")], flip=flip, out_dir=str(out),
                       console=lambda *a: None, fold_order=folds)
    model = paddle.jit.load(str(tmp / "export" / "backbone"))
    model.eval()
    splits = None if folds == "file" else [test for _, test in stratified_splits(issame, image_keys(pixels), 10)]
    accuracy, std = reference(model, pixels, issame, flip, splits=splits)
    assert accuracy > 0.7  # the set is not degenerate for this backbone
    assert results["pairs"]["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert results["pairs"]["std"] == pytest.approx(std, abs=1e-12)
    written = json.load(open(out / "eval_pairs.json"))
    assert written["accuracy"] == results["pairs"]["accuracy"] and written["pairs"] == PAIRS
    assert (out / "roc_pairs.png").stat().st_size > 0


@pytest.mark.subprocess
def test_run_eval_cli_prints_insightface_line_and_agrees_with_export(trained):
    tmp, _, _ = trained
    from_export = evaluate(str(tmp / "export"), [str(tmp / "pairs.bin")], flip=True, out_dir=str(tmp / "o1"),
                           console=lambda *a: None)["pairs"]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", "eval", str(tmp / "run"), "--sets",
                           str(tmp / "pairs.bin"), "--flip", "--weights", "averaged", "--out", str(tmp / "o2")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"^\[pairs\]\[8\]Accuracy-Flip: (\d\.\d{5})\+-(\d\.\d{5})$", proc.stdout, re.M)
    assert match, proc.stdout
    assert float(match.group(1)) == pytest.approx(from_export["accuracy"], abs=5e-6)  # averaged weights, both ways
    assert float(match.group(2)) == pytest.approx(from_export["std"], abs=5e-6)
    assert "| pairs " in proc.stdout and proc.stderr == ""


def test_eval_errors_are_one_sentence(trained, tmp_path):
    tmp, _, _ = trained
    with pytest.raises(ConfigError, match="neither a training run"):
        evaluate(str(tmp_path), [str(tmp / "pairs.bin")])
    with pytest.raises(ConfigError, match="applies to a run"):
        evaluate(str(tmp / "export"), [str(tmp / "pairs.bin")], weights="live")
