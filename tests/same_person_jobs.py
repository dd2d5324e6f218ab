"""The two-team job of the same-person tests (tests/test_user_reports_names.py, tests/test_issue53_followups.py):
teamA's people (held-out ones among them) and teamB's, named by their folders, with the pairs that are one person
and the head ids a renumbering done by hand gives."""
import json
import os

import numpy as np

# teamA's list labels its people 0..4 in this order and holds out ann and cid (by name); teamB holds nobody out
PEOPLE = {"teamA": ["ann", "bob", "cid", "dan", "eve"], "teamB": ["amy", "eve", "dan"]}
HELD = {"teamA": ["ann", "cid"], "teamB": []}
SAME = [("bob", "amy"), ("dan", "dan"), ("eve", "eve")]  # (person of teamA, person of teamB)


def head_ids_by_hand(task):
    """{name: head class}: the data's labels of the people kept, in label order, numbered 0.. (holdout_classes)."""
    kept = [label for label, name in enumerate(PEOPLE[task]) if name not in HELD[task]]
    return {PEOPLE[task][label]: cls for cls, label in enumerate(kept)}


def named_job(tmp_path, pairs_path=None, out="run"):
    """A job of two image-list tasks whose people are named by their folders, teamA with people held out; with
    ``pairs_path``, cross-head negatives masked by it. The loaded config."""
    from mtl.config.loading import load_job
    from tests.newcomer_runs import write_images

    tasks = []
    for task, people in PEOPLE.items():
        folder = tmp_path / task
        if not folder.exists():
            rels = write_images(str(folder), count=2 * len(people), people=people)
            (folder / "list.txt").write_text("".join(f"{r}\t{people.index(r.split('/')[0])}\n" for r in rels))
        reader = {"type": "image_list", "list": str(folder / "list.txt"), "image_size": 8}
        if HELD[task]:
            reader["holdout_classes"] = HELD[task]
        tasks.append({"name": task, "reader": reader, "head": {"type": "arcface", "scale": 8.0}, "eval": None})
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / out), "tasks": tasks,
           "backbone": {"type": "mlp", "input_shape": [3, 8, 8], "hidden": [], "embedding_size": 8},
           "schedule": {"batch_size": 4, "steps": 2}, "log": {"progress": False, "plot": False},
           "data": {"num_workers": 0}}
    if pairs_path:
        job["cross_negatives"] = {"rate": 1.0, "mask": "pairs", "pairs": pairs_path}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    return load_job(str(tmp_path / "job.yaml"))


def pairs_by(key_a, key_b):
    label = {task: {name: i for i, name in enumerate(people)} for task, people in PEOPLE.items()}
    value = {"name": lambda task, name: name, "label": lambda task, name: label[task][name],
             "class": lambda task, name: name}  # class_x given a name (a string)
    return [{"task_a": "teamA", f"{key_a}_a": value[key_a]("teamA", a), "task_b": "teamB",
             f"{key_b}_b": value[key_b]("teamB", b)} for a, b in SAME]


def finished_run(tmp_path):
    """A finished run of :func:`_named_job` written by hand: teamB's class centres copy teamA's of the same person
    (by the hand renumbering), plus noise; the others point elsewhere."""
    import paddle

    from mtl.train.job import build_job

    cfg = named_job(tmp_path, out="finished")
    job = build_job(cfg, announce_plan=False)
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    rng = np.random.default_rng(0)
    centres = {"teamA": rng.standard_normal((len(a), 8)), "teamB": rng.standard_normal((len(b), 8))}
    for x, y in SAME:
        centres["teamB"][b[y]] = centres["teamA"][a[x]] + 0.05 * rng.standard_normal(8)
    ckpt = tmp_path / "finished" / "checkpoints" / "step_1"
    os.makedirs(ckpt / "heads")
    (tmp_path / "finished" / "job.json").write_text(json.dumps(cfg, default=str))
    (ckpt / "state.json").write_text(json.dumps({"step": 1}))
    paddle.save(job.backbone.state_dict(), str(ckpt / "backbone.pdparams"))
    for task, weight in centres.items():
        paddle.save({"weight": paddle.to_tensor(weight.astype(np.float32))},
                    str(ckpt / "heads" / f"{task}.shard0of1.pdparams"))
    return str(tmp_path / "finished")
