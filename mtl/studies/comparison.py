"""Did joint training help? Single-task baselines, the multi-task gain Δm, and runs side by side.

``mtl baseline CONFIG`` derives from a joint job one single-task job per task (same backbone, same per-task
sub-batch, steps, optimizer and seed; static weighting), runs them under ``output_dir/baselines/<task>`` (a finished
run there is reused), and reports every task's primary metric jointly and alone with the multi-task gain of
Maninis et al. 2019 / Vandenhende et al. 2021 (as LibMTL reports it):

    Δm% = (100 / T) · Σ_t s_t · (M_joint,t − M_single,t) / M_single,t,   s_t = +1 if higher is better, else −1

(positive: joint training helped). ``mtl compare RUN_DIR ...`` prints the same table for several runs side by side
(for example one per weighting strategy) and draws a bar chart.
"""
import copy
import json
import math
import os
from typing import Dict, List

from tabulate import tabulate

from mtl.core.errors import ConfigError, DataError
from mtl.core.utf8 import read_json

BASELINE_FILE = "baseline.json"
BASELINE_DIR = "baselines"  # the single-task runs, one folder per task, under the joint job's output_dir


def delta_m(joint: Dict[str, float], single: Dict[str, float], higher_is_better: Dict[str, bool]) -> float:
    """Δm% over the tasks present in all three mappings (see the module docstring); NaN if none is usable."""
    terms = []
    for task, value in joint.items():
        base = single.get(task)
        if base is None or value is None or not math.isfinite(base) or base == 0 or not math.isfinite(value):
            continue
        sign = 1.0 if higher_is_better[task] else -1.0
        terms.append(sign * (value - base) / abs(base))
    return 100.0 * sum(terms) / len(terms) if terms else float("nan")


def primary_metrics(summary: dict) -> Dict[str, dict]:
    """``{task: {metric, value, higher_is_better}}`` from a ``summary.json`` (averaged weights when present)."""
    out = {}
    for task, info in summary["tasks"].items():
        metrics = info.get("eval_averaged") or info.get("eval") or {}
        name = info.get("primary_metric")
        out[task] = {"metric": name, "value": metrics.get(name), "higher_is_better": info.get("higher_is_better")}
    return out


def read_summary(run_dir: str) -> dict:
    """The ``summary.json`` of a finished run, or a ConfigError naming the folder (a DataError naming the file when
    it is not a run's summary: not JSON, no ``tasks`` of objects, a primary metric's value that is not a number)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        raise ConfigError(f"'{os.path.abspath(run_dir)}' holds no summary.json: it is not a finished run")
    summary = read_json(path, "summary")
    tasks = summary.get("tasks") if isinstance(summary, dict) else None
    if not isinstance(tasks, dict) or not all(isinstance(info, dict) for info in tasks.values()):
        raise DataError(f"summary '{path}' has no 'tasks' object of one object per task: it is not a run's summary")
    for task, info in primary_metrics(summary).items():
        value = info["value"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise DataError(f"summary '{path}': task '{task}' has {info['metric']} = {value!r}, not a number")
    return summary


def single_task_config(cfg: dict, task_name: str, sub_batch: int) -> dict:
    """The single-task job of ``task_name`` derived from the validated joint config ``cfg``: its sub-batch for the
    joint job's steps (with ``schedule.epochs``, the steps they give the joint job: ``cfg``'s ``schedule.steps``
    resolved, :func:`mtl.train.job.planned_steps`), so that it reads the samples it reads in the joint job."""
    single = copy.deepcopy(cfg)
    single["tasks"] = [copy.deepcopy(t) for t in cfg["tasks"] if t["name"] == task_name]
    single["schedule"]["batch_size"] = int(sub_batch)
    single["schedule"]["mode"] = "joint"
    single["schedule"].update(epochs=None, epochs_of=None, same_rows=False)  # one task: no rows to share
    single["output_dir"] = os.path.join(cfg["output_dir"], BASELINE_DIR, task_name)
    if "weighting" in single:
        single["weighting"] = {"type": "static"}
    return single


def sub_batches(cfg: dict) -> Dict[str, int]:
    """Each task's sub-batch in the joint job (sample mode: the whole batch, the size of a step of that task)."""
    from mtl.data.scheduler import largest_remainder

    names = [t["name"] for t in cfg["tasks"]]
    batch = cfg["schedule"]["batch_size"]
    if cfg["schedule"]["mode"] != "joint":
        return {n: batch for n in names}
    return dict(zip(names, largest_remainder(batch, [t["ratio"] for t in cfg["tasks"]])))


