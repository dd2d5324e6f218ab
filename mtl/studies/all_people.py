"""``mtl eval RUN_DIR --all-people``: every held-out person of every task of a run scored together
(:mod:`mtl.evaluation.held_out`): 1:1 verification on every pair of their images (10-fold balanced accuracy, TAR at
FAR 1e-2 and 1e-3; people capped at 20 images by weight, :mod:`mtl.evaluation.all_pairs`) and 1:N identification
(rank-1, rank-5 and the CMC curve; gallery: each person's first image, :mod:`mtl.evaluation.identification`).
Writes ``eval_all_people.json``."""
import json
import os

from mtl.core.errors import ConfigError

ALL_PEOPLE_NOTE = ("(accuracy: 10-fold balanced accuracy over every pair of images, people capped at 20 images by "
                   "weight; TAR at FAR: on every pair; rank-k: share of probes whose own person is among the k "
                   "closest of the gallery, which holds each person's first image, the probes being the others)")


def held_out_readers(cfg) -> dict:
    """``{task: evaluation reader}`` of every task of the job config ``cfg`` whose evaluation split holds people
    no head trained on (``holdout_classes``), its samples sized for the job's backbone."""
    from mtl.backbones.base import constructor_config
    from mtl.core import registry
    from mtl.train.job import build_reader, reader_context

    backbone = registry.build("backbone", constructor_config(registry.as_component(cfg["backbone"])),
                              cfg.get("source"), "backbone")
    context = reader_context(backbone)
    readers = {}
    for task in cfg["tasks"]:
        if task["eval"]["enabled"] and task["eval"]["split"]:
            reader = build_reader(task, dict(task["eval"]["reader"]), context)
            if reader.open_set:
                readers[task["name"]] = reader
    return readers


def evaluate_all_people(path, weights="auto", batch_size=256, out_dir=None, console=print,
                        trust_plugins=False) -> dict:
    """Score the run ``path`` on all its tasks' held-out people together; write ``eval_all_people.json`` into
    ``out_dir`` (default the run); return the figures (``accuracy``, ``tar_far_1e-2``, ``tar_far_1e-3``,
    ``identification``: ``rank1``, ``rank5``, ``cmc``, ... and what was pooled)."""
    from mtl.evaluation.held_out import embed_tasks, pool_people, score_all_people
    from mtl.serving.inference import open_run

    if not os.path.isfile(os.path.join(path, "job.json")):
        raise ConfigError(f"'{path}' is not a training run (no job.json): --all-people scores the held-out people of "
                          "a run's tasks, which only a run folder knows", key="--all-people")
    run = open_run(path, None, weights, trust_plugins)
    readers = held_out_readers(run.job_config())
    if not readers:
        raise ConfigError(f"run '{path}' holds out no people: none of its tasks has an evaluation split of people "
                          "it never trained on (reader holdout_classes)", key="--all-people")
    console(f"evaluating {run.description}, step {run.step}, on the held-out people of "
            f"{', '.join(readers)} together")
    pooled = pool_people(embed_tasks(run, readers, batch_size), {t: r.sample_files() for t, r in readers.items()})
    result = score_all_people(pooled.features, pooled.labels)
    result.pop("cross_condition", None)  # no condition sides here (the face report's benchmark has them)
    result.pop("cross_condition_pairs", None)
    result.update(model=run.description, step=run.step, tasks=list(readers), images=int(len(pooled.labels)),
                  people=pooled.people, shared_images=pooled.shared_images)
    out_dir = out_dir or path
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "eval_all_people.json"), "w") as f:
        json.dump(result, f, indent=1)
    if pooled.shared_images:
        console(f"{pooled.shared_images} held-out image(s) are held by more than one task: each counted once, and "
                "the people who share an image are one person")
    console(all_people_table(result))
    console(ALL_PEOPLE_NOTE)
    console(f"results in {os.path.join(out_dir, 'eval_all_people.json')}")
    return result


def all_people_table(result) -> str:
    """One row: images, people, pairs, accuracy, TAR at FAR 1e-2 and 1e-3, probes, rank-1, rank-5."""
    from tabulate import tabulate

    found = result["identification"]
    row = [result["images"], result["people"], result["pairs"], f"{result['accuracy']:.4f}",
           f"{result['tar_far_1e-2']:.4f}", f"{result['tar_far_1e-3']:.4f}", found["probes"],
           f"{found['rank1']:.4f}", f"{found['rank5']:.4f}"]
    return tabulate([row], headers=["images", "people", "pairs", "accuracy", "TAR@FAR1e-2", "TAR@FAR1e-3", "probes",
                                    "rank-1", "rank-5"], tablefmt="github", disable_numparse=True)
