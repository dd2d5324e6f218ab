"""All held-out people verified together when the source dataset of an image is not known (a deployed model's case),
for runs whose architecture embeds each task through its own layers (task BatchNorms, adapters).

    python examples/faces_source_free.py RUN [RUN ...] [--config examples/configs/faces_six.yaml] [--set KEY=VALUE ...]
        [--json FILE]

``examples/faces_report.py`` embeds each dataset's held-out people through that dataset's own task layers, which
uses the source of every image. Here every image of every dataset goes through one task's layers, once per task
(``through <task>``), beside the report's way (``own``): all-people accuracy and TAR at FAR 1e-3 per run, then
mean and std over the runs. ``--config`` and ``--set`` give the held-out people (the runs' recipe);
``--json`` writes ``{"runs": [...], "scores": {way: [[accuracy, tar] per run]}}``.
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from examples import faces_report  # noqa: E402
from examples.faces_arms import Benchmark, Recipe  # noqa: E402


def scores(recipe, run_dir):
    """``{way: (accuracy, TAR at FAR 1e-3)}`` of one run: through each task's layers, and each through its own."""
    from mtl.evaluation.evaluator import embed
    from mtl.serving.inference import open_run

    run = open_run(run_dir)
    tasks = [t["name"] for t in run.cfg["tasks"]]
    through = {task: run.backbone(task) for task in tasks}  # each task's embedder, built once
    out = {}
    for way in tasks + ["own"]:
        embedded = {}
        for name, reader in recipe.eval_readers.items():
            features, rest = embed(through[name if way == "own" else way], reader, 256)
            embedded[name] = (features.numpy().astype(np.float64), np.asarray(rest["label"]).reshape(-1))
        found = faces_report.all_people_of(recipe, embedded)
        out[way] = (float(found["accuracy"]), float(found["tar_far_1e-3"]))
    return out


def main(argv=None):
    """Score every run, print one line per way (mean ± std over the runs), write ``--json``."""
    from mtl.core.console import configure_console
    from mtl.core.runtime import select_device

    configure_console()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="finished run folders of the recipe (one per seed)")
    parser.add_argument("--config", default=os.path.join(ROOT, "examples", "configs", "faces_six.yaml"))
    parser.add_argument("--set", nargs="*", default=[], help="the runs' overrides (their architecture)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    select_device("cpu")
    recipe = Recipe(faces_report.load_cfg(args.config, args.set, []), Benchmark.beside(args.config))
    table = {}
    for run_dir in args.runs:
        for way, value in scores(recipe, run_dir).items():
            table.setdefault(way, []).append(value)
    for way, values in table.items():
        v = np.array(values)
        label = "own task (the report's way)" if way == "own" else f"through {way}"
        print(f"{label:32s} accuracy {v[:, 0].mean():.4f} ± {v[:, 0].std():.4f}   "
              f"TAR@1e-3 {v[:, 1].mean():.3f} ± {v[:, 1].std():.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "scores": table}, f, indent=1)
    return table


if __name__ == "__main__":
    from mtl.cli import run_script

    run_script(main)
