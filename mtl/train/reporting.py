"""What a run leaves behind: ``metrics.jsonl``, ``summary.json``, the end-of-run table and ``loss_curves.png``.

A record or a log line that cannot be written (a full disk, a read-only filesystem) is not lost silently: the first
such problem is kept (:attr:`MetricsLog.problem`, :func:`log_problem`) and the trainer stops every rank on it at the
next step (exit status 74); a half-written record is cut off again, so the records before it stay intact.
``summary.json`` is written whole or not at all.
"""
import json
import logging
import math
import os
import sys

import numpy as np
from tabulate import tabulate

from mtl.core.errors import DiskError, write_problem


class RankLogHandler(logging.FileHandler):
    """The rank's log file; a line that cannot be written keeps its problem in ``problem`` (the job stops on it)
    instead of printing logging's "--- Logging error ---" traceback on the console."""

    problem = None

    def handleError(self, record):
        exc = sys.exc_info()[1]
        if self.problem is None:
            self.problem = (write_problem(self.baseFilename, exc) if isinstance(exc, OSError) else
                            f"could not write '{self.baseFilename}': {exc}")


def log_problem():
    """The first line this rank's log could not take (:class:`RankLogHandler`), or None."""
    return next((h.problem for h in logging.getLogger("mtl").handlers if isinstance(h, RankLogHandler) and h.problem),
                None)


def append_line(path, text):
    """Append ``text`` to the file ``path``; on failure the file is cut back to what it held (no half line) and the
    problem's words are returned (None when written)."""
    size = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        with open(path, "a") as f:
            f.write(text)
        return None
    except OSError as exc:
        try:
            os.truncate(path, size)
        except OSError:
            pass
        return write_problem(path, exc)


def write_whole(path, text):
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed into place); DiskError naming the
    file otherwise."""
    part = f"{path}.partial"
    try:
        with open(part, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except OSError as exc:
        if os.path.exists(part):
            os.remove(part)
        raise DiskError(write_problem(path, exc)) from exc


def setup_logging(output_dir, rank):
    """Every rank logs to ``output_dir/logs/rank<k>.log`` (the console gets only rank 0's progress and table)."""
    os.makedirs(os.path.join(output_dir, "logs"), exist_ok=True)
    logger = logging.getLogger("mtl")
    logger.setLevel(logging.INFO)
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    fh = RankLogHandler(os.path.join(output_dir, "logs", f"rank{rank}.log"))  # appends: a resumed run adds
    fh.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    logger.addHandler(fh)
    logger.propagate = False
    return logger


class MetricsLog:
    """Appends JSON records to ``metrics.jsonl`` (rank 0 only): one per training step (``loss`` ..., written out every
    ``log.every`` steps), plus one per evaluation (``eval/<task>/<metric>`` ...). They are not kept in memory (they
    grew a long run by about a kilobyte a step, bench/bench_soak.py): :attr:`records` reads them back.

    ``records``: what a resumed run keeps of the earlier file (the file itself is prepared by ``mtl.store.rundir``).
    With ``visualdl`` (the job's ``log.visualdl``) every record also goes to VisualDL (:mod:`mtl.train.scalars`)
    under ``<folder of path>/vdl``, the kept records first. ``problem``: why the first record that could not be
    written was not (nothing is written after it).
    """

    def __init__(self, path, enabled=True, records=None, visualdl=False):
        self.path, self.enabled, self.problem, self._scalars = path, enabled, None, None
        kept = list(records or [])
        if enabled and visualdl:
            from mtl.train.scalars import SCALAR_DIR, ScalarWriter

            self._scalars = ScalarWriter(os.path.join(os.path.dirname(path) or ".", SCALAR_DIR), kept)
        if enabled:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            write_whole(path, "".join(json.dumps(r) + "\n" for r in kept))

    @property
    def records(self):
        """Every record written so far (from the file; none on a rank that writes none)."""
        from mtl.store.rundir import read_jsonl

        return read_jsonl(self.path) if self.enabled else []

    def write(self, record):
        """Append one record; non-finite numbers become null, so that the file is strict JSON."""
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        if self.enabled and self.problem is None:
            self.append(self.path, record)
            if self._scalars:
                self._scalars.write(record)

    def append(self, path, record):
        """Append ``record`` to the JSON-lines file ``path`` (``metrics.jsonl``, ``eval.jsonl``), or keep why not in
        :attr:`problem`."""
        problem = append_line(path, json.dumps(record) + "\n")
        if problem and self.problem is None:
            self.problem = f"the record of step {record.get('step')} was not written: {problem}"


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4f}" if math.isfinite(v) else str(v)
    return v


