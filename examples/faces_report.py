"""Open-set face verification report of a multi-dataset recipe: joint, each dataset alone, one merged head, and the
classic baselines, on the held-out people of every dataset.

    python examples/faces_report.py [--config examples/configs/faces_six.yaml] [--seeds 0 1 2] [--json FILE]
        [--out runs/faces_report] [--jobs 2] [--steps N] [--set KEY=VALUE ...] [--task-set KEY=VALUE ...]
        [--only joint alone merged] [--no-baselines]

The identity tasks of the config are those whose evaluation split is open-set (``holdout_classes``: people no head
trains on). For every seed it trains, each in its own process:

* **joint**: the config as it is (every task, one backbone);
* **alone**: each identity task by itself, derived from the config: same backbone, the task's per-step sub-batch of
  the joint job, same steps, optimizer and seed;
* **merged**: the identity tasks replaced by one task whose ``concat`` reader merges their training people into one
  label space (the de-duplicated alternative: it assumes no person is in two datasets), one head with the first
  identity task's head settings, the identity tasks' summed sub-batch; other tasks kept.

Every run is scored the same way: its backbone (averaged weights when the run averaged) embeds each identity task's
held-out people; verification on all their positive pairs (up to the reader's ``max_positive_pairs``) and as many
negative pairs, 10 folds. "all" verifies the held-out people of every dataset together (cross-dataset negatives).
Baselines on the same pairs, fitted on the dataset's own training people (augmentation off, the task's own
preprocessing): raw pixels, PCA (95 % of the variance) and Fisherfaces (PCA + LDA). ``--json`` writes
``{"seeds", "datasets": {TASK: {"joint", "alone", "merged": [per seed], "pixels", "pca", "fisherfaces"}},
"all": {"joint", "merged"}}``. A variant config (other lists, other held-out people) runs with ``--config``.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")
sys.path.insert(0, ROOT)
KINDS = ("joint", "alone", "merged")


def task_overrides(task_sets, count):
    """``tasks.N.KEY=VALUE`` for every task N < count and every ``KEY=VALUE`` of ``task_sets``."""
    return [f"tasks.{n}.{item}" for n in range(count) for item in task_sets]


def load_cfg(config, sets=(), task_sets=()):
    """The validated config with the job overrides ``sets`` and ``task_sets`` applied to every task."""
    from mtl.config.loading import load_job

    count = len(load_job(config, list(sets))["tasks"])
    return load_job(config, list(sets) + task_overrides(task_sets, count))


class Recipe:
    """What the report derives from the config: identity tasks, their readers, sub-batches, the merged task."""

    def __init__(self, cfg):
        from mtl import registry
        from mtl.commands.compare import sub_batches
        from mtl.job import build_reader, reader_context

        self.cfg = cfg
        from mtl.backbones.base import constructor_config

        backbone_cfg = constructor_config(registry.as_component(cfg["backbone"]))
        context = reader_context(registry.build("backbone", backbone_cfg, cfg["source"], "backbone"))
        self.eval_readers, self.train_readers = {}, {}
        for task in cfg["tasks"]:
            if not (task["eval"]["enabled"] and task["eval"]["split"]):
                continue
            reader = build_reader(task, dict(task["eval"]["reader"]), context)
            if reader.open_set:
                self.eval_readers[task["name"]] = reader
                self.train_readers[task["name"]] = build_reader(task, None, context)
                self.train_readers[task["name"]].set_augmentation(False)
        if not self.eval_readers:
            raise SystemExit(f"error: {cfg['source']}: no task has held-out people (reader holdout_classes and an "
                             "evaluation split): nothing to verify")
        self.identity = [t for t in cfg["tasks"] if t["name"] in self.eval_readers]
        self.sub_batch = sub_batches(cfg)

    def merged_task(self) -> dict:
        """The merged identity task as a task mapping (reader paths already absolute)."""
        first = self.identity[0]
        return {"name": "merged", "reader": {"type": "concat", "readers": [t["reader"] for t in self.identity]},
                "head": first["head"], "ratio": float(sum(t["ratio"] for t in self.identity)),
                "eval": {"split": False}}

    def runs(self, kinds, task_sets=()):
        """``[(name, overrides)]`` of the runs of one seed (``name``: joint, alone_TASK or merged); ``task_sets`` are
        applied to every task of a run but the merged one (whose file is written with them)."""
        out = []
        if "joint" in kinds:
            out.append(("joint", task_overrides(task_sets, len(self.cfg["tasks"]))))
        if "alone" in kinds:
            out += [(f"alone_{t['name']}", [f"tasks=[{t['source']}]",
                                            f"schedule.batch_size={self.sub_batch[t['name']]}",
                                            *task_overrides(task_sets, 1)]) for t in self.identity]
        if "merged" in kinds:
            others = [t for t in self.cfg["tasks"] if t["name"] not in self.eval_readers]
            size = sum(self.sub_batch[t["name"]] for t in self.cfg["tasks"])
            sets = [f"tasks.{n + 1}.{item}" for n in range(len(others)) for item in task_sets]
            out.append(("merged", [f"tasks=[MERGED{''.join(', ' + t['source'] for t in others)}]",
                                   f"schedule.batch_size={size}", *sets]))
        return out


def train(config, out_dir, seed, sets, threads):
    """Train one run in a fresh process (``--overwrite``); return the command and its stderr tail on failure."""
    sets = [*sets, f"seed={seed}", f"output_dir={out_dir}", "log.progress=false", "log.plot=false"]
    if threads:
        sets.append(f"threads={threads}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), config, "--overwrite", "--set", *sets]
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return None if done.returncode == 0 else f"{' '.join(cmd)}\n{done.stderr[-3000:]}"


def embeddings(run_dir, readers, batch_size=256, embedding_task=None):
    """``{task: (features [N, D], labels)}`` of every reader, embedded by the run's backbone (averaged weights); when
    the run's architecture gives each task its own embedding, each reader's through its task's (``embedding_task``:
    one task for every reader instead, e.g. the merged run's)."""
    from mtl.evaluation.evaluator import embed
    from mtl.export import load_run_backbone

    out = {}
    for name, reader in readers.items():
        backbone = load_run_backbone(run_dir, task=embedding_task or name)[0]
        features, rest = embed(backbone, reader, batch_size)
        out[name] = (features.numpy().astype(np.float64), np.asarray(rest["label"]).reshape(-1))
    return out


