"""Checkpoints: everything needed to continue exactly, written atomically.

Layout of ``output_dir/checkpoints/step_N/``: ``backbone.pdparams`` and replicated heads (rank 0), one file per head
shard ``heads/<task>.shard<k>of<W>.pdparams``, ``optimizer.rank<k>.pdopt`` (optimizer + LR state of that rank,
Partial FC row velocities included), ``averager.rank<k>.pdparams``, ``rng.rank<k>.pdparams`` (random state),
``state.json`` (step, world size, schedule); with averaging on, also the averaged weights themselves
(``backbone.averaged.pdparams``, ``heads/<task>...averaged.pdparams``) for export.
Every rank writes into ``.step_N.tmp`` and fsyncs its files; after a barrier rank 0 writes ``state.json`` with the
SHA-256 and size of every file (:mod:`mtl.store.integrity`), fsyncs the folders and renames it to ``step_N`` (a rename
is atomic), so a crash mid-save never leaves a half checkpoint; old ones beyond ``keep`` are removed. ``--resume``
verifies: a damaged newest checkpoint (truncated or altered file) is reported in one line and the newest one that
verifies is used.
"""
import json
import logging
import os
import shutil
import sys
import warnings

import paddle

from mtl.core import activity
from mtl.core.errors import ConfigError, DiskError, write_problem
from mtl.core.low_precision import portable_state, state_for
from mtl.core.safe_pickle import GeneratorRecord, generator_state, load_paddle_file
from mtl.parallel.sync_bn import ARCHITECTURE_STATISTIC
from mtl.store import integrity, layout, reshard

log = logging.getLogger("mtl")

class WriteFault(Exception):
    """Writing a file of a checkpoint failed: ``problem`` says which file and why
    (:func:`mtl.core.errors.write_problem`)."""

    def __init__(self, path, exc: OSError):
        super().__init__(write_problem(path, exc))
        self.problem = str(self)


