"""A checkpoint written by W processes, read by W' processes: head shards re-split by class range.

What is per rank in a checkpoint and how it moves (``mtl/store/checkpoint.py`` has the layout):

* class-sharded head weights (``heads/<task>.shard<k>of<W>.pdparams``, also ``.averaged``): concatenated along the
  class axis in rank order (the full ``[C, ...]`` arrays), then cut again with the balanced split
  ``C_k = C // W' + (k < C % W')`` (``mtl.parallel.distributed.shard_range``);
* optimizer state (``optimizer.rank<k>.pdopt``): the accumulators of sharded parameters (momentum velocities, Adam
  moments, Partial FC's row velocities, moments and per-row step counts) the same way; per-parameter scalars
  (``*_pow_acc``), the learning-rate schedule and everything of replicated parameters come from rank 0 (they are
  equal on every rank);
* averager sums (``averager.rank<k>.pdparams``): sums of sharded tensors re-split, counters and replicated sums
  from rank 0;
* random state (``rng.rank<k>.pdparams``): rank k keeps rank k's when it existed; a new rank keeps the stream the
  trainer seeded from (seed, rank), so dropout masks then differ from an uninterrupted run (nothing else does).

Each new rank reads only what it needs: the files of the saved ranks whose class ranges overlap its own (plus rank
0's for the replicated state), one file at a time, keeping only the overlapping rows; at a 1M-class head re-split
from 4 processes to 2, a rank holds two of the four shards' rows instead of all four files at once
(``bench/bench_reshard_memory.py`` measures the peak).
"""
import os
import re

import numpy as np

from mtl.core.arrays import to_numpy
from mtl.core.errors import ConfigError, DataError
from mtl.core.safe_pickle import load_paddle_file

# Paddle is imported inside the functions: this module adds `mtl checkpoint` to the CLI, which must not start Paddle
# before the console is configured (mtl.core.console.configure_console).

_SHARD_FILE = re.compile(r"^(?P<task>.+)\.shard(?P<rank>\d+)of(?P<world>\d+)(?P<suffix>(\.averaged)?\.pdparams)$")
_SCALAR_ACCUMULATORS = ("pow_acc",)


def sharded_tasks(path):
    """``{task: saved world size}`` of the class-sharded heads of a checkpoint (from its file names)."""
    found = {}
    folder = os.path.join(path, "heads")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        m = _SHARD_FILE.match(name)
        if m:
            found[m.group("task")] = int(m.group("world"))
    return found


def _is_sharded_key(key, tasks):
    """True for a structured name (``heads.<task>.<param>[::accumulator]``) of a sharded head's per-row tensor."""
    if not isinstance(key, str) or not key.startswith("heads."):
        return False
    task = key[len("heads."):].split(".", 1)[0]
    return task in tasks and not any(s in key for s in _SCALAR_ACCUMULATORS)


def merge_rows(parts):
    """Concatenate per-rank row blocks (rank order) into the full array; empty shards contribute nothing."""
    arrays = [to_numpy(p) for p in parts if p is not None]
    return np.concatenate(arrays, axis=0) if arrays else None


def split_rows(full, world, rank):
    """Rank ``rank``'s block of a full ``[C, ...]`` array under the balanced split over ``world`` ranks."""
    from mtl.parallel.distributed import shard_range

    start, count = shard_range(full.shape[0], world, rank)
    return full[start:start + count]


def _overlap(total, saved_world, k, world, rank):
    """Rows ``[lo, hi)`` of saved rank ``k``'s block (in its own indices) that belong to ``rank`` of ``world``; an
    empty range when none do."""
    from mtl.parallel.distributed import shard_range

    start, count = shard_range(total, saved_world, k)
    mine, size = shard_range(total, world, rank)
    lo, hi = max(start, mine), min(start + count, mine + size)
    return (lo - start, hi - start) if hi > lo else (0, 0)


def needed_ranks(totals, saved_world, world, rank):
    """The saved ranks whose files rank ``rank`` reads: those holding any of its rows of any sharded head, and 0."""
    ranks = {0}
    for total in totals.values():
        ranks.update(k for k in range(saved_world) if _overlap(total, saved_world, k, world, rank)[1] > 0)
    return sorted(ranks)


def _rows(value, lo, hi):
    """Rows ``[lo, hi)`` of a loaded array, copied when they are part of it (a view would keep the whole file's
    array alive)."""
    array = to_numpy(value)
    return array if (lo, hi) == (0, array.shape[0]) else array[lo:hi].copy()


def _task_of(key):
    return key[len("heads."):].split(".", 1)[0]


def _gather(out, state, totals, saved_world, k, world, rank):
    """Add what saved rank ``k``'s ``state`` holds for ``rank`` to ``out``: the overlapping rows of every sharded
    key (a list of row blocks, in saved-rank order), and rank 0's replicated entries."""
    for key, value in state.items():
        if isinstance(value, dict):
            _gather(out.setdefault(key, {}), value, totals, saved_world, k, world, rank)
        elif _is_sharded_key(key, totals):
            lo, hi = _overlap(totals[_task_of(key)], saved_world, k, world, rank)
            out.setdefault(key, []).append(_rows(value, lo, hi))
        elif k == 0:
            out[key] = value


