"""Issue 53, items 3-5: the same person, one name.

3. A same-person pairs file (``cross_negatives: {mask: pairs}``) that names a task the job does not have, or a class
   outside a head, is refused in one sentence; the pairs in use are counted on the console and in the rank's log.
"""
import json
import os

import pytest

from mtl.errors import ConfigError
from tests import equivalence

CROSS = ["cross_negatives.rate=1.0", "cross_negatives.mask=pairs"]


def _write(tmp_path, pairs, name="pairs.json"):
    path = tmp_path / name
    path.write_text(json.dumps(pairs))
    return str(path)


# ---- 3. a pairs file that matches nothing ------------------------------------------------------------------------
def test_a_task_name_typed_wrong_is_refused_naming_the_file_the_entry_and_the_tasks(tmp_path):
    from mtl.config.loading import load_job

    path = _write(tmp_path, [{"task_a": "arc7", "class_a": 1, "task_b": "cos5", "class_b": 4},
                             {"task_a": "arc7", "class_a": 2, "task_b": "Cos_5", "class_b": 0}])
    with pytest.raises(ConfigError) as info:
        load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}"])
    text = str(info.value)
    assert info.value.key == "cross_negatives.pairs" and path in text and "entry 1" in text, text
    assert "'Cos_5'" in text and "arc7, arc1, cos5, soft3, reg" in text and "did you mean 'cos5'" in text, text
    assert len(text.splitlines()) == 1


def test_a_task_of_the_job_that_does_not_take_part_is_refused(tmp_path):
    from mtl.config.loading import load_job

    path = _write(tmp_path, [{"task_a": "arc7", "class_a": 1, "task_b": "soft3", "class_b": 0}])
    with pytest.raises(ConfigError, match="entry 0: task_b 'soft3' does not take part in cross-head negatives"):
        load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}"])


@pytest.mark.parametrize("task, cls, classes", [("cos5", 5, 5), ("arc1", 1, 1), ("arc7", 70, 7)])
def test_a_class_outside_its_head_is_refused(tmp_path, task, cls, classes):
    from mtl.config.loading import load_job
    from mtl.job import build_job

    other = "arc7" if task != "arc7" else "cos5"
    path = _write(tmp_path, [{"task_a": other, "class_a": 0, "task_b": task, "class_b": cls}])
    cfg = load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}"])
    with pytest.raises(ConfigError) as info:
        build_job(cfg, announce_plan=False)
    text = str(info.value)
    assert path in text and "entry 0" in text and f"class {cls} of task '{task}'" in text, text
    assert f"[0, {classes})" in text and info.value.key == "cross_negatives.pairs", text


def test_the_pairs_in_use_are_counted_on_the_console_and_in_the_log(tmp_path):
    """Listed twice, or either way round, a pair counts once; a pair of one head's classes is not used here."""
    from mtl.config.loading import load_job
    from mtl.job import build_job
    from mtl.train.trainer import Trainer

    pairs = [{"task_a": "arc7", "class_a": 1, "task_b": "cos5", "class_b": 4},
             {"task_a": "cos5", "class_a": 4, "task_b": "arc7", "class_b": 1},  # the first, the other way round
             {"task_a": "arc7", "class_a": 2, "task_b": "cos5", "class_b": 0},
             {"task_a": "arc1", "class_a": 0, "task_b": "arc7", "class_b": 5},
             {"task_a": "arc7", "class_a": 3, "task_b": "arc7", "class_b": 6}]  # one head's two classes
    path = _write(tmp_path, pairs)
    out = str(tmp_path / "run")
    cfg = load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}", f"output_dir={out}"])
    lines = []
    trainer = Trainer(build_job(cfg, announce_plan=False), console=lines.append)
    trainer.release()
    # the count by hand: distinct unordered pairs of two heads, per two heads in job order (arc7, arc1, cos5)
    distinct = {frozenset([(p["task_a"], p["class_a"]), (p["task_b"], p["class_b"])]) for p in pairs
                if p["task_a"] != p["task_b"]}
    order = ["arc7", "arc1", "cos5"]
    per = {(a, b): sum(1 for d in distinct if {t for t, _ in d} == {a, b}) for i, a in enumerate(order)
           for b in order[i + 1:]}
    assert per == {("arc7", "arc1"): 1, ("arc7", "cos5"): 2, ("arc1", "cos5"): 0}
    expected = (f"cross-head negatives: {len(distinct)} same-person pairs of {path} masked ("
                + ", ".join(f"{a}-{b} {n}" for (a, b), n in per.items()))
    shown = [line for line in lines if line.startswith("cross-head negatives:")]
    assert len(shown) == 1 and shown[0].startswith(expected) and "1 pairs of two classes of one head" in shown[0]
    assert expected in open(os.path.join(out, "logs", "rank0.log")).read()
