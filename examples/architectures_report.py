"""The architectures' tables and verdicts from the three benchmarks' JSON files (one command per benchmark made them):

    python examples/mmoe_synthetic_report.py --runs 40 --json synthetic.json --plot synthetic.png
    python examples/multimnist_report.py --steps 5850 --json multimnist.json  # 30 epochs (the recipe: 100)
    python examples/faces_report.py --only joint alone --no-baselines --json faces_hard.json
    python examples/faces_report.py --only joint --no-baselines --set architecture=... --json faces_mmoe.json  # each
    python bench/bench_architectures.py --json costs.json
    python examples/multimnist_report.py --steps 975 --json screen.json  # a shorter budget: every configuration
    python examples/architectures_report.py --synthetic synthetic.json --multimnist multimnist.json \\
        --multimnist-screen screen.json [more files of that budget] --multimnist-long long.json [more] \\
        --faces hard=faces_hard.json mmoe=faces_mmoe.json ... --costs costs.json [--json FILE] [--write DOC]

Verdicts, each against the spread over seeds or runs (a difference smaller than it is noise):
* synthetic: MMoE below shared-bottom at a correlation when the paired difference (same data in every run) is below
  zero by more than twice its standard error; MMoE "equal to" one-gate MoE when their paired difference is within
  twice its standard error; the widest spread is the largest interquartile range of the final loss over runs.
  Beside it, not a verdict: in how many runs MMoE is below shared-bottom and the two-sided exact sign test of that
  count (ties dropped), which one stalled run cannot sway as it sways a mean;
* MultiMNIST: Delta_m against single task, and each configuration's left / right mean against single's; the screen
  (every configuration at a shorter budget, from several files at the seeds they share) best Delta_m first, with
  the largest std over seeds of a configuration's per-seed Delta_m (against the same seed's single task, from
  whichever file has it) as the noise;
* faces: per architecture, the datasets where joint >= alone (means over the architecture's seeds, alone at
  the same seeds) and joint - alone on the mean; a column of one seed says which.
``--write DOC`` puts the tables between the ``<!-- architectures-tables -->`` markers of DOC.
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from mtl.core.errors import DataError  # noqa: E402

SECTION = "architectures-tables"  # the markers of the generated section (mtl.core.generated_pages)


def paired(a, b):
    """(mean, standard error) of a - b over runs."""
    diff = np.asarray(a, float) - np.asarray(b, float)
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def sign_test(a, b):
    """``(runs with a < b, runs where a != b, two-sided exact sign-test p)``: under "neither is lower" the count of
    a < b among n untied runs is Binomial(n, 1/2); p = min(1, 2 P(X >= max(k, n - k)))."""
    from math import comb

    diff = np.asarray(a, float) - np.asarray(b, float)
    lower, n = int((diff < 0).sum()), int((diff != 0).sum())
    tail = sum(comb(n, i) for i in range(max(lower, n - lower), n + 1)) / 2.0 ** n
    return lower, n, min(1.0, 2.0 * tail)


def synthetic_verdict(report):
    """``{correlation: {"mmoe_below_shared_bottom", "mmoe_lower_sign_test", "mmoe_equals_omoe", "widest", ...}}``
    (module docstring)."""
    out = {}
    for p, cells in report["cells"].items():
        below, below_se = paired(cells["mmoe"]["final"], cells["shared_bottom"]["final"])
        same, same_se = paired(cells["mmoe"]["final"], cells["omoe"]["final"])
        spread = {m: float(np.subtract(*np.percentile(c["final"], [75, 25]))) for m, c in cells.items()}
        out[p] = {"mmoe_minus_shared_bottom": [below, below_se], "mmoe_below_shared_bottom": below < -2 * below_se,
                  "mmoe_lower_sign_test": sign_test(cells["mmoe"]["final"], cells["shared_bottom"]["final"]),
                  "mmoe_minus_omoe": [same, same_se], "mmoe_equals_omoe": abs(same) <= 2 * same_se,
                  "iqr": spread, "widest": max(spread, key=spread.get)}
    return out


def synthetic_table(report):
    from tabulate import tabulate

    verdict = synthetic_verdict(report)
    rows = []
    for p, cells in report["cells"].items():
        for model, cell in cells.items():
            final = np.asarray(cell["final"])
            rows.append([p, model, len(final), f"{final.mean():.4f} ± {final.std(ddof=1):.4f}",
                         f"{np.median(final):.4f}", f"{verdict[p]['iqr'][model]:.4f}"])
    text = tabulate(rows, headers=["correlation", "model", "runs", "final loss mean ± std", "median", "IQR"],
                    tablefmt="github", disable_numparse=True)
    lines = []
    for p, v in verdict.items():
        (d, se), (e, se2), (k, n, sign_p) = (v["mmoe_minus_shared_bottom"], v["mmoe_minus_omoe"],
                                             v["mmoe_lower_sign_test"])
        lines.append(f"* correlation {p}: MMoE - shared-bottom {d:+.4f} ± {se:.4f} (s.e., paired) "
                     f"{'below' if v['mmoe_below_shared_bottom'] else 'not below'} (lower in {k} of {n} runs, "
                     f"sign test p = {sign_p:.1g}); MMoE - OMoE {e:+.4f} ± "
                     f"{se2:.4f} ({'within' if v['mmoe_equals_omoe'] else 'beyond'} 2 s.e.); widest spread "
                     f"(IQR): {v['widest']}")
    return text + "\n\n" + "\n".join(lines)


def multimnist_table(report):
    from multimnist_report import table

    return table(report)


def read_report(path, keys):
    """A report's JSON with ``keys``, or a sentence naming the file and what it lacks."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the report {path}: {exc}") from None
    missing = [k for k in keys if k not in data]
    if missing:
        raise DataError(f"the report {path} lacks {', '.join(missing)} (examples/multimnist_report.py's --json "
                        "has them)")
    return data


