"""Checkpoints: everything needed to continue exactly, written atomically.

Layout of ``output_dir/checkpoints/step_N/``: ``backbone.pdparams`` and replicated heads (rank 0), one file per head
shard ``heads/<task>.shard<k>of<W>.pdparams``, ``optimizer.rank<k>.pdopt`` (optimizer + LR state of that rank,
Partial FC row velocities included), ``averager.rank<k>.pdparams``, ``rng.rank<k>.pdparams`` (random state),
``state.json`` (step, world size, schedule); with averaging on, also the averaged weights themselves
(``backbone.averaged.pdparams``, ``heads/<task>...averaged.pdparams``) for export.
Every rank writes into ``.step_N.tmp`` and fsyncs its files; after a barrier rank 0 writes ``state.json`` with the
SHA-256 and size of every file (:mod:`mtl.train.integrity`), fsyncs the folders and renames it to ``step_N`` (a rename
is atomic), so a crash mid-save never leaves a half checkpoint; old ones beyond ``keep`` are removed. ``--resume``
verifies: a damaged newest checkpoint (truncated or altered file) is reported in one line and the newest one that
verifies is used.
"""
import json
import logging
import os
import re
import shutil
import sys

import numpy as np
import paddle

from mtl.errors import ConfigError
from mtl.low_precision import portable_state, state_for
from mtl.train import integrity, reshard

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