def verify(features, labels, cap):
    """Open-set verification accuracy of ``features`` on the pairs of ``labels`` (10 folds)."""
    from mtl.evaluation.pairs import open_set_verification

    return float(open_set_verification(features, labels, cap, seed=0)["verification_accuracy"])


def verify_all(embedded, cap):
    """Verification over the held-out people of every dataset together (labels kept apart per dataset)."""
    features, labels, offset = [], [], 0
    for feats, lab in embedded.values():
        features.append(feats)
        labels.append(lab + offset)
        offset += int(lab.max()) + 1
    return verify(np.concatenate(features), np.concatenate(labels), cap)


def classic_baselines(recipe):
    """``{task: {"pixels", "pca", "fisherfaces": accuracy}}`` on each dataset's held-out people."""
    from mtl.data.steps import iterate_eval
    from mtl.evaluation.baselines import BASELINES

    def images(reader):
        batches = list(iterate_eval(reader, 256))
        return np.concatenate([b["image"] for b in batches]), np.concatenate([b["label"] for b in batches])

    out = {}
    for name, eval_reader in recipe.eval_readers.items():
        train_x, train_y = images(recipe.train_readers[name])
        test_x, test_y = images(eval_reader)
        out[name] = {}
        for kind, cls in BASELINES.items():
            model = cls().fit(train_x, train_y)
            out[name][kind] = verify(model.transform(test_x), test_y.reshape(-1), eval_reader.max_positive_pairs)
    return out


def score(recipe, run_dir, name):
    """``{task: accuracy}`` (and ``"all"`` for joint and merged runs) of one finished run."""
    readers = recipe.eval_readers
    if name.startswith("alone_"):
        readers = {name[len("alone_"):]: readers[name[len("alone_"):]]}
    embedded = embeddings(run_dir, readers, embedding_task="merged" if name == "merged" else None)
    out = {task: verify(f, lab, recipe.eval_readers[task].max_positive_pairs) for task, (f, lab) in embedded.items()}
    if not name.startswith("alone_"):
        out["all"] = verify_all(embedded, max(r.max_positive_pairs for r in recipe.eval_readers.values()))
    return out


def run_all(args, recipe):
    """Train every run of every seed (``args.jobs`` at a time); return ``{seed: {run name: run folder}}``."""
    os.makedirs(args.out, exist_ok=True)
    merged_file = os.path.join(os.path.abspath(args.out), "merged_task.yaml")
    with open(merged_file, "w") as f:
        yaml.safe_dump(recipe.merged_task(), f, sort_keys=False)
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    steps = [] if args.steps is None else [f"schedule.steps={args.steps}"]
    todo = [(seed, name, os.path.join(args.out, f"seed{seed}", name),
             [*args.set, *steps, *(o.replace("MERGED", merged_file) for o in overrides)])
            for seed in args.seeds for name, overrides in recipe.runs(args.only, args.task_set)]

    def one(item):
        seed, name, out_dir, sets = item
        print(f"seed {seed}: {name}", flush=True)
        return train(args.config, out_dir, seed, sets, threads)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        failures = [f for f in pool.map(one, todo) if f]
    if failures:
        sys.exit("training failed:\n" + failures[0])
    return [(seed, name, out_dir) for seed, name, out_dir, _ in todo]


