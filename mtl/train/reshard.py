"""A checkpoint written by W processes, read by W' processes: head shards re-split by class range.

What is per rank in a checkpoint and how it moves (``mtl/train/checkpoint.py`` has the layout):

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
"""
import os
import re

import numpy as np

from mtl.arrays import to_numpy
from mtl.errors import ConfigError
from mtl.safe_pickle import load_paddle_file

# Paddle is imported inside the functions: this module adds `mtl checkpoint` to the CLI, which must not start Paddle
# before the console is configured (mtl.console.configure_console).

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


def _reshard_mapping(per_rank, tasks, world, rank, drop_empty=False):
    """One rank's dict from every saved rank's dicts: sharded keys re-split, the rest from rank 0.

    A rank may lack a sharded key (an empty shard is not tracked by the averager); ``drop_empty`` leaves out keys
    whose new block is empty, for the same reason.
    """
    out = {}
    keys = list(dict.fromkeys(k for p in per_rank for k in p))
    for key in keys:
        value = next(p[key] for p in per_rank if key in p)
        if isinstance(value, dict):
            out[key] = _reshard_mapping([p.get(key, {}) for p in per_rank], tasks, world, rank, drop_empty)
        elif _is_sharded_key(key, tasks):
            block = split_rows(merge_rows([p.get(key) for p in per_rank]), world, rank)
            if block.shape[0] or not drop_empty:
                out[key] = block
        elif key in per_rank[0]:
            out[key] = per_rank[0][key]
    return out


def _load_all(path, pattern, saved_world):

    files = [os.path.join(path, pattern.format(rank=k)) for k in range(saved_world)]
    if not all(os.path.isfile(f) for f in files):
        return None
    return [load_paddle_file(f) for f in files]


def head_state(path, task, saved_world, world, rank, averaged=False):
    """A sharded head's state for ``rank`` of ``world`` from the shards of ``saved_world`` ranks."""

    suffix = ".averaged.pdparams" if averaged else ".pdparams"
    parts = _load_all(path, os.path.join("heads", f"{task}.shard{{rank}}of{saved_world}{suffix}"), saved_world)
    if parts is None:
        raise ConfigError(f"checkpoint '{path}' lacks a shard of task '{task}' written by {saved_world} processes")
    return {k: split_rows(merge_rows([p[k] for p in parts]), world, rank) for k in parts[0]}


def rank_state(path, saved_world, world, rank):
    """``{"optimizer", "averager", "rng"}`` of ``rank`` of ``world`` from a checkpoint of ``saved_world`` ranks
    (``averager`` / ``rng`` None when the checkpoint has none for this rank)."""

    tasks = set(sharded_tasks(path))
    if saved_world == world:
        def own(name):
            file = os.path.join(path, name.format(rank=rank))
            return load_paddle_file(file) if os.path.isfile(file) else None

        return {"optimizer": own("optimizer.rank{rank}.pdopt"), "averager": own("averager.rank{rank}.pdparams"),
                "rng": own("rng.rank{rank}.pdparams")}
    optimizer = _load_all(path, "optimizer.rank{rank}.pdopt", saved_world)
    if optimizer is None:
        raise ConfigError(f"checkpoint '{path}' lacks an optimizer file of its {saved_world} processes")
    averager = _load_all(path, "averager.rank{rank}.pdparams", saved_world)
    rng = os.path.join(path, f"rng.rank{rank}.pdparams")
    return {"optimizer": _reshard_mapping(optimizer, tasks, world, rank),
            "averager": _reshard_mapping(averager, tasks, world, rank, drop_empty=True) if averager else None,
            "rng": load_paddle_file(rng) if rank < saved_world and os.path.isfile(rng) else None}


def reshard(path, world, out):
    """Write the checkpoint ``path`` again for ``world`` processes into the new folder ``out`` (1 merges)."""
    import json
    import shutil

    import paddle

    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    saved = int(state["world_size"])
    if os.path.exists(out):
        raise ConfigError(f"'{out}' exists; reshard writes a new checkpoint folder")
    tasks = sharded_tasks(path)
    shutil.copytree(path, out, ignore=lambda folder, names: [n for n in names if _per_rank(n)])
    for rank in range(world):
        for task in tasks:
            for averaged in (False, True):
                suffix = ".averaged.pdparams" if averaged else ".pdparams"
                if os.path.isfile(os.path.join(path, "heads", f"{task}.shard0of{saved}{suffix}")):
                    paddle.save(head_state(path, task, saved, world, rank, averaged),
                                os.path.join(out, "heads", f"{task}.shard{rank}of{world}{suffix}"))
        for kind, value in rank_state(path, saved, world, rank).items():
            if value is not None:
                name = {"optimizer": "optimizer.rank{}.pdopt", "averager": "averager.rank{}.pdparams",
                        "rng": "rng.rank{}.pdparams"}[kind].format(rank)
                paddle.save(value, os.path.join(out, name))
    _write_statistics(path, out, world)
    from mtl.train import integrity

    state["world_size"] = world
    state.pop("files", None)
    os.remove(os.path.join(out, integrity.STATE_FILE))  # written again with the new files' checksums
    integrity.write_state(out, state)
    return out


def _write_statistics(path, out, world):
    """Every new rank's own BatchNorm statistics: the averaged ones of the backbone file (what a rank of another
    process count starts from), under the names the source's ``statistics.rank0`` holds (none in older
    checkpoints)."""
    import paddle

    source = os.path.join(path, "statistics.rank0.pdparams")
    if not os.path.isfile(source):
        return
    backbone = load_paddle_file(os.path.join(path, "backbone.pdparams"))
    averaged = {name: backbone[name] for name in load_paddle_file(source)}
    for rank in range(world):
        paddle.save(averaged, os.path.join(out, f"statistics.rank{rank}.pdparams"))


def _per_rank(name):
    """Files that belong to one rank (written again by :func:`reshard`; at another process count every rank's own
    BatchNorm statistics are the averaged ones of the backbone file)."""
    return bool(_SHARD_FILE.match(name)) or bool(re.match(r"^(optimizer|averager|rng|statistics)\.rank\d+\.", name))


def describe(path):
    """Rows (what, detail) saying what a checkpoint holds: step, process count, heads, optimizer, averager."""
    import json


    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
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
