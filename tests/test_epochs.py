"""``schedule.epochs``: a job's length said in passes over a task's training split, resolved into steps when the job
is built; the layer rule that makes a variant or ``--set`` giving steps or epochs replace the other."""
import json
import math

import pytest
import yaml

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.data.scheduler import JointSchedule, SampleSchedule, steps_for_epochs


def task(name, samples, ratio=1.0):
    """A synthetic regression task of ``samples`` training samples."""
    return {"name": name, "ratio": ratio, "eval": None, "head": {"type": "regression"},
            "reader": {"type": "synthetic", "target": "regression", "num_samples": samples}}


def job(tmp_path, schedule, tasks=None, **extra):
    return {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"), "backbone": {"type": "mlp"},
            "tasks": tasks or [task("a", 30, 1.0), task("b", 50, 3.0)], "schedule": schedule,
            "log": {"progress": False, "plot": False}, "data": {"num_workers": 0},
            **{"optimizer": {"lr": 0.001}, **extra}}


@pytest.mark.parametrize("epochs, size, ratios, batch", [(3, 30, (1, 3), 8), (2.5, 50, (1, 3), 8), (1, 7, (2, 1), 9),
                                                        (100, 50_000, (1, 1), 512)])
def test_the_steps_are_the_fewest_whose_samples_make_the_epochs(epochs, size, ratios, batch):
    """Joint mode: after the resolved steps the task's read cursor (the schedule's own ``consumed``, which places
    every read) has passed ``epochs`` times its training samples, and one step fewer has not."""
    schedule = JointSchedule(["a", "b"], ratios, batch)
    steps = steps_for_epochs(schedule, epochs, "a", size)
    assert schedule.consumed("a", steps) >= epochs * size > schedule.consumed("a", steps - 1)


def test_sample_mode_counts_the_expected_rows_of_the_task():
    """Sample mode: one task a step, drawn with probability p: steps = ceil(E N / (p B)); the realised draws of a
    long run reach the epochs within a few per cent."""
    schedule = SampleSchedule(["a", "b"], [0.25, 0.75], 16, seed=3)
    steps = steps_for_epochs(schedule, 40, "a", 100)
    assert steps == math.ceil(40 * 100 / (0.25 * 16)) == 1000
    assert schedule.consumed("a", steps) / (40 * 100) == pytest.approx(1.0, abs=0.1)


def test_a_job_given_epochs_trains_the_steps_they_make(tmp_path):
    """The job resolves the steps from the first task's training split (or ``epochs_of``), trains them, and its
    ``job.json`` records them beside the epochs; the announcement says how they were counted."""
    from mtl.train.job import build_job, planned_steps
    from mtl.train.trainer import Trainer

    cfg = load_job(data=job(tmp_path, {"batch_size": 8, "epochs": 1.5}))  # sub-batches 2 and 6
    assert cfg["schedule"]["steps"] is None
    assert planned_steps(cfg) == math.ceil(1.5 * 30 / 2) == 23
    printed = []
    built = build_job(cfg, announce_plan=False)
    assert cfg["schedule"]["steps"] == 23
    summary = Trainer(built, console=printed.append).run()
    assert summary["steps"] == 23
    recorded = json.load(open(tmp_path / "run" / "job.json"))["schedule"]
    assert (recorded["steps"], recorded["epochs"]) == (23, 1.5)
    other = load_job(data=job(tmp_path, {"batch_size": 8, "epochs": 1.5, "epochs_of": "b"}))
    assert planned_steps(other) == math.ceil(1.5 * 50 / 6) == 13


