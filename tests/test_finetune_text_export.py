"""Issue 54 item 6: a fine-tuned joint model (MiniLM-shaped random BERT; UPOS, dependencies, NER, genre) exports,
and ``mtl predict`` tags a raw sentence from the export as it does from the run folder: UPOS, head and relation,
entities and genre, printed as CoNLL-U. The export keeps a second program (``text_encoder``: the sequence and the
pooled vector) for the word and tree heads; the run folder's dygraph encoder is the reference."""
import os

import pytest

from tests.minilm_shaped import write_checkpoint
from tests.shared_runs import train_here

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "dist_scripts", "text_minilm_job.yaml")
SENTENCES = ["The cat sat on the mat in New York.", "John Smith works for Google!"]


def predicted(capsys, *argv):
    from mtl.cli import main

    capsys.readouterr()
    assert main(["predict", *map(str, argv)]) in (0, None)
    return capsys.readouterr().out


def test_the_export_tags_a_raw_sentence_as_the_run_does(tmp_path, capsys):
    from mtl.cli import main

    run, export = tmp_path / "run", tmp_path / "export"
    train_here(JOB, "--set", f"output_dir={run}", f"backbone.pretrained={write_checkpoint(str(tmp_path / 'ck'))}",
               "schedule.steps=3")
    assert main(["export", str(run), str(export)]) in (0, None)
    assert (export / "text_encoder.json").is_file() and (export / "tokenizer.json").is_file()
    text = tmp_path / "new.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    from_run, from_export = predicted(capsys, run, text), predicted(capsys, export, text)
    assert from_export == from_run
    blocks = [b for b in from_export.strip().split("\n\n")]
    assert len(blocks) == 2
    for block, sentence in zip(blocks, SENTENCES):
        comments = [line for line in block.splitlines() if line.startswith("#")]
        rows = [line.split("\t") for line in block.splitlines() if not line.startswith("#")]
        assert f"# text = {sentence}" in comments and any(c.startswith("# genre = ") for c in comments)
        assert all(len(r) == 10 for r in rows) and [int(r[0]) for r in rows] == list(range(1, len(rows) + 1))
        assert "".join(r[1] for r in rows) == sentence.replace(" ", "")
        for r in rows:
            assert r[3] != "_" and 0 <= int(r[6]) <= len(rows) and r[7] != "_" and "ner=" in r[9], r
        assert sum(int(r[6]) == 0 for r in rows) == 1  # one root
