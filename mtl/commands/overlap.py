"""``mtl overlap RUN_DIR``: which identities of one task's classifier are likely the same people as another's.

The problem of the motivating case: face datasets whose identities overlap, each with its own head. After training,
every class-label head (arcface, cosface, softmax: :class:`mtl.heads.sharded.ShardedClassHead`) holds one centre per
class, in the shared embedding space. For each pair of tasks (A, B) the cosine similarity of every centre of A with
every centre of B is computed (``S = A_hat B_hat^T``, rows L2-normalised); a pair (a, b) is *mutual nearest
neighbours* when b = argmax_j S[a, j] and a = argmax_i S[i, b]. The decision: mutual nearest neighbours with
``S[a, b] > threshold``.

Default threshold 0.5 (see the README): centres of different people are pushed apart by the margin loss and by
chance two unrelated directions in D = 128 dimensions have cosine ~ N(0, 1/D) (sd 0.09, so the largest of 20 x 20
is about 0.3); the same person seen by two heads gets two centres pointing at the same cluster of embeddings.
Measured on the ORL recipe (people 7-14 in both datasets, seed 0): the shared people score 0.79-0.89; people found in
only one dataset can still be each other's mutual nearest neighbours (their true match is absent) and then scored up
to 0.76, so a stricter T trades recall for precision (see the README's figures).

Class centres come from the averaged weights when the checkpoint has them. ``--embed`` uses instead the mean
embedding of each class's training images (augmentation off). ``--sets`` also flags images of each task's open-set
evaluation split and verification sets whose embedding is as close to a training class (of any task) as that
class's own training images: cosine with the class centre above the 5th percentile of the training images' cosine
with their own centre. Such images are possible train/test identity leakage.
"""
import json
import os

import numpy as np

from mtl.arrays import unit_rows
from mtl.errors import ConfigError

DEFAULT_THRESHOLD = 0.5


def match_classes(centres_a, centres_b, threshold: float = DEFAULT_THRESHOLD, all_mutual: bool = False):
    """Likely-same classes of two ``[C, D]`` centre sets: list of ``{class_a, class_b, similarity, mutual}``.

    Every mutual-nearest-neighbour pair is listed when ``all_mutual``; otherwise only those with similarity above
    ``threshold`` (the decision). Sorted by decreasing similarity.
    """
    sim = unit_rows(centres_a) @ unit_rows(centres_b).T
    best_b = np.argmax(sim, axis=1)
    best_a = np.argmax(sim, axis=0)
    found = []
    for a, b in enumerate(best_b):
        mutual = bool(best_a[b] == a)
        if mutual and (all_mutual or sim[a, b] > threshold):
            found.append({"class_a": int(a), "class_b": int(b), "similarity": float(sim[a, b]), "mutual": mutual})
    return sorted(found, key=lambda m: -m["similarity"])


def load_run(run_dir: str):
    """``(job, checkpoint folder, averaged)`` of a finished run: the job rebuilt from ``job.json``, its backbone
    loaded with the averaged weights when the checkpoint has them (else the live ones)."""
    import paddle

    from mtl import registry
    from mtl.job import build_job
    from mtl.train import checkpoint

    path = os.path.join(run_dir, "job.json")
    if not os.path.isfile(path):
        raise ConfigError(f"'{run_dir}' is not a training run: it has no job.json (train with `mtl train` first)")
    with open(path) as f:
        cfg = json.load(f)
    ckpt = checkpoint.latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"'{run_dir}' has no complete checkpoint (the run did not finish a save)")
    registry.load_all(cfg.get("plugin_folders", []))
    job = build_job(cfg, announce_plan=False)
    averaged = os.path.isfile(os.path.join(ckpt, "backbone.averaged.pdparams"))
    weights = "backbone.averaged.pdparams" if averaged else "backbone.pdparams"
    job.backbone.set_state_dict(paddle.load(os.path.join(ckpt, weights)))
    job.backbone.eval()
    return job, ckpt, averaged


def class_centres(job, ckpt, averaged, embed=False, batch_size=256):
    """``{task: [C, D] centres}`` of every class-label head: head weights, or mean training embeddings (``embed``)."""
    from mtl.heads.sharded import ShardedClassHead
    from mtl.train import checkpoint

    centres = {}
    for task in job.tasks:
        if not isinstance(task.head, ShardedClassHead):
            continue
        if embed:
            features, labels = _embed_reader(job, task.reader, task.head.label_field, batch_size)
            sums = np.zeros((task.head.num_classes, features.shape[1]))
            np.add.at(sums, labels, unit_rows(features))
            centres[task.name] = sums
        else:
            centres[task.name] = checkpoint.merged_head_state(ckpt, task.name, averaged=averaged)["weight"]
    if len(centres) < 2:
        raise ConfigError(f"the run has {len(centres)} class-label head(s): an overlap report needs two")
    return centres


