"""Checks of a loaded job across its keys (components against the schedule, ``schedule.same_rows``, cross-head
negatives, the learning-rate milestones, gradient accumulation), each a ConfigError naming the key, at load time."""
import os

from mtl.config.keys import BACKBONE, resolve_milestones
from mtl.config.overrides import blame_set
from mtl.config.paths import resolve_path
from mtl.config.schema import validate
from mtl.core import registry
from mtl.core.errors import ConfigError


def check_job(job, tasks, base_dir, source):
    """Every cross-key check of a validated job and its tasks (``base_dir``: the job config's folder)."""
    _check_components(job, tasks, source)
    _check_cross_negatives(job, tasks, base_dir, source)
    check_milestones(job, source)
    _check_epochs_of(job, tasks, source)
    _check_accumulate(job, tasks, source)


def _check_component(kind, cfg, source, key):
    registry.split_cfg(kind, cfg, source, key)


def _check_components(job, tasks, source):
    """Every component (the architecture too) names a registered plug-in with parameters it accepts; the weighting
    fits the schedule."""
    from mtl.backbones.base import JOB_KEYS, constructor_config

    validate(BACKBONE, {k: v for k, v in job["backbone"].items() if k in JOB_KEYS}, source, "backbone")
    _check_component("backbone", constructor_config(job["backbone"]), source, "backbone")
    for t in tasks:
        prefix = f"{t['key']}." if t["key"] else ""
        for kind in ("reader", "head"):
            try:
                _check_component(kind, t[kind], t["source"], prefix + kind)
            except ConfigError as exc:
                raise blame_set(t, exc) from None
    _check_component("architecture", job["architecture"], source, "architecture")
    entry, _ = registry.split_cfg("weighting", job["weighting"], source, "weighting")
    # built once here (plain numpy, cheap) so that a bad hyper-parameter value fails at load time too
    registry.build("weighting", job["weighting"], source, "weighting", tasks=[t["name"] for t in tasks],
                   loss_weights=[t["loss_weight"] for t in tasks], seed=job["seed"])
    if job["schedule"]["mode"] == "sample" and not entry.cls.sample_mode:
        per_task = ", ".join(e.name for e in registry.entries("weighting") if e.cls.sample_mode)
        raise ConfigError(f"weighting '{entry.name}' needs every task in every step and cannot run with "
                          f"schedule.mode: sample (one task per step); use schedule.mode: joint, or a weighting that "
                          f"works per task ({per_task})", source, "weighting.type")
    if job["schedule"]["mode"] == "joint" and job["schedule"]["batch_size"] < len(tasks):
        raise ConfigError(
            f"joint mode needs at least one sample per task: batch_size {job['schedule']['batch_size']} "
            f"< {len(tasks)} tasks", source, "schedule.batch_size")
    if job["schedule"]["same_rows"]:
        _check_same_rows(job, tasks, source)


def _check_same_rows(job, tasks, source):
    """``schedule.same_rows``: joint mode, and the same sub-batch for every task that shares rows (a task whose
    reader alters its inputs, masked LM, keeps rows and a backbone pass of its own: :func:`own_rows`; the training
    splits' sizes are checked when the readers are built, :func:`mtl.data.scheduler.build_schedule`)."""
    from mtl.data.scheduler import JointSchedule

    schedule = job["schedule"]
    if schedule["mode"] != "joint":
        raise ConfigError("every task reads the same samples in each step: this needs schedule.mode: "
                          "joint (sample mode has one task a step)", source, "schedule.same_rows")
    own = own_rows(tasks)
    if len(own) == len(tasks) > 1:
        raise ConfigError(f"every task reads the same samples in each step, but every task's reader changes its "
                          f"inputs ({', '.join(own)}), so no two tasks can share a row: drop schedule.same_rows",
                          source, "schedule.same_rows")
    sharing = [t for t in tasks if t["name"] not in own]
    ratios = [t["ratio"] for t in tasks]
    try:
        JointSchedule([t["name"] for t in tasks], ratios, schedule["batch_size"], job["seed"], same_rows=True,
                      own_rows=own)
    except ValueError as exc:
        if len({t["ratio"] for t in sharing}) > 1:
            hint = "give every task that shares rows the same ratio" if own else "give every task the same ratio"
        elif not own:
            hint = f"make schedule.batch_size a multiple of the {len(tasks)} tasks"
        else:
            fits = [b for b in range(schedule["batch_size"] + 1, 2 * schedule["batch_size"] + len(tasks))
                    if _splits_evenly(tasks, b, own)]
            hint = "choose schedule.batch_size so that the tasks that share rows get equal sub-batches" + (
                f" (the next that does: {fits[0]})" if fits else "")
        raise ConfigError(f"{exc}: {hint}", source, "schedule.same_rows") from None
    weighting = registry.build("weighting", job["weighting"], source, "weighting", tasks=[t["name"] for t in tasks],
                               loss_weights=[t["loss_weight"] for t in tasks], seed=job["seed"])
    architecture = registry.get("architecture", job["architecture"]["type"]).cls
    if weighting.uses_representation and not architecture.shares_backbone_output:
        raise ConfigError(f"weighting '{job['weighting']['type']}' with representation: true pairs each input's "
                          f"gradients at the representation every task shares, and "
                          f"architecture '{job['architecture']['type']}' has task layers inside the backbone (or a "
                          f"column per task), so there is none: use representation: false, or an architecture that "
                          f"shares the backbone", source, "weighting.representation")


