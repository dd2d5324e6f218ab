"""The run directory between runs: refuse to overwrite, start over, resume, and keep the logs consistent.

A new run never silently mixes with an earlier one in the same ``output_dir``: it refuses when checkpoints exist
unless told ``--resume`` (continue from the latest) or ``--overwrite`` (remove them and start over). A resumed run
keeps the records up to its checkpoint and drops what the stopped run wrote after it.
"""
import json
import logging
import os
import shutil

from mtl.core.errors import ConfigError
from mtl.store import layout

LOG_FILES = ("metrics.jsonl", "eval.jsonl", "summary.json")


def check_output_dir(output_dir):
    """ConfigError naming the key when ``output_dir`` could not be created or written (a file of that name, a
    parent that is a file, a folder without write permission); creates nothing."""
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"'{output_dir}' is a file, not a folder; name a folder for the run's records",
                          key="output_dir")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"cannot create the folder '{output_dir}': '{existing}' is a file", key="output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f", so '{output_dir}' cannot be created there"
        why = "it is on a read-only filesystem" if _read_only(existing) else "no permission"
        raise ConfigError(f"the folder '{existing}' is not writable ({why}){where}", key="output_dir")


def _read_only(path) -> bool:
    """True when ``path`` lies on a filesystem mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def make_output_dir(output_dir):
    """Create ``output_dir`` (and its parents) if missing, after :func:`check_output_dir`; the folders it created,
    outermost first (for :func:`remove_created`)."""
    check_output_dir(output_dir)
    missing, path = [], os.path.abspath(output_dir)
    while not os.path.exists(path):
        missing.insert(0, path)
        path = os.path.dirname(path)
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as exc:  # a read-only disk, or the file system changed since the check
        raise ConfigError(f"cannot create the folder '{output_dir}': {exc.strerror}", key="output_dir") from None
    return missing


def open_output_dir(output_dir, resume, resume_from):
    """The run's folder before anything is built in it: a ``--resume`` naming no checkpoint
    (:func:`named_checkpoint`) is refused before anything is created, then the folder is made; the folders created."""
    if resume:
        named_checkpoint(output_dir, resume_from)
    return make_output_dir(output_dir)


def remove_created(created, output_dir, rank):
    """A run that failed before training (a --resume refused while restoring, ...): remove what it made, the folders
    ``created`` (:func:`make_output_dir`) with this rank's log in them, so that no empty run folder is left; a folder
    that holds anything else (another rank's log, the user's files) stays."""
    if not created:
        return
    logger = logging.getLogger("mtl")
    for handler in list(logger.handlers):  # the rank's log file (mtl.train.reporting.setup_logging)
        logger.removeHandler(handler)
        handler.close()
    log_file = os.path.join(output_dir, "logs", f"rank{rank}.log")
    if os.path.isfile(log_file):
        os.remove(log_file)
    for folder in [os.path.join(output_dir, "logs"), *reversed(created)]:
        try:
            os.rmdir(folder)
        except OSError:  # not empty, or gone
            pass


def read_jsonl(path):
    """Records of a JSON-lines file; a malformed line (a write cut short by a crash) and all after it are dropped."""
    records = []
    if not os.path.isfile(path):
        return records
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def write_jsonl(path, records):
    """Rewrite a JSON-lines file with ``records``."""
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def all_damaged(output_dir):
    """The sentence refusing ``--resume`` when checkpoints exist and none verifies (the newest one's problem), or
    None."""
    damaged = layout.damaged_checkpoints(output_dir)
    if not damaged or len(damaged) < len(layout.list_checkpoints(output_dir)):
        return None
    path, problem = damaged[0]
    return (f"--resume: every checkpoint under {layout.checkpoint_root(output_dir)} is damaged ({len(damaged)}; the "
            f"newest, '{path}': {problem}); nothing was started and they are left as they are: repair them, or "
            f"start again with --overwrite (which removes them)")


def refuse_or_clear(output_dir, resume, overwrite, source, strategy):
    """Before a run: ``--resume`` with ``--overwrite`` is a contradiction; a run that does not resume refuses an
    output_dir with checkpoints unless ``overwrite`` (collective: ``strategy`` holds the barriers around rank 0's
    clearing)."""
    if resume and overwrite:
        raise ConfigError("--resume continues the run in output_dir and --overwrite removes it: pass one of them",
                          source, "output_dir")
    existing = layout.list_checkpoints(output_dir)
    if not existing or resume:
        return
    if not overwrite:
        raise ConfigError(
            f"output_dir '{output_dir}' already holds checkpoints of a run (latest step {existing[-1][0]}); pass "
            f"--resume to continue it, --overwrite to start over (its checkpoints and logs are removed), or choose "
            f"another output_dir", source, "output_dir")
    strategy.barrier()
    if strategy.is_main:
        shutil.rmtree(layout.checkpoint_root(output_dir), ignore_errors=True)
        shutil.rmtree(os.path.join(output_dir, "logs"), ignore_errors=True)
    strategy.barrier()


def start_fresh(output_dir):
    """A run from step 0: remove the log files an earlier run left (rank 0)."""
    for name in LOG_FILES:
        path = os.path.join(output_dir, name)
        if os.path.isfile(path):
            os.remove(path)


def keep_until(output_dir, step):
    """A run resumed at ``step``: keep the records up to it, drop later ones and the stopped run's final evaluation.

    Returns the kept ``metrics.jsonl`` records.
    """
    metrics = [r for r in read_jsonl(os.path.join(output_dir, "metrics.jsonl"))
               if r.get("step", 0) < step or (r.get("step", 0) == step and not r.get("final"))]
    write_jsonl(os.path.join(output_dir, "metrics.jsonl"), metrics)
    evals = [r for r in read_jsonl(os.path.join(output_dir, "eval.jsonl")) if r.get("step", 0) <= step]
    write_jsonl(os.path.join(output_dir, "eval.jsonl"), evals)
    return metrics


LATEST = "latest"  # --resume without a value


def named_checkpoint(output_dir, wanted):
    """The checkpoint ``--resume STEP_OR_PATH`` names: ``latest`` (None: the newest that verifies), a step (``500``
    or ``step_500``: ``output_dir/checkpoints/step_500``) or a checkpoint folder (of this run or another run of the
    same job: a warm start); a ConfigError naming what exists otherwise."""
    if wanted in (None, LATEST):
        return None
    text = str(wanted)
    step = text[len("step_"):] if text.startswith("step_") else text
    if step.isdigit() and not os.path.isdir(text):
        path = os.path.join(layout.checkpoint_root(output_dir), f"step_{int(step)}")
    else:
        path = text
    if not os.path.isfile(os.path.join(path, "state.json")):
        have = ", ".join(f"step_{s}" for s, _ in layout.list_checkpoints(output_dir)) or "none"
        raise ConfigError(f"--resume {text}: '{path}' is not a complete checkpoint (it has no state.json); the "
                          f"checkpoints of {output_dir}: {have}")
    return path


def resumed_line(path, step, steps, written_by, world) -> str:
    """The line a resumed run starts with: the checkpoint, its step of the job's ``steps``, and the processes that
    wrote it and that continue it (class-sharded heads are re-split when they differ)."""
    processes = f"{written_by} process" + ("es" if written_by != 1 else "")
    return f"--resume: from checkpoint {path} (step {step} of {steps}), written by {processes} and continued on {world}"


def horizon_moved(before, steps, epochs=None) -> str:
    """The notice of a resume whose job trains ``steps`` steps where the run that wrote the checkpoint was to train
    ``before`` (``epochs``: the job's ``schedule.epochs``, when they set the steps)."""
    why = (f" (schedule.epochs {epochs:g} make {steps} steps now: a training split changed size)"
           if epochs is not None else "")
    return (f"--resume: the checkpoint's run was to train {before} steps, this job trains {steps}{why}; the "
            f"learning-rate schedule and the averaging follow {steps} from here")


def drop_after(output_dir, step, console=print):
    """A run resumed from an older checkpoint than its newest: remove the checkpoints after ``step`` (they belong to
    the run it replaces, and a later --resume would take them), saying which."""
    later = [(s, path) for s, path in layout.list_checkpoints(output_dir) if s > step]
    for _, path in later:
        shutil.rmtree(path, ignore_errors=True)
    if later:
        console(f"--resume from step {step}: removed the later checkpoints {', '.join(f'step_{s}' for s, _ in later)} "
                f"of the run this one replaces")
