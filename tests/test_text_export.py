"""A text run's export keeps its tokenizer, and ``mtl embed`` of text lines gives the pooled vectors of the run's own
encoder on the same pieces (the reference: the run's backbone read back, fed by hand)."""
import filecmp
import os

import numpy as np
import paddle
import pytest

from mtl.serving.export import embed, export
from mtl.serving.inference import open_run
from mtl.text.tokenizer import TextTokenizer
from tests.dist_util import ROOT
from tests.shared_runs import train_here

pytestmark = pytest.mark.slow
JOB = os.path.join(ROOT, "tests", "dist_scripts", "text_job.yaml")


def test_text_export_tokenises_as_training_did(tmp_path):
    run, out = str(tmp_path / "run"), str(tmp_path / "export")
    train_here(JOB, "--set", f"output_dir={run}", "schedule.steps=3")
    meta = export(run, out)
    assert meta["text"] and meta["input_fields"] == ["token_ids", "segment_ids"]
    assert filecmp.cmp(os.path.join(run, "tokenizer.json"), os.path.join(out, "tokenizer.json"), shallow=False)
    texts = tmp_path / "texts.txt"
    lines = ["The cat sat on the mat.", "Unbelievably, jurists nominated two individuals!", "ok"]
    texts.write_text("\n".join(lines) + "\n\n")
    got = embed(out, [str(texts)], batch_size=2)
    backbone = open_run(run).backbone()
    tokenizer = TextTokenizer.from_file(os.path.join(run, "tokenizer.json"))
    for line, vector in zip(lines, got):
        ids = [tokenizer.cls_id, *tokenizer.encode_text(line)[0], tokenizer.sep_id]
        with paddle.no_grad():
            ref = backbone({"token_ids": paddle.to_tensor([ids]), "segment_ids": paddle.zeros([1, len(ids)],
                                                                                                "int64")})
        np.testing.assert_allclose(vector, ref["pooled"].numpy()[0], rtol=1e-5, atol=1e-6)
    assert got.shape == (3, 32)


def test_bert_reading_comprehension_end_to_end(tmp_path):
    """The bert backbone (loaded from the transformers fixture) trains in a joint job with the span head on the
    hand-made SQuAD file and a first-token classifier; evaluation reports SQuAD's EM/F1 as fractions, as every head
    does."""
    import json

    run = str(tmp_path / "run")
    train_here(os.path.join(ROOT, "tests", "dist_scripts", "text_bert_squad.yaml"), "--set", f"output_dir={run}")
    summary = json.load(open(os.path.join(run, "summary.json")))
    squad = summary["tasks"]["squad"]["eval"]
    assert set(squad) == {"exact_match", "f1"} and 0 <= squad["exact_match"] <= squad["f1"] <= 1
    assert summary["tasks"]["genre"]["primary_metric"] == "accuracy"
    meta = export(run, str(tmp_path / "export"))
    assert meta["text"] and meta["feature_size"] == 32
