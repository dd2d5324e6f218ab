"""The synthetic benchmark of Ma et al. (KDD 2018, section 4): shared-bottom, one-gate MoE and MMoE on two regression
tasks at several correlations, many runs each; the loss curves' mean and spread (their Figure 4) and the spread of
the final losses over runs (their Figure 5).

    python examples/mmoe_synthetic_report.py [--config examples/configs/mmoe_synthetic.yaml] [--runs 20]
        [--steps N] [--correlations 0.5 0.9 1.0] [--models shared_bottom omoe mmoe] [--out runs/mmoe_synthetic]
        [--json FILE] [--plot FILE]

Run r (0, 1, ..., runs - 1) of a cell draws new data (reader seed r: the task vectors, inputs and noise) and a new
initialisation (job seed r); the three models of one run see the same data. The loss is the mean over the two tasks
of the mean squared error on the evaluation inputs (2000 per run, never trained on), every ``eval.every`` steps.
Runs already in ``OUT/results.jsonl`` are not trained again (an interrupted report continues); a line per run says
which of how many and the time so far and left, and a running run's step every 30 s. ``--json`` writes
``{"steps": [...], "models": {name: architecture}, "parameters": {name: count}, "cells": {"<p>": {model:
{"curves": [[loss per step] per run], "final": [per run]}}}}``.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "configs", "mmoe_synthetic.yaml")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from architecture_variants import SYNTHETIC as MODELS  # noqa: E402

from mtl.core.progress import Progress  # noqa: E402


def overrides(model, correlation, run, steps, out_dir):
    """The ``--set`` list of one run."""
    sets = [f"seed={run}", f"output_dir={out_dir}", f"architecture={json.dumps(MODELS[model])}",
            "log.progress=false"]
    for task in (0, 1):
        sets += [f"tasks.{task}.reader.correlation={correlation}", f"tasks.{task}.reader.seed={run}"]
    return sets + ([f"schedule.steps={steps}"] if steps is not None else [])


def curve(out_dir, tasks):
    """(eval steps, mean over tasks of the MSE at each) of a finished run (its eval.jsonl and final summary)."""
    path, records = os.path.join(out_dir, "eval.jsonl"), []
    if os.path.isfile(path):  # none in a run shorter than eval.every
        with open(path) as f:
            records = [json.loads(line) for line in f]
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    steps = [r["step"] for r in records] + [summary["steps"]]
    values = [[r["eval"][t]["rmse"] ** 2 for t in tasks] for r in records]
    values.append([summary["tasks"][t]["eval"]["rmse"] ** 2 for t in tasks])
    return steps, [float(np.mean(v)) for v in values]


def train_one(config, sets):
    """Train one run in this process; return (its folder, its task names, its parameter count)."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    cfg = load_job(config, sets)
    job = build_job(cfg, announce_plan=False)
    count = sum(int(np.prod(p.shape)) for p in job.model.parameters() if not p.stop_gradient)
    Trainer(job, console=lambda *a: None, overwrite=True).run()
    return cfg["output_dir"], [t.name for t in job.tasks], count


def run_all(args):
    """Train every (correlation, model, run) not yet in ``OUT/results.jsonl``; return every result line."""
    from mtl.config.loading import load_job
    from mtl.core.runtime import select_device

    select_device("cpu")
    for model in args.models:  # every setting checked before anything is written or trained
        load_job(args.config, overrides(model, args.correlations[0], 0, args.steps, os.path.join(args.out, "check")))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.jsonl")
    done = {}
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                item = json.loads(line)
                done[(item["correlation"], item["model"], item["run"])] = item
    todo = [(p, m, r) for p in args.correlations for r in range(args.runs) for m in args.models
            if (p, m, r) not in done]
    progress = Progress("train", len(todo))
    for p, model, run in todo:
        out_dir, began = os.path.join(args.out, f"p{p}", model, f"run{run}"), time.time()
        with progress.watch(f"correlation {p} {model} run {run}", out_dir):
            folder, tasks, count = train_one(args.config, overrides(model, p, run, args.steps, out_dir))
        steps, values = curve(folder, tasks)
        done[(p, model, run)] = item = {"correlation": p, "model": model, "run": run, "steps": steps,
                                        "loss": values, "parameters": count}
        with open(path, "a") as f:
            f.write(json.dumps(item) + "\n")
        progress.finished(f"correlation {p} {model} run {run}: final loss {values[-1]:.4f}", began)
    return [done[(p, m, r)] for p in args.correlations for m in args.models for r in range(args.runs)]


