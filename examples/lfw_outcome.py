"""The LFW report's figures: every finished run under ``--out`` collected into tables, the JSON and the ROC picture.

Collected from disk (every unit of the view that has scores, not only this sitting's), so that View 2 run over
several sittings with ``--reuse`` gives one report. Paired differences are taken over the units both arms have:
mean difference and its standard error (std with n - 1, over sqrt(n)), as LFW's standard error is computed.
"""
import json
import os
import re

import numpy as np

ACCURACY, AUC, TAR = "accuracy", "auc", "tar_far_1e-2"
COMPARED = (("cross", "lfw_alone"), ("cross", "naive"), ("cross", "dedup"), ("cross", "separate"),
            ("separate", "lfw_alone"), ("dedup", "naive"))


def unit_names(out, view):
    """The units found under ``out`` for ``view`` (``seed0``... or ``set1``...), in order."""
    pattern = r"seed(\d+)" if view == 1 else r"set(\d+)"
    found = set()
    for arm in os.listdir(out) if os.path.isdir(out) else []:
        for name in os.listdir(os.path.join(out, arm)) if os.path.isdir(os.path.join(out, arm)) else []:
            if re.fullmatch(pattern, name):
                found.add(name)
    return sorted(found, key=lambda n: int(re.sub(r"\D", "", n)))


def score_file(out, arm, unit, view):
    stem = "view1" if view == 1 else f"view2_{unit}"
    return os.path.join(out, arm, unit, f"eval_lfw_{stem}.json")


def collect(report):
    """``{"view", "arms": {arm: {units, accuracy, auc, tar, distances, issame}}, "removed", "duplicates",
    "within"}`` of every finished run under the report's ``--out``."""
    out, view = report.args.out, report.args.view
    units = unit_names(out, view)
    arms = {}
    for arm in report.arms:
        rows = {}
        for unit in units:
            path = score_file(out, arm, unit, view)
            if os.path.isfile(path):
                with open(path) as f:
                    record = json.load(f)
                (name, figures), = record["sets"].items()
                rows[unit] = {**figures, "distances": record["distances"][name], "issame": record["issame"][name]}
        if rows:
            arms[arm] = rows
    removed, pairs, within = {}, {}, {}
    for unit in units:
        folder = os.path.join(out, "filter", unit)
        if os.path.isfile(os.path.join(folder, "decision.json")):
            with open(os.path.join(folder, "decision.json")) as f:
                decision = json.load(f)
            removed[unit] = decision["removed"]
            pairs[unit] = decision["pairs"]
            within[unit] = decision["within"]
    return {"view": view, "arms": arms, "removed": removed, "pairs": pairs, "within": within}


def paired(figures, a, b, key=ACCURACY):
    """``(mean of a - b, its standard error, units)`` over the units both arms have, or None."""
    arms = figures["arms"]
    if a not in arms or b not in arms:
        return None
    common = [u for u in arms[a] if u in arms[b]]
    if not common:
        return None
    diff = np.array([arms[a][u][key] - arms[b][u][key] for u in common])
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    return float(diff.mean()), se, common


def as_json(figures, variants_tried):
    """The report's JSON (issue 52's form): per arm the accuracies (one per set, or per seed on View 1), their mean
    and standard error, AUCs and TAR at FAR 1e-2; the removed classes per split; the same-person pairs the recipe's
    mask used for the first unit's training people; the number of variants tried."""
    from mtl.evaluation.lfw import summary

    arms = {}
    for arm, rows in figures["arms"].items():
        accuracy = [rows[u][ACCURACY] for u in rows]
        arms[arm] = {"units": list(rows), "accuracy": accuracy, **summary(accuracy),
                     "auc": [rows[u][AUC] for u in rows], TAR: [rows[u][TAR] for u in rows]}
    first = next(iter(figures["pairs"]), None)
    duplicates = [[p["name_a"], p["name_b"], p["similarity"]] for p in figures["pairs"].get(first, [])]
    return {"view": figures["view"], "arms": arms, "removed": figures["removed"], "duplicates": duplicates,
            "duplicates_split": first, "within": figures["within"], "variants_tried": int(variants_tried),
            "differences": {f"{a}-{b}": dict(zip(("mean", "se", "units"), d)) for a, b in COMPARED
                            if (d := paired(figures, a, b)) is not None}}


ARM_WORDS = {"lfw_alone": "LFW's training people alone", "separate": "a head per dataset",
             "naive": "one head, datasets merged as they are", "dedup": "one head, de-duplicated by the tool",
             "cross": "the recipe: heads that see each other"}


