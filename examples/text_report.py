"""Joint vs alone report of a text recipe (default: the English Web Treebank recipe, examples/configs/text_ewt.yaml).

    python examples/text_report.py [--config CFG] [--seeds 0 1 2] [--json FILE] [--out runs/text_report]
        [--steps N] [--nproc 2] [--set KEY=VALUE ...] [--only joint alone noaux] [--reuse]
    python examples/text_report.py --arms scratch glove minilm_alone minilm [--arm-config ARM=CFG ...] [...]

``--arms``: the pretrained-encoder comparison instead (``examples/text_arms.py``): today's BiLSTM from scratch, the
BiLSTM on GloVe, MiniLM per task alone and MiniLM joint, each from its recipe; the JSON then holds ``"arms"`` (every
arm's score of every main task per seed), ``"tasks"`` and ``"delta_m"`` (MiniLM joint against alone) and
``"seconds"`` (each run's wall time).

For every seed it trains, one run at a time (each in its own process, under ``mtl launch`` when ``--nproc`` > 1; a
line per run says which of how many and the time so far and left, and a running run's step every 30 s):

* **joint**: the config as it is (every task on one encoder);
* **alone**: each main task by itself: the same encoder, steps, optimizer, seed, and the task's per-step sub-batch
  of the joint job;
* **noaux**: the main tasks jointly without the auxiliary ones (heads of type ``masked_lm``), with their summed
  sub-batches: the auxiliary task's effect is joint - noaux.

Each run's score of a task is its head's primary metric on the task's evaluation file (``eval_path`` of its reader:
change that one key to score another split), in percent (``accuracy``, ``las``, ``f1``; a run's own tables and
``summary.json`` hold them as fractions, as every head's metrics). ``--reuse`` keeps a run folder
that already holds a finished run of the same steps (``summary.json``) instead of training it again, and continues
(``--resume``) a run that was stopped before its end. ``--json`` writes
``{"seeds": [...], "tasks": {TASK: {"metric": NAME, "joint": [per seed], "alone": [...], "noaux": [...]}},
"delta_m": [per seed], "seconds": {run: [per seed]}}`` with Δm (Maninis et al., 2019) = the mean over main tasks of
``100 (joint - alone) / alone`` (every metric here is higher-better).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "configs", "text_ewt.yaml")
sys.path.insert(0, ROOT)
from mtl.core.progress import Progress, spread  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_arms import ARMS, arm_configs, arm_runs, arms_table, collect_arms  # noqa: E402

AUXILIARY_HEADS = ("masked_lm",)


def plan(cfg):
    """(main tasks, auxiliary tasks, sub-batch of every task) of a validated config."""
    from mtl.studies.comparison import sub_batches

    auxiliary = [t for t in cfg["tasks"] if t["head"]["type"] in AUXILIARY_HEADS]
    main = [t for t in cfg["tasks"] if t not in auxiliary]
    return main, auxiliary, sub_batches(cfg)


def runs(cfg, kinds, pinned=()):
    """``[(name, overrides)]`` of one seed: joint, alone_TASK, noaux; ``pinned``: the overrides that give the runs
    with other tasks the joint job's steps (:func:`mtl.train.job.steps_override`)."""
    main, auxiliary, sizes = plan(cfg)
    out = [("joint", [])] if "joint" in kinds else []
    if "alone" in kinds:
        out += [(f"alone_{t['name']}", [f"tasks=[{t['source']}]", f"schedule.batch_size={sizes[t['name']]}",
                                        *pinned]) for t in main]
    if "noaux" in kinds and auxiliary:
        out.append(("noaux", [f"tasks=[{', '.join(t['source'] for t in main)}]",
                              f"schedule.batch_size={sum(sizes[t['name']] for t in main)}", *pinned]))
    return out


