"""Task weighting on the six-face-dataset benchmark: does any strategy beat static weights, at what cost?

For every strategy and seed the recipe ``examples/configs/faces_six.yaml`` trains jointly (``--steps``, default the
recipe's) with ``weighting: {type: NAME}``, one child process per run (its peak resident memory is its own); each
dataset trained alone (the same backbone, sub-batch, steps and seed; shared by every strategy) gives the reference.
Reported per strategy, mean and spread over the seeds, on the validation people of every dataset (averaged weights):

* the mean open-set verification accuracy over the six datasets, and its difference to ``static``;
* Δm% against each dataset alone: ``(100 / T) sum_t (M_joint,t - M_alone,t) / M_alone,t`` (Maninis et al. 2019);
* the step time (median of the logged throughput) and the peak resident memory relative to ``static``.

A difference to ``static`` counts as a gain or a loss only when it exceeds twice the larger of the two strategies'
seed-to-seed standard deviations; otherwise it is noise. ``--write`` puts the table into docs/weighting.md between
the ``faces-weighting`` markers.

    python bench/bench_weighting_faces.py [--seeds 0 1 2] [--steps 300] [--jobs 2] [--out runs/bench_weighting_faces]
        [--strategies static pcgrad ...] [--write] [--finished-only]

``--finished-only`` trains nothing: it tabulates the strategies whose every seed has finished in ``--out`` (a run
that was stopped can be continued later by the same command without it) and names the others as not measured.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_weighting import STRATEGIES  # noqa: E402

RECIPE = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")
QUIET = ["log.progress=false", "log.plot=false"]
BEGIN, END = "<!-- faces-weighting -->", "<!-- /faces-weighting -->"


def child(args):
    """In a child process: train one run, then print its peak resident memory (MiB) as JSON."""
    from mtl.config.loading import load_job
    from mtl.core.runtime import select_device
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    select_device("cpu")
    sets = [f"weighting={STRATEGIES[args.child]}", f"seed={args.seed}", f"output_dir={args.run}", *QUIET]
    if args.steps:
        sets.append(f"schedule.steps={args.steps}")
    if args.threads:
        sets.append(f"threads={args.threads}")
    Trainer(build_job(load_job(RECIPE, sets)), console=lambda *a: None, overwrite=True).run()
    print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def train(name, seed, out, steps, threads):
    """Train ``name`` for ``seed`` in a child process (reused when its summary exists); its figures."""
    run = os.path.join(out, name, f"seed{seed}")
    result_file = os.path.join(run, "bench.json")
    if not os.path.isfile(result_file):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--seed", str(seed), "--run", run,
               "--steps", str(steps or 0), "--threads", str(threads or 0)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        if done.returncode != 0:
            raise SystemExit(f"{name} seed {seed} failed:\n{done.stderr[-3000:]}")
        peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
        with open(result_file, "w") as f:
            json.dump({"peak_mib": peak}, f)
    return figures(run, json.load(open(result_file))["peak_mib"])


def figures(run, peak):
    """``{"verification": {task: acc}, "samples_per_s", "peak_mib"}`` of a finished run."""
    summary = json.load(open(os.path.join(run, "summary.json")))
    verification = {t: info.get("eval_averaged", info["eval"])["verification_accuracy"]
                    for t, info in summary["tasks"].items()}
    rates = [json.loads(line).get("samples_per_s") for line in open(os.path.join(run, "metrics.jsonl"))]
    rates = [r for r in rates if r]
    return {"verification": verification, "samples_per_s": statistics.median(rates), "peak_mib": peak}


def alone_figures(args):
    """``{seed: {task: acc}}`` of every dataset trained alone (examples/faces_report.py --only alone)."""
    path = os.path.join(args.out, "alone.json")
    if not os.path.isfile(path):
        cmd = [sys.executable, os.path.join(ROOT, "examples", "faces_report.py"), "--only", "alone",
               "--no-baselines", "--seeds", *map(str, args.seeds), "--jobs", str(args.jobs), "--out",
               os.path.join(args.out, "alone"), "--json", path] + (["--steps", str(args.steps)] if args.steps else [])
        subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True)
    datasets = json.load(open(path))["arms"]["alone"]["datasets"]
    return {seed: {t: v[i] for t, v in datasets.items()} for i, seed in enumerate(args.seeds)}


def delta_m(joint, alone):
    """Δm% of one run's per-task accuracies against the alone runs of the same seed (higher is better)."""
    return 100.0 * statistics.mean((joint[t] - alone[t]) / alone[t] for t in alone)


