"""Faces on LFW's own protocol with a second dataset that shares people: every arm of examples/lfw_arms.py on View 1
or View 2, with the test people removed from the outside data, found from the faces alone.

    python examples/lfw_report.py --lfw ../shared/data/lfw --glint ../shared/data/glint_subset --view 1 --seeds 0
    python examples/lfw_report.py --lfw DIR --glint DIR --view 2 --sets 1 2 3 --reuse   # View 2, several sittings

Per split (View 1 and a seed, or a View 2 set): ``lfw_alone`` trains first on LFW's training people of the split;
its model then finds the outside classes that are test people of the split (:mod:`mtl.evaluation.contamination`,
calibrated as ``mtl overlap``), removes them (``filter/UNIT/removed.json``) and estimates the same-person pairs
between the outside data and LFW's training people and inside the outside data (``filter/UNIT/pairs.json``); then
the other arms train on the filtered data. Each run keeps its folder ``ARM/seedS`` (View 1) or ``ARM/setK`` (View 2)
with its export in ``export/`` and its LFW scores in ``eval_lfw_*.json``. ``--reuse`` keeps every finished run whose
job is unchanged, so View 2 can span sittings and the JSON of several ``--sets`` merges. Writes ``report.md``, the
JSON (``--json``) and ``roc.png`` (View 2: the arms' mean ROC beside LFW's published curves, when the LFW folder has
``published_roc/``).
"""
import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import yaml  # noqa: E402
from lfw_arms import ARMS, LFW, MERGED, SCREEN, arm_job, extra_tasks, recipe_tasks  # noqa: E402
from lfw_outcome import collect, write_outputs  # noqa: E402

RECIPE = os.path.join(ROOT, "examples", "configs", "lfw_glint.yaml")


class Unit:
    """One training split: LFW's View 1 with a seed (``seedS``) or a View 2 set with the recipe's seed (``setK``)."""

    def __init__(self, view, number):
        from mtl.data.lfw import Split

        self.split = Split(1) if view == 1 else Split(2, number)
        self.seed = number if view == 1 else None
        self.name = f"seed{number}" if view == 1 else f"set{number}"


