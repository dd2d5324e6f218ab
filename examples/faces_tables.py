"""The output of ``examples/faces_report.py``: its tables (per dataset, all people together, images per step, the
estimated duplicates) and the all-people ROC plot, from the report's ``result`` (the ``--json`` layout) and its arms'
ROC curves (TAR at :data:`PLOT_FARS`)."""
import os

import numpy as np

from mtl.core.progress import spread

PLOT_FARS = np.logspace(-4, 0, 121)  # the FARs at which every run's all-people ROC is kept and plotted


def cell(values):
    """``mean ± std`` over seeds, ``value (one seed)`` for one (empty for no value)."""
    return spread(values)  # one seed: "0.8628 (one seed)", no spread


def tables(result) -> str:
    """Per-dataset, all-people and sampling tables (GitHub), and the duplicates line."""
    from tabulate import tabulate

    arms, datasets = result["arms"], next(iter(result["arms"].values()))["datasets"]
    base = result.get("baselines", {})
    kinds = list(next(iter(base.values()))) if base else []
    rows = [[d] + [cell(arms[a]["datasets"][d]) for a in arms] + [f"{base[d][k]:.4f}" for k in kinds]
            for d in datasets]
    means = [np.mean([np.mean(arms[a]["datasets"][d]) for d in datasets]) for a in arms]
    means += [np.mean([base[d][k] for d in datasets]) for k in kinds]
    rows.append(["mean"] + [f"{v:.4f}" for v in means])
    text = tabulate(rows, headers=["dataset", *arms, *kinds], tablefmt="github", disable_numparse=True)
    keys = [("accuracy", "all", "accuracy"), ("TAR@FAR 1e-2", "all", "tar_far_1e-2"),
            ("TAR@FAR 1e-3", "all", "tar_far_1e-3"), ("cross-condition TAR@1e-3", None, "cross_condition")]
    rows = [[label] + [cell(arms[a][group][key] if group else arms[a][key]) for a in arms]
            for label, group, key in keys]
    text += "\n\nAll held-out people together (every pair):\n"
    text += tabulate(rows, headers=["", *arms], tablefmt="github", disable_numparse=True)
    rows = [[d] + [f"{result['sampling'][a].get(d, 0):g}" for a in arms] for d in datasets]
    text += "\n\nImages of each dataset per step (expected; merged arms read their images uniformly):\n"
    text += tabulate(rows, headers=["dataset", *arms], tablefmt="github", disable_numparse=True)
    if "separate" in arms and "alone" in arms:
        gaps = [np.mean(arms["separate"]["datasets"][d]) - np.mean(arms["alone"]["datasets"][d]) for d in datasets]
        text += (f"\nseparate - alone: {np.mean(gaps):+.4f} on average, separate >= alone on "
                 f"{sum(g >= 0 for g in gaps)} of {len(gaps)} datasets")
    for found in (result.get("duplicates"), result.get("duplicates_two_stage")):
        text += duplicates_line(found) if found else ""
    return text


def duplicates_line(found) -> str:
    """The report's line of one estimate of the duplicates."""
    text = ""
    if found:
        per_seed = {k: ", ".join("-" if v is None else str(v) for v in found[k]) for k in ("pairs", "correct")}
        true = "no true pairs known" if found["true"] is None else f"{found['true']} true pairs"
        text += (f"\n\nEstimated duplicates ({found['arm']} run, {found['from'][0]}; {true}): "
                 f"pairs found {per_seed['pairs']}, correct {per_seed['correct']} (per seed); precision "
                 f"{cell(found['precision']) or '-'}, recall {cell(found['recall']) or '-'}")
    return text


def plot(arms, path):
    """The all-people ROC of every arm (mean TAR over seeds at each FAR), log FAR axis."""
    from mtl.evaluation.verify import plot_roc

    curves = {}
    for arm, info in arms.items():
        if info["roc"]:
            tar = np.mean(np.asarray(info["roc"]), axis=0)
            curves[f"{arm} (TAR@1e-3 {np.mean(info['all']['tar_far_1e-3']):.3f})"] = (PLOT_FARS, tar)
    if curves:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        plot_roc(curves, path, "all held-out people, every pair")
