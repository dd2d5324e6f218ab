"""MultiMNIST (Sener and Koltun, NeurIPS 2018): single-task baselines, every task-weighting strategy and every
architecture on their LeNet, several seeds; left and right accuracy and Delta_m against single task, with their
Table 3 beside.

    python examples/multimnist_report.py [--config examples/configs/multimnist.yaml] [--configurations NAME,...]
        [--seeds 0 1 2] [--steps N] [--eval-split val|test] [--json FILE] [--out runs/multimnist_report]
        [--set KEY=VALUE ...]

Configurations (``--configurations``, default all): ``single`` (each digit trained alone: the recipe with one task,
its 256 images per step, the same steps), every weighting strategy by name (``static`` is the recipe itself;
``mgda_ub`` is MGDA on the representation, Sener and Koltun's MGDA-UB) and every architecture by name (``mmoe``,
``cgc``, ``ple``, ``cross_stitch``, ``cross_stitch_backbone``, and on the LeNet with BatchNorm ``hard_bn``,
``task_norm``, ``adapters``); ``static_same_rows``, ``mgda_ub_same_rows``, ``adapters_same_rows`` and
``cross_stitch_backbone_same_rows`` are those four with Sener and Koltun's step, both digits' losses on the same
images (``schedule.same_rows``; otherwise each task reads its own images). Each run trains in its
own process; a run whose ``summary.json`` exists is not trained again; a line per run says which of how many and
the time so far and left, and a running run's step every 30 s. Accuracy is the head's on the evaluation split:
``--eval-split val`` (the default) the validation digits held out of the training digits, where settings are chosen;
``--eval-split test`` the MNIST test digits (``t10k-*`` in the task files' ``mnist_dir``, kept back by the project),
each run then training on all 60,000 training digits (``val_size: 0``) as Sener and Koltun do: the one look of
settings chosen on the validation digits. ``--json`` writes ``{"seeds": [...], "configurations": {NAME: {"left":
[per seed], "right": [per seed]}}}`` (accuracy in percent), with the ``config``, the runs' ``steps`` (and the
recipe's ``epochs`` that gave them, or null) and ``eval_split``.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "configs", "multimnist.yaml")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from architecture_variants import MULTIMNIST as ARCHITECTURES  # noqa: E402
from bench_weighting import STRATEGIES  # noqa: E402  (the 20 strategies, as the weighting benchmarks name them)

from mtl.core.errors import DataError  # noqa: E402
from mtl.core.progress import Progress, spread  # noqa: E402

PAPER = {"single task": (97.23, 95.90), "uniform scaling": (96.46, 94.99), "MGDA-UB": (97.26, 95.90)}
TASKS = ("left", "right")


# with Sener and Koltun's step as well: one image, both digits' losses
SAME_ROWS = ("static", "mgda_ub", "adapters", "cross_stitch_backbone")


def configurations():
    """``{name: [overrides]}`` of every configuration but ``single``; ``NAME_same_rows``: configuration NAME with
    both tasks reading the same images in each step (``schedule.same_rows``)."""
    out = {name: [f"weighting={spec}"] for name, spec in STRATEGIES.items()}
    out.update(ARCHITECTURES)
    out.update({f"{name}_same_rows": [*out[name], "schedule.same_rows=true"] for name in SAME_ROWS})
    return out


def split_sets(eval_split, count):
    """The overrides that make ``count`` tasks evaluate on ``eval_split``; ``test`` also trains them on every training
    digit (``val_size: 0``: nothing is left to validate on)."""
    if eval_split == "val":
        return []
    return [s for i in range(count) for s in (f"tasks.{i}.reader.eval_split=test", f"tasks.{i}.reader.val_size=0")]


def runs(name, config, seed, out, sets, eval_split="val"):
    """``[(run folder, overrides, tasks)]`` of configuration ``name`` at ``seed``."""
    base = [*sets, f"seed={seed}", "log.progress=false", "log.plot=false"]
    if name != "single":
        folder = os.path.join(out, f"seed{seed}", name)
        return [(folder, [*base, *configurations()[name], *split_sets(eval_split, len(TASKS)), f"output_dir={folder}"],
                 TASKS)]
    from mtl.config.loading import load_job
    from mtl.train.job import steps_override

    cfg = load_job(config, [*sets, *split_sets(eval_split, len(TASKS))])
    size = cfg["schedule"]["batch_size"] // len(cfg["tasks"])
    pinned = steps_override(cfg)  # a budget in epochs: the steps it gives the joint job, as every digit's alone
    return [(os.path.join(out, f"seed{seed}", f"single_{t['name']}"),
             [*base, f"tasks=[{t['source']}]", f"schedule.batch_size={size}", *split_sets(eval_split, 1), *pinned,
              f"output_dir={os.path.join(out, f'seed{seed}', 'single_' + t['name'])}"], (t["name"],))
            for t in cfg["tasks"]]


def train(config, folder, sets):
    """Train one run in a fresh process; the error text on failure."""
    from mtl.core.runtime import user_environment

    # the user's environment: each run sets its threads from its own loader workers, not from this process's
    env = dict(user_environment(), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), config, "--overwrite", "--set", *sets]
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return None if done.returncode == 0 else f"{' '.join(cmd)}\n{done.stderr[-3000:]}"


def accuracy(folder, task):
    """The task's accuracy (percent) in a finished run's final evaluation."""
    with open(os.path.join(folder, "summary.json")) as f:
        return 100.0 * float(json.load(f)["tasks"][task]["eval"]["accuracy"])


def trained_as(folder):
    """``(steps, evaluation split)`` a finished run was trained with (its ``job.json``)."""
    with open(os.path.join(folder, "job.json")) as f:
        job = json.load(f)
    return job["schedule"]["steps"], job["tasks"][0]["reader"].get("eval_split", "val")


def run_all(args):
    """Train every run of every configuration and seed (a run whose summary exists is read, not trained again), a
    progress line per run (:mod:`mtl.core.progress`); return the report's JSON content."""
    from mtl.config.loading import load_job
    from mtl.train.job import planned_steps

    # the runs' steps: --steps, or those the recipe's epochs make on the training digits of the evaluation split
    cfg = load_job(args.config, [*args.sets, *split_sets(args.eval_split, len(TASKS))])
    steps = planned_steps(cfg)
    result = {"config": os.path.relpath(args.config, ROOT), "steps": steps, "epochs": cfg["schedule"]["epochs"],
              "eval_split": args.eval_split, "seeds": args.seeds, "configurations": {}}
    todo = [(name, seed, *run) for name in args.configurations for seed in args.seeds
            for run in runs(name, args.config, seed, args.out, args.sets, args.eval_split)]
    progress = Progress("train", len(todo))
    for name, seed, folder, sets, tasks in todo:
        cell = result["configurations"].setdefault(name, {t: [] for t in TASKS})
        label, began = f"seed {seed}: {name} {' '.join(tasks)}", time.time()
        read = os.path.isfile(os.path.join(folder, "summary.json"))
        if read:
            label += " (finished before, read)"
            trained = trained_as(folder)
            if trained != (steps, args.eval_split):  # a table of runs of two budgets or two splits would be wrong
                raise DataError(f"{folder} was trained for {trained[0]} steps and evaluated on eval_split "
                                f"{trained[1]}, this report's runs take {steps} steps on {args.eval_split}: remove "
                                f"it or give another --out")
        else:
            with progress.watch(label, folder):
                failure = train(args.config, folder, sets)
            if failure:
                sys.exit("training failed:\n" + failure)
        progress.finished(label, began, read=read)
        for task in tasks:
            cell[task].append(accuracy(folder, task))
    return result