# where a config was read from, not what it trains: a run of the same job moved or read through another path is the
# same run
_PROVENANCE = ("config_path", "config_dir", "source", "plugin_folders", "set_keys")
_TASK_PROVENANCE = ("source", "key", "set_prefix", "set_keys")  # a task's file and what --set changed in it


def _trained(cfg: dict) -> dict:
    """``cfg`` as ``job.json`` holds it (JSON types), without the keys that only say where it was read from."""
    plain = json.loads(json.dumps(cfg, default=str))
    for key in _PROVENANCE:
        plain.pop(key, None)
    for task in plain.get("tasks", []):
        if isinstance(task, dict):
            for key in _TASK_PROVENANCE:
                task.pop(key, None)
    return plain


def first_difference(old, new, where=""):
    """The dotted path of the first key (or list item) where ``old`` and ``new`` differ, with both values; None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            if key not in old or key not in new:
                return f"{where}{key}: {old.get(key, '(absent)')!r} before, {new.get(key, '(absent)')!r} now"
            found = first_difference(old[key], new[key], f"{where}{key}.")
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = first_difference(a, b, f"{where}{i}.")
            if found:
                return found
        return None
    return None if old == new else f"{where.rstrip('.')}: {old!r} before, {new!r} now"


def finished(run_dir: str, steps: int) -> bool:
    """True when ``run_dir`` holds a finished run of ``steps`` steps (a summary.json that is not JSON: a
    DataError)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return False
    summary = read_json(path, "summary")
    return isinstance(summary, dict) and summary.get("steps") == steps


def reusable(job_cfg: dict, overwrite: bool = False) -> bool:
    """True when ``job_cfg``'s output_dir holds the finished run of this very job (its ``job.json`` equal but for
    where the config was read): reused. False when the folder is empty or missing, or holds an unfinished run of
    this job, or ``overwrite``: trained (again). A run of another job there is a ConfigError naming the first key
    that differs: ``mtl baseline`` never trains over a run it did not make without ``--overwrite``."""
    folder = job_cfg["output_dir"]
    if overwrite or not os.path.isdir(folder) or not set(os.listdir(folder)) - {BASELINE_DIR}:
        return False
    job_file = os.path.join(folder, "job.json")
    saved = _trained(read_json(job_file, "job")) if os.path.isfile(job_file) else None
    difference = "it has no job.json" if saved is None else first_difference(saved, _trained(job_cfg))
    if difference is None:
        return finished(folder, job_cfg["schedule"]["steps"])
    raise ConfigError(f"'{folder}' holds files of another job ({difference}); mtl baseline does not train over "
                      "them: give --overwrite to train it again, or another output_dir")


def baseline_table(result: dict) -> str:
    """The table of a :func:`report`: task, primary metric, joint, alone, change %; then Δm."""
    rows = []
    for task, info in result["tasks"].items():
        change = delta_m({task: info["joint"]}, {task: info["single"]}, {task: info["higher_is_better"]})
        metric = info["metric"]
        rows.append([task, metric_label(metric, info["higher_is_better"]), _fmt(info["joint"], metric=metric),
                     _fmt(info["single"], metric=metric), _fmt(change, "+.2f")])
    table = tabulate(rows, headers=["task", "primary metric", "joint", "alone", "change %"], tablefmt="github",
                     disable_numparse=True)
    return f"{table}\n\nΔm = {_fmt(result['delta_m'], '+.2f')} % (positive: joint training helped)"


def _fmt(value, spec=None, metric=None):
    """``value`` as a table shows it: ``n/a`` when missing, ``spec`` when given, else the form of the metric called
    ``metric`` (:func:`mtl.train.reporting.format_value`: counts whole, the rest with four digits)."""
    from mtl.train.reporting import format_value

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec) if spec else format_value(value, metric)


def report(joint_summary: dict, single_summaries: Dict[str, dict]) -> dict:
    """The content of ``baseline.json``: per-task primary metrics jointly and alone, and Δm%."""
    joint = primary_metrics(joint_summary)
    single = {t: primary_metrics(s)[t] for t, s in single_summaries.items()}
    higher = {t: bool(info["higher_is_better"]) for t, info in joint.items()}
    value = delta_m({t: i["value"] for t, i in joint.items()}, {t: i["value"] for t, i in single.items()}, higher)
    return {"tasks": {t: {"metric": joint[t]["metric"], "higher_is_better": higher[t], "joint": joint[t]["value"],
                          "single": single.get(t, {}).get("value")} for t in joint},
            "delta_m": value}


