"""Open-set face verification report of a multi-dataset recipe: arms of training on several face datasets, scored on
the held-out people of every dataset, one dataset at a time and all people together.

    python examples/faces_report.py [--config examples/configs/faces_six.yaml] [--arms ARM,...] [--seeds 0 1 2]
        [--json FILE] [--plot FILE] [--out runs/faces_report] [--jobs 2] [--threads 1] [--steps N]
        [--set KEY=VALUE ...] [--task-set KEY=VALUE ...] [--no-baselines] [--overlap] [--shared-labels]
        [--only joint alone merged]

Arms (``examples/faces_arms.py`` says what each trains and how it samples): ``separate``, ``merged``, ``cross`` on
the six datasets as they are (the default there); ``naive``, ``oracle``, ``separate``, ``dropout``, ``cross``,
``cross_oracle`` on the overlap benchmark (``tools/make_overlap_benchmark.py``: a ``benchmark.json`` beside the
config; the default there); ``alone``. ``dropout`` and the ``cross`` arms set the job key ``cross_negatives``; a
config whose schema lacks it fails, in one line, before anything trains. ``--only joint alone merged`` (the former
report) is ``--arms separate,alone,merged``. Every run trains in its own process, ``--jobs`` at a time and at
``--threads`` intra-op threads (1 unless given: the thread count changes a run's figures); a line per
run says which of how many, the time so far and the time left (estimated), and a running run's step every
30 s (:mod:`mtl.core.progress`).

Scores, on the held-out people, by each run's backbone (averaged weights when the run averaged):

* ``datasets``: per dataset, verification on its held-out people as before (all positive pairs up to the reader's
  ``max_positive_pairs``, as many negatives, 10 folds);
* ``all``: every pair of every held-out image of every dataset (:mod:`mtl.evaluation.all_pairs`: persons capped at
  20 images by weight, 10-fold balanced accuracy, TAR at FAR 1e-2 and 1e-3);
* ``cross_condition``: the TAR, at the all-people FAR 1e-3 threshold, of positive pairs whose two images lie on
  opposite sides of the benchmark's split condition (light side on Extended Yale B, halves of a person's images
  elsewhere);
* ``duplicates`` (on the benchmark, or with ``--overlap``): the estimated same-person pairs of the ``cross`` run (its
  ``same_person.json``, else ``mtl overlap``'s calibrated decision on it) or, without ``cross``, of the ``separate``
  run (``mtl overlap``), against the true pairs (``duplicates.json``; ``--shared-labels``: equal data labels of two
  tasks are one person; else none): precision and recall.

Baselines (raw pixels, PCA, Fisherfaces) are fitted on each evaluated task's own training people (on the benchmark:
source A's). ``--json`` writes ``{"config", "seeds", "arms": {ARM: {"all": {"accuracy", "tar_far_1e-2",
"tar_far_1e-3"}, "cross_condition", "datasets": {DATASET: [per seed]}}}, "duplicates": {"precision", "recall", ...},
"sampling": {ARM: {DATASET: images per step}}, "baselines": {DATASET: {"pixels", "pca", "fisherfaces"}}}``; the plot
(``--plot``, default ``OUT/roc_all_people.png``) is the all-people ROC of the arms (mean TAR over seeds, log FAR);
the tables (``examples/faces_tables.py``) go to the console and ``OUT/report.md``.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")
sys.path.insert(0, ROOT)

from examples import faces_arms  # noqa: E402
from examples.faces_arms import ARMS, LEGACY, MERGED, ORACLE, Benchmark, Recipe, task_overrides  # noqa: E402
from examples.faces_tables import PLOT_FARS, plot, tables  # noqa: E402
from mtl.core.errors import ConfigError, DataError  # noqa: E402
from mtl.core.progress import Progress  # noqa: E402


def load_cfg(config, sets=(), task_sets=()):
    """The validated config with the job overrides ``sets`` and ``task_sets`` applied to every task."""
    from mtl.config.loading import load_job

    count = len(load_job(config, list(sets))["tasks"])
    return load_job(config, list(sets) + task_overrides(task_sets, count))


def train(config, out_dir, seed, sets, threads):
    """Train one run in a fresh process (``--overwrite``) at ``threads`` intra-op threads; return the command and its
    stderr tail on failure."""
    sets = [*sets, f"seed={seed}", f"output_dir={out_dir}", "log.progress=false", "log.plot=false",
            f"threads={threads}"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), config, "--overwrite", "--set", *sets]
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return None if done.returncode == 0 else f"{' '.join(cmd)}\n{done.stderr[-3000:]}"


def plan(args, recipe, arms):
    """``[(seed, arm, run name, run folder, overrides)]`` of every run; writes the merged and oracle task files and
    loads every arm's config once, so that a bad arm fails before anything trains."""
    from mtl.config.loading import load_job
    from mtl.core.errors import MtlError

    created = not os.path.exists(args.out)  # removed again when an arm's config is refused
    os.makedirs(args.out, exist_ok=True)
    files = {MERGED: ("merged_task.yaml", recipe.merged_task), ORACLE: ("oracle_task.yaml", recipe.oracle_task)}
    for placeholder, (name, make) in list(files.items()):
        if placeholder == ORACLE and "oracle" not in arms:
            continue
        path = os.path.join(os.path.abspath(args.out), name)
        with open(path, "w") as f:
            yaml.safe_dump(make(), f, sort_keys=False)
        files[placeholder] = path
    steps = [] if args.steps is None else [f"schedule.steps={args.steps}"]
    runs = []
    for arm in arms:
        for name, overrides in recipe.runs(arm, args.task_set):
            for placeholder, path in files.items():
                overrides = [o.replace(placeholder, str(path)) for o in overrides]
            sets = [*args.set, *steps, *overrides]
            try:  # a two_stage run's pairs exist once its separate run is done: checked with none until then
                load_job(args.config, [o.replace(faces_arms.SEPARATE_PAIRS, no_pairs(args.out)) for o in sets])
            except MtlError as exc:
                if created:
                    shutil.rmtree(args.out)
                raise ConfigError(f"arm '{arm}' (run {name}): {exc}") from None
            runs += [(seed, arm, name, os.path.join(args.out, f"seed{seed}", name),
                      [o.replace(faces_arms.SEPARATE_PAIRS, separate_pairs(args.out, seed)) for o in sets])
                     for seed in args.seeds]
    return sorted(runs, key=lambda r: args.seeds.index(r[0]))