def table(data) -> str:
    """The arms' accuracy (mean ± standard error), AUC and TAR at FAR 1e-2, one row each, as markdown, from the
    report's JSON (:func:`as_json`): what report.md, the README and docs/lfw.md show."""
    from tabulate import tabulate

    rows = []
    for arm, found in data["arms"].items():
        se = "" if np.isnan(found["se"]) else f" ± {found['se']:.4f}"
        rows.append([f"`{arm}`: {ARM_WORDS.get(arm, arm)}", f"{found['mean']:.4f}{se}",
                     f"{np.mean(found['auc']):.4f}", f"{np.mean(found[TAR]):.4f}",
                     " ".join(f"{a:.3f}" for a in found["accuracy"])])
    unit = "set" if data["view"] == 2 else "seed"
    return tabulate(rows, headers=["arm", "accuracy (mean ± s.e.)", "AUC", "TAR at FAR 1e-2", f"per {unit}"],
                    tablefmt="github", disable_numparse=True)


def differences(data) -> str:
    """Paired differences of accuracy between arms over the units both have, from the report's JSON."""
    unit = "sets" if data["view"] == 2 else "seeds"
    lines = []
    for name, d in data["differences"].items():
        se = d["se"]
        told = "" if se is None or np.isnan(se) else f" ± {se:.4f}" + (f" ({d['mean'] / se:+.1f} s.e.)" if se > 0
                                                                        else "")
        lines.append(f"- {name.replace('-', ' - ')}: {d['mean']:+.4f}{told} over {len(d['units'])} {unit}")
    return "\n".join(lines)


def mean_roc(rows):
    """LFW's averaged ROC of one arm: ``(tpr, fpr)`` at each threshold, the mean over its units."""
    from mtl.evaluation.lfw import roc_points

    return roc_points([np.asarray(r["distances"]) for r in rows.values()],
                      [np.asarray(r["issame"], dtype=bool) for r in rows.values()])


def plot_roc(figures, lfw_dir, path):
    """The arms' mean ROC beside LFW's published curves (``published_roc/*.txt`` of the LFW folder, if there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtl.evaluation.lfw import read_roc

    fig, ax = plt.subplots(figsize=(7, 5.5))
    published = os.path.join(lfw_dir, "published_roc")
    for name in sorted(os.listdir(published)) if os.path.isdir(published) else []:
        if name.endswith(".txt"):
            tpr, fpr = read_roc(os.path.join(published, name))
            ax.plot(fpr, tpr, lw=0.8, alpha=0.6, ls="--", label=name[:-4])
    for arm, rows in figures["arms"].items():
        tpr, fpr = mean_roc(rows)
        ax.plot(fpr, tpr, lw=2, label=f"{arm} (ours)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(f"LFW view {figures['view']}: our arms (mean over {'sets' if figures['view'] == 2 else 'seeds'}) "
                 "and published curves")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(figures, report) -> str:
    """``report.md``: the table, the paired differences, what the filter removed and the same-person pairs."""
    data = as_json(figures, report.args.variants_tried)
    lines = [f"# LFW view {figures['view']}", "", table(data), "", differences(data), ""]
    for unit, removed in figures["removed"].items():
        shown = ", ".join(f"{r['class']} as {r['person']} ({r['similarity']:.3f})" for r in removed) or "none"
        pairs = ", ".join(f"{p['name_a']} = {p['name_b']} ({p['similarity']:.3f})" for p in figures["pairs"][unit])
        inside = ", ".join(f"{p['name_a']} = {p['name_b']}" for p in figures["within"][unit].get("glint", []))
        lines += [f"- {unit}: removed as test people: {shown}; same-person pairs with LFW's training people: "
                  f"{pairs or 'none'}; inside the outside data: {inside or 'none'}"]
    lines += ["", f"Settings tried on View 1 before this report: {report.args.variants_tried}."]
    return "\n".join(lines) + "\n"


def write_rocs(figures, out):
    """Each arm's mean ROC in LFW's format: ``roc_<arm>.txt`` under ``out``."""
    from mtl.evaluation.lfw import write_roc

    for arm, rows in figures["arms"].items():
        write_roc(os.path.join(out, f"roc_{arm}.txt"), *mean_roc(rows))


def write_outputs(report, figures):
    """``report.md``, ``roc.png``, each arm's ``roc_<arm>.txt`` and (``--json``) the JSON; prints the table."""
    out = report.args.out
    os.makedirs(out, exist_ok=True)
    write_rocs(figures, out)
    text = markdown(figures, report)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    if figures["arms"]:
        plot_roc(figures, report.lfw_dir, os.path.join(out, "roc.png"))
    if report.args.json:
        with open(report.args.json, "w") as f:
            json.dump(as_json(figures, report.args.variants_tried), f, indent=1)
    print(text)
    print(f"wrote {os.path.join(out, 'report.md')}, {os.path.join(out, 'roc.png')}"
          + (f", {report.args.json}" if report.args.json else ""))