def _joined(out, drop_empty):
    """The gathered row blocks concatenated (keys whose block is empty left out with ``drop_empty``: an empty shard
    is not tracked by the averager)."""
    result = {}
    for key, value in out.items():
        if isinstance(value, dict):
            result[key] = _joined(value, drop_empty)
        elif isinstance(value, list):
            block = np.concatenate(value, axis=0)
            if block.shape[0] or not drop_empty:
                result[key] = block
        else:
            result[key] = value
    return result


def _stream(path, pattern, totals, saved_world, world, rank, drop_empty=False):
    """One rank's dict from the saved ranks' files ``pattern`` (``{rank}`` in it), reading only the needed ones, one
    at a time; None when a needed file is missing."""
    out = {}
    for k in needed_ranks(totals, saved_world, world, rank):
        file = os.path.join(path, pattern.format(rank=k))
        if not os.path.isfile(file):
            return None
        _gather(out, load_paddle_file(file), totals, saved_world, k, world, rank)
    return _joined(out, drop_empty)


def head_rows(path, task, saved_world, averaged=False):
    """The row count of every saved shard of a head, reading one shard file at a time (for a checkpoint whose class
    count is not otherwise known)."""
    suffix = ".averaged.pdparams" if averaged else ".pdparams"
    rows = []
    for k in range(saved_world):
        file = os.path.join(path, "heads", f"{task}.shard{k}of{saved_world}{suffix}")
        if not os.path.isfile(file):
            raise ConfigError(f"checkpoint '{path}' lacks shard {k} of task '{task}' written by {saved_world} "
                              "processes")
        rows.append(int(to_numpy(next(iter(load_paddle_file(file).values()))).shape[0]))
    return rows


def class_totals(path, classes=None):
    """``{task: class count}`` of the sharded heads of a checkpoint (``classes`` where the caller knows them, else
    read from the shards' row counts)."""
    found = sharded_tasks(path)
    classes = dict(classes or {})
    return {task: int(classes[task]) if task in classes else sum(head_rows(path, task, saved))
            for task, saved in found.items()}


def head_state(path, task, saved_world, world, rank, averaged=False, total=None):
    """A sharded head's state for ``rank`` of ``world`` from the shards of ``saved_world`` ranks: only the shards
    holding its rows are read (``total``: the head's class count, when known)."""
    suffix = ".averaged.pdparams" if averaged else ".pdparams"
    totals = {task: total if total is not None else sum(head_rows(path, task, saved_world, averaged))}
    state = {}
    needed = [k for k in range(saved_world) if _overlap(totals[task], saved_world, k, world, rank)[1] > 0]
    for k in needed or [0]:  # a rank with no class still gets every key, with no row
        lo, hi = _overlap(totals[task], saved_world, k, world, rank)
        file = os.path.join(path, "heads", f"{task}.shard{k}of{saved_world}{suffix}")
        if not os.path.isfile(file):
            raise ConfigError(f"checkpoint '{path}' lacks a shard of task '{task}' written by {saved_world} "
                              "processes")
        for key, value in load_paddle_file(file).items():
            state.setdefault(key, []).append(_rows(value, lo, hi))
    return {key: np.concatenate(blocks, axis=0) for key, blocks in state.items()}


def rank_state(path, saved_world, world, rank, classes=None):
    """``{"optimizer", "averager", "rng"}`` of ``rank`` of ``world`` from a checkpoint of ``saved_world`` ranks
    (``averager`` / ``rng`` None when the checkpoint has none for this rank); ``classes``: ``{task: class count}`` of
    the sharded heads when the caller knows them."""
    if saved_world == world:
        def own(name):
            file = os.path.join(path, name.format(rank=rank))
            return load_paddle_file(file) if os.path.isfile(file) else None

        return {"optimizer": own("optimizer.rank{rank}.pdopt"), "averager": own("averager.rank{rank}.pdparams"),
                "rng": own("rng.rank{rank}.pdparams")}
    totals = class_totals(path, classes)
    optimizer = _stream(path, "optimizer.rank{rank}.pdopt", totals, saved_world, world, rank)
    if optimizer is None:
        raise ConfigError(f"checkpoint '{path}' lacks an optimizer file of its {saved_world} processes")
    averager = _stream(path, "averager.rank{rank}.pdparams", totals, saved_world, world, rank, drop_empty=True)
    rng = os.path.join(path, f"rng.rank{rank}.pdparams")
    return {"optimizer": optimizer, "averager": averager,
            "rng": load_paddle_file(rng) if rank < saved_world and os.path.isfile(rng) else None}


def checkpoint_state(path):
    """``state.json`` of the checkpoint ``path``, its ``step`` and ``world_size`` checked (a DataError names the file
    and what is wrong)."""
    from mtl.store import integrity

    state, problem = integrity.read_state(path)
    if problem:
        raise DataError(f"checkpoint '{path}': {problem}")
    for key in ("step", "world_size"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "world_size" else 0):
            raise DataError(f"checkpoint '{path}': {integrity.STATE_FILE} key '{key}' must be a "
                            f"{'positive' if key == 'world_size' else 'non-negative'} whole number, got {value!r}")
    return state


