"""``mtl overlap RUN_DIR``: which identities of one task's classifier are likely the same people as another's.

The problem of the motivating case: face datasets whose identities may overlap, each with its own head. After
training, every identity of a class-label head (arcface, cosface, softmax:
:class:`mtl.headkit.sharded.ShardedClassHead`)
gets a *template*: the mean of the unit embeddings of (up to ``--images-per-class``) of its training images,
augmentation off, L2-normalised. For each pair of tasks (A, B), ``S = T_A T_B^T`` holds the cosines of every template
of A with every template of B; a pair (a, b) is *mutual nearest neighbours* when b = argmax_j S[a, j] and
a = argmax_i S[i, b].

The decision is calibrated on the run itself: mutual nearest neighbours whose cosine reaches what two halves of one
person's own images reach. Every training identity with two images or more is split into its even- and odd-numbered
images; the cosine of the two half-templates is a same-person similarity measured inside its own head. The threshold
is the 5th percentile of those cosines over every identity of every head (``--percentile``). Two people who are
merely the least different ones of two datasets are mutual nearest neighbours too (their true match is absent), but
they fall well below it (measured figures: docs/faces.md).

``--threshold T`` replaces the calibration by a fixed cosine; ``--centres`` compares the heads' class centres (their
weights, averaged when the run averaged) instead of templates: it needs no data but has no calibration (default
threshold 0.5; centres of different people are pushed apart inside a head, not across heads, so unrelated people
of two datasets reach 0.5-0.7). ``--sets`` also flags images of each task's open-set evaluation split and of its
verification sets whose embedding is as close to a training identity (of any task) as that identity's own training
images: cosine with its template (or centre) above the 5th percentile of the training images' cosine with their own.
Such images are possible train/test identity leakage.

Every person is shown and written as the data labels them: the dataset's own label and its name (``23 (emp168)``, as
``mtl data inspect`` lists them), never the head's class id, which ``holdout_classes`` renumbers. ``--json`` writes
``{task_a, name_a, label_a, task_b, name_b, label_b, similarity}`` per pair: the same-person file that
``cross_negatives: {mask: pairs}`` and ``mtl data merge`` read (:mod:`mtl.data.same_person`).
"""
import json
import os

import numpy as np

from mtl.core.arrays import unit_rows
from mtl.core.errors import ConfigError
from mtl.data.same_person import People, written
from mtl.evaluation.identities import (  # noqa: F401 (re-exported)
    CENTRES_THRESHOLD,
    IMAGES_PER_CLASS,
    PERCENTILE,
    calibrated_threshold,
    chosen_images,
    embed_samples,
    match_classes,
    templates,
)


def load_run(run_dir: str, trust_plugins: bool = False):
    """``(job, run weights)`` of a finished run: the job rebuilt from ``job.json`` (its readers give the training
    images), its backbone and architecture with the averaged weights when the checkpoint has them (else the live
    ones). Refused when the architecture embeds each task in coordinates of its own (``Architecture.one_embedding``
    false: towers, experts, stitch columns)."""
    from mtl.serving.inference import open_run
    from mtl.train.job import build_job

    run = open_run(run_dir, trust_plugins=trust_plugins)
    job = build_job(run.job_config(), announce_plan=False)
    if not job.model.architecture.one_embedding:  # each task's centres live in its own embedding: nothing to compare
        raise ConfigError(f"'{run_dir}': mtl overlap compares the tasks' class centres in one shared embedding, but "
                          f"the run's architecture '{job.model.architecture.registered_name}' gives each task its own "
                          f"(task BatchNorms and adapters without towers share one)")
    run.load_into(job.backbone)  # task BatchNorms and adapters are layers of the backbone
    run.load_architecture_into(job.model.architecture)
    return job, run


def class_label_tasks(job):
    """The tasks whose head classifies identities (class centres sharded by class); two are needed."""
    from mtl.headkit.sharded import ShardedClassHead

    tasks = [t for t in job.tasks if isinstance(t.head, ShardedClassHead)]
    if len(tasks) < 2:
        raise ConfigError(f"the run has {len(tasks)} class-label head(s): an overlap report needs two")
    return tasks


def class_centres(job, run):
    """``{task: [C, D] class centres}`` of every class-label head (its weights, merged from the shards)."""
    return {t.name: run.head_state(t.name)["weight"] for t in class_label_tasks(job)}


def class_templates(job, per_class: int = IMAGES_PER_CLASS, batch_size: int = 256):
    """``({task: templates [C, D]}, {task: half-template cosines [C]})`` of every class-label head's training
    identities (up to ``per_class`` images each, augmentation off)."""
    found, halves = {}, {}
    for task in class_label_tasks(job):
        picked = chosen_images(task.reader.labels(), per_class)
        features, labels = _embed_reader(job, task, task.reader, batch_size, picked)
        found[task.name], halves[task.name] = templates(features, labels, task.head.num_classes)
    return found, halves