def summarise(runs, alone, seeds):
    """Per strategy: mean/std over seeds of the mean accuracy and of Δm, and the cost ratios to static."""
    static = runs["static"]
    rate0 = statistics.mean(r["samples_per_s"] for r in static)
    peak0 = statistics.mean(r["peak_mib"] for r in static)
    rows = {}
    for name, results in runs.items():
        accuracy = [statistics.mean(r["verification"][t] for t in alone[seeds[0]]) for r in results]
        gains = [delta_m(r["verification"], alone[seed]) for r, seed in zip(results, seeds)]
        rows[name] = {"accuracy": accuracy, "delta_m": gains,
                      "step_time": rate0 / statistics.mean(r["samples_per_s"] for r in results),
                      "memory": statistics.mean(r["peak_mib"] for r in results) / peak0}
    return rows


def std(values):
    """Population standard deviation (0 for one value)."""
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def verdict(row, static):
    """``better``, ``worse`` or ``noise``: the difference of mean accuracies against twice the larger spread."""
    if len(row["accuracy"]) < 2:
        return "n/a (one seed)"
    diff = statistics.mean(row["accuracy"]) - statistics.mean(static["accuracy"])
    margin = 2 * max(std(row["accuracy"]), std(static["accuracy"]))
    return "better" if diff > margin else "worse" if diff < -margin else "noise"


def table(rows):
    """The GitHub table of :func:`summarise`'s rows."""
    from tabulate import tabulate

    static = rows["static"]
    base = statistics.mean(static["accuracy"])
    body = [[name, f"{statistics.mean(r['accuracy']):.4f} ± {std(r['accuracy']):.4f}",
             f"{statistics.mean(r['accuracy']) - base:+.4f}", f"{statistics.mean(r['delta_m']):+.2f} ± "
             f"{std(r['delta_m']):.2f}", f"{r['step_time']:.2f}", f"{r['memory']:.2f}", verdict(r, static)]
            for name, r in rows.items()]
    return tabulate(body, headers=["weighting", "mean verification", "vs static", "Δm % vs alone", "step time",
                                   "peak memory", "vs static, beyond noise?"], tablefmt="github",
                    disable_numparse=True)


def write(text, path=os.path.join(ROOT, "docs", "weighting.md")):
    """Replace the text between the markers of ``path`` (appended with the markers when missing)."""
    content = open(path).read()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in content:
        head, rest = content.split(BEGIN, 1)
        content = head + block + rest.split(END, 1)[1]
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(content)


def finished_runs(args, names):
    """``{strategy: [figures per seed]}`` of the strategies whose every seed finished in ``args.out``."""
    runs = {}
    for name in names:
        folders = [os.path.join(args.out, name, f"seed{seed}") for seed in args.seeds]
        if all(os.path.isfile(os.path.join(folder, "bench.json")) for folder in folders):
            runs[name] = [figures(folder, json.load(open(os.path.join(folder, "bench.json")))["peak_mib"])
                          for folder in folders]
    if "static" not in runs:
        raise SystemExit(f"--finished-only: static, the reference, has not finished for seeds {args.seeds} in "
                         f"{args.out}")
    return runs


def train_all(args, names):
    """Train every strategy and seed (``--jobs`` at a time): ``{strategy: [figures per seed]}``."""
    threads = 1 if args.jobs > 1 else 0
    todo = [(n, s) for n in names for s in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda item: train(item[0], item[1], args.out, args.steps, threads), todo))
    return {n: [done[todo.index((n, s))] for s in args.seeds] for n in names}


def main():
    """Train every strategy and seed, print the table (and ``--write`` it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time (one thread each)")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_weighting_faces"))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--finished-only", action="store_true", help="tabulate the finished runs, train nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    names = ["static"] + [n for n in args.strategies if n != "static"]
    alone = alone_figures(args)
    runs = finished_runs(args, names) if args.finished_only else train_all(args, names)
    missing = [n for n in names if n not in runs]
    text = table(summarise(runs, alone, args.seeds))
    print(text)
    if missing:
        print(f"not measured: {', '.join(missing)}")
    if args.write:
        note = (f"Six face datasets, {len(args.seeds)} seeds ({', '.join(map(str, args.seeds))}), "
                f"{args.steps or 'the recipe'} steps, {args.jobs} runs at a time on 2 cores")
        note += f"; not measured (no time left for them): {', '.join(missing)}:" if missing else ":"
        write(f"{note}\n\n{text}")


if __name__ == "__main__":
    main()