def no_pairs(out):
    """An empty same-person file under ``out`` (what a two_stage run's config is checked with before training)."""
    path = os.path.join(os.path.abspath(out), "no_pairs.json")
    with open(path, "w") as f:
        f.write("[]\n")
    return path


def separate_pairs(out, seed):
    """Where a two_stage run of ``seed`` reads its pairs: ``mtl overlap --json`` of that seed's separate run."""
    return os.path.join(os.path.abspath(out), f"seed{seed}", "separate", "overlap.json")


def write_separate_pairs(args, runs):
    """The two-stage option's middle stage: ``mtl overlap``'s calibrated decision on each seed's separate run,
    written where its two_stage run reads it."""
    from mtl.studies import overlap

    for seed in sorted({seed for seed, arm, *_ in runs if arm == "two_stage"}):
        folder = os.path.dirname(separate_pairs(args.out, seed))
        overlap.report(folder, json_path=separate_pairs(args.out, seed))


def train_all(args, runs):
    """Train every run (``args.jobs`` at a time), a progress line per run; two_stage runs after the others, once
    their seed's separate run has its ``mtl overlap`` pairs. ``--score-only``: nothing trains (the runs must be
    there)."""
    if args.score_only:
        missing = [out for *_, out, _ in runs if not os.path.isfile(os.path.join(out, "summary.json"))]
        if missing:
            raise DataError(f"--score-only, but {len(missing)} run(s) are not finished, e.g. {missing[0]}")
        return
    first = [r for r in runs if r[1] != "two_stage"]
    train_runs(args, first)
    if len(first) < len(runs):
        write_separate_pairs(args, runs)
        train_runs(args, [r for r in runs if r[1] == "two_stage"])