def _splits_evenly(tasks, batch_size, own) -> bool:
    """Whether ``batch_size`` gives the tasks outside ``own`` equal sub-batches."""
    from mtl.data.scheduler import JointSchedule

    try:
        JointSchedule([t["name"] for t in tasks], [t["ratio"] for t in tasks], batch_size, same_rows=True,
                      own_rows=own)
    except ValueError:
        return False
    return True


def own_rows(tasks) -> list:
    """The names of the tasks whose readers alter their inputs (``Reader.alters_inputs``: masked LM corrupts its
    texts), which keep rows of their own under ``schedule.same_rows``."""
    return [t["name"] for t in tasks if registry.get("reader", t["reader"]["type"]).cls.alters_inputs]


def _check_cross_negatives(job, tasks, base_dir, source):
    """Cross-head negatives name tasks of the job whose heads can score other heads' classes, at least two; the
    pairs file of ``mask: pairs`` exists and reads as same-person pairs (its path resolved as data paths are)."""
    cross = job["cross_negatives"]
    if cross["rate"] <= 0:
        return
    if cross["rows"] == "shared" and job["schedule"]["mode"] == "sample":
        raise ConfigError("rows: shared scores the rows each other head samples for itself in the same step, and with "
                          "schedule.mode: sample a step holds one task: use schedule.mode: joint, or rows: drawn",
                          source, "cross_negatives.rows")
    if cross["rows"] == "shared" and cross["rate"] != 1.0:
        raise ConfigError(f"rows: shared scores every row the other head scores itself at a step (its Partial FC "
                          f"sample sets the fraction): rate must be 1.0, got {cross['rate']:g} (or rows: drawn to "
                          "draw that fraction of its classes)", source, "cross_negatives.rate")
    names = [t["name"] for t in tasks]
    able = [t["name"] for t in tasks if registry.get("head", t["head"]["type"]).cls.cross_negatives]
    chosen = able if cross["tasks"] == "all" else cross["tasks"]
    for name in chosen:
        if name not in names:
            raise ConfigError(f"task '{name}' is not a task of this job ({', '.join(names)})", source,
                              "cross_negatives.tasks")
        if name not in able:
            head = next(t["head"]["type"] for t in tasks if t["name"] == name)
            raise ConfigError(f"task '{name}': head '{head}' cannot score other heads' classes as negatives (the "
                              f"margin heads can: arcface, cosface)", source, "cross_negatives.tasks")
    if len(chosen) < 2:
        raise ConfigError(f"cross-head negatives need at least two heads that can take part, the job has "
                          f"{len(chosen)} ({', '.join(chosen) or 'none'})", source, "cross_negatives.tasks")
    if cross["mask"] == "pairs":
        if not cross["pairs"]:
            raise ConfigError("mask: pairs needs the same-person JSON in cross_negatives.pairs", source,
                              "cross_negatives.pairs")
        from mtl.headkit.cross_negatives import read_pairs

        cross["pairs"] = os.path.abspath(resolve_path(cross["pairs"], base_dir))
        read_pairs(cross["pairs"], source, tasks=names)


def check_milestones(job, source):
    """The learning-rate schedule fits the job: multistep names milestones that resolve to increasing steps (with
    ``schedule.epochs`` the steps are known once the job is built, :func:`mtl.train.job.build_job` checks again; here
    integer milestones, and fractions of a long run, are checked)."""
    opt = job["optimizer"]
    if opt["decay"] != "multistep":
        return
    if not opt["milestones"]:
        raise ConfigError("decay multistep needs milestones (steps, or fractions of schedule.steps)", source,
                          "optimizer.milestones")
    try:
        resolve_milestones(opt["milestones"], job["schedule"]["steps"] or 10**9)
    except ValueError as exc:
        raise ConfigError(str(exc), source, "optimizer.milestones") from None


def _check_epochs_of(job, tasks, source):
    """``schedule.epochs_of`` names a task of the job."""
    name, names = job["schedule"]["epochs_of"], [t["name"] for t in tasks]
    if name is not None and name not in names:
        raise ConfigError(f"names the task whose passes schedule.epochs counts, but the job has no task {name!r} "
                          f"(its tasks: {', '.join(names)})", source, "schedule.epochs_of")


def _check_accumulate(job, tasks, source):
    """``schedule.accumulate`` K: every task's sub-batch of a step splits into K equal micro-batches (the process
    count is checked again at start-up, :func:`mtl.data.steps.check_divisible`)."""
    from mtl.data.scheduler import JointSchedule, SampleSchedule
    from mtl.data.steps import check_divisible

    schedule, names = job["schedule"], [t["name"] for t in tasks]
    if schedule["accumulate"] == 1:
        return
    if schedule["mode"] == "joint":
        plan = JointSchedule(names, [t["ratio"] for t in tasks], schedule["batch_size"], job["seed"])
    else:
        plan = SampleSchedule(names, [1.0 / len(names)] * len(names), schedule["batch_size"], job["seed"])
    check_divisible(plan, 1, source, schedule["accumulate"])