def reshard(path, world, out):
    """Write the checkpoint ``path`` again for ``world`` processes into the new folder ``out`` (1 merges). The files
    are written into a temporary folder beside ``out``, renamed to ``out`` once complete; on any failure it is
    removed, so ``out`` is the whole checkpoint or nothing."""
    from mtl.core.staging import staged_folder

    state = checkpoint_state(path)
    if os.path.exists(out):
        raise ConfigError(f"'{out}' exists; reshard writes a new checkpoint folder")
    with staged_folder(out) as partial:
        _write_resharded(path, state, world, partial)
    return out


def _write_resharded(path, state, world, out):
    """The new checkpoint's files in ``out`` (see :func:`reshard`)."""
    import shutil

    import paddle

    from mtl.store import integrity

    saved = state["world_size"]
    totals = class_totals(path)
    shutil.copytree(path, out, ignore=lambda folder, names: [n for n in names if _per_rank(n)], dirs_exist_ok=True)
    for rank in range(world):
        for task in totals:
            for averaged in (False, True):
                suffix = ".averaged.pdparams" if averaged else ".pdparams"
                if os.path.isfile(os.path.join(path, "heads", f"{task}.shard0of{saved}{suffix}")):
                    paddle.save(head_state(path, task, saved, world, rank, averaged, totals[task]),
                                os.path.join(out, "heads", f"{task}.shard{rank}of{world}{suffix}"))
        for kind, value in rank_state(path, saved, world, rank, totals).items():
            if value is not None:
                name = {"optimizer": "optimizer.rank{}.pdopt", "averager": "averager.rank{}.pdparams",
                        "rng": "rng.rank{}.pdparams"}[kind].format(rank)
                paddle.save(value, os.path.join(out, name))
    _write_statistics(path, out, world)
    state = {**state, "world_size": world}
    state.pop("files", None)
    os.remove(os.path.join(out, integrity.STATE_FILE))  # written again with the new files' checksums
    integrity.write_state(out, state)


def _write_statistics(path, out, world):
    """Every new rank's own BatchNorm statistics: the averaged ones of the backbone file (what a rank of another
    process count starts from), under the names the source's ``statistics.rank0`` holds (none in older
    checkpoints)."""
    import paddle

    source = os.path.join(path, "statistics.rank0.pdparams")
    if not os.path.isfile(source):
        return
    from mtl.parallel.sync_bn import ARCHITECTURE_STATISTIC as prefix

    backbone = load_paddle_file(os.path.join(path, "backbone.pdparams"))
    names = list(load_paddle_file(source))
    architecture = (load_paddle_file(os.path.join(path, "architecture.pdparams"))
                    if any(n.startswith(prefix) for n in names) else {})
    averaged = {name: architecture[name[len(prefix):]] if name.startswith(prefix) else backbone[name]
                for name in names}
    for rank in range(world):
        paddle.save(averaged, os.path.join(out, f"statistics.rank{rank}.pdparams"))


def _per_rank(name):
    """Files that belong to one rank (written again by :func:`reshard`; at another process count every rank's own
    BatchNorm statistics are the averaged ones of the backbone file)."""
    return bool(_SHARD_FILE.match(name)) or bool(re.match(r"^(optimizer|averager|rng|statistics)\.rank\d+\.", name))


def describe(path):
    """Rows (what, detail) saying what a checkpoint holds: step, process count, heads, optimizer, averager."""
    import json

    state = checkpoint_state(path)
    rows = [("step", state["step"]), ("written by", f"{state['world_size']} process(es)")]
    backbone = load_paddle_file(os.path.join(path, "backbone.pdparams"), "backbone weights")
    rows.append(("backbone", f"{len(backbone)} tensors, {sum(int(np.size(v)) for v in backbone.values()):,} values"))
    for task, saved in sorted(sharded_tasks(path).items()):
        parts = [load_paddle_file(os.path.join(path, "heads", f"{task}.shard{k}of{saved}.pdparams"))
                 for k in range(saved)]
        shapes = {k: list(merge_rows([p[k] for p in parts]).shape) for k in parts[0]}
        rows.append((f"head {task}", f"sharded over {saved}: " + ", ".join(f"{k} {v}" for k, v in shapes.items())))
    for name in sorted(os.listdir(os.path.join(path, "heads"))):
        if not _SHARD_FILE.match(name):
            rows.append((f"head {name.split('.')[0]}", f"replicated ({name})"))
    optimizer = load_paddle_file(os.path.join(path, "optimizer.rank0.pdopt"))
    rows.append(("optimizer", f"{len(optimizer)} entries on rank 0 (row-sparse state: "
                              f"{sum(1 for k in optimizer if '::sparse_' in str(k))})"))
    rows.append(("averager", "yes" if os.path.isfile(os.path.join(path, "averager.rank0.pdparams")) else "no"))
    rows.extend((key, json.dumps(state[key])) for key in ("weighting", "nonfinite") if key in state)
    return rows