def train_runs(args, runs):
    """Train ``runs`` (``args.jobs`` at a time), a progress line per run; with ``--reuse`` a run whose folder holds
    a ``summary.json`` (finished) is scored as it is, not trained again."""
    if args.reuse:
        done = [r for r in runs if os.path.isfile(os.path.join(r[3], "summary.json"))]
        if done:
            print(f"reusing {len(done)} finished run(s) (--reuse), e.g. {done[0][3]}", flush=True)
        runs = [r for r in runs if r not in done]
    threads = args.threads
    progress = Progress("train", len(runs))
    print(f"training {len(runs)} runs, {args.jobs} at a time, {threads} intra-op thread(s) each", flush=True)

    def one(item):
        seed, _, name, out_dir, sets = item
        began = time.time()
        with progress.watch(f"seed {seed} {name}", out_dir):  # the run's step every 30 s while it trains
            failure = train(args.config, out_dir, seed, sets, threads)
        progress.finished(f"seed {seed} {name}" + (": FAILED" if failure else ""), began)
        return failure

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        failures = [f for f in pool.map(one, runs) if f]
    if failures:
        sys.exit("training failed:\n" + failures[0])


def embeddings(run_dir, readers, batch_size=256):
    """``{task: (features [N, D], labels)}`` of every reader, embedded by the run's backbone (averaged weights; each
    reader through its task's embedding when the run's architecture gives each task its own:
    :func:`mtl.evaluation.held_out.embed_tasks`)."""
    from mtl.evaluation.held_out import embed_tasks
    from mtl.serving.inference import open_run

    return embed_tasks(open_run(run_dir), readers, batch_size)


def verify(features, labels, cap):
    """Open-set verification accuracy of ``features`` on the pairs of ``labels`` (10 folds)."""
    from mtl.evaluation.pairs import open_set_verification

    return float(open_set_verification(features, labels, cap, seed=0)["verification_accuracy"])


def all_people_of(recipe, embedded):
    """The held-out people of every task together, as ``mtl eval RUN --all-people`` scores them
    (:mod:`mtl.evaluation.held_out`: people kept apart per task, an image file two tasks hold counted once), with
    the condition sides where known."""
    from mtl.evaluation.held_out import pool_people, score_all_people

    pooled = pool_people(embedded, {task: recipe.eval_readers[task].sample_files() for task in embedded})
    return score_all_people(pooled.features, pooled.labels, pooled.take(recipe.sides, -1), plot_fars=PLOT_FARS)


def score(recipe, run_dir, name):
    """``{"datasets": {dataset: accuracy}, "all": all-people figures or None}`` of one finished run."""
    readers = recipe.eval_readers
    if name.startswith("alone_"):
        readers = {name[len("alone_"):]: readers[name[len("alone_"):]]}
    embedded = embeddings(run_dir, readers)
    datasets = {recipe.dataset[task]: verify(f, lab, recipe.eval_readers[task].max_positive_pairs)
                for task, (f, lab) in embedded.items()}
    return {"datasets": datasets, "all": None if name.startswith("alone_") else all_people_of(recipe, embedded)}


def collect_arms(args, recipe, arms, runs):
    """``{arm: {"all", "cross_condition", "datasets", "roc"}}`` of the finished runs (a progress line per run)."""
    out = {arm: {"all": {"accuracy": [], "tar_far_1e-2": [], "tar_far_1e-3": []}, "cross_condition": [],
                 "datasets": {recipe.dataset[t]: [] for t in recipe.eval_readers}, "roc": []} for arm in arms}
    progress = Progress("score", len(runs))
    for seed, arm, name, out_dir, _ in runs:
        began = time.time()
        scores = score(recipe, out_dir, name)
        for dataset, value in scores["datasets"].items():
            out[arm]["datasets"][dataset].append(value)
        if scores["all"] is not None:
            for key in out[arm]["all"]:
                out[arm]["all"][key].append(scores["all"][key])
            out[arm]["cross_condition"].append(scores["all"]["cross_condition"])
            out[arm]["roc"].append(scores["all"]["roc"])
        progress.finished(f"seed {seed} {name}", began)
    return out


