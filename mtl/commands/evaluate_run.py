"""``mtl eval RUN_DIR`` without ``--sets``: the run's own held-out data scored again, as the run scored it at its
end: every task's evaluation split (held-out images, or held-out people by verification) and its ``eval.sets``,
with the checkpoint's averaged weights (``--weights``) in one process. Writes ``eval_run.json``."""
import json
import os

from mtl.core.errors import ConfigError


def evaluate_run(path, weights="auto", out_dir=None, console=print, trust_plugins=False) -> dict:
    """``{task: {metric: value}}`` of the run ``path`` on its own evaluation data; a table on ``console``."""
    from mtl.evaluation.evaluator import Evaluator
    from mtl.serving.inference import open_run
    from mtl.train.job import build_job

    if not os.path.isfile(os.path.join(path, "job.json")):
        what = "an export" if os.path.isfile(os.path.join(path, "export.json")) else "not a training run"
        raise ConfigError(f"'{path}' is {what}: it holds no data of its own to score, so mtl eval needs --sets FILE "
                          "... (verification sets) or --ijb ROOT (IJB-B/C); a run folder is scored on its own "
                          "evaluation data without them")
    run = open_run(path, None, weights, trust_plugins)
    job = build_job(run.job_config(), announce_plan=False)
    run.load_into(job.backbone)
    run.load_architecture_into(job.model.architecture)  # its own layers: towers, experts, backbone copies
    run.load_heads_into(job.model.heads)
    scored = [t.name for t in job.tasks if t.cfg["eval"]["enabled"]]
    if not scored:
        raise ConfigError(f"run '{path}' evaluates none of its tasks (eval: null); give --sets FILE ...")
    out_dir = out_dir or path
    os.makedirs(out_dir, exist_ok=True)
    console(f"evaluating {run.description}, step {run.step}, on the run's own evaluation data ({', '.join(scored)})")
    results = Evaluator(job, out_dir).evaluate()
    with open(os.path.join(out_dir, "eval_run.json"), "w") as f:
        json.dump({"model": run.description, "step": run.step, "tasks": results}, f, indent=1)
    console(results_table(job, results))
    console(f"results in {os.path.join(out_dir, 'eval_run.json')}")
    return results


def results_table(job, results) -> str:
    """One row per (task, metric), the task's primary metric first (marked ``*`` with its direction)."""
    from tabulate import tabulate

    from mtl.train.reporting import format_value

    rows = []
    for task in job.tasks:
        metrics, head = results.get(task.name) or {}, task.head
        arrow = " ↑" if head.higher_is_better else " ↓"
        for i, name in enumerate(sorted(metrics, key=lambda k: (k != head.primary_metric, k))):
            shown = f"{name} *{arrow}" if name == head.primary_metric else name
            rows.append([task.name if i == 0 else "", head.registered_name if i == 0 else "", shown,
                         format_value(metrics[name], name)])
    return tabulate(rows, headers=["task", "head", "metric", "value"], tablefmt="github", disable_numparse=True)