def _embed_reader(job, task, reader, batch_size, indices=None):
    """Embeddings [N, D] (numpy) and ``task``'s labels of the samples ``indices`` of ``reader`` (all by default),
    augmentation off, embedded as ``task``'s samples are (through its BatchNorms or adapters, if the architecture
    has them: :meth:`mtl.train.model.Model.embedder`)."""
    names = [f.name for f in job.backbone.input_fields()]
    return embed_samples(job.model.embedder(task.name), names, reader, task.head.label_field, batch_size, indices)


def overlaps(centres, threshold=CENTRES_THRESHOLD, all_mutual=False):
    """Likely-same identities over every pair of tasks: list of ``{task_a, class_a, task_b, class_b, similarity,
    mutual}``."""
    names = list(centres)
    found = []
    for i, task_a in enumerate(names):
        for task_b in names[i + 1:]:
            for match in match_classes(centres[task_a], centres[task_b], threshold, all_mutual):
                found.append({"task_a": task_a, "class_a": match["class_a"], "task_b": task_b,
                              "class_b": match["class_b"], "similarity": match["similarity"],
                              "mutual": match["mutual"]})
    return found


def decide(run_dir, threshold=None, centres=False, percentile=PERCENTILE, per_class=IMAGES_PER_CLASS,
           trust_plugins=False):
    """``(job, centres or templates, matches, decision)`` of a finished run; ``decision`` says how the threshold
    was set: ``{"threshold", "how", ...}``."""
    job, run = load_run(run_dir, trust_plugins)
    if centres:
        bank = class_centres(job, run)
        limit = CENTRES_THRESHOLD if threshold is None else float(threshold)
        decision = {"threshold": limit,
                    "how": f"fixed; class centres ({'averaged' if run.averaged else 'live'} weights)"}
    else:
        bank, halves = class_templates(job, per_class)
        identities = int(sum(np.isfinite(h).sum() for h in halves.values()))
        if threshold is None:
            limit = calibrated_threshold(list(halves.values()), percentile)
            how = (f"calibrated: the {percentile:g}th percentile of the same-person cosines of {identities} training "
                   f"identities (two halves of their images)")
        else:
            limit, how = float(threshold), "fixed"
        decision = {"threshold": limit, "how": how + f"; templates of up to {per_class} training images"}
    decision["checkpoint"] = run.checkpoint
    return job, bank, as_people(job, overlaps(bank, limit)), decision


def as_people(job, found):
    """The matches with each person by name and dataset label (:func:`mtl.data.same_person.written`), never by the
    head's class ids, which ``holdout_classes`` renumbers; ``class_a``/``class_b`` repeat the labels (the key the face
    report compares by), ``mutual`` kept."""
    people = class_people(job)
    out = []
    for m in found:
        entry = written(m["task_a"], people[m["task_a"]], m["class_a"], m["task_b"], people[m["task_b"]],
                        m["class_b"], similarity=m["similarity"], mutual=m["mutual"])
        out.append(dict(entry, class_a=entry["label_a"], class_b=entry["label_b"]))
    return out


def leak_threshold(job, centres, percentile=PERCENTILE, batch_size=256):
    """The cosine above which an evaluation image counts as "as close to a class as its own training images": the
    ``percentile`` of every training image's cosine with its own class's centre or template (augmentation off)."""
    own = []
    for task in job.tasks:
        if task.name in centres:
            features, labels = _embed_reader(job, task, task.reader, batch_size)
            own.append(np.sum(unit_rows(features) * unit_rows(centres[task.name])[labels], axis=1))
    return float(np.percentile(np.concatenate(own), percentile))


def leaks(job, centres, threshold, batch_size=256):
    """Evaluation images (open-set splits and ``eval.sets``) whose embedding has cosine > ``threshold`` with their
    nearest training class of any task: list of ``{set, image, task, class, similarity}``, images checked."""
    from mtl.evaluation.evaluator import Evaluator
    from mtl.evaluation.verify import embed_pairs

    evaluator = Evaluator(job)
    field = job.backbone.input_fields()[0].name
    probes = []
    for task in job.tasks:
        if task.cfg["eval"]["enabled"] and task.cfg["eval"]["split"]:
            reader = evaluator.reader(task)
            if reader.open_set:
                probes.append((f"{task.name}/eval", _embed_reader(job, task, reader, batch_size)[0]))
        for vset in evaluator.sets(task) if task.cfg["eval"]["sets"] else []:
            probes.append((vset.name, np.asarray(embed_pairs(job.model.embedder(task.name), vset, batch_size,
                                                             field))))
    names = list(centres)
    bank = np.concatenate([unit_rows(centres[n]) for n in names])
    owner = np.concatenate([[(n, c) for c in range(len(centres[n]))] for n in names])
    flagged, checked = [], 0
    for name, features in probes:
        checked += len(features)
        sim = unit_rows(features) @ bank.T
        best = np.argmax(sim, axis=1)
        for image in np.flatnonzero(sim[np.arange(len(sim)), best] > threshold):
            task_name, class_id = owner[best[image]]
            flagged.append({"set": name, "image": int(image), "task": str(task_name), "class": int(class_id),
                            "similarity": float(sim[image, best[image]])})
    return flagged, checked