def delta_m(cell, single):
    """Delta_m (%): the mean over tasks of (M_t - M_single,t) / M_single,t x 100 (accuracy: higher is better)."""
    return float(np.mean([(np.mean(cell[t]) - np.mean(single[t])) / np.mean(single[t]) * 100 for t in TASKS]))


def table(result):
    """Mean ± std over seeds (one seed: said) per configuration, Delta_m against single, and Sener and Koltun's
    Table 3."""
    from tabulate import tabulate

    configs = result["configurations"]
    single = configs.get("single")
    rows = []
    for name, cell in configs.items():
        dm = f"{delta_m(cell, single):+.2f}" if single and name != "single" else ""
        rows.append([name, *(spread(cell[t], 2) for t in TASKS), dm])
    rows += [[f"{name} (their Table 3)", f"{left:.2f}", f"{right:.2f}", ""] for name, (left, right) in PAPER.items()]
    return tabulate(rows, headers=["configuration", "left (%)", "right (%)", "Δm vs single (%)"],
                    tablefmt="github", disable_numparse=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--configurations", default=",".join(["single", *configurations()]),
                        help="comma-separated names (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the recipe's budget, 100 epochs)")
    parser.add_argument("--eval-split", choices=("val", "test"), default="val",
                        help="val: the validation digits (choosing); test: the MNIST test digits, training on all "
                             "60,000 training digits (the one look)")
    parser.add_argument("--out", default=None, help="runs folder (default runs/multimnist_report[_test])")
    parser.add_argument("--json", default=None)
    parser.add_argument("--set", dest="sets", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides of every run")
    args = parser.parse_args(argv)
    args.configurations = [c for c in args.configurations.split(",") if c]
    known = ["single", *configurations()]
    unknown = [c for c in args.configurations if c not in known]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if args.out is None:
        args.out = os.path.join("runs", "multimnist_report" + ("_test" if args.eval_split == "test" else ""))
    if args.steps is not None:
        args.sets = [*args.sets, f"schedule.steps={args.steps}"]
    args.config = os.path.abspath(args.config)
    return args


def main(argv=None):
    """Train (or read) every run, print the table, write ``--json``."""
    from mtl.core.console import configure_console

    configure_console()  # Paddle's start-up warnings stay off the console
    args = parse_args(argv)
    result = run_all(args)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    from mtl.cli import run_script

    run_script(main)