def test_a_variant_or_set_giving_one_of_steps_and_epochs_replaces_the_other(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(job(tmp_path, {"batch_size": 8, "steps": 5})))
    variant = tmp_path / "variant.yaml"
    variant.write_text(yaml.safe_dump({"base": "base.yaml", "schedule": {"epochs": 2}}))
    assert (load_job(str(base))["schedule"]["steps"], load_job(str(base))["schedule"]["epochs"]) == (5, None)
    schedule = load_job(str(variant))["schedule"]
    assert (schedule["steps"], schedule["epochs"], schedule["batch_size"]) == (None, 2.0, 8)
    schedule = load_job(str(variant), ["schedule.steps=7"])["schedule"]
    assert (schedule["steps"], schedule["epochs"]) == (7, None)
    schedule = load_job(str(base), ["schedule.epochs=3"])["schedule"]
    assert (schedule["steps"], schedule["epochs"]) == (None, 3.0)
    schedule = load_job(str(base), ["schedule.steps=null"])["schedule"]
    assert schedule["steps"] == 1000  # neither given: the default
    schedule = load_job(str(base), ["schedule.steps=4", "schedule.epochs=2"])["schedule"]
    assert (schedule["steps"], schedule["epochs"]) == (None, 2.0)  # the later --set wins
    schedule = load_job(str(variant), ["schedule.epochs=2", "schedule.steps=4"])["schedule"]
    assert (schedule["steps"], schedule["epochs"]) == (4, None)


def test_steps_replace_the_task_the_epochs_counted_and_null_replaces_nothing(tmp_path):
    """Found by a review: a recipe in epochs of a named task could not be shortened with steps (its epochs_of
    stayed behind and was refused), and a null replaced the other key (the job fell back to 1000 steps)."""
    counted = tmp_path / "counted.yaml"
    counted.write_text(yaml.safe_dump(job(tmp_path, {"batch_size": 8, "epochs": 2, "epochs_of": "b"})))
    stepped = tmp_path / "stepped.yaml"
    stepped.write_text(yaml.safe_dump(job(tmp_path, {"batch_size": 8, "steps": 5})))
    schedule = load_job(str(counted), ["schedule.steps=20"])["schedule"]
    assert (schedule["steps"], schedule["epochs"], schedule["epochs_of"]) == (20, None, None)
    variant = tmp_path / "short.yaml"
    variant.write_text(yaml.safe_dump({"base": "counted.yaml", "schedule": {"steps": 20}}))
    assert load_job(str(variant))["schedule"]["steps"] == 20
    schedule = load_job(str(counted), ["schedule.steps=null"])["schedule"]
    assert (schedule["steps"], schedule["epochs"], schedule["epochs_of"]) == (None, 2.0, "b")
    schedule = load_job(str(stepped), ["schedule.epochs=null"])["schedule"]
    assert (schedule["steps"], schedule["epochs"]) == (5, None)
    variant.write_text(yaml.safe_dump({"base": "counted.yaml", "schedule": {"steps": None}}))
    assert load_job(str(variant))["schedule"]["epochs"] == 2.0
    one_layer = tmp_path / "one_layer.yaml"  # a layer's own epochs_of is not replaced by its own steps
    one_layer.write_text(yaml.safe_dump({"base": "counted.yaml", "schedule": {"steps": 20, "epochs_of": "a"}}))
    with pytest.raises(ConfigError) as info:
        load_job(str(one_layer))
    assert info.value.key == "schedule.epochs_of" and "gives no epochs" in str(info.value)


def test_the_runs_a_report_derives_take_the_joint_jobs_steps(tmp_path):
    """Each task alone (a report's ``tasks=[...]`` and its sub-batch) would count the epochs over its own split;
    :func:`mtl.train.job.steps_override` pins the joint job's steps, which a later --set may give over the epochs."""
    from mtl.train.job import planned_steps, steps_override

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(tmp_path, {"batch_size": 8, "epochs": 2})))
    cfg = load_job(str(path))
    joint = planned_steps(cfg)
    assert steps_override(cfg) == [f"schedule.steps={joint}"] and joint == math.ceil(2 * 30 / 2)
    alone_b = [f"tasks=[{yaml.safe_dump(task('b', 50), default_flow_style=True).strip()}]", "schedule.batch_size=6"]
    assert planned_steps(load_job(str(path), alone_b)) == math.ceil(2 * 50 / 6) != joint
    assert planned_steps(load_job(str(path), [*alone_b, *steps_override(cfg)])) == joint
    assert steps_override(load_job(str(path), ["schedule.steps=9"])) == []