def merge_screen(files):
    """The MultiMNIST reports of one budget merged: ``{"steps", "seeds", "configurations": {name: {"left",
    "right"}}}`` at the seeds every configuration has (a configuration may come at some seeds from one file and at
    others from another), and the noise at this budget (:func:`screen_noise`)."""
    # a list, not a dict by path: a file given twice is refused below
    reports = [(path, read_report(path, ("steps", "seeds", "configurations"))) for path in files]
    steps = {r["steps"] for _, r in reports}
    if len(steps) > 1:
        raise DataError("the screen's files are of different budgets: "
                         + ", ".join(f"{p} {r['steps']} steps" for p, r in reports))
    values = {}  # {name: {seed: {task: accuracy}}}
    for path, r in reports:
        for name, cell in r["configurations"].items():
            for i, seed in enumerate(r["seeds"]):
                if seed in values.setdefault(name, {}):
                    raise DataError(f"configuration {name!r} is in two of the screen's files at seed {seed} "
                                     f"({path})")
                values[name][seed] = {t: v[i] for t, v in cell.items()}
    if "single" not in values:
        raise DataError(f"none of the screen's files {', '.join(files)} has the configuration 'single'")
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in values.values())))
    if not seeds:
        raise DataError(f"the screen's files {', '.join(files)} share no seed")
    merged = {name: {t: [by_seed[s][t] for s in seeds] for t in by_seed[seeds[0]]} for name, by_seed in values.items()}
    return {"steps": steps.pop(), "seeds": seeds, "configurations": merged}, screen_noise(values)


def screen_noise(values):
    """The largest std over seeds of a configuration's per-seed Delta_m, each configuration at every seed it shares
    with ``single`` (against that seed's single task); None when no configuration has two. ``values``: ``{name:
    {seed: {task: accuracy}}}``."""
    from multimnist_report import delta_m

    single, spreads = values["single"], []
    for name, by_seed in values.items():
        shared = [s for s in by_seed if s in single]
        if name != "single" and len(shared) > 1:
            spreads.append(float(np.std([delta_m({t: [v] for t, v in by_seed[s].items()},
                                                 {t: [v] for t, v in single[s].items()}) for s in shared])))
    return max(spreads) if spreads else None


