"""The real-face recipe's report: pixel baselines, the joint model and each dataset alone, on the same open-set pairs.

For every seed it trains ``examples/configs/faces_orl.yaml`` (two ORL datasets, one backbone) and, derived from it,
each dataset alone (same backbone, the task's per-step sub-batch, same steps, optimizer and seed), then reads the
open-set verification accuracy (people 21-30, never trained on; averaged weights) from each run's ``summary.json``.
The baselines embed the same evaluation images as raw pixels and as mean-centred pixels (centred by the mean image of
the training people 1-20, or, transductively, of the evaluated people themselves) and use the same pairs and
10-fold protocol. It also runs the identity-overlap report on each joint run (people 7-14 are in both datasets) and
prints precision and recall. Usage:

    python examples/faces_orl_report.py [--seeds 0 1 2] [--steps N] [--out runs/faces_orl_report] [--json FILE]
        [--set KEY=VALUE ...] [--task-set KEY=VALUE ...] [--config VARIANT.yaml]
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "configs", "faces_orl.yaml")
sys.path.insert(0, ROOT)


def load_cfg(overrides=(), config=CONFIG):
    """The validated recipe config (with ``--set`` style overrides)."""
    from mtl.config.loading import load_job

    return load_job(config, list(overrides))


def task_readers(cfg, split):
    """``{task: reader}`` of the recipe's tasks for ``split`` (augmentation is off for 'eval')."""
    from mtl.job import build_reader

    size = cfg["backbone"]["input_size"]
    return {t["name"]: build_reader(t, {"split": split}, {"image_size": size, "channels": 3}) for t in cfg["tasks"]}


def pixel_baselines(cfg):
    """Open-set verification of raw and mean-centred pixels on the recipe's pairs: ``{name: accuracy}``."""
    from mtl.evaluation.pairs import open_set_verification

    eval_reader = next(iter(task_readers(cfg, "eval").values()))
    probe = np.stack([eval_reader[i]["image"].ravel() for i in range(len(eval_reader))]).astype(np.float64)
    train = []
    for reader in task_readers(cfg, "train").values():
        reader.set_augmentation(False)
        train.extend(reader[i]["image"].ravel() for i in range(len(reader)))
    train_mean = np.mean(train, axis=0)
    labels, cap = eval_reader.labels(), eval_reader.max_positive_pairs
    return {
        "raw pixels (0..255)": open_set_verification((probe + 1.0) * 127.5, labels, cap)["verification_accuracy"],
        "pixels - mean of training people": open_set_verification(probe - train_mean, labels,
                                                                  cap)["verification_accuracy"],
        "pixels - mean of evaluated people (transductive)": open_set_verification(
            probe - probe.mean(axis=0), labels, cap)["verification_accuracy"],
    }


def train(out_dir, seed, steps, tasks=None, batch_size=None, overrides=(), config=CONFIG, task_sets=()):
    """Train the recipe (or a single-task job derived from it) in a fresh process; return its summary.

    ``task_sets``: ``tasks.N.KEY=VALUE`` overrides of the run's own tasks (:func:`task_overrides`), applied last."""
    sets = [*overrides, f"seed={seed}", f"output_dir={out_dir}", "log.progress=false", "log.plot=false"]
    if steps:
        sets.append(f"schedule.steps={steps}")
    if tasks:
        sets += [f"tasks=[{', '.join(tasks)}]", f"schedule.batch_size={batch_size}"]
    sets += list(task_sets)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), config, "--overwrite", "--set", *sets]
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"training failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    with open(os.path.join(out_dir, "summary.json")) as f:
        return json.load(f)


def task_overrides(task_sets, count):
    """``tasks.N.KEY=VALUE`` for every task N < count and every ``KEY=VALUE`` of ``task_sets``."""
    return [f"tasks.{n}.{item}" for n in range(count) for item in task_sets]


def verification_of(summary):
    """Open-set verification accuracy of a run: averaged weights when present, of its first task."""
    task = next(iter(summary["tasks"].values()))
    return task.get("eval_averaged", task["eval"])["verification_accuracy"]