def estimated_pairs(run_dir):
    """``(pairs, how)``: the run's online mask (``same_person.json``) or ``mtl overlap``'s calibrated decision."""
    from mtl.evaluation.duplicates import read_pairs
    from mtl.studies import overlap

    path = os.path.join(run_dir, "same_person.json")
    if os.path.isfile(path):
        return read_pairs(path), "same_person.json"
    _, _, found, decision = overlap.decide(run_dir)
    return found, f"mtl overlap (threshold {decision['threshold']:.3f})"


def duplicates_of(args, recipe, arms, runs, arm=None):
    """Precision and recall of the estimated duplicates per seed (None when there is nothing to compare): of
    ``arm``'s runs, by default the ``cross`` run's online estimate, else the ``separate`` run's ``mtl overlap``."""
    from mtl.evaluation.duplicates import duplicate_scores

    truth = recipe.true_pairs(args.shared_labels)
    arm = arm if arm in arms else next((a for a in ("cross", "separate") if a in arms), None)
    if arm is None or (truth is None and not args.overlap):
        return None
    out = {"arm": arm, "from": [], "pairs": [], "correct": [], "true": None, "precision": [], "recall": []}
    progress = Progress("duplicates", sum(run_arm == arm for _, run_arm, *_ in runs))
    for seed, run_arm, name, out_dir, _ in runs:
        if run_arm == arm:
            began = time.time()
            found, how = estimated_pairs(out_dir)
            progress.finished(f"seed {seed} {name}: {len(found)} same-person pairs estimated ({how})", began)
            scores = duplicate_scores(found, truth if truth is not None else [])
            if truth is None:  # nothing known: only the count of pairs found
                scores.update(correct=None, precision=None, recall=None, true=None)
            out["from"].append(how)
            for key in ("pairs", "correct", "precision", "recall"):
                out[key].append(scores[key])
            out["true"] = scores["true"]
    return out


def classic_baselines(recipe):
    """``{dataset: {"pixels", "pca", "fisherfaces": accuracy}}`` on each dataset's held-out people."""
    from mtl.data.steps import iterate_eval
    from mtl.evaluation.baselines import BASELINES

    def images(reader):
        batches = list(iterate_eval(reader, 256))
        return np.concatenate([b["image"] for b in batches]), np.concatenate([b["label"] for b in batches])

    out = {}
    progress = Progress("baselines", len(recipe.eval_readers))
    for name, eval_reader in recipe.eval_readers.items():
        began = time.time()
        train_x, train_y = images(recipe.train_readers[name])
        test_x, test_y = images(eval_reader)
        out[recipe.dataset[name]] = {kind: verify(cls().fit(train_x, train_y).transform(test_x), test_y.reshape(-1),
                                                  eval_reader.max_positive_pairs) for kind, cls in BASELINES.items()}
        progress.finished(f"{recipe.dataset[name]}: {', '.join(BASELINES)}", began)
    return out


def parse_arms(parser, args, benchmark):
    """The arms to run: ``--arms``, else ``--only`` (the former kinds), else the default of the config's kind."""
    if args.arms and args.only:
        parser.error("--arms and --only cannot be combined (--only joint alone merged is the former report's)")
    if args.only:
        return list(dict.fromkeys(LEGACY[k] for k in args.only))
    if not args.arms:
        return list(faces_arms.OVERLAP_ARMS if benchmark else faces_arms.SIX_ARMS)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        if arm not in ARMS:
            parser.error(f"--arms: unknown arm '{arm}'; known: {', '.join(ARMS)}")
        if arm == "two_stage" and "separate" not in arms:
            parser.error("--arms two_stage needs separate too (its first stage: the separate run of each seed)")
        if arm in ("oracle", "cross_oracle") and benchmark is None:
            parser.error(f"--arms {arm} needs the overlap benchmark's true persons: a config written by "
                         "tools/make_overlap_benchmark.py (benchmark.json beside it)")
    return list(dict.fromkeys(arms))