def screen_table(screen, noise):
    """Every configuration of the merged screen, best Delta_m first, Sener and Koltun's Table 3 beside them (at their
    100 epochs), and the noise line."""
    from multimnist_report import PAPER, TASKS, delta_m
    from tabulate import tabulate

    from mtl.core.progress import spread

    configs = screen["configurations"]
    order = sorted((n for n in configs if n != "single"), key=lambda n: -delta_m(configs[n], configs["single"]))
    rows = [[n, *(spread(configs[n][t], 2) for t in TASKS),
             f"{delta_m(configs[n], configs['single']):+.2f}" if n != "single" else ""] for n in ["single", *order]]
    rows += [[f"{name} (their Table 3, 100 epochs)", f"{left:.2f}", f"{right:.2f}", ""]
             for name, (left, right) in PAPER.items()]
    text = tabulate(rows, headers=["configuration", "left (%)", "right (%)", "Δm vs single (%)"],
                    tablefmt="github", disable_numparse=True)
    if noise is not None:
        text += (f"\n\nThe seed-to-seed spread of Δm at this budget: up to {noise:.2f} (std over the seeds of the "
                 "configurations run at several)")
    return text


def faces_rows(files):
    """``(alone, columns)``: ``alone = {dataset: {seed: value}}`` from the file that has it; ``columns = {NAME:
    {"seeds": [...], "joint": {dataset: [per seed]}}}``, the joint of each file. A file without ``seeds`` has seeds
    0, 1, ... (one per value)."""
    alone, columns = {}, {}
    for name, path in files.items():
        data = read_report(path, ("datasets",))
        datasets = data["datasets"]
        count = len(next(iter(datasets.values()))["joint"])
        seeds = list(data.get("seeds", range(count)))
        if any("alone" in info for info in datasets.values()) and not alone:
            alone = {d: dict(zip(seeds, info["alone"])) for d, info in datasets.items()}
        columns[name] = {"seeds": seeds, "joint": {d: info["joint"] for d, info in datasets.items()}}
    if not alone:
        raise DataError(f"none of the --faces files ({', '.join(files.values())}) has the datasets' alone "
                         f"runs (an \"alone\" list beside \"joint\"); give the one that has them")
    return alone, columns


def faces_verdict(alone, columns):
    """``{architecture: {"seeds", "wins", "mean_gap", "gaps"}}``: joint >= alone per dataset, each column against
    alone at its own seeds (means over them)."""
    out = {}
    for name, column in columns.items():
        missing = [s for s in column["seeds"] if any(s not in alone[d] for d in alone)]
        if missing:
            raise DataError(f"the faces file of {name!r} has seeds {missing} that the alone runs lack")
        gaps = {d: float(np.mean(column["joint"][d]) - np.mean([alone[d][s] for s in column["seeds"]]))
                for d in alone}
        out[name] = {"seeds": column["seeds"], "gaps": gaps, "wins": sum(g >= 0 for g in gaps.values()),
                     "mean_gap": float(np.mean(list(gaps.values())))}
    return out


def _cell(values, seeds):
    """``mean ± std`` over seeds, or the one seed's value and which seed it is."""
    return f"{np.mean(values):.4f} ± {np.std(values):.4f}" if len(values) > 1 else f"{values[0]:.4f} (seed {seeds[0]})"


def faces_table(alone, columns):
    """Per dataset: alone over all its seeds and each architecture's joint; the verdict rows compare each column
    with alone at that column's seeds."""
    from tabulate import tabulate

    datasets = list(alone)
    alone_seeds = sorted(next(iter(alone.values())))
    alone_col = {d: [alone[d][s] for s in alone_seeds] for d in datasets}
    rows = [[d, _cell(alone_col[d], alone_seeds)] + [_cell(c["joint"][d], c["seeds"]) for c in columns.values()]
            for d in datasets]
    means = [np.mean([np.mean(alone_col[d]) for d in datasets])]
    means += [np.mean([np.mean(c["joint"][d]) for d in datasets]) for c in columns.values()]
    rows.append(["mean"] + [f"{m:.4f}" for m in means])
    verdict = faces_verdict(alone, columns)
    rows.append(["joint >= alone (same seeds)", ""] + [f"{v['wins']} of {len(datasets)}" for v in verdict.values()])
    rows.append(["joint - alone (mean, same seeds)", ""] + [f"{v['mean_gap']:+.4f}" for v in verdict.values()])
    headers = ["dataset", "alone"] + [f"joint, {n}" for n in columns]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def costs_table(costs):
    from bench_architectures import table

    return table(costs)