def overlap_of(run_dir, shared_labels):
    """``mtl overlap``'s calibrated decision on a joint run: pairs found and, with ``shared_labels`` (equal data
    labels of two tasks are the same person, as in the ORL overlap case), how many are right, precision and recall."""
    from mtl.commands import overlap

    job, _, found, decision = overlap.decide(run_dir)
    out = {"pairs": len(found), "threshold": round(decision["threshold"], 4)}
    if shared_labels:
        person = {t.name: t.reader.class_labels for t in overlap.class_label_tasks(job)}
        names = list(person)
        truth = sum(len(np.intersect1d(person[a], person[b])) for i, a in enumerate(names) for b in names[i + 1:])
        correct = sum(person[m["task_a"]][m["class_a"]] == person[m["task_b"]][m["class_b"]] for m in found)
        out.update(correct=int(correct), shared=int(truth), precision=float(correct / len(found)) if found else 1.0,
                   recall=float(correct / truth) if truth else 1.0)
    return out


def collect(args, recipe, finished, baselines):
    """The report's JSON content from the finished runs and the baselines."""
    datasets = {task: {kind: [] for kind in args.only} for task in recipe.eval_readers}
    everything = {kind: [] for kind in args.only if kind != "alone"}
    for seed in args.seeds:
        for _, name, out_dir in (f for f in finished if f[0] == seed):
            scores = score(recipe, out_dir, name)
            kind = "alone" if name.startswith("alone_") else name
            for task, value in scores.items():
                (everything[kind] if task == "all" else datasets[task][kind]).append(value)
    for task, values in baselines.items():
        datasets[task].update(values)
    result = {"config": os.path.relpath(args.config, ROOT), "seeds": args.seeds, "datasets": datasets,
              "all": everything}
    if args.overlap or args.shared_labels:
        result["overlap"] = [dict(seed=seed, **overlap_of(out_dir, args.shared_labels))
                             for seed, name, out_dir in finished if name == "joint"]
    return result


def table(result):
    """The report as a GitHub table: mean (std) over seeds per dataset and method, plus the means."""
    from tabulate import tabulate

    def cell(values):
        if isinstance(values, list):
            return f"{np.mean(values):.4f} ± {np.std(values):.4f}" if values else ""
        return f"{values:.4f}"

    datasets = result["datasets"]
    methods = list(next(iter(datasets.values())))
    rows = [[task] + [cell(info[m]) for m in methods] for task, info in datasets.items()]
    means = [float(np.mean([np.mean(info[m]) for info in datasets.values()])) for m in methods]
    rows.append(["mean"] + [f"{v:.4f}" for v in means])
    if result["all"]:
        rows.append(["all together"] + [cell(result["all"].get(m, [])) if m in result["all"] else "" for m in methods])
    text = tabulate(rows, headers=["dataset"] + methods, tablefmt="github", disable_numparse=True)
    if "joint" in methods and "alone" in methods:
        gaps = [np.mean(info["joint"]) - np.mean(info["alone"]) for info in datasets.values()]
        text += (f"\njoint - alone: {np.mean(gaps):+.4f} on average, joint >= alone on "
                 f"{sum(g >= 0 for g in gaps)} of {len(gaps)} datasets")
    return text


def parse_args(argv=None):
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help="the recipe or a variant of it (default: faces_six.yaml)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--out", default=os.path.join("runs", "faces_report"))
    parser.add_argument("--json", default=None, help="write the figures as JSON")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (threads split evenly)")
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS), help="which models to train")
    parser.add_argument("--no-baselines", action="store_true", help="skip pixels, PCA and Fisherfaces")
    parser.add_argument("--overlap", action="store_true",
                        help="run mtl overlap's calibrated decision on every joint run and count the pairs found")
    parser.add_argument("--shared-labels", action="store_true",
                        help="with --overlap: equal data labels of two tasks are the same person (precision, recall)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides of every run (as train_joint's --set)")
    parser.add_argument("--task-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of every task of every run, relative to the task (head.scale=24)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def main(argv=None):
    """Train, score, print the table and write ``--json``."""
    args = parse_args(argv)
    recipe = Recipe(load_cfg(args.config, args.set, args.task_set))
    baselines = {} if args.no_baselines else classic_baselines(recipe)
    finished = run_all(args, recipe) if args.only else []
    result = collect(args, recipe, finished, baselines)
    print(f"\nOpen-set verification on held-out people (seeds {', '.join(map(str, args.seeds))}: mean ± std over "
          "seeds):")
    print(table(result))
    for row in result.get("overlap", []):
        print("mtl overlap on the joint run: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                         for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    from mtl.errors import MtlError

    try:
        main()
    except MtlError as exc:  # a bad --config / --set / --task-set: one line, before any training
        sys.exit(f"error: {exc}")