def baseline_jobs(cfg: dict) -> List[tuple]:
    """``[(job config, what it is)]``: the joint job, then every task alone (:func:`single_task_config`); with
    ``schedule.epochs`` the joint job's steps are resolved first (:func:`mtl.train.job.planned_steps`) and every
    single-task job takes them."""
    from mtl.train.job import planned_steps

    if cfg["schedule"].get("epochs") is not None:
        cfg = copy.deepcopy(cfg)
        cfg["schedule"]["steps"] = planned_steps(cfg)
    return [(cfg, "joint job")] + [(single_task_config(cfg, task, size), f"task '{task}' alone (sub-batch {size})")
                                   for task, size in sub_batches(cfg).items()]


def run_baselines(cfg: dict, console=print, overwrite: bool = False) -> dict:
    """Run (or reuse, :func:`reusable`) the joint job and every single-task job of ``cfg``; write and return
    ``baseline.json``. Every job's folder is checked before any of them trains."""
    from mtl.store.rundir import check_output_dir
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    jobs = baseline_jobs(cfg)
    for job_cfg, _ in jobs:
        check_output_dir(job_cfg["output_dir"])
    reuse = [reusable(job_cfg, overwrite) for job_cfg, _ in jobs]
    summaries = []
    for (job_cfg, what), reused in zip(jobs, reuse):
        if reused:
            console(f"{what}: reusing the finished run in {job_cfg['output_dir']}")
        else:
            console(f"{what}: training in {job_cfg['output_dir']}")
            Trainer(build_job(job_cfg), console=console, overwrite=True).run()
        summaries.append(read_summary(job_cfg["output_dir"]))
    joint, singles = summaries[0], {t["tasks"][0]["name"]: s for (t, _), s in zip(jobs[1:], summaries[1:])}
    result = report(joint, singles)
    result["config"] = cfg.get("config_path")
    with open(os.path.join(cfg["output_dir"], BASELINE_FILE), "w") as f:
        json.dump(result, f, indent=1)
    console("\n" + baseline_table(result))
    console(f"\nwritten to {os.path.join(cfg['output_dir'], BASELINE_FILE)}")
    return result


def compare_runs(run_dirs: List[str]) -> dict:
    """``{run: {"tasks": {task: {metric, higher_is_better, value}}, "delta_m": Δm or None}}`` of finished runs."""
    out, seen = {}, {}
    for run_dir in run_dirs:
        same = seen.setdefault(os.path.realpath(run_dir), run_dir)
        if same is not run_dir:
            raise ConfigError(f"run folder '{run_dir}' is given twice (also as '{same}')")
        summary = read_summary(run_dir)
        baseline = os.path.join(run_dir, BASELINE_FILE)
        delta = None
        if os.path.isfile(baseline):
            result = read_json(baseline, "baseline")
            delta = result.get("delta_m", "missing") if isinstance(result, dict) else "missing"
            if delta is not None and (isinstance(delta, bool) or not isinstance(delta, (int, float))):
                raise DataError(f"baseline '{baseline}' has no number under 'delta_m' (got {delta!r}): made by "
                                "mtl baseline? Remove it, or run mtl baseline again")
        out[run_dir] = {"tasks": primary_metrics(summary), "delta_m": delta}
    return out


def direction(higher_is_better) -> str:
    """``higher is better`` / ``lower is better`` (a summary without the flag: ``direction unknown``)."""
    if higher_is_better is None:
        return "direction unknown"
    return "higher is better" if higher_is_better else "lower is better"


def metric_label(metric, higher_is_better) -> str:
    """``accuracy ↑ (higher is better)``: a primary metric with its direction."""
    arrow = {True: "↑ ", False: "↓ "}.get(higher_is_better, "")
    return f"{metric} {arrow}({direction(higher_is_better)})"


def comparison_rows(runs: dict) -> List[tuple]:
    """One row per (task, primary metric, direction) found in any run: ``(task, metric, higher_is_better,
    {run: value})``. Runs whose task has another primary metric (a classification run and a regression run of the
    same task name) get rows of their own, so a value is never shown under another metric's name."""
    rows = {}
    for name, run in runs.items():
        for task, info in run["tasks"].items():
            key = (task, info["metric"], info["higher_is_better"])
            rows.setdefault(key, {})[name] = info["value"]
    tasks = list(dict.fromkeys(task for task, _, _ in rows))  # a task's rows together, in first-seen order
    return [(task, metric, higher, values) for (task, metric, higher), values
            in sorted(rows.items(), key=lambda item: tasks.index(item[0][0]))]


