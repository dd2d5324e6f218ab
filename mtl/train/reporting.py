"""What a run leaves behind: ``metrics.jsonl``, ``summary.json``, the end-of-run table and ``loss_curves.png``."""
import json
import logging
import math
import os

from tabulate import tabulate


def setup_logging(output_dir, rank):
    """Every rank logs to ``output_dir/logs/rank<k>.log`` (the console gets only rank 0's progress and table)."""
    os.makedirs(os.path.join(output_dir, "logs"), exist_ok=True)
    logger = logging.getLogger("mtl")
    logger.setLevel(logging.INFO)
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    fh = logging.FileHandler(os.path.join(output_dir, "logs", f"rank{rank}.log"))  # appends: a resumed run adds
    fh.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    logger.addHandler(fh)
    logger.propagate = False
    return logger


class MetricsLog:
    """Appends JSON records to ``metrics.jsonl`` (rank 0 only) and keeps them in memory: one per logged step
    (``loss`` ...), plus one per evaluation (``eval/<task>/<metric>`` ...).

    ``records``: what a resumed run keeps of the earlier file (the file itself is prepared by ``mtl.train.rundir``).
    With ``log.visualdl: true`` in the run's ``job.json`` every record also goes to VisualDL
    (:mod:`mtl.train.scalars`), the kept records first.
    """

    def __init__(self, path, enabled=True, records=None):
        self.path = path
        self.enabled = enabled
        self.records = list(records or [])
        self._scalars = None  # built on the first write, when the trainer has written job.json
        if enabled:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                for r in self.records:
                    f.write(json.dumps(r) + "\n")

    def write(self, record):
        """Append one record."""
        if self.enabled and self._scalars is None:
            from mtl.train.scalars import writer_for_run

            self._scalars = writer_for_run(os.path.dirname(self.path) or ".", self.records) or False
        self.records.append(record)
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if self._scalars:
                self._scalars.write(record)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4f}" if math.isfinite(v) else str(v)
    return v


def metrics_table(summary_tasks):
    """A tabulate table, one row per (task, metric): live weights and, when averaging is on, averaged weights.

    The first row of a task also shows its head and its loss at the start and at the end of training (means over
    the first and last tenth of the logged steps). The task's primary metric comes first, marked with ``*``.
    """
    with_avg = any(info.get("eval_averaged") for info in summary_tasks.values())
    rows = []
    for task, info in summary_tasks.items():
        live = info.get("eval") or {}
        avg = info.get("eval_averaged") or {}
        primary = info.get("primary_metric")
        names = sorted(live, key=lambda k: (k != primary, k))
        loss = f"{_fmt(info.get('loss_start'))} -> {_fmt(info.get('loss_end'))}"
        if not names:
            names = [None]
        for i, name in enumerate(names):
            row = [task if i == 0 else "", info.get("head") if i == 0 else "", loss if i == 0 else "",
                   "" if name is None else (f"{name} *" if name == primary else name),
                   "" if name is None else _fmt(live[name])]
            if with_avg:
                row.append(_fmt(avg[name]) if name in avg else "")
            rows.append(row)
    headers = ["task", "head", "loss start -> end", "metric", "live"] + (["averaged"] if with_avg else [])
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def plot_losses(records, tasks, path, smooth=0.8):
    """PNG of every task's loss against the step: raw values faint, exponentially smoothed values bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for task in tasks:
        pts = [(r["step"], r[f"loss/{task}"]) for r in records if f"loss/{task}" in r]
        if not pts:
            continue
        steps, values = zip(*pts)
        line, = ax.plot(steps, values, alpha=0.25, linewidth=0.8)
        if smooth and len(values) > 1:
            out, acc = [], values[0]
            for v in values:
                acc = smooth * acc + (1 - smooth) * v  # EMA: s_t = a s_{t-1} + (1 - a) x_t
                out.append(acc)
            values = out
        ax.plot(steps, values, label=task, color=line.get_color(), linewidth=1.6)
    total = [(r["step"], r["loss"]) for r in records if "loss" in r]
    if total:
        ax.plot(*zip(*total), label="total (raw)", color="black", linewidth=0.8, alpha=0.3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.set_title("training loss per task")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
