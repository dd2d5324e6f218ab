"""What a run folder holds and where: its checkpoint folders and the weight files inside one.

``output_dir/checkpoints/step_N/`` (written by :mod:`mtl.store.checkpoint`) holds ``backbone.pdparams`` and the
replicated heads (``heads/<task>.pdparams``), one file per head shard ``heads/<task>.shard<k>of<W>.pdparams``, the
averaged weights beside them (``.averaged.pdparams``), the per-rank training state and ``state.json`` with the
SHA-256 of every file (:mod:`mtl.store.integrity`). Training (resume) and inference (``mtl.serving.inference``) both
find checkpoints and head files here; only training reads the training state.
"""
import logging
import os
import re
import sys

import numpy as np

from mtl.core.errors import ConfigError
from mtl.core.safe_pickle import load_paddle_file
from mtl.store import integrity

log = logging.getLogger("mtl")

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(output_dir):
    """The folder that holds ``step_N`` checkpoints."""
    return os.path.join(output_dir, "checkpoints")


def list_checkpoints(output_dir):
    """Complete checkpoints as (step, path), oldest first."""
    root = checkpoint_root(output_dir)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(root, name, "state.json")):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def report_damaged(message):
    """Say in one line (stderr and the log) that a checkpoint is damaged and which one is used. Under a strategy
    only rank 0 reads the checkpoints (:func:`latest_checkpoint`), so only rank 0 says it."""
    log.warning(message)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def damaged_checkpoints(output_dir):
    """``[(path, problem)]`` of every complete checkpoint folder whose files do not match their manifest, newest
    first (empty when every one verifies)."""
    return [(path, problem) for _, path in reversed(list_checkpoints(output_dir))
            for problem in [integrity.verify(path)] if problem]


def newest_verified(output_dir, report=report_damaged):
    """Path of the newest checkpoint whose files match their checksums, or None; the newest damaged one newer than
    it is reported (which one, why, and which one is used instead).

    Only the caller's own process reads the files (see :func:`latest_checkpoint` for the collective form).
    """
    found = list_checkpoints(output_dir)
    for i in range(len(found) - 1, -1, -1):
        path = found[i][1]
        problem = integrity.verify(path)
        if not problem:
            return path
        older = next((p for _, p in reversed(found[:i]) if not integrity.verify(p)), None)
        report(f"checkpoint '{path}' is damaged ({problem}); " +
               (f"using '{older}' instead" if older else "no older checkpoint verifies"))
        return older
    return None


def latest_checkpoint(output_dir, report=report_damaged, strategy=None):
    """Path of the newest complete checkpoint that verifies, or None.

    With a ``strategy`` (:class:`mtl.parallel.strategy.ParallelStrategy`; every rank must call it) rank 0 reads and
    verifies the files and every rank gets its answer, so that all ranks load the same step; without one (tools that
    read a finished run) this process reads the files itself.
    """
    if strategy is None:
        return newest_verified(output_dir, report)
    return strategy.from_main(newest_verified(output_dir, report) if strategy.is_main else None)


def head_file(task, head, rank, world):
    if head.sharded:
        return os.path.join("heads", f"{task}.shard{rank}of{world}.pdparams")
    return os.path.join("heads", f"{task}.pdparams")


def head_files(path, task, averaged=False):
    """Weight files of one head in a checkpoint, in rank order (one file for a replicated head)."""
    suffix = ".averaged.pdparams" if averaged else ".pdparams"
    heads = os.path.join(path, "heads")
    single = os.path.join(heads, f"{task}{suffix}")
    if os.path.isfile(single):
        return [single]
    found = {}
    for name in os.listdir(heads) if os.path.isdir(heads) else []:
        m = re.match(rf"^{re.escape(task)}\.shard(\d+)of(\d+){re.escape(suffix)}$", name)
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = os.path.join(heads, name)
    if not found:
        return []
    if len(found) > 1:
        raise ConfigError(f"checkpoint '{path}' mixes head shards of several process counts for task '{task}': "
                          f"{sorted(found)}")
    world, shards = next(iter(found.items()))
    missing = sorted(set(range(world)) - set(shards))
    if missing:
        raise ConfigError(f"checkpoint '{path}' lacks shard(s) {missing} of {world} of task '{task}'"
                          f"{' (averaged weights)' if averaged else ''}: the head cannot be assembled")
    return [shards[k] for k in range(world)]


def merged_head_state(path, task, averaged=False):
    """A head's full weights from a checkpoint: shards concatenated along the class axis (axis 0), as numpy."""
    files = head_files(path, task, averaged)
    if not files:
        raise ConfigError(f"checkpoint '{path}' has no {'averaged ' if averaged else ''}weights for task '{task}'")
    states = [load_paddle_file(f) for f in files]
    return {k: np.concatenate([np.asarray(s[k]) for s in states], axis=0) for k in states[0]}