def format_value(v, name=None):
    """The value ``v`` of the metric called ``name`` as the tables show it: a count (a metric that
    :data:`mtl.evaluation.metrics.COUNT_METRICS` declares one, e.g. ``verification_pairs``) whole, any other number
    with four digits whatever its value (a rate of 1 is ``1.0000``, a threshold or an RMSE of 2 is ``2.0000``)."""
    from mtl.evaluation.metrics import is_count

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    if is_count(name) and math.isfinite(v) and v == int(v):
        return str(int(v))
    return _fmt(float(v))


def metrics_table(summary_tasks):
    """A tabulate table, one row per (task, metric): live weights and, when averaging is on, averaged weights.

    The first row of a task also shows its head and its loss at the start and at the end of training (means over
    the first and last tenth of the logged steps). The task's primary metric comes first, marked with ``*``. Every
    head reports rates (accuracy, F1, LAS, ...) as fractions, text and image heads alike: the header says so.
    """
    with_avg = any(info.get("eval_averaged") for info in summary_tasks.values())
    rows = []
    for task, info in summary_tasks.items():
        live = info.get("eval") or {}
        avg = info.get("eval_averaged") or {}
        primary = info.get("primary_metric")
        arrow = {True: " ↑", False: " ↓"}.get(info.get("higher_is_better"), "")
        names = sorted(live, key=lambda k: (k != primary, k))
        loss = f"{_fmt(info.get('loss_start'))} -> {_fmt(info.get('loss_end'))}"
        if not names:
            names = [None]
        for i, name in enumerate(names):
            row = [task if i == 0 else "", info.get("head") if i == 0 else "", loss if i == 0 else "",
                   "" if name is None else (f"{name} *{arrow}" if name == primary else name),
                   "" if name is None else format_value(live[name], name)]
            if with_avg:
                row.append(format_value(avg[name], name) if name in avg else "")
            rows.append(row)
    headers = ["task", "head", "loss start -> end", "metric (rates as fractions)", "live"] + \
        (["averaged"] if with_avg else [])
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def plot_losses(records, tasks, path, smooth=0.8):
    """PNG of every task's loss against the step (raw values faint, exponentially smoothed values bold), and a
    second panel of the task weights when the records hold ``weight/<task>`` (a weighting strategy's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weighted = any(k.startswith("weight/") for r in records for k in r) and any(
        r.get(f"weight/{t}") not in (None, records[0].get(f"weight/{t}")) for r in records for t in tasks)
    fig, axes = plt.subplots(2 if weighted else 1, 1, figsize=(8.5, 6.5 if weighted else 4), squeeze=False)
    ax = axes[0, 0]
    for task in tasks:
        _plot_series(ax, [(r["step"], r[f"loss/{task}"]) for r in records if r.get(f"loss/{task}") is not None],
                     task, smooth)
    total = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    if total:
        ax.plot(*zip(*total), label="total (raw)", color="black", linewidth=0.8, alpha=0.3)
    positive = any(value > 0 for line in ax.get_lines() for value in line.get_ydata())
    _finish_axes(ax, "loss", "training loss per task", log=positive)  # no positive loss: a log axis shows nothing
    if weighted:
        for task in tasks:
            _plot_series(axes[1, 0], [(r["step"], r[f"weight/{task}"]) for r in records
                                      if r.get(f"weight/{task}") is not None], task, 0.0)
        _finish_axes(axes[1, 0], "weight", "task weights (weighting strategy)", log=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_series(ax, points, label, smooth):
    """One task's series: raw values faint, EMA-smoothed ``s_t = a s_{t-1} + (1 - a) x_t`` bold."""
    if not points:
        return
    steps, values = zip(*points)
    line, = ax.plot(steps, values, alpha=0.25 if smooth else 1.0, linewidth=0.8)
    if smooth and len(values) > 1:
        out, acc = [], values[0]
        for v in values:
            acc = smooth * acc + (1 - smooth) * v
            out.append(acc)
        ax.plot(steps, out, label=label, color=line.get_color(), linewidth=1.6)
    else:
        line.set_label(label)