def runs_per_cell(data) -> str:
    """``"40 runs per cell"``, or the count of each correlation when they differ (a cell taken further)."""
    counts = {p: max(len(cell["final"]) for cell in models.values()) for p, models in data["cells"].items()}
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()))} runs per cell"
    return "runs per cell: " + ", ".join(f"{n} at correlation {p}" for p, n in counts.items())


def report(args):
    """``(text, json content)`` of every benchmark given."""
    parts, content = [], {}
    if args.synthetic:
        data = read_report(args.synthetic, ("cells",))
        parts.append(f"### MMoE synthetic benchmark ({runs_per_cell(data)})\n\n" + synthetic_table(data))
        content["synthetic"] = synthetic_verdict(data)
    if args.multimnist:
        data = read_report(args.multimnist, ("seeds", "configurations"))
        budget = f" at {data['steps']} steps" if "steps" in data else ""
        parts.append(f"### MultiMNIST{budget} (seeds {', '.join(map(str, data['seeds']))})\n\n"
                     + multimnist_table(data))
        content["multimnist"] = data
    if args.multimnist_long:
        long, _ = merge_screen(args.multimnist_long)
        parts.append(f"### MultiMNIST at {long['steps']} steps (seeds {', '.join(map(str, long['seeds']))})\n\n"
                     + multimnist_table(long))
        content["multimnist_long"] = long
    if args.multimnist_screen:
        screen, noise = merge_screen(args.multimnist_screen)
        parts.append(f"### MultiMNIST screen: every configuration at {screen['steps']} steps (seed"
                     f"{'s' if len(screen['seeds']) > 1 else ''} {', '.join(map(str, screen['seeds']))})\n\n"
                     + screen_table(screen, noise))
        content["multimnist_screen"] = {**screen, "noise": noise}
    if args.faces:
        alone, columns = faces_rows(dict(item.split("=", 1) for item in args.faces))
        parts.append("### Six faces, validation people\n\n" + faces_table(alone, columns))
        content["faces"] = faces_verdict(alone, columns)
    if args.costs:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        parts.append("### Costs\n\n" + costs_table(read_report(args.costs, ())))
    return "\n\n".join(parts), content


def write(doc, text):
    """Replace the text between the markers of ``doc``."""
    from mtl.core.generated_pages import write_section

    write_section(doc, SECTION, text)  # a page without the markers: a ConfigError, one line (run_script)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--synthetic", help="examples/mmoe_synthetic_report.py's --json")
    parser.add_argument("--multimnist", help="examples/multimnist_report.py's --json")
    parser.add_argument("--multimnist-screen", nargs="*", default=[], metavar="FILE",
                        help="examples/multimnist_report.py's --json files of one shorter budget, tabled at their "
                             "common seeds")
    parser.add_argument("--multimnist-long", nargs="*", default=[], metavar="FILE",
                        help="examples/multimnist_report.py's --json files of one longer budget (the paper's), "
                             "merged as the screen's and tabled as --multimnist")
    parser.add_argument("--faces", nargs="*", default=[], metavar="NAME=FILE",
                        help="examples/faces_report.py's --json per architecture (one of them with alone)")
    parser.add_argument("--costs", help="bench/bench_architectures.py's --json")
    parser.add_argument("--json", default=None)
    parser.add_argument("--write", default=None, metavar="DOC", help="put the tables into DOC between the markers")
    args = parser.parse_args(argv)
    text, content = report(args)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(content, f, indent=1)
    if args.write:
        write(args.write, text)
    return content


if __name__ == "__main__":
    from mtl.cli import run_script

    run_script(main)