class Report:
    """The runs of one report: which to train, in which order, and their files under ``out``."""

    def __init__(self, args):
        self.args = args
        self.lfw_dir = os.path.abspath(args.lfw)
        from mtl.evaluation.lfw import images_root

        self.lfw_images = images_root(self.lfw_dir)
        self.outside_images = images_root(os.path.abspath(args.glint))
        self.recipe, self.tasks = recipe_tasks(args.config)
        self.extras = extra_tasks(args.extra)
        numbers = args.seeds if args.view == 1 else args.sets
        self.units = [Unit(args.view, n) for n in numbers]
        self.arms = [a for a in ARMS if a in args.arms]
        # the run each unit starts with, whose model finds the test people (none with the independent matcher)
        self.first = None if args.filter_model == "dlib" else args.filter_model
        self.stages = ([self.first] if self.first else []) + [a for a in self.arms if a != self.first]
        self.done, self.total, self.started = 0, len(self.units) * len(self.stages), time.time()

    def folder(self, arm, unit):
        return os.path.join(self.args.out, arm, unit.name)

    def filter_folder(self, unit):
        return os.path.join(self.args.out, "filter", unit.name)

    def files(self, unit):
        """The data files of ``unit``'s arms (the filter writes them)."""
        where = self.filter_folder(unit)
        return {"split": unit.split, "lfw_dir": self.lfw_dir, "lfw_images": self.lfw_images,
                "outside_images": self.outside_images, "kept": os.path.join(where, "kept.txt"),
                "pairs": os.path.join(where, "pairs.json"),
                "merged": os.path.join(where, "merged", "dedup", "balanced.txt"),
                "naive": os.path.join(where, "merged", "naive", "balanced.txt")}

    def job(self, arm, unit):
        """The job config of ``arm`` on ``unit``."""
        files = self.files(unit)
        if arm == "naive":
            files = dict(files, merged=files["naive"])
        seed = self.recipe.get("seed", 0) if unit.seed is None else unit.seed
        return arm_job(arm, self.recipe, self.tasks, files, seed, self.folder(arm, unit), self.args.steps,
                       self.extras)

    # ------------------------------------------------------------------------------------------------ one run
    def finished(self, arm, unit) -> bool:
        """A run kept by ``--reuse``: its LFW scores (the screening run: its summary) exist and its job is the one
        asked for now."""
        folder = self.folder(arm, unit)
        score = os.path.join(folder, "summary.json" if arm == SCREEN else f"eval_lfw_{self.view_name(unit)}.json")
        asked = os.path.join(folder, "job_asked.yaml")
        if not (self.args.reuse and os.path.isfile(score) and os.path.isfile(asked)):
            return False
        with open(asked) as f:
            return yaml.safe_load(f) == self.job(arm, unit)

    def view_name(self, unit):
        return "view1" if unit.split.view == 1 else f"view2_set{unit.split.test_set}"

    def train(self, arm, unit):
        """Train, export and score one run (subprocesses with ``--threads`` intra-op threads); returns seconds."""
        started = time.time()
        folder = self.folder(arm, unit)
        os.makedirs(folder, exist_ok=True)
        asked = os.path.join(folder, "job_asked.yaml")
        with open(asked, "w") as f:
            yaml.safe_dump(self.job(arm, unit), f, sort_keys=False)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.args.threads), PYTHONPATH=ROOT)
        task = MERGED if arm in ("naive", "dedup") else LFW
        view = ["--view", str(unit.split.view)] + ([] if unit.split.view == 1 else ["--set", str(unit.split.test_set)])
        commands = [["train", asked, "--overwrite"], ["export", folder, os.path.join(folder, "export")],
                    ["eval", os.path.join(folder, "export"), "--lfw", self.lfw_dir, *view, "--flip", "--out", folder,
                     "--preprocess", task]]
        with open(os.path.join(folder, "report_run.log"), "w") as log:
            for command in commands[:1] if arm == SCREEN else commands:
                code = subprocess.call([sys.executable, "-m", "mtl.cli", *command], stdout=log,
                                       stderr=subprocess.STDOUT, env=env)
                if code != 0:
                    raise RuntimeError(f"{arm} {unit.name}: 'mtl {command[0]}' failed (exit {code}); its output is "
                                       f"in {os.path.join(folder, 'report_run.log')}")
        return time.time() - started

    def progress(self, arm, unit, seconds, kept=False):
        """One line per run: which of how many, its time, the elapsed time and an estimate of what is left."""
        self.done += 1
        elapsed = time.time() - self.started
        left = elapsed / self.done * (self.total - self.done)
        done = "trained" if arm == SCREEN else "trained and scored"
        what = "kept (--reuse)" if kept else f"{done} in {seconds / 60:.1f} min"
        print(f"[{self.done}/{self.total}] {arm} {unit.name}: {what}; elapsed {elapsed / 60:.1f} min, about "
              f"{left / 60:.0f} min left", flush=True)

    # ------------------------------------------------------------------------------------------------ the filter
    def filter(self, unit):
        """Find the outside classes that are test people of ``unit`` and the same-person pairs, with ``unit``'s
        first model (``--filter-model``); write ``removed.json``, ``pairs.json``, ``kept.txt`` and the merged
        lists."""
        from lfw_filter import run_filter

        model = self.folder(self.first, unit) if self.first else "dlib"
        run_filter(model, unit.split, self.lfw_dir, self.lfw_images, self.outside_images,
                   self.tasks, self.filter_folder(unit), self.args.percentile, threshold=self.args.filter_threshold)

    # ------------------------------------------------------------------------------------------------ schedule
    def run(self):
        """Every run, ``--jobs`` at a time: a unit's first model (``--filter-model``), its filter (in this
        process), then its other arms."""
        if self.first is None:  # the independent matcher: every unit's filter now, then every arm
            for unit in self.units:
                self.filter(unit)
            ready = [(a, u) for u in self.units for a in self.stages]
        else:
            ready = [(self.first, u) for u in self.units]
        after = {u.name: self.stages[1:] for u in self.units}
        with ThreadPoolExecutor(max_workers=self.args.jobs) as pool:
            running = {}
            while ready or running:
                while ready and len(running) < self.args.jobs:
                    arm, unit = ready.pop(0)
                    if self.finished(arm, unit):
                        self.progress(arm, unit, 0, kept=True)
                        ready += self.next_runs(arm, unit, after)
                        continue
                    running[pool.submit(self.train, arm, unit)] = (arm, unit)
                if not running:
                    continue
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    arm, unit = running.pop(future)
                    self.progress(arm, unit, future.result())
                    ready += self.next_runs(arm, unit, after)

    def next_runs(self, arm, unit, after):
        """The runs ``arm`` of ``unit`` unlocks: after the unit's first model, the filter, then its other arms."""
        if self.first is None or arm != self.first:
            return []
        self.filter(unit)
        return [(a, unit) for a in after[unit.name]]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lfw", required=True, help="LFW's folder: its pairs and people files, its images (DIR/images)")
    p.add_argument("--glint", required=True, help="the outside dataset: a folder per person (DIR/images or DIR)")
    p.add_argument("--view", type=int, choices=[1, 2], default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="View 1: the seeds")
    p.add_argument("--sets", type=int, nargs="+", default=list(range(1, 11)), help="View 2: the sets (1-10)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1)), help="intra-op threads per run")
    p.add_argument("--config", default=RECIPE, help="the recipe (default examples/configs/lfw_glint.yaml)")
    p.add_argument("--extra", help="a job config whose tasks join every arm but lfw_alone as further heads")
    p.add_argument("--steps", type=int, help="train this many steps instead of the recipe's (a shortened run)")
    p.add_argument("--filter-model", choices=["lfw_alone", SCREEN, "dlib"], default="lfw_alone",
                   help="what finds the test people: lfw_alone's model, screen (separate on every outside class; "
                        "used for nothing else), or dlib (an independent face matcher: requirements-lfw.txt)")
    p.add_argument("--percentile", type=float, default=5.0, help="the filter's calibration percentile")
    p.add_argument("--filter-threshold", type=float, help="a fixed cosine for the filter instead of the calibrated "
                                                          "one (shortened runs, whose models cannot calibrate)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "lfw_report"))
    p.add_argument("--json", help="also write the figures as JSON here")
    p.add_argument("--reuse", action="store_true", help="keep finished runs whose job is unchanged")
    p.add_argument("--variants-tried", type=int, default=0, help="how many settings were tried on View 1 (recorded)")
    args = p.parse_args(argv)
    bad = [k for k in args.sets if not 1 <= k <= 10]
    if bad:
        p.error(f"--sets: LFW's View 2 has sets 1 to 10, got {bad}")
    if args.jobs < 1 or args.threads < 1:
        p.error("--jobs and --threads must be at least 1")
    return args


def main(argv=None):
    from mtl.core.runtime import set_threads

    args = parse(argv)
    set_threads(args.threads)  # the screening model of the filter runs in this process, as a run does in its own
    report = Report(args)
    print(f"LFW view {args.view}: arms {', '.join(report.arms)} on {', '.join(u.name for u in report.units)}; "
          f"{report.total} runs, {args.jobs} at a time, {args.threads} thread(s) each", flush=True)
    report.run()
    figures = collect(report)
    write_outputs(report, figures)


if __name__ == "__main__":
    main()