def _finish_axes(ax, ylabel, title, log):
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0.0)  # beside the curves


def eval_record(step, results, prefix):
    """A metrics.jsonl record of evaluation results: ``{"step", "<prefix>/<task>/<metric>": value}``."""
    record = {"step": step}
    for task, metrics in results.items():
        for name, value in metrics.items():
            record[f"{prefix}/{task}/{name}"] = value
    return record


def _mean(values):
    return float(np.mean(values)) if values else None


def task_summary(task, records, live, averaged):
    """One task's entry of ``summary.json``: head, loss at the start and end, metrics, primary metric."""
    losses = [r[f"loss/{task.name}"] for r in records if r.get(f"loss/{task.name}") is not None]
    tenth = max(1, len(losses) // 10)
    info = {
        "head": task.cfg["head"]["type"],
        "loss_start": _mean(losses[:tenth]),
        "loss_end": _mean(losses[-tenth:]),
        "eval": live.get(task.name),
        "eval_averaged": (averaged or {}).get(task.name),
        "primary_metric": task.head.primary_metric,
        "higher_is_better": task.head.higher_is_better,
    }
    if task.reader.counts_skipped:  # readers with on_bad_sample: skip count what they skipped
        info["bad_samples"] = int(task.reader.bad_samples)
        info["skipped"] = task.reader.skipped_samples(SKIPPED_LISTED)
    return info


SKIPPED_LISTED = 10  # skipped samples named in summary.json (their count is exact)


def skipped_lines(tasks: dict) -> list:
    """A console line per task that skipped samples (``on_bad_sample: skip``): how many, and the first ones."""
    lines = []
    for name, info in tasks.items():
        if info.get("bad_samples"):
            first = "; ".join(info["skipped"][:3]) + ("; ..." if info["bad_samples"] > 3 else "")
            lines.append(f"task '{name}': {info['bad_samples']} bad sample(s) skipped (on_bad_sample: skip): {first} "
                         f"(summary.json lists the first {SKIPPED_LISTED})")
    return lines


def write_summary(job, records, live, averaged, run, output_dir, console=None, plot=True):
    """``summary.json`` (``run`` facts + one entry per task), the loss plot and, on ``console``, the table.

    Only rank 0 passes a ``console``; it alone writes files. Returns the summary dict.
    """
    records = [r for r in records if "loss" in r]
    tasks = {t.name: task_summary(t, records, live, averaged) for t in job.tasks}
    summary = dict(run, tasks=tasks)
    if console is None:
        return summary
    write_whole(os.path.join(output_dir, "summary.json"), json.dumps(summary, indent=1))
    if plot and records:
        path = os.path.join(output_dir, "loss_curves.png")
        try:
            plot_losses(records, [t.name for t in job.tasks], path)
        except OSError as exc:
            raise DiskError(write_problem(path, exc)) from exc
    console("\n" + metrics_table(tasks))
    console("(loss start / end: mean over the first / last tenth of the logged steps; * primary metric, "
            "↑ higher is better, ↓ lower is better; accuracy, F1, LAS and other rates are fractions: 0.9328 = 93.28 %)")
    for line in skipped_lines(tasks):
        console(line)
    console(f"\nresults in {output_dir} (metrics.jsonl, summary.json, loss_curves.png)")
    return summary