def train(config, out_dir, seed, sets, nproc, resume=False):
    """One run in fresh processes; (seconds, None) or (seconds, the failure's command and stderr tail)."""
    sets = [*sets, f"seed={seed}", f"output_dir={out_dir}", "log.progress=false", "log.plot=false"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    cut_short = resume and os.path.isdir(os.path.join(out_dir, "checkpoints"))  # stopped before: continue it
    script = [os.path.join(ROOT, "examples", "train_joint.py"), config, "--resume" if cut_short else "--overwrite",
              "--set", *sets]
    cmd = [sys.executable, "-m", "mtl.cli", "launch", "--nproc_per_node", str(nproc), *script] if nproc > 1 \
        else [sys.executable, *script]
    started = time.time()
    done = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    failure = None if done.returncode == 0 else f"{' '.join(cmd)}\n{done.stderr[-3000:]}"
    return time.time() - started, failure


def scores(run_dir):
    """``{task: (metric name, value in percent)}`` of a finished run (its averaged weights' evaluation, else its
    live weights'); a run whose summary holds a value above 1 was trained when text metrics were percentages: it is
    refused, naming the folder (multiplying it again would report 100 times the figure)."""
    path = os.path.join(run_dir, "summary.json")
    with open(path) as f:
        tasks = json.load(f)["tasks"]
    out = {}
    for name, t in tasks.items():
        value = float((t["eval_averaged"] or t["eval"])[t["primary_metric"]])
        if value > 1.0:
            raise SystemExit(f"error: '{path}': task '{name}' has {t['primary_metric']} {value}, a percentage: the run "
                             "was trained before metrics were fractions; train it again (without --reuse)")
        out[name] = (t["primary_metric"], 100.0 * value)
    return out


def collect(cfg, seeds, done):
    """The report's JSON from ``done[seed][run] = run folder``."""
    main, _, _ = plan(cfg)
    report = {"seeds": list(seeds), "tasks": {}, "delta_m": [], "seconds": {}}
    for t in main:
        entry = report["tasks"].setdefault(t["name"], {"metric": None, "joint": [], "alone": [], "noaux": []})
        for seed in seeds:
            for kind, run in (("joint", "joint"), ("alone", f"alone_{t['name']}"), ("noaux", "noaux")):
                if run in done[seed]:
                    metric, value = scores(done[seed][run])[t["name"]]
                    entry["metric"] = metric
                    entry[kind].append(value)
    for i, _ in enumerate(seeds):
        gains = [100.0 * (e["joint"][i] - e["alone"][i]) / e["alone"][i] for e in report["tasks"].values()
                 if len(e["joint"]) > i and len(e["alone"]) > i and e["alone"][i]]
        if gains:
            report["delta_m"].append(float(np.mean(gains)))
    return report


def table(report) -> str:
    """The report as a markdown table of percentages: mean ± standard deviation over seeds (one seed: said, no
    spread); a column that no run filled (e.g. ``--only joint alone``: no run without the auxiliary task) is left
    out."""
    def cell(values, unit=""):
        return spread(values, 2, unit) or "-"

    columns = {"joint": lambda e: e["joint"], "alone": lambda e: e["alone"],
               "joint - alone": lambda e: [a - b for a, b in zip(e["joint"], e["alone"])],
               "without the auxiliary task": lambda e: e["noaux"]}
    shown = [name for name, values in columns.items() if any(values(e) for e in report["tasks"].values())]
    rows = ["| task | metric (%) | " + " | ".join(shown) + " |", "|---|---|" + "---|" * len(shown)]
    for name, e in report["tasks"].items():
        rows.append(f"| {name} | {e['metric']} | " + " | ".join(cell(columns[c](e)) for c in shown) + " |")
    if report["delta_m"]:
        rows.append(f"\nΔm (joint vs alone, mean over the main tasks): {cell(report['delta_m'], ' %')}"
                    + (f" over {len(report['seeds'])} seeds" if len(report["seeds"]) > 1 else ""))
    return "\n".join(rows)


def smoke_note(steps: int, recipe: int) -> str:
    """What a shortened report is: a check that the pipeline runs, whose figures say nothing of the recipe."""
    return (f"These runs trained {steps} of the recipe's {recipe} steps: a smoke run of the pipeline (every run "
            "trains, evaluates and is reported), not results; at so few steps the metrics sit near their starting "
            "values. docs/text.md has the recipe's figures (3 seeds, every step).")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", help="write the report's JSON here")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "text_report"))
    parser.add_argument("--steps", type=int, help="schedule.steps of every run (default: the config's)")
    parser.add_argument("--nproc", type=int, default=1, help="processes per run (mtl launch when > 1)")
    parser.add_argument("--set", nargs="*", default=[], help="overrides of every run (KEY=VALUE)")
    parser.add_argument("--only", nargs="+", default=["joint", "alone", "noaux"], choices=["joint", "alone", "noaux"])
    parser.add_argument("--reuse", action="store_true", help="keep finished runs of the same steps, continue stopped "
                        "ones")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), help="the pretrained-encoder comparison: these arms "
                        "(examples/text_arms.py) instead of --config's joint/alone/noaux")
    parser.add_argument("--arm-config", nargs="*", default=[], help="ARM=CFG: train an arm from another config")
    args = parser.parse_args(argv)
    from mtl.core.console import configure_console

    configure_console()  # Paddle's start-up warnings stay off the console
    from mtl.config.loading import load_job
    from mtl.train.job import planned_steps

    sets = list(args.set) + ([f"schedule.steps={args.steps}"] if args.steps is not None else [])
    if args.arms:
        return report_arms(args, sets)
    cfg = load_job(args.config, sets)
    steps = planned_steps(cfg)  # a config in epochs: every run takes the steps of its joint job
    pinned = [f"schedule.steps={steps}"] if cfg["schedule"]["epochs"] is not None else []
    todo = [(seed, name, args.config, overrides) for seed in args.seeds
            for name, overrides in runs(cfg, args.only, pinned)]
    done, seconds = train_all(args, sets, todo)
    report = collect(cfg, args.seeds, done)
    report["seconds"] = seconds
    print(table(report))
    if args.steps is not None:  # shortened: say what the figures are
        recipe = planned_steps(load_job(args.config, list(args.set)))
        if steps < recipe:
            print(smoke_note(steps, recipe))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


