"""Fixes found reviewing issue 53's changes, each checked against a hand-written expectation."""
from types import SimpleNamespace

from mtl.studies.overlap import next_step

FOUND = [{"task_a": "a", "task_b": "b"}]


def job(readers, set_keys=None, source="job.yaml"):
    """What next_step reads of a loaded job: its config (set_keys as load_job records them) and its tasks' readers."""
    cfg = {"config_path": None, "source": source}
    if set_keys is not None:
        cfg["set_keys"] = set_keys
    return SimpleNamespace(cfg=cfg, tasks=[SimpleNamespace(name=n, cfg={"reader": r}) for n, r in readers.items()])


def test_mtl_overlap_offers_a_merge_only_of_data_read_from_files():
    """Item 5: the demo's digits are built in memory; a merge command of 'a=DATA b=DATA' cannot run."""
    in_memory = next_step(job({"a": {"type": "digits"}, "b": {"type": "digits"}}), "runs/x", "p.json", FOUND)
    assert "mtl data merge" not in in_memory and in_memory.startswith("next: train the heads masked"), in_memory
    lists = next_step(job({"a": {"list": "data/a.txt"}, "b": {"list": "data/b.txt"}}), "runs/x", "p.json", FOUND)
    assert lists.splitlines()[0] == ("or one de-duplicated dataset of them: mtl data merge runs/merged/train "
                                     "a=data/a.txt b=data/b.txt --pairs p.json"), lists


def test_mtl_overlap_names_the_first_runs_set_keys_to_give_again_but_output_dir():
    """Item 5: the first run's --set gave output_dir too; giving it again would train into the first run's folder."""
    readers = {"a": {"type": "digits"}, "b": {"type": "digits"}}
    said = next_step(job(readers, ["output_dir", "schedule.steps"], "job.yaml (with --set)"), "runs/x", "p.json",
                     FOUND)
    assert said.endswith("cross_negatives.pairs=p.json (and the first run's --set of schedule.steps)"), said
    said = next_step(job(readers, ["output_dir"], "job.yaml (with --set)"), "runs/x", "p.json", FOUND)
    assert said.endswith("cross_negatives.pairs=p.json"), said
    said = next_step(job(readers, None, "job.yaml (with --set)"), "runs/x", "p.json", FOUND)  # a run before set_keys
    assert said.endswith("(and the first run's --set options but output_dir)"), said