def compare_table(runs: dict) -> str:
    """Runs side by side: one row per (task, primary metric with its direction), one column per run, Δm last."""
    names = list(runs)
    rows = [[task, metric_label(metric, higher)] + [_fmt(values.get(n), metric=metric) for n in names]
            for task, metric, higher, values in comparison_rows(runs)]
    rows.append(["Δm %", "vs single-task"] + [_fmt(runs[n]["delta_m"], "+.2f") for n in names])
    headers = ["task", "primary metric"] + list(run_names(names).values())
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def run_names(run_dirs: List[str]) -> Dict[str, str]:
    """``{run_dir: name}``: each run's folder name, with as many parent folders as it takes to tell the runs apart
    (``a/run1`` and ``b/run1``, not two columns called ``run1``)."""
    parts = {d: os.path.abspath(os.path.normpath(d)).strip(os.sep).split(os.sep) for d in run_dirs}
    depth = 1
    while len({tuple(p[-depth:]) for p in parts.values()}) < len(parts) and depth < max(map(len, parts.values())):
        depth += 1
    return {d: os.path.join(*p[-depth:]) if p != [""] else os.sep for d, p in parts.items()}


TICK_CHARS = 14  # a run's name is wrapped to lines of this many characters under its bar (8 pt: ~0.85 in)
BAR_INCHES = 1.1  # width per bar: a wrapped name never reaches its neighbour's


def _tick_label(name: str) -> str:
    """A run's name (:func:`run_names`) wrapped to lines of at most ``TICK_CHARS`` (after ``_``, ``-`` and ``/`` where
    it can), for the tick under its bar."""
    import re

    lines = [""]
    for piece in re.split(r"(?<=[-_/])", name):
        while piece:
            room = TICK_CHARS - len(lines[-1])
            if len(piece) <= room:
                lines[-1], piece = lines[-1] + piece, ""
            elif lines[-1] and len(piece) <= TICK_CHARS:
                lines.append("")
            else:
                lines[-1], piece = lines[-1] + piece[:room], piece[room:]
                lines.append("")
    return "\n".join(line for line in lines if line)


def comparison_figure(runs: dict):
    """A matplotlib Figure: one panel per row of :func:`comparison_rows` (its own y axis around its values: metrics
    differ in scale and direction), titled with the task, the y axis named by the metric and its direction, one bar
    per run that has the metric, its value written on it (Δm in the run's tick label where known)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, names = comparison_rows(runs), list(runs)
    labels = run_names(names)
    cols = max(1, min(len(rows), 3))
    lines = max(1, -(-len(rows) // cols))
    fig = Figure(figsize=(cols * max(4.0, 1.0 + BAR_INCHES * len(names)), 3.6 * lines))
    FigureCanvasAgg(fig)
    for i, (task, metric, higher, values) in enumerate(rows):
        ax = fig.add_subplot(lines, cols, i + 1)
        present = [n for n in names if values.get(n) is not None]
        bars = ax.bar(range(len(present)), [values[n] for n in present],
                      color=[f"C{names.index(n)}" for n in present])
        ax.bar_label(bars, labels=[_fmt(values[n], metric=metric) for n in present], fontsize=8, padding=2)
        _zoom(ax, [values[n] for n in present])
        ax.set_xticks(range(len(present)))
        ax.set_xticklabels([_tick_label(labels[n]) + ("" if runs[n]["delta_m"] is None else
                                              f"\n(Δm {runs[n]['delta_m']:+.2f} %)") for n in present], fontsize=8)
        ax.set_title(task)
        ax.set_ylabel(f"{metric} ({direction(higher)})")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _zoom(ax, values):
    """The y range of a panel around its values (not from 0): runs at 0.862 and 0.865 would be bars of one height.
    The values are written on the bars, so the cut axis misleads nobody."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    pad = (high - low) or abs(high) * 0.05 or 1.0
    ax.set_ylim(low - pad, high + pad / 2)


def plot_comparison(runs: dict, path: str):
    """Bar chart PNG of :func:`comparison_figure`: each task's primary metric per run, one panel per metric."""
    comparison_figure(runs).savefig(path, dpi=100)
