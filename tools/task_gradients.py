"""Who moves the shared backbone: each task's gradient over the backbone's parameters, on a few training steps.

    python tools/task_gradients.py CONFIG [--set KEY=VALUE ...] [--checkpoint RUN/checkpoints/step_N]
        [--steps 0 50 100 150]

For each training step named (its batch as the job reads it), the gradient of every task's weighted loss
``w_t L_t`` with respect to the shared parameters (``JointModel.shared_parameters``: the backbone's, and an
architecture's shared experts or columns), each alone: prints the norms (mean over the steps), the share of each
mean norm's square in their sum, and the mean cosine of every two tasks' gradients. The model is the job's
as built (pretrained encoder, fresh heads), or with ``--checkpoint`` the weights of a 1-process run's checkpoint
(its backbone.pdparams and heads/TASK.pdparams, read with the project's safe reader). In training mode, as a step
sees them (dropout included: ``--set backbone.dropout=0 ...`` to leave it out; Paddle's recurrent layers keep
nothing for a backward in evaluation mode).
docs/text.md's table of the MiniLM recipe comes from this.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def task_gradient_rows(model, batch, step):
    """``[T, P]`` float64: row t = the gradient of task t's weighted loss alone (the others' weights 0) over
    ``model.shared_parameters()``, through the model's own forward and backward on ``batch`` (a tied head's input
    embeddings included); every task's forward draws the same dropout masks (Paddle's generator state restored)."""
    import paddle

    params, rows, draws = model.shared_parameters(), [], paddle.get_rng_state()
    tasks = list(model.heads.keys())
    for task in tasks:
        model.clear_gradients()
        paddle.set_rng_state(draws)
        forward = model.forward(batch, step=step)
        model.backward(forward, {t: (model.loss_weights[t] if t == task else 0.0) for t in tasks})
        rows.append(np.concatenate([(np.zeros(p.shape) if p.grad is None else p.grad.numpy()).ravel()
                                    .astype(np.float64) for p in params]))
    model.clear_gradients()
    return np.stack(rows)


def task_gradients(built, steps, seed):
    """``(tasks, norms [S, T], cosines [S, T, T])`` of the job ``built`` (:func:`mtl.train.job.build_job`) at the
    training ``steps`` (:func:`task_gradient_rows` of each step's batch, in training mode)."""
    from mtl.data.steps import StepDataset
    from mtl.train.step import as_tensors

    model = built.model
    model.train()
    data = StepDataset(built.schedule, {t.name: t.reader for t in built.tasks}, seed, 0, max(steps) + 1)
    norms, cosines = [], []
    for step in steps:
        matrix = task_gradient_rows(model, as_tensors(data[step]), step)
        n = np.linalg.norm(matrix, axis=1)
        norms.append(n)
        safe = np.where(n > 0, n, 1.0)
        cosines.append(np.where(np.outer(n, n) > 0, matrix @ matrix.T / np.outer(safe, safe), np.nan))
    return list(model.heads.keys()), np.array(norms), np.array(cosines)


def load_checkpoint(model, folder):
    """The backbone's and every head's weights from a 1-process checkpoint ``folder``."""
    from mtl.core.errors import ConfigError
    from mtl.core.safe_pickle import load_paddle_file

    files = {"backbone": os.path.join(folder, "backbone.pdparams")}
    files.update({task: os.path.join(folder, "heads", f"{task}.pdparams") for task in model.heads.keys()})
    for part, path in files.items():
        if not os.path.isfile(path):
            raise ConfigError(f"checkpoint '{folder}' has no {path} (the {part} weights of a 1-process run)")
    model.backbone.set_state_dict(load_paddle_file(files.pop("backbone")))
    for task, path in files.items():
        model.heads[task].set_state_dict(load_paddle_file(path))
    if len(model.architecture.state_dict()):  # towers, gates, experts: their own file
        from mtl.store.checkpoint import load_architecture

        load_architecture(folder, model.architecture)


def report(tasks, norms, cosines) -> str:
    """Markdown: a row of mean norms (the share of each one's square in their sum) and the mean cosines."""
    mean = norms.mean(axis=0)
    share = mean ** 2 / max(float((mean ** 2).sum()), 1e-300)
    lines = ["| | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks),
             "| norm (share) | " + " | ".join(f"{m:.3g} ({100 * s:.1f} %)" for m, s in zip(mean, share)) + " |"]
    seen = np.isfinite(cosines).sum(axis=0)  # a task with no gradient at any step has no cosine
    cos = np.where(seen > 0, np.where(np.isfinite(cosines), cosines, 0.0).sum(axis=0) / np.maximum(seen, 1), np.nan)
    lines += [f"| cos {t} | " + " | ".join("-" if not np.isfinite(c) else f"{c:+.3f}" for c in row) + " |"
              for t, row in zip(tasks, cos)]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", nargs="*", default=[], help="overrides (KEY=VALUE)")
    parser.add_argument("--checkpoint", help="a 1-process run's checkpoint folder (default: the job as built)")
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 50, 100, 150])
    args = parser.parse_args(argv)
    from mtl.core.runtime import set_threads

    set_threads()  # before Paddle loads: cores, not Paddle's own 1
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    cfg = load_job(args.config, args.set)
    built = build_job(cfg, announce_plan=False)
    if args.checkpoint:
        load_checkpoint(built.model, args.checkpoint)
    print(report(*task_gradients(built, args.steps, cfg["seed"])))


if __name__ == "__main__":
    main()