def overlap_scores(run_dir, cfg, threshold):
    """Precision and recall of ``mtl overlap``'s decision against the known shared people of the recipe."""
    from mtl.commands import overlap

    readers = task_readers(cfg, "train")
    person = {name: r.class_labels for name, r in readers.items()}  # class id -> data label (person - 1)
    job, ckpt, averaged = overlap.load_run(run_dir)
    found = overlap.overlaps(overlap.class_centres(job, ckpt, averaged), threshold)
    truth = len(np.intersect1d(*person.values()))
    correct = sum(person[m["task_a"]][m["class_a"]] == person[m["task_b"]][m["class_b"]] for m in found)
    return {"found": len(found), "correct": int(correct), "shared": int(truth),
            "precision": correct / len(found) if found else 0.0, "recall": correct / truth if truth else 0.0}


def run_seed(args, cfg, seed, rows):
    """Train the joint run and each dataset alone for ``seed``, add their figures to ``rows``; return the joint
    run's overlap scores."""
    from mtl.commands.overlap import DEFAULT_THRESHOLD

    print(f"seed {seed}: joint", flush=True)
    joint_dir = os.path.join(args.out, f"joint_seed{seed}")
    joint = train(joint_dir, seed, args.steps, overrides=args.set, config=args.config,
                  task_sets=task_overrides(args.task_set, len(cfg["tasks"])))
    rows.setdefault("joint (both datasets)", []).append(verification_of(joint))
    per_task = cfg["schedule"]["batch_size"] // len(cfg["tasks"])
    for task in cfg["tasks"]:
        print(f"seed {seed}: {task['name']} alone", flush=True)
        run = train(os.path.join(args.out, f"{task['name']}_seed{seed}"), seed, args.steps,
                    [os.path.relpath(task["source"], os.path.dirname(args.config))], per_task, args.set,
                    args.config, task_overrides(args.task_set, 1))
        rows.setdefault(f"{task['name']} alone", []).append(verification_of(run))
    return overlap_scores(joint_dir, cfg, DEFAULT_THRESHOLD)


def main(argv=None):
    """Run the report and print the table (and write ``--json``)."""
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--out", default=os.path.join("runs", "faces_orl_report"))
    parser.add_argument("--json", default=None, help="write the figures as JSON")
    parser.add_argument("--config", default=CONFIG, help="a variant of the recipe (default: faces_orl.yaml)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides applied to every run (joint and single), as train_joint's --set")
    parser.add_argument("--task-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of every task of every run, relative to the task (head.scale=24, "
                             "reader.augment.erase=0.5)")
    args = parser.parse_args(argv)
    cfg = load_cfg(args.set + task_overrides(args.task_set, len(load_cfg(args.set, args.config)["tasks"])),
                   args.config)
    rows = {name: [value] * len(args.seeds) for name, value in pixel_baselines(cfg).items()}
    overlap_rows = [run_seed(args, cfg, seed, rows) for seed in args.seeds]
    single = np.mean([np.mean(v) for k, v in rows.items() if k.endswith(" alone")])
    table = [(name, f"{np.mean(v):.4f}", f"{np.std(v):.4f}", " ".join(f"{x:.4f}" for x in v))
             for name, v in rows.items()]
    print(f"\nOpen-set verification on ORL people 21-30 (never trained on), "
          f"{len(args.seeds)} seed(s), same pairs, 10-fold protocol:")
    print(tabulate(table, headers=["method", "mean", "std", "per seed"], tablefmt="github"))
    joint = float(np.mean(rows["joint (both datasets)"]))
    print(f"joint - mean of single datasets: {joint - float(single):+.4f}")
    print(tabulate([(s, o["found"], o["correct"], o["shared"], f"{o['precision']:.3f}", f"{o['recall']:.3f}")
                    for s, o in zip(args.seeds, overlap_rows)],
                   headers=["seed", "overlap pairs found", "correct", "shared people", "precision", "recall"],
                   tablefmt="github"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seeds": args.seeds, "verification": rows, "overlap": overlap_rows}, f, indent=1)


if __name__ == "__main__":
    from mtl.errors import MtlError

    try:
        main()
    except MtlError as exc:  # a bad --set / --task-set / --config: one line, before any training
        sys.exit(f"error: {exc}")
