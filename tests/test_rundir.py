"""The run directory: logs cut short by a crash, resume bookkeeping."""
import json

from mtl.store import rundir


def test_a_line_cut_short_by_a_crash_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + json.dumps({"step": 2, "loss": 1.5}) + "\n"
                    + '{"step": 3, "lo')
    assert [r["step"] for r in rundir.read_jsonl(str(path))] == [1, 2]


def test_keep_until_drops_later_records_and_the_final_evaluation(tmp_path):
    records = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}, {"step": 2, "eval/a/acc": 0.5},
               {"step": 3, "loss": 1.0}, {"step": 3, "eval/a/acc": 0.9, "final": True}]
    rundir.write_jsonl(str(tmp_path / "metrics.jsonl"), records)
    rundir.write_jsonl(str(tmp_path / "eval.jsonl"), [{"step": 2, "eval": {}}, {"step": 3, "eval": {}}])
    kept = rundir.keep_until(str(tmp_path), 2)
    assert kept == records[:3]
    assert [r["step"] for r in rundir.read_jsonl(str(tmp_path / "eval.jsonl"))] == [2]
    # resumed exactly at the step where the earlier run ended: its final evaluation goes, its losses stay
    rundir.write_jsonl(str(tmp_path / "metrics.jsonl"), records)
    assert rundir.keep_until(str(tmp_path), 3) == records[:4]
