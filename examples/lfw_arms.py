"""The arms of the LFW report (``examples/lfw_report.py``): the job each trains for one split of LFW's protocol.

Every arm trains with the recipe's backbone, steps, batch (images per step), optimizer and seed
(``examples/configs/lfw_glint.yaml``); they differ in their data and heads:

* ``lfw_alone``: LFW's training people of the split only, one ArcFace head (the whole batch is LFW's).
* ``separate``: one head per dataset, LFW's training people and the outside dataset's classes that are not test
  people of the split (the filter's ``kept`` people file), each its share of the batch (``ratio``).
* ``naive``: one head over every dataset as it is (a ``concat`` reader): a person in two datasets is two classes.
* ``dedup``: a two-stage de-duplication by the tool: the same-person pairs the filter estimated (outside classes
  against LFW's training people, and inside the outside data), then ``mtl data merge`` into one list of
  de-duplicated people, one head over it.
* ``cross``: the recipe: separate heads, each also scoring the other heads' classes as negatives, minus the
  estimated same-person pairs (``cross_negatives: {mask: pairs}``).

Before them, the filter needs a model (``--filter-model``): ``lfw_alone``'s, or ``screen``: ``separate`` on every
outside class, the test people's included. ``screen`` is never scored on LFW and never reaches an arm: it only
decides which outside classes are test people (they are removed) and which are LFW's training people.

The extra datasets of ``--extra CONFIG`` (the six small face datasets) join every arm but ``lfw_alone`` as further
heads of their own.
"""
import copy
import os

import yaml

ARMS = ("lfw_alone", "separate", "naive", "dedup", "cross")
SCREEN = "screen"  # the filter's model when --filter-model screen: separate on unfiltered outside data
LFW, OUTSIDE, MERGED = "lfw", "glint", "merged"


def read_yaml(path):
    """A YAML mapping (the recipe or a task file)."""
    with open(path) as f:
        return yaml.safe_load(f)


def recipe_tasks(recipe_path):
    """``(recipe without tasks, {task name: task dict})``: the task files the recipe names, read as written."""
    recipe = read_yaml(recipe_path)
    folder = os.path.dirname(os.path.abspath(recipe_path))
    tasks = {}
    for entry in recipe.pop("tasks"):
        task = read_yaml(os.path.join(folder, entry)) if isinstance(entry, str) else copy.deepcopy(entry)
        tasks[task["name"]] = task
    return recipe, tasks


def extra_tasks(config_path):
    """The tasks of another job config (``--extra``), their relative reader paths made absolute."""
    if not config_path:
        return []
    _, tasks = recipe_tasks(config_path)
    folder = os.path.dirname(os.path.abspath(config_path))
    out = []
    recipe = read_yaml(config_path)
    for entry, task in zip(recipe["tasks"], tasks.values()):
        task = copy.deepcopy(task)
        base = os.path.dirname(os.path.join(folder, entry)) if isinstance(entry, str) else folder
        for key in ("list", "root", "path"):
            value = task["reader"].get(key)
            if isinstance(value, str) and not os.path.isabs(value):
                task["reader"][key] = os.path.normpath(os.path.join(base, value))
        out.append(task)
    return out


def lfw_task(tasks, split, lfw_images, lfw_dir):
    """The recipe's LFW task reading this split's training people."""
    task = copy.deepcopy(tasks[LFW])
    task["reader"].update({"root": lfw_images, **split.train_people(lfw_dir)})
    return task


def outside_task(tasks, outside_images, kept_people):
    """The recipe's outside task reading the classes the filter kept (a people file of LFW's format; None: every
    class, for the screening model)."""
    task = copy.deepcopy(tasks[OUTSIDE])
    task["reader"]["root"] = outside_images
    if kept_people is not None:
        task["reader"]["people"] = kept_people
    return task


def one_head(tasks, reader):
    """A single task over ``reader`` with the LFW task's head and the whole batch."""
    return {"name": MERGED, "reader": reader, "head": copy.deepcopy(tasks[LFW]["head"]), "ratio": 1.0,
            "loss_weight": 1.0, "eval": None}


def arm_tasks(arm, tasks, lfw, outside, merged_list, extras):
    """The task list of ``arm`` (see the module docstring)."""
    if arm == "lfw_alone":
        return [dict(lfw, ratio=1.0, loss_weight=1.0)]
    if arm in ("separate", "cross", SCREEN):
        return [lfw, outside] + extras
    if arm == "naive":
        readers = [lfw["reader"], outside["reader"]]
        return [one_head(tasks, {"type": "concat", "readers": readers})] + extras
    if arm == "dedup":
        reader = {k: v for k, v in lfw["reader"].items() if k not in ("type", "root", "people", "exclude_sets",
                                                                     "sets", "min_images")}
        reader.update({"type": "image_list", "list": merged_list})
        return [one_head(tasks, reader)] + extras
    raise ValueError(f"unknown arm {arm!r}; the arms: {', '.join(ARMS)}")


def arm_job(arm, recipe, tasks, files, seed, output_dir, steps=None, extras=()):
    """The job config of ``arm`` for one split: ``files`` gives ``split``, ``lfw_dir``, ``lfw_images``,
    ``outside_images``, ``kept`` (people file), ``pairs`` (same-person JSON) and ``merged`` (label list)."""
    job = copy.deepcopy(recipe)
    lfw = lfw_task(tasks, files["split"], files["lfw_images"], files["lfw_dir"])
    outside = outside_task(tasks, files["outside_images"], None if arm == SCREEN else files["kept"])
    job["tasks"] = arm_tasks(arm, tasks, lfw, outside, files.get("merged"), list(copy.deepcopy(extras)))
    job["seed"] = int(seed)
    job["output_dir"] = output_dir
    if arm == "cross":
        job["cross_negatives"] = dict(job.get("cross_negatives") or {}, mask="pairs", pairs=files["pairs"])
    else:
        job.pop("cross_negatives", None)
    if steps is not None:
        job.setdefault("schedule", {})["steps"] = int(steps)
        job["schedule"].pop("epochs", None)
    return job