def _embed_reader(job, reader, label_field, batch_size):
    """Embeddings [N, D] (numpy) and labels of every sample of ``reader``, augmentation off."""
    from mtl.evaluation.evaluator import embed

    reader.set_augmentation(False)
    features, rest = embed(job.backbone, reader, batch_size)
    return features.numpy(), np.asarray(rest[label_field]).reshape(-1).astype(np.int64)


def overlaps(centres, threshold=DEFAULT_THRESHOLD, all_mutual=False):
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


def leak_threshold(job, centres, percentile=5.0, batch_size=256):
    """The cosine above which an evaluation image counts as "as close to a class as its own training images": the
    ``percentile`` of every training image's cosine with its own class centre (augmentation off)."""
    own = []
    for task in job.tasks:
        if task.name in centres:
            features, labels = _embed_reader(job, task.reader, task.head.label_field, batch_size)
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
                probes.append((f"{task.name}/eval", _embed_reader(job, reader, task.head.label_field, batch_size)[0]))
        for vset in evaluator.sets(task) if task.cfg["eval"]["sets"] else []:
            probes.append((vset.name, np.asarray(embed_pairs(job.backbone, vset, batch_size, field))))
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


def report(run_dir, threshold=DEFAULT_THRESHOLD, embed=False, sets=False, json_path=None):
    """Run the overlap analysis of ``run_dir``; print tables; write ``json_path`` (a list of matches) if given."""
    from tabulate import tabulate

    job, ckpt, averaged = load_run(run_dir)
    centres = class_centres(job, ckpt, averaged, embed=embed)
    found = overlaps(centres, threshold)
    source = "mean training embeddings" if embed else f"class centres ({'averaged' if averaged else 'live'} weights)"
    print(f"{len(found)} likely-same identities (mutual nearest neighbours, cosine > {threshold:g}) from {source} "
          f"of {os.path.basename(ckpt)}:")
    rows = [(m["task_a"], m["class_a"], m["task_b"], m["class_b"], f"{m['similarity']:.3f}", "yes")
            for m in found]
    print(tabulate(rows, headers=["task_a", "class_a", "task_b", "class_b", "cosine", "mutual NN"],
                   tablefmt="github"))
    if json_path:
        with open(json_path, "w") as f:
            json.dump([{k: m[k] for k in ("task_a", "class_a", "task_b", "class_b", "similarity")} for m in found], f,
                      indent=1)
        print(f"wrote {json_path}")
    if sets:
        cut = leak_threshold(job, centres)
        flagged, checked = leaks(job, centres, cut)
        print(f"{len(flagged)} of {checked} verification images are as close to a training class as its own "
              f"training images (cosine > {cut:.3f}, the 5th percentile of theirs)" + (":" if flagged else ""))
        if flagged:
            print(tabulate([(f["set"], f["image"], f["task"], f["class"], f"{f['similarity']:.3f}")
                            for f in flagged[:50]], headers=["set", "image", "task", "class", "cosine"],
                           tablefmt="github"))
    return found


def _cmd_overlap(args):
    if not 0.0 <= args.threshold < 1.0:
        raise ConfigError(f"--threshold must be a cosine in [0, 1), got {args.threshold}")
    report(args.run_dir, args.threshold, args.embed, args.sets, args.json)


def add_cli(sub):
    """Register ``mtl overlap RUN_DIR [--threshold T] [--json FILE] [--embed] [--sets]``."""
    p = sub.add_parser("overlap", help="list likely-same identities across the class heads of a finished run")
    p.add_argument("run_dir")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"cosine above which mutual nearest neighbours count as one identity (default "
                        f"{DEFAULT_THRESHOLD})")
    p.add_argument("--json", metavar="FILE", help="write the matches as a JSON list")
    p.add_argument("--embed", action="store_true",
                   help="compare mean embeddings of each class's training images instead of head weights")
    p.add_argument("--sets", action="store_true",
                   help="also flag verification images closer than the threshold to a training class (leakage)")
    p.set_defaults(func=_cmd_overlap)