def parse_args(argv=None):
    """The command line (arms resolved into ``args.arms`` as a list)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help="the recipe, a variant or an overlap benchmark's config")
    parser.add_argument("--arms", default=None, help=f"comma-separated arms of {', '.join(ARMS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--out", default=os.path.join("runs", "faces_report"))
    parser.add_argument("--json", default=None, help="write the figures as JSON")
    parser.add_argument("--plot", default=None, help="the all-people ROC (default: OUT/roc_all_people.png)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at the same time")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op CPU threads of every run (default 1): a run's figures depend on its thread "
                             "count, and this keeps them independent of --jobs and of the machine's cores")
    parser.add_argument("--only", nargs="+", choices=list(LEGACY), default=None,
                        help="the former report's kinds (joint = separate)")
    parser.add_argument("--no-baselines", action="store_true", help="skip pixels, PCA and Fisherfaces")
    parser.add_argument("--score-only", action="store_true",
                        help="score the finished runs under --out again (nothing trains; e.g. after adding an arm)")
    parser.add_argument("--reuse", action="store_true",
                        help="runs already finished under --out (a summary.json) are scored, not trained again")
    parser.add_argument("--overlap", action="store_true", help="estimated duplicates even without true pairs")
    parser.add_argument("--shared-labels", action="store_true",
                        help="true pairs: equal data labels of two tasks are the same person (the ORL case)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides of every run (as train_joint's --set)")
    parser.add_argument("--task-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of every task of every run, relative to the task (head.scale=24)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.threads < 1:
        raise ConfigError(f"--jobs and --threads must be at least 1, got {args.jobs} and {args.threads}")
    if any(s.split("=", 1)[0].strip() == "threads" for s in args.set):
        raise ConfigError("give a run's thread count as --threads N, not --set threads=N (the report sets it)")
    args.arms = parse_arms(parser, args, Benchmark.beside(args.config))
    return args


def main(argv=None):
    """Train every arm, score, print the tables (also into ``OUT/report.md``), write ``--json`` and the plot."""
    from mtl.core.console import configure_console

    configure_console()  # Paddle's start-up warnings ("No ccache found") stay off the console
    args = parse_args(argv)
    if args.score_only and not os.path.isdir(args.out):
        raise DataError(f"--score-only, but {args.out} does not exist: there are no runs to score (give the --out of "
                        "a finished report)")
    recipe = Recipe(load_cfg(args.config, args.set, args.task_set), Benchmark.beside(args.config))
    runs = plan(args, recipe, args.arms)
    baselines = {} if args.no_baselines else classic_baselines(recipe)
    train_all(args, runs)
    arms = collect_arms(args, recipe, args.arms, runs)
    result = {"config": os.path.relpath(os.path.abspath(args.config), ROOT), "seeds": args.seeds,
              "arms": {a: {k: v for k, v in info.items() if k != "roc"} for a, info in arms.items()},
              "sampling": {arm: recipe.sampling(arm) for arm in args.arms}}
    found = duplicates_of(args, recipe, args.arms, runs)
    if found is not None:
        result["duplicates"] = found
    if "two_stage" in args.arms and found is not None and found["arm"] != "separate":  # the two-stage option's own
        result["duplicates_two_stage"] = duplicates_of(args, recipe, args.arms, runs, "separate")
    if baselines:
        result["baselines"] = baselines
    seeds = f"seeds {', '.join(map(str, args.seeds))}: mean ± std over seeds" if len(args.seeds) > 1 else \
        f"seed {args.seeds[0]}: one seed, no spread"
    text = f"Open-set verification on held-out people ({seeds}):\n{tables(result)}"
    print("\n" + text)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text + "\n")
    plot(arms, args.plot or os.path.join(args.out, "roc_all_people.png"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    from mtl.cli import run_script

    run_script(main)