def newest_verified(output_dir, report=report_damaged):
    """Path of the newest checkpoint whose files match their checksums, or None; each damaged newer one is reported.

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


def _head_file(task, head, rank, world):
    if head.sharded:
        return os.path.join("heads", f"{task}.shard{rank}of{world}.pdparams")
    return os.path.join("heads", f"{task}.pdparams")


def _save(obj, path):
    """``paddle.save`` and fsync: the file is on the disk before the checkpoint is published."""
    paddle.save(obj, path)
    integrity.fsync_file(path)


def _has_architecture_state(model) -> bool:
    """The architecture has weights of its own (``architecture.pdparams``); ``hard`` without towers has none."""
    return len(model.architecture.state_dict()) > 0


def _write_weights(tmp, model, rank, world, suffix=".pdparams"):
    """Backbone and the architecture's own weights (rank 0), replicated heads (rank 0) and this rank's head shards
    into ``tmp``."""
    if rank == 0:  # float32 files whatever the precision (O2 keeps bfloat16 weights): export and eval read them
        _save(portable_state(model.backbone.state_dict()), os.path.join(tmp, "backbone" + suffix))
        if _has_architecture_state(model):
            _save(portable_state(model.architecture.state_dict()), os.path.join(tmp, "architecture" + suffix))
    for task, head in model.heads.items():
        if head.sharded or rank == 0:
            path = os.path.join(tmp, _head_file(task, head, rank, world))
            _save(portable_state(head.state_dict()), path.replace(".pdparams", suffix))


def _missing_shards(tmp, model, world, step):
    """Rank 0's sentence when it cannot see every rank's head shards (output_dir not shared), else None."""
    for task, head in model.heads.items():
        if head.sharded:
            missing = [k for k in range(world) if not os.path.isfile(os.path.join(tmp, _head_file(task, head, k,
                                                                                                 world)))]
            if missing:
                return (f"checkpoint of step {step}: rank 0 cannot see the head shards that rank(s) {missing} "
                        f"wrote for task '{task}' under '{tmp}'; with several machines, output_dir must be on "
                        f"a filesystem every machine shares")
    return None


def _publish(output_dir, tmp, final, state, keep):
    """Rank 0: write ``state.json`` with every file's checksum, fsync, rename the folder into place (atomic, then
    fsync of the parent so that the rename is durable), drop checkpoints beyond ``keep``."""
    integrity.write_state(tmp, state)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    integrity.fsync_dir(os.path.dirname(final))
    for _, old in [c for c in list_checkpoints(output_dir) if c[0] <= state["step"]][:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def save(output_dir, step, model, optimizer, schedule, strategy, averager=None, keep=3, extra=None):
    """Save a checkpoint of ``step`` (collective: every rank must call it; ``strategy`` holds the barriers).

    The backbone files hold BatchNorm statistics averaged over ranks (what evaluation and export use); each rank's
    own statistics go to ``statistics.rank<k>.pdparams`` too, so that a resume at the same process count continues
    exactly. ``extra``: JSON-able state equal on every rank (the task weighting's), stored in ``state.json``.
    """
    rank, world = strategy.rank, strategy.world
    root = checkpoint_root(output_dir)
    final, tmp = os.path.join(root, f"step_{step}"), os.path.join(root, f".step_{step}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "heads"), exist_ok=True)
    strategy.barrier()
    _save(dict(strategy.statistics), os.path.join(tmp, f"statistics.rank{rank}.pdparams"))  # this rank's own
    with strategy.agreed_statistics():
        _write_weights(tmp, model, rank, world)
    if averager is not None:  # the averaged weights themselves, for evaluation and export without re-deriving them
        with averager.apply(), strategy.agreed_statistics():
            _write_weights(tmp, model, rank, world, ".averaged.pdparams")
    _save(optimizer.state_dict(), os.path.join(tmp, f"optimizer.rank{rank}.pdopt"))
    if averager is not None:
        _save(averager.state_dict(), os.path.join(tmp, f"averager.rank{rank}.pdparams"))
    # random state of this rank (dropout and other random layers), so that a resumed run draws the same numbers
    _save(random_state(), os.path.join(tmp, f"rng.rank{rank}.pdparams"))
    strategy.barrier()
    problem = strategy.agree_on_error(_missing_shards(tmp, model, world, step) if rank == 0 else None)
    if problem:
        raise ConfigError(problem)
    if rank == 0:
        state = {"step": int(step), "world_size": world, "schedule": schedule.state_dict(), **(extra or {})}
        _publish(output_dir, tmp, final, state, keep)
    strategy.barrier()
    return final


def random_state() -> dict:
    """This process's random state for its checkpoint: the generators of its device (``paddle``: one per GPU of the
    machine on a GPU, the CPU's on the CPU), which device that is (``device``, ``index``) and, on a GPU, the CPU
    generator's too (``cpu``)."""
    kind, _, index = paddle.get_device().partition(":")
    state = {"device": kind, "index": int(index or 0), "paddle": paddle.get_rng_state()}
    if kind != "cpu":
        state["cpu"] = paddle.get_rng_state("cpu")
    return state


def restore_random_state(saved: dict):
    """Restore :func:`random_state` output (or the ``{"paddle": cpu state}`` of older checkpoints); None, or the
    sentence saying why this device's generator keeps its seed: a state written on another kind of device (a CUDA
    generator's state is not the CPU's, and ``paddle.set_rng_state`` on the CPU takes one state only). The CPU
    generator is restored whenever the file has its state."""
    kind, _, index = paddle.get_device().partition(":")
    saved_kind = saved.get("device", "cpu")  # checkpoints written before the key came from CPU runs
    cpu = saved.get("cpu", saved["paddle"] if saved_kind == "cpu" else None)
    if cpu is not None:
        paddle.set_rng_state(cpu, "cpu")
    if saved_kind != kind:
        return (f"the checkpoint's random state is a {saved_kind} generator's and this process runs on {kind}: its "
                f"{kind} generator keeps the job's seed, so random draws on the device (dropout) differ from those "
                f"of the run that wrote the checkpoint")
    if kind != "cpu":
        states = paddle.get_rng_state()  # every GPU's; this process draws from its own device's only
        states[int(index or 0)] = saved["paddle"][saved.get("index", 0)]  # the generator the saving rank used
        paddle.set_rng_state(states)
    return None


def _check_compatible(path, state, schedule):
    """Refuse a checkpoint of another schedule (one line saying what to do); another process count is fine."""
    if state["schedule"] != _jsonable(schedule.state_dict()):
        raise ConfigError(f"checkpoint '{path}' was written with another schedule ({state['schedule']}); resume "
                          f"with the same schedule, tasks and seed")


def _files_read(path, model, rank, world, saved_world, averager):
    """Relative paths of the files rank ``rank`` of ``world`` loads from a checkpoint of ``saved_world`` ranks (the
    ones it verifies first): its own per-rank files, or every rank's when the shards are re-split."""
    ranks = [rank] if saved_world == world else list(range(saved_world))
    files = ["backbone.pdparams", f"rng.rank{rank}.pdparams"] + [f"optimizer.rank{k}.pdopt" for k in ranks]
    files += ["architecture.pdparams"] if _has_architecture_state(model) else []
    if saved_world == world and os.path.isfile(os.path.join(path, f"statistics.rank{rank}.pdparams")):
        files.append(f"statistics.rank{rank}.pdparams")
    files += [_head_file(task, head, k, saved_world).replace(os.sep, "/") for task, head in model.heads.items()
              for k in (ranks if head.sharded else [0])]
    return files + ([f"averager.rank{k}.pdparams" for k in ranks] if averager is not None else [])


def load(path, model, optimizer, schedule, averager=None, rank=0, world=1):
    """Restore a checkpoint into the model, optimizer and averager; return its state dict (with ``step``).

    The files this rank reads are verified against the checksums of ``state.json`` first. A checkpoint of another
    process count is re-split by class range (``mtl.train.reshard``). ``rank`` / ``world``: this process among
    the job's (the parallel strategy's).
    """
    state, problem = integrity.read_state(path)
    saved_world = int(state["world_size"]) if state else world
    problem = problem or integrity.verify(path, _files_read(path, model, rank, world, saved_world, averager))
    if problem:
        raise ConfigError(f"checkpoint '{path}' is damaged: {problem}; remove it to resume from an older one")
    _check_compatible(path, state, schedule)
    model.backbone.set_state_dict(state_for(model.backbone, paddle.load(os.path.join(path, "backbone.pdparams"))))
    own = os.path.join(path, f"statistics.rank{rank}.pdparams")
    if saved_world == world and os.path.isfile(own):  # this rank's own BatchNorm statistics (resharded: the average)
        model.backbone.set_state_dict(state_for(model.backbone, paddle.load(own)))
    if _has_architecture_state(model):
        load_architecture(path, model.architecture)
    for task, head in model.heads.items():
        head.set_state_dict(_head_state(path, task, head, saved_world, world, rank))
    per_rank = reshard.rank_state(path, saved_world, world, rank)
    optimizer.set_state_dict(per_rank["optimizer"])
    note = restore_random_state(per_rank["rng"]) if per_rank["rng"] is not None else None
    if note:
        log.warning(note)
        if rank == 0:
            print(f"warning: {note}", file=sys.stderr, flush=True)
    if averager is not None and per_rank["averager"] is not None:
        averager.set_state_dict(per_rank["averager"])
    return state


def load_architecture(path, architecture, averaged=False):
    """The architecture's own weights from checkpoint ``path`` (``architecture[.averaged].pdparams``)."""
    from mtl.convert.weights import read_paddle_file

    file = os.path.join(path, "architecture.averaged.pdparams" if averaged else "architecture.pdparams")
    if not os.path.isfile(file):
        raise ConfigError(f"checkpoint '{path}' has no weights of architecture '{architecture.registered_name}' "
                          f"({file}): it was written by a job with another architecture")
    architecture.set_state_dict(state_for(architecture, read_paddle_file(file)))


def _head_state(path, task, head, saved_world, world, rank):
    """This rank's weights of one head (a sharded head's re-split when the process count changed)."""
    if head.sharded and saved_world != world:
        return reshard.head_state(path, task, saved_world, world, rank)
    file = os.path.join(path, _head_file(task, head, rank, saved_world))
    if not os.path.isfile(file):
        raise ConfigError(f"checkpoint '{path}' has no weights for task '{task}' ({file})")
    return paddle.load(file)


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
    states = [paddle.load(f) for f in files]
    return {k: np.concatenate([np.asarray(s[k].numpy() if hasattr(s[k], "numpy") else s[k]) for s in states],
                              axis=0) if len(states) > 1 else np.asarray(states[0][k].numpy())
            for k in states[0]}


def _jsonable(obj):
    return json.loads(json.dumps(obj))
