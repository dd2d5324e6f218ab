"""The architectures' tables and verdicts from the three benchmarks' JSON files (one command per benchmark made them):

    python examples/mmoe_synthetic_report.py --runs 20 --json synthetic.json --plot synthetic.png
    python examples/multimnist_report.py --json multimnist.json
    python examples/faces_report.py --only joint alone --no-baselines --json faces_hard.json
    python examples/faces_report.py --only joint --no-baselines --set architecture=... --json faces_mmoe.json  # each
    python bench/bench_architectures.py --json costs.json
    python examples/architectures_report.py --synthetic synthetic.json --multimnist multimnist.json \\
        --faces hard=faces_hard.json mmoe=faces_mmoe.json ... --costs costs.json [--json FILE] [--write DOC]

Verdicts, each against the spread over seeds or runs (a difference smaller than it is noise):
* synthetic: MMoE below shared-bottom at a correlation when the paired difference (same data in every run) is below
  zero by more than twice its standard error; MMoE "equal to" one-gate MoE when their paired difference is within
  twice its standard error; the widest spread is the largest interquartile range of the final loss over runs;
* MultiMNIST: Delta_m against single task, and each configuration's left / right mean against single's;
* faces: per architecture, the datasets where joint >= alone (means over seeds) and joint - alone on the mean.
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
SECTION = "architectures-tables"  # the markers of the generated section (mtl.generated_pages)


def paired(a, b):
    """(mean, standard error) of a - b over runs."""
    diff = np.asarray(a, float) - np.asarray(b, float)
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def synthetic_verdict(report):
    """``{correlation: {"mmoe_below_shared_bottom", "mmoe_vs_omoe", "widest"}}`` (module docstring)."""
    out = {}
    for p, cells in report["cells"].items():
        below, below_se = paired(cells["mmoe"]["final"], cells["shared_bottom"]["final"])
        same, same_se = paired(cells["mmoe"]["final"], cells["omoe"]["final"])
        spread = {m: float(np.subtract(*np.percentile(c["final"], [75, 25]))) for m, c in cells.items()}
        out[p] = {"mmoe_minus_shared_bottom": [below, below_se], "mmoe_below_shared_bottom": below < -2 * below_se,
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
        (d, se), (e, se2) = v["mmoe_minus_shared_bottom"], v["mmoe_minus_omoe"]
        lines.append(f"* correlation {p}: MMoE - shared-bottom {d:+.4f} ± {se:.4f} (s.e., paired) "
                     f"{'below' if v['mmoe_below_shared_bottom'] else 'not below'}; MMoE - OMoE {e:+.4f} ± "
                     f"{se2:.4f} ({'within' if v['mmoe_equals_omoe'] else 'beyond'} 2 s.e.); widest spread "
                     f"(IQR): {v['widest']}")
    return text + "\n\n" + "\n".join(lines)


def multimnist_table(report):
    from multimnist_report import table

    return table(report)


def faces_rows(files):
    """``{column: {dataset: [per seed]}}``: ``alone`` from the file that has it, ``NAME`` the joint of each file."""
    columns = {}
    for name, path in files.items():
        with open(path) as f:
            datasets = json.load(f)["datasets"]
        if any("alone" in info for info in datasets.values()) and "alone" not in columns:
            columns["alone"] = {d: info["alone"] for d, info in datasets.items()}
        columns[name] = {d: info["joint"] for d, info in datasets.items()}
    return columns


def faces_verdict(columns):
    """``{architecture: {"wins", "mean_gap", "gaps"}}``: joint >= alone per dataset (means over seeds)."""
    alone = columns["alone"]
    out = {}
    for name, joint in columns.items():
        if name == "alone":
            continue
        gaps = {d: float(np.mean(joint[d]) - np.mean(alone[d])) for d in alone}
        out[name] = {"gaps": gaps, "wins": sum(g >= 0 for g in gaps.values()),
                     "mean_gap": float(np.mean(list(gaps.values())))}
    return out


def faces_table(columns):
    from tabulate import tabulate

    datasets = list(columns["alone"])
    rows = [[d] + [f"{np.mean(col[d]):.4f} ± {np.std(col[d]):.4f}" for col in columns.values()] for d in datasets]
    rows.append(["mean"] + [f"{np.mean([np.mean(col[d]) for d in datasets]):.4f}" for col in columns.values()])
    verdict = faces_verdict(columns)
    rows.append(["joint >= alone"] + [""] + [f"{verdict[n]['wins']} of {len(datasets)}" for n in verdict])
    rows.append(["joint - alone (mean)"] + [""] + [f"{verdict[n]['mean_gap']:+.4f}" for n in verdict])
    headers = ["dataset", "alone"] + [f"joint, {n}" for n in columns if n != "alone"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def costs_table(costs):
    from bench_architectures import table

    return table(costs)


def report(args):
    """``(text, json content)`` of every benchmark given."""
    parts, content = [], {}
    if args.synthetic:
        data = json.load(open(args.synthetic))
        parts.append(f"### MMoE synthetic benchmark ({data['runs']} runs per cell)\n\n" + synthetic_table(data))
        content["synthetic"] = synthetic_verdict(data)
    if args.multimnist:
        data = json.load(open(args.multimnist))
        parts.append(f"### MultiMNIST (seeds {', '.join(map(str, data['seeds']))})\n\n" + multimnist_table(data))
        content["multimnist"] = data
    if args.faces:
        columns = faces_rows(dict(item.split("=", 1) for item in args.faces))
        parts.append("### Six faces, validation people\n\n" + faces_table(columns))
        content["faces"] = faces_verdict(columns)
    if args.costs:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        parts.append("### Costs\n\n" + costs_table(json.load(open(args.costs))))
    return "\n\n".join(parts), content


def write(doc, text):
    """Replace the text between the markers of ``doc``."""
    from mtl.errors import ConfigError
    from mtl.generated_pages import write_section

    try:
        write_section(doc, SECTION, text)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--synthetic", help="examples/mmoe_synthetic_report.py's --json")
    parser.add_argument("--multimnist", help="examples/multimnist_report.py's --json")
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
    main()