def class_people(job):
    """``{task: People}``: who the classes of each class-label head are, by the dataset's labels and names
    (:meth:`mtl.readers.base.Reader.class_people`)."""
    return {t.name: t.reader.class_people(t.head.label_field) or People.numbered(t.head.num_classes)
            for t in class_label_tasks(job)}


def shown(label, name) -> str:
    """A person as the tables show it, as ``mtl data inspect`` lists them: the dataset's label and the name,
    ``23 (emp168)``, or ``23`` without a name."""
    return f"{label} ({name})" if name is not None else str(label)


JSON_KEYS = ("task_a", "name_a", "label_a", "task_b", "name_b", "label_b", "similarity")  # what --json writes


def report(run_dir, threshold=None, centres=False, sets=False, json_path=None, percentile=PERCENTILE,
           per_class=IMAGES_PER_CLASS, trust_plugins=False):
    """Run the overlap analysis of ``run_dir``; print tables; write ``json_path`` (a list of matches) if given."""
    from tabulate import tabulate

    job, bank, found, decision = decide(run_dir, threshold, centres, percentile, per_class, trust_plugins)
    print(f"{len(found)} likely-same identities (mutual nearest neighbours, cosine >= {decision['threshold']:.3f}, "
          f"{decision['how']}) of {os.path.basename(decision['checkpoint'])}" + (":" if found else ""))
    if found:
        print(tabulate([(m["task_a"], shown(m["label_a"], m["name_a"]), m["task_b"], shown(m["label_b"], m["name_b"]),
                         f"{m['similarity']:.3f}") for m in found],
                       headers=["task_a", "person_a", "task_b", "person_b", "cosine"], tablefmt="github"))
        print("(people as the data labels them: label (name), as mtl data inspect lists them)")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump([{k: m[k] for k in JSON_KEYS} for m in found], f, indent=1, ensure_ascii=False)
        print(f"wrote {json_path}")
    print(next_step(job, run_dir, json_path, found))
    if sets:
        cut = leak_threshold(job, bank)
        flagged, checked = leaks(job, bank, cut)
        print(f"{len(flagged)} of {checked} verification images are as close to a training identity as its own "
              f"training images (cosine > {cut:.3f}, the 5th percentile of theirs)" + (":" if flagged else ""))
        if flagged:
            people = class_people(job)
            print(tabulate([(f["set"], f["image"], f["task"], shown(*people[f["task"]].describe(f["class"])),
                             f"{f['similarity']:.3f}") for f in flagged[:50]],
                           headers=["set", "image", "task", "nearest person", "cosine"], tablefmt="github"))
    return found


def next_step(job, run_dir: str, json_path, found) -> str:
    """The closing lines: the other way (one de-duplicated dataset, ``mtl data merge``, when every task it names
    reads its data from files), then the next command of the two-stage workflow (separate heads, ``mtl overlap
    --json``, then a run whose cross-head negatives are masked with these pairs); or why there is none."""
    import shlex

    if not found:
        return "no likely-same people: the heads can train as they are, with no same-person mask"
    config = job.cfg.get("config_path")
    config = shlex.quote(os.path.relpath(config)) if config and os.path.isfile(config) else "JOB.yaml"
    pairs = shlex.quote(json_path) if json_path else "PAIRS.json"
    readers = {t.name: t.cfg["reader"] for t in job.tasks}
    sources = sorted({m[f"task_{end}"] for m in found for end in "ab"}, key=list(readers).index)
    where = {t: readers[t].get("list") or readers[t].get("path") for t in sources}
    data = " ".join(f"{t}={shlex.quote(os.path.relpath(str(where[t])))}" for t in sources)
    merge = f"or one de-duplicated dataset of them: mtl data merge runs/merged/train {data} --pairs {pairs}\n" \
        if all(where.values()) else ""  # data built in memory (the demo's digits) has no files to merge
    first = "" if json_path else "write them with --json PAIRS.json; then "
    return (f"{merge}next: {first}train the heads masked with these pairs: mtl train {config} --set output_dir="
            f"{shlex.quote(os.path.normpath(run_dir) + '_masked')} cross_negatives.rate=1.0 cross_negatives.mask=pairs "
            f"cross_negatives.pairs={pairs}{first_run_sets(job.cfg)}")


def first_run_sets(cfg) -> str:
    """`` (and the first run's --set of KEY, ...)``: the keys the first run's ``--set`` gave besides ``output_dir``
    (which the next run replaces), to give again; empty when it gave none."""
    keys = [k for k in cfg.get("set_keys") or () if k != "output_dir"]
    if not keys and "set_keys" not in cfg and str(cfg.get("source", "")).endswith("--set)"):  # a run before set_keys
        return " (and the first run's --set options but output_dir)"
    return f" (and the first run's --set of {', '.join(keys)})" if keys else ""