@pytest.mark.parametrize("schedule, sets, key, words", [
    ({"batch_size": 8, "steps": 5, "epochs": 2}, [], "schedule.epochs",
     "steps (5) and epochs (2) both say how long the job trains: give one of them"),
    ({"batch_size": 8, "epochs": 2, "epochs_of": "c"}, [], "schedule.epochs_of",
     "the job has no task 'c' (its tasks: a, b)"),
    ({"batch_size": 8, "steps": 5, "epochs_of": "a"}, [], "schedule.epochs_of", "but the job gives no epochs"),
    ({"batch_size": 8, "epochs": 0}, [], "schedule.epochs", "must be > 0.0"),
])
def test_a_budget_that_cannot_be_read_is_refused_at_load_naming_the_key(tmp_path, schedule, sets, key, words):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(tmp_path, schedule)))
    with pytest.raises(ConfigError) as info:
        load_job(str(path), sets)
    assert info.value.key == key and words in str(info.value), str(info.value)


def test_milestones_are_checked_again_against_the_steps_the_epochs_make(tmp_path):
    """Fractions of a budget in epochs are fine at load time; built, 0.3 and 0.4 of 3 steps are both step 1."""
    from mtl.train.job import build_job

    data = job(tmp_path, {"batch_size": 8, "epochs": 0.2}, optimizer={"decay": "multistep", "milestones": [0.3, 0.4],
                                                                                "lr": 0.001})
    cfg = load_job(data=data)
    with pytest.raises(ConfigError) as info:
        build_job(cfg, announce_plan=False)
    assert info.value.key == "optimizer.milestones" and "give steps [1, 1] of 3" in str(info.value)


def test_single_task_baselines_take_the_steps_the_epochs_give_the_joint_job(tmp_path):
    """``mtl baseline`` of a job in epochs: every task alone trains the joint job's steps with its sub-batch (the
    samples it reads in the joint job), not epochs over its own split."""
    from mtl.studies.comparison import baseline_jobs

    cfg = load_job(data=job(tmp_path, {"batch_size": 8, "epochs": 2}))
    jobs = baseline_jobs(cfg)
    steps = math.ceil(2 * 30 / 2)
    assert [j["schedule"]["steps"] for j, _ in jobs] == [steps, steps, steps]
    assert [j["schedule"]["epochs"] for j, _ in jobs] == [2.0, None, None]
    assert [j["schedule"]["batch_size"] for j, _ in jobs] == [8, 2, 6]
    assert cfg["schedule"]["steps"] is None  # the loaded config is not changed


def test_a_resume_whose_steps_moved_says_so(tmp_path):
    """A run in epochs resumed after its training split changed size trains other steps: the learning-rate schedule
    and the averaging then follow the new count. The checkpoint records its run's steps; the resume says both."""
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    data = job(tmp_path, {"batch_size": 8, "epochs": 1.0})  # ceil(30 / 2) = 15 steps
    assert Trainer(build_job(load_job(data=data), announce_plan=False), console=lambda *a: None).run()["steps"] == 15
    state = json.load(open(tmp_path / "run" / "checkpoints" / "step_15" / "state.json"))
    assert state["total_steps"] == 15
    data["tasks"][0]["reader"]["num_samples"] = 40  # ceil(40 / 2) = 20 steps
    printed = []
    summary = Trainer(build_job(load_job(data=data), announce_plan=False), resume=True, console=printed.append).run()
    assert summary["steps"] == 20
    said = [p for p in printed if "was to train" in p]
    assert said == ["--resume: the checkpoint's run was to train 15 steps, this job trains 20 (schedule.epochs 1 "
                    "make 20 steps now: a training split changed size); the learning-rate schedule and the averaging "
                    "follow 20 from here"], printed