def collect(items, args):
    """The report's JSON content from the result lines."""
    cells = {str(p): {m: {"curves": [], "final": []} for m in args.models} for p in args.correlations}
    for item in items:
        cell = cells[str(item["correlation"])][item["model"]]
        cell["curves"].append(item["loss"])
        cell["final"].append(item["loss"][-1])
    return {"config": os.path.relpath(args.config, ROOT), "runs": args.runs, "steps": items[0]["steps"],
            "models": {m: MODELS[m] for m in args.models},
            "parameters": {m: next(i["parameters"] for i in items if i["model"] == m) for m in args.models},
            "cells": cells}


def table(result):
    """Per correlation and model: final loss mean ± std, median and interquartile range over runs; and the paired
    difference of each model against shared-bottom (same data in every run)."""
    from tabulate import tabulate

    rows = []
    for p, models in result["cells"].items():
        base = np.array(models.get("shared_bottom", {}).get("final", []))
        for model, cell in models.items():
            final = np.array(cell["final"])
            q1, med, q3 = np.percentile(final, [25, 50, 75])
            paired = ""
            if len(base) == len(final) and model != "shared_bottom" and len(base):
                diff = final - base
                paired = (f"{diff.mean():+.4f} ± {diff.std(ddof=1) / np.sqrt(len(diff)):.4f} "
                          f"(lower in {int((diff < 0).sum())}/{len(diff)})")
            rows.append([p, model, len(final), f"{final.mean():.4f} ± {final.std(ddof=1):.4f}", f"{med:.4f}",
                         f"{q3 - q1:.4f}", paired])
    return tabulate(rows, headers=["correlation", "model", "runs", "final loss mean ± std", "median", "IQR",
                                   "minus shared-bottom (mean ± s.e.)"], tablefmt="github", disable_numparse=True)


def plot(result, path):
    """Row 1: mean loss curve per model with the band between the 25th and 75th percentiles over runs (Fig. 4);
    row 2: histograms of the final loss over runs (Fig. 5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    fig, axes = plt.subplots(2, len(cells), figsize=(4.5 * len(cells), 7), squeeze=False)
    steps = result["steps"]
    for col, (p, models) in enumerate(cells.items()):
        finals = np.concatenate([cell["final"] for cell in models.values()])
        bins = np.linspace(finals.min(), np.percentile(finals, 99), 25)
        for model, cell in models.items():
            curves = np.array(cell["curves"])
            line, = axes[0, col].plot(steps, curves.mean(axis=0), label=model)
            low, high = np.percentile(curves, [25, 75], axis=0)
            axes[0, col].fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
            axes[1, col].hist(np.clip(cell["final"], None, bins[-1]), bins=bins, alpha=0.5, label=model)
        axes[0, col].set(title=f"correlation {p}", xlabel="step", ylabel="evaluation loss (mean of both MSEs)",
                         yscale="log")
        axes[1, col].set(xlabel="final evaluation loss", ylabel="runs")
        axes[0, col].legend()
        axes[1, col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--runs", type=int, default=20, help="runs per (correlation, model) cell")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the config's)")
    parser.add_argument("--correlations", type=float, nargs="+", default=[0.5, 0.9, 1.0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--out", default=os.path.join("runs", "mmoe_synthetic"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None, help="write the curves and histograms (PNG)")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2 (the spread needs two runs)")
    return args


def main(argv=None):
    """Train (or read) every run, print the table, write ``--json`` and ``--plot``."""
    from mtl.core.console import configure_console

    configure_console()  # Paddle's start-up warnings stay off the console
    args = parse_args(argv)
    result = collect(run_all(args), args)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    from mtl.cli import run_script

    run_script(main)