def train_all(args, sets, todo):
    """Train ``todo`` [(seed, run name, config, overrides)] one run at a time (``--reuse``: keep finished runs);
    (``done[seed][name] = run folder``, ``{name: [seconds per seed]}``)."""
    from mtl.config.loading import load_job
    from mtl.studies.comparison import finished
    from mtl.train.job import planned_steps

    done = {seed: {} for seed in args.seeds}
    seconds = {}
    progress = Progress("train", len(todo))
    for seed, name, config, overrides in todo:
        out_dir, began = os.path.join(args.out, f"seed{seed}", name), time.time()
        done[seed][name] = out_dir
        if args.reuse and finished(out_dir, planned_steps(load_job(config, [*sets, *overrides]))):
            progress.finished(f"seed {seed}: {name} (finished before, kept)", began, read=True)
            continue
        with progress.watch(f"seed {seed}: {name}", out_dir):
            took, failure = train(config, out_dir, seed, [*sets, *overrides], args.nproc, args.reuse)
        if failure:
            raise SystemExit(f"error: a run failed:\n{failure}")
        progress.finished(f"seed {seed}: {name}", began)
        seconds.setdefault(name, []).append(round(took, 1))
    return done, seconds


def report_arms(args, sets):
    """``--arms``: train every arm's runs for every seed, print the table, write the JSON (examples/text_arms.py)."""
    from mtl.config.loading import load_job

    configs = arm_configs(args.arm_config)
    todo, main_tasks = [], []
    for arm in args.arms:
        main_tasks += [t["name"] for t in plan(load_job(configs[arm], sets))[0] if t["name"] not in main_tasks]
        todo += [(seed, *run) for seed in args.seeds for run in arm_runs(arm, configs[arm], runs, load_job, sets)]
    done, seconds = train_all(args, sets, todo)
    report = collect_arms(args.arms, args.seeds, done, scores, main_tasks)
    report["seconds"] = seconds
    print(arms_table(report, spread))
    if args.steps is not None:
        print(f"These runs trained {args.steps} steps each: a smoke run of the pipeline, not results.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    from mtl.cli import run_script

    run_script(main)