def _save(obj, path):
    """``paddle.save`` and fsync: the file is on the disk before the checkpoint is published. An empty state (the
    BatchNorm statistics of a backbone without BatchNorm, SGD's optimizer state) is written as it is, without
    Paddle's "The input state dict is empty" warning: the file keeps the checkpoint's layout the same for every job.
    A failed write (a full disk, a read-only filesystem, ...) raises :class:`WriteFault` naming the file."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The input state dict is empty", category=UserWarning)
            paddle.save(obj, path)
        integrity.fsync_file(path)
    except OSError as exc:
        raise WriteFault(path, exc) from exc


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
            path = os.path.join(tmp, layout.head_file(task, head, rank, world))
            _save(portable_state(head.state_dict()), path.replace(".pdparams", suffix))


def _missing_shards(tmp, model, world, step):
    """Rank 0's sentence when it cannot see every rank's head shards (output_dir not shared), else None."""
    for task, head in model.heads.items():
        if head.sharded:
            missing = [k for k in range(world) if not os.path.isfile(os.path.join(tmp, layout.head_file(task, head, k,
                                                                                                 world)))]
            if missing:
                return (f"checkpoint of step {step}: rank 0 cannot see the head shards that rank(s) {missing} "
                        f"wrote for task '{task}' under '{tmp}'; with several machines, output_dir must be on "
                        f"a filesystem every machine shares")
    return None


def _prepare(tmp):
    """Rank 0: an empty ``tmp`` folder (with ``heads/``) for the files of a checkpoint."""
    shutil.rmtree(tmp, ignore_errors=True)
    for folder in (tmp, os.path.join(tmp, "heads")):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise WriteFault(folder, exc) from exc


def _publish(output_dir, tmp, final, state, keep):
    """Rank 0: write ``state.json`` with every file's checksum, fsync, rename the folder into place (atomic, then
    fsync of the parent so that the rename is durable), drop checkpoints beyond ``keep``. A checkpoint of the same
    step already there is moved aside first and back when the rename fails: it is replaced, never lost."""
    try:
        integrity.write_state(tmp, state)
    except OSError as exc:
        raise WriteFault(os.path.join(tmp, integrity.STATE_FILE), exc) from exc
    aside = f"{final}.replaced"
    if os.path.isdir(final):
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    try:
        os.replace(tmp, final)
    except OSError as exc:
        if os.path.isdir(aside):
            os.replace(aside, final)
        raise WriteFault(final, exc) from exc
    shutil.rmtree(aside, ignore_errors=True)
    integrity.fsync_dir(os.path.dirname(final))
    for _, old in [c for c in layout.list_checkpoints(output_dir) if c[0] <= state["step"]][:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _attempt(work, *args):
    """Run ``work(*args)``; None, or the words of the :class:`WriteFault` it raised."""
    try:
        work(*args)
    except WriteFault as fault:
        return fault.problem
    return None


def _write_rank_files(tmp, model, optimizer, strategy, averager):
    """Every file of this rank: its own BatchNorm statistics, the weights it holds (and their averages), its
    optimizer, averager and random states."""
    rank, world = strategy.rank, strategy.world
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


def save(output_dir, step, model, optimizer, schedule, strategy, averager=None, keep=3, extra=None):
    """Save a checkpoint of ``step`` (collective: every rank must call it; ``strategy`` holds the agreements).

    The backbone files hold BatchNorm statistics averaged over ranks (what evaluation and export use); each rank's
    own statistics go to ``statistics.rank<k>.pdparams`` too, so that a resume at the same process count continues
    exactly. ``extra``: JSON-able state equal on every rank (the task weighting's), stored in ``state.json``.

    A file that cannot be written on any rank (a full disk, a read-only filesystem, no permission, an I/O error) is
    agreed on by every rank after each stage (prepare, write, publish: the same four small collectives as the
    barriers they replace); the unfinished folder is then removed and every rank raises :class:`DiskError` naming
    the rank, the file and why: nothing of the checkpoint is kept, and the previous one stays the one ``--resume``
    continues from.
    """
    rank, world = strategy.rank, strategy.world
    root = layout.checkpoint_root(output_dir)
    final, tmp = os.path.join(root, f"step_{step}"), os.path.join(root, f".step_{step}.tmp")
    problem = _agree(strategy, _attempt(_prepare, tmp) if rank == 0 else None)
    if not problem:
        problem = _agree(strategy, _attempt(_write_rank_files, tmp, model, optimizer, strategy, averager))
    if not problem:
        missing = strategy.agree_on_error(_missing_shards(tmp, model, world, step) if rank == 0 else None)
        if missing:
            raise ConfigError(missing)
        state = {"step": int(step), "world_size": world, "schedule": schedule.state_dict(), **(extra or {})}
        problem = _agree(strategy, _attempt(_publish, output_dir, tmp, final, state, keep) if rank == 0 else None)
    if problem:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # (a read-only one stays: a hidden name, never a checkpoint)
        raise DiskError(f"the checkpoint of step {step} was not written: {problem}; nothing of it was kept")
    return final


def _agree(strategy, problem):
    """Any rank's problem (``rank k could not write ...``), the lowest rank's, on every rank; the ranks done first
    wait for the others without a collective (rank 0 writes and hashes more: gloo would give up after 30 s)."""
    with activity.collective("the agreement of the ranks on the checkpoint's files"):
        strategy.wait_for_all("the wait for every rank's checkpoint files")
        return strategy.agree_on_error(f"rank {strategy.rank} {problem}" if problem and strategy.world > 1 else
                                       problem)


def random_state() -> dict:
    """This process's random state for its checkpoint: the generators of its device (``paddle``: one per GPU of the
    machine on a GPU, the CPU's on the CPU), which device that is (``device``, ``index``) and, on a GPU, the CPU
    generator's too (``cpu``)."""
    kind, _, index = paddle.get_device().partition(":")
    state = {"device": kind, "index": int(index or 0), "paddle": _plain(paddle.get_rng_state())}
    if kind != "cpu":
        state["cpu"] = _plain(paddle.get_rng_state("cpu"))
    return state


def _plain(states):
    """Paddle's generator states as their plain state tuples (the file then holds no Paddle object)."""
    return [s.__getstate__() for s in states]


def _generators(states):
    """Paddle's ``GeneratorState`` objects of saved states: plain tuples (this module writes them), the records of
    older files (:class:`mtl.core.safe_pickle.GeneratorRecord`), or Paddle's objects themselves (a state in memory)."""
    return [s.to_paddle() if isinstance(s, GeneratorRecord) else generator_state(s) if isinstance(s, (tuple, list))
            else s for s in states]


def restore_random_state(saved: dict):
    """Restore :func:`random_state` output (or the ``{"paddle": cpu state}`` of older checkpoints); None, or the
    sentence saying why this device's generator keeps its seed: a state written on another kind of device (a CUDA
    generator's state is not the CPU's, and ``paddle.set_rng_state`` on the CPU takes one state only). The CPU
    generator is restored whenever the file has its state."""
    kind, _, index = paddle.get_device().partition(":")
    saved_kind = saved.get("device", "cpu")  # checkpoints written before the key came from CPU runs
    cpu = saved.get("cpu", saved["paddle"] if saved_kind == "cpu" else None)
    if cpu is not None:
        paddle.set_rng_state(_generators(cpu), "cpu")
    if saved_kind != kind:
        return (f"the checkpoint's random state is a {saved_kind} generator's and this process runs on {kind}: its "
                f"{kind} generator keeps the job's seed, so random draws on the device (dropout) differ from those "
                f"of the run that wrote the checkpoint")
    if kind != "cpu":
        states = paddle.get_rng_state()  # every GPU's; this process draws from its own device's only
        states[int(index or 0)] = _generators(saved["paddle"])[saved.get("index", 0)]  # the saving rank's own
        paddle.set_rng_state(states)
    return None


def _check_compatible(path, state, schedule):
    """Refuse a checkpoint of another schedule (one line saying what to do); another process count is fine."""
    if state["schedule"] != _jsonable(schedule.state_dict()):
        raise ConfigError(f"checkpoint '{path}' was written with another schedule ({state['schedule']}); resume "
                          f"with the same schedule, tasks and seed")


def _files_read(path, model, rank, world, saved_world, averager):
    """Relative paths of the files rank ``rank`` of ``world`` loads from a checkpoint of ``saved_world`` ranks (the
    ones it verifies first): its own per-rank files, or, when the shards are re-split, those of the saved ranks
    holding any of its rows (and rank 0's, for the replicated state)."""
    classes = {task: head.class_count() for task, head in model.heads.items() if head.sharded}
    ranks = [rank] if saved_world == world else reshard.needed_ranks(classes, saved_world, world, rank)
    files = ["backbone.pdparams", f"rng.rank{rank}.pdparams"] + [f"optimizer.rank{k}.pdopt" for k in ranks]
    files += ["architecture.pdparams"] if _has_architecture_state(model) else []
    if saved_world == world and os.path.isfile(os.path.join(path, f"statistics.rank{rank}.pdparams")):
        files.append(f"statistics.rank{rank}.pdparams")
    files += [layout.head_file(task, head, k, saved_world).replace(os.sep, "/") for task, head in model.heads.items()
              for k in (ranks if head.sharded else [0])]
    return files + ([f"averager.rank{k}.pdparams" for k in ranks] if averager is not None else [])


def load(path, model, optimizer, schedule, averager=None, rank=0, world=1):
    """Restore a checkpoint into the model, optimizer and averager; return its state dict (with ``step``).

    The files this rank reads are verified against the checksums of ``state.json`` first. A checkpoint of another
    process count is re-split by class range (``mtl.store.reshard``). ``rank`` / ``world``: this process among
    the job's (the parallel strategy's).
    """
    state, problem = integrity.read_state(path)
    saved_world = int(state["world_size"]) if state else world
    problem = problem or integrity.verify(path, _files_read(path, model, rank, world, saved_world, averager))
    if problem:
        raise ConfigError(f"checkpoint '{path}' is damaged: {problem}; remove it to resume from an older one")
    _check_compatible(path, state, schedule)
    weights = load_paddle_file(os.path.join(path, "backbone.pdparams"))
    own = os.path.join(path, f"statistics.rank{rank}.pdparams")
    statistics = {}
    if saved_world == world and os.path.isfile(own):  # this rank's own BatchNorm statistics (resharded: the average)
        statistics = load_paddle_file(own)
    prefix = ARCHITECTURE_STATISTIC
    # one complete state each: a partial one makes Paddle warn per parameter
    weights.update({k: v for k, v in statistics.items() if not k.startswith(prefix)})
    model.backbone.set_state_dict(state_for(model.backbone, weights))
    if _has_architecture_state(model):
        load_architecture(path, model.architecture,
                          own={k[len(prefix):]: v for k, v in statistics.items() if k.startswith(prefix)})
    for task, head in model.heads.items():
        head.set_state_dict(_head_state(path, task, head, saved_world, world, rank))
    classes = {task: head.class_count() for task, head in model.heads.items() if head.sharded}
    per_rank = reshard.rank_state(path, saved_world, world, rank, classes)
    optimizer.set_state_dict(per_rank["optimizer"])
    note = restore_random_state(per_rank["rng"]) if per_rank["rng"] is not None else None
    if note:
        log.warning(note)
        if rank == 0:
            print(f"warning: {note}", file=sys.stderr, flush=True)
    if averager is not None and per_rank["averager"] is not None:
        averager.set_state_dict(per_rank["averager"])
    return state


def load_architecture(path, architecture, averaged=False, own=None):
    """The architecture's own weights from checkpoint ``path`` (``architecture[.averaged].pdparams``); ``own``: this
    rank's own BatchNorm statistics of its backbone copies, in place of the averaged ones of the file."""
    file = os.path.join(path, "architecture.averaged.pdparams" if averaged else "architecture.pdparams")
    if not os.path.isfile(file):
        raise ConfigError(f"checkpoint '{path}' has no weights of architecture '{architecture.registered_name}' "
                          f"({file}): it was written by a job with another architecture")
    weights = load_paddle_file(file, "architecture weights")
    weights.update(own or {})
    architecture.set_state_dict(state_for(architecture, weights))


def _head_state(path, task, head, saved_world, world, rank):
    """This rank's weights of one head (a sharded head's re-split when the process count changed)."""
    if head.sharded and saved_world != world:
        return reshard.head_state(path, task, saved_world, world, rank, total=head.class_count())
    file = os.path.join(path, layout.head_file(task, head, rank, saved_world))
    if not os.path.isfile(file):
        raise ConfigError(f"checkpoint '{path}' has no weights for task '{task}' ({file})")
    return load_paddle_file(file)


def _jsonable(obj):
    return json.loads(json.dumps(obj))
