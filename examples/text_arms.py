"""The arms of the text report (``examples/text_report.py --arms ...``): which config each trains and how it is read.

* ``scratch``: today's recipe, a BiLSTM trained from scratch (``examples/configs/text_ewt.yaml``, joint, with its
  auxiliary masked LM);
* ``glove``: the same BiLSTM with GloVe 6B 50d as its word embeddings (``text_ewt_glove.yaml``, joint; frozen or tuned:
  ``--set backbone.freeze_vectors=true``);
* ``minilm_alone``: the MiniLM recipe (``text_ewt_minilm.yaml``) with each main task alone: the same encoder, steps,
  optimizer and seed, and the task's own sub-batch of the joint step;
* ``minilm``: the MiniLM recipe, every task on one encoder.

Every arm scores each main task with its head's primary metric on the task's evaluation file (percent); the
joint - alone comparison and Δm are ``minilm`` against ``minilm_alone``. ``--arm-config ARM=PATH`` trains an arm from
another config (the tests give tiny ones).
"""
import os

import numpy as np

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
ARMS = {"scratch": ("text_ewt.yaml", "joint"), "glove": ("text_ewt_glove.yaml", "joint"),
        "minilm_alone": ("text_ewt_minilm.yaml", "alone"), "minilm": ("text_ewt_minilm.yaml", "joint")}
JOINT, ALONE = "minilm", "minilm_alone"


def arm_configs(given):
    """``{arm: config path}``: the recipes, with ``given`` (``["ARM=PATH", ...]``) in their place."""
    paths = {arm: os.path.join(CONFIGS, name) for arm, (name, _) in ARMS.items()}
    for item in given or []:
        arm, _, path = item.partition("=")
        if arm not in ARMS or not path:
            raise SystemExit(f"error: --arm-config {item!r}: expected ARM=PATH with ARM one of {', '.join(ARMS)}")
        paths[arm] = path
    return paths


def arm_runs(arm, config, runs, load_job, sets):
    """``[(run name, config path, overrides)]`` of one arm for one seed (``runs``: text_report's joint/alone plan)."""
    cfg = load_job(config, sets)
    kind = ARMS[arm][1]
    return [(arm if name == "joint" else f"{arm}_{name[len('alone_'):]}", config, overrides)
            for name, overrides in runs(cfg, [kind], pinned_steps(cfg))]


def pinned_steps(cfg):
    """The overrides that give a run with other tasks the joint job's steps (a config in epochs)."""
    from mtl.train.job import planned_steps

    return [f"schedule.steps={planned_steps(cfg)}"] if cfg["schedule"]["epochs"] is not None else []


def collect_arms(arms, seeds, done, scores, main_tasks):
    """The report's JSON from ``done[seed][run name] = run folder``: ``{"seeds", "arms": {arm: {task: {"metric",
    "values": [per seed]}}}, "tasks": {task: {"metric", "joint", "alone"}}, "delta_m"}`` (joint = minilm, alone =
    minilm_alone, each task's primary metric in percent)."""
    report = {"seeds": list(seeds), "arms": {}, "tasks": {}, "delta_m": []}
    for arm in arms:
        for task in main_tasks:
            run = arm if ARMS[arm][1] == "joint" else f"{arm}_{task}"
            entry = report["arms"].setdefault(arm, {}).setdefault(task, {"metric": None, "values": []})
            for seed in seeds:
                if run in done[seed]:
                    metric, value = scores(done[seed][run]).get(task, (None, None))
                    if value is not None:
                        entry["metric"] = metric
                        entry["values"].append(value)
    for task in main_tasks:
        joint = report["arms"].get(JOINT, {}).get(task)
        alone = report["arms"].get(ALONE, {}).get(task)
        if joint and alone:
            report["tasks"][task] = {"metric": joint["metric"], "joint": joint["values"], "alone": alone["values"]}
    for i, _ in enumerate(seeds):
        gains = [100.0 * (e["joint"][i] - e["alone"][i]) / e["alone"][i] for e in report["tasks"].values()
                 if len(e["joint"]) > i and len(e["alone"]) > i and e["alone"][i]]
        if gains:
            report["delta_m"].append(float(np.mean(gains)))
    return report


def arms_table(report, spread) -> str:
    """Markdown: a row per main task, a column per arm (mean ± std over seeds), then MiniLM joint - alone (paired)
    when both ran; Δm below."""
    arms = list(report["arms"])
    tasks = list(next(iter(report["arms"].values()), {}))
    rows = ["| task | metric (%) | " + " | ".join(arms) + (" | joint - alone |" if report["tasks"] else " |"),
            "|---|---|" + "---|" * (len(arms) + bool(report["tasks"]))]
    for task in tasks:
        metric = next((report["arms"][a][task]["metric"] for a in arms if report["arms"][a][task]["metric"]), "-")
        cells = [spread(report["arms"][a][task]["values"], 2) or "-" for a in arms]
        if report["tasks"]:
            e = report["tasks"].get(task)
            cells.append((spread([j - a for j, a in zip(e["joint"], e["alone"])], 2) or "-") if e else "-")
        rows.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    if report["delta_m"]:
        rows.append(f"\nΔm (MiniLM joint vs alone, mean over the main tasks): {spread(report['delta_m'], 2, ' %')}")
    return "\n".join(rows)
