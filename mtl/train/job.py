"""Build a job's components from its validated config: backbone, readers, heads, joint model, schedule.

Checks the field contracts of every task once, at build time, before anything trains.
"""
import copy
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import paddle

from mtl.architectures.build import build_architecture
from mtl.backbones.base import build_backbone
from mtl.config.checks import check_milestones, own_rows
from mtl.config.overrides import blame_set
from mtl.core import contracts, registry
from mtl.core.errors import ConfigError, DataError
from mtl.core.runtime import on_host_generator
from mtl.data.scheduler import build_schedule, steps_for_epochs
from mtl.data.steps import check_labels, task_seed
from mtl.optimizer.sparse import check_sparse_optimizer
from mtl.parallel import distributed, sync_bn
from mtl.train.finetune import apply_layer_decay, apply_lr_multipliers, freeze_batchnorm, freeze_parameters
from mtl.train.memory_plan import check_job_memory
from mtl.train.model import JointModel


@dataclass
class Task:
    """One task of a job: its validated config, training reader and head."""

    name: str
    cfg: dict
    reader: object
    head: paddle.nn.Layer
    ratio: float
    loss_weight: float
    eval_reader: object = None

    @property
    def source(self):
        return self.cfg["source"]

    def key(self, sub):
        """Dotted key path of ``sub`` inside this task's config (inline tasks live under ``tasks.N``)."""
        return f"{self.cfg['key']}.{sub}" if self.cfg["key"] else sub


@dataclass
class Job:
    """Everything built from a job config."""

    cfg: dict
    backbone: paddle.nn.Layer
    tasks: List[Task]
    model: JointModel
    schedule: object
    reader_context: Dict = field(default_factory=dict)

    def task(self, name) -> Task:
        """The task called ``name``."""
        return next(t for t in self.tasks if t.name == name)

    def eval_reader(self, task: Task):
        """The evaluation reader of a task (its reader config with the task's ``eval.reader`` overrides)."""
        if task.eval_reader is not None:
            return task.eval_reader
        return build_reader(task.cfg, copy.deepcopy(task.cfg["eval"]["reader"]), self.reader_context)


def reader_context(backbone) -> dict:
    """Keyword arguments offered to readers so that their samples fit the backbone (image size, channels, shape)."""
    fields = backbone.input_fields()
    ctx = {} if backbone.tokenizer is None else {"tokenizer": backbone.tokenizer}  # text: every task tokenises alike
    if fields:
        shape = fields[0].shape
        ctx["shape"] = tuple(shape)
        if len(shape) == 3 and shape[1] is not None and shape[1] == shape[2]:
            ctx["channels"] = shape[0]
            ctx["image_size"] = shape[1]
    return ctx


def build_reader(task_cfg, split_overrides=None, context=None):
    """The reader of a task; ``split_overrides`` (e.g. ``{"split": "eval"}``) are merged into its config."""
    cfg = dict(task_cfg["reader"])  # normalised and its paths resolved at load time (mtl.config)
    cfg.update(split_overrides or {})
    key = f"{task_cfg['key']}.reader" if task_cfg["key"] else "reader"
    try:
        reader = registry.build("reader", cfg, task_cfg["source"], key, **(context or {}))
    except ConfigError as exc:  # a value --set gave is named as --set's
        raise blame_set(task_cfg, exc) from None
    if len(reader) == 0:
        raise ConfigError(f"task '{task_cfg['name']}': the reader yields no samples for split "
                          f"'{cfg.get('split', 'train')}'", task_cfg["source"], key)
    return reader


def _build_backbone(cfg):
    """The job's backbone as :func:`_build_backbone_and_architecture` builds it."""
    return _build_backbone_and_architecture(cfg)[0]


def _build_backbone_and_architecture(cfg):
    """(backbone, architecture): the job's backbone (with pretrained weights, the architecture's task layers inside
    it, and synchronised BatchNorm when asked for at world > 1), its ``freeze`` prefixes frozen and, with
    ``freeze_bn``, its BatchNorm statistics; the architecture between it and the heads."""
    # drawn on the CPU's generator whatever the device: the same seed gives the same weights on CPU and GPU
    backbone = on_host_generator(lambda: build_backbone(cfg["backbone"], cfg["source"]))
    architecture = build_architecture(cfg, backbone)
    copies = architecture.backbone_copies()  # an architecture's columns get what the backbone gets
    if cfg["distributed"]["sync_bn"] and distributed.world_size() > 1:
        backbone = sync_bn.convert_sync_batchnorm(backbone)
        for copy in copies:
            sync_bn.convert_sync_batchnorm(copy)  # in place: a backbone is not itself a BatchNorm
    for layer in [backbone, *copies]:
        freeze_parameters(layer, cfg["backbone"].get("freeze") or [], cfg["source"])
        if cfg["backbone"].get("freeze_bn"):
            freeze_batchnorm(layer)
    return backbone, architecture


def _build_task(cfg, tcfg, backbone, ctx, reader, warn=True, feature_size=None) -> Task:
    """One task: its (built) reader, its head (seeded from the job seed and the task name), contracts checked;
    ``warn``: print the warnings of :func:`check_class_count` (rank 0 of a training run)."""
    name, source = tcfg["name"], tcfg["source"]
    head_key = f"{tcfg['key']}.head" if tcfg["key"] else "head"
    paddle.seed(task_seed(cfg["seed"], name))
    head_ctx = {"feature_size": feature_size or backbone.feature_size, "seed": task_seed(cfg["seed"], name)}
    sizes = reader.sizes()
    head_cls = registry.get("head", tcfg["head"]["type"], source, head_key).cls
    head_ctx.update({param: sizes[size] for param, size in head_cls.reader_sizes.items() if sizes[size] is not None})
    if head_cls.reads_people:  # who the classes of each source are: pairs by name or dataset label
        head_ctx["people"] = reader.source_people(tcfg["head"].get("label_field") or "label")
    # replicated heads are drawn on the CPU's generator (as the backbone); class-sharded ones draw with numpy
    try:
        head = registry.build("head", tcfg["head"], source, head_key, **head_ctx) if head_cls.sharded else \
            on_host_generator(lambda: registry.build("head", tcfg["head"], source, head_key, **head_ctx))
    except ConfigError as exc:  # a value --set gave is named as --set's
        raise blame_set(tcfg, exc) from None
    contracts.check_task(name, tcfg["reader"]["type"], reader.fields(), backbone.registered_name,
                         backbone.input_fields(), tcfg["head"]["type"], head.fields())
    contracts.check_output(name, backbone.registered_name, backbone.output_fields(), backbone.default_output,
                           tcfg["head"]["type"], head.reads)
    if head.ties_input_embeddings:
        head.tie_input_embeddings(backbone.input_embeddings())
    try:
        check_class_count(name, head.class_count(), reader.num_classes, source, head_key + ".num_classes", warn)
    except ConfigError as exc:  # a class count --set gave is named as --set's
        raise blame_set(tcfg, exc) from None
    if head.row_sparse:
        check_sparse_optimizer(cfg["optimizer"], f"task '{name}' ({source})", cfg["source"])
    task = Task(name, tcfg, reader, head, tcfg["ratio"], tcfg["loss_weight"])
    if tcfg["eval"]["enabled"] and tcfg["eval"]["split"]:
        task.eval_reader = _checked_eval_reader(task, ctx)
    return task


def check_class_count(task, classes, data_classes, source, key, warn=True):
    """A class head needs a class for every label of its reader: fewer classes than the reader's ``num_classes`` is a
    ConfigError (labels would fall outside the head). More is allowed, since a dataset's label space can be larger than
    the rows present (held-out identities, a published identity count over a partial download): their centres simply
    get no pull from training samples; but it is also what a typo looks like, so it prints one warning line (when
    ``warn``) naming the task, the key and both counts. A head of one class for data of one class warns too."""
    if warn and classes is not None and data_classes is not None and int(classes) == int(data_classes) == 1:
        print(f"warning: {source}: {key}: task '{task}': its training split holds one class, so its head has nothing "
              f"to tell apart and its loss is 0 from the start (are the other classes held out, or outside "
              f"reader.num_classes?)", file=sys.stderr, flush=True)
    if classes is None or data_classes is None or int(classes) == int(data_classes):
        return
    data_classes = int(data_classes)
    if classes < data_classes:
        raise ConfigError(f"task '{task}': head has num_classes {classes} but the reader's labels are "
                          f"0..{data_classes - 1} ({data_classes} classes): set num_classes to {data_classes} or "
                          f"leave it out (the reader's count is then used)", source, key)
    if warn:
        print(f"warning: {source}: {key}: task '{task}': the head has {classes} classes but the reader's labels are "
              f"0..{data_classes - 1} ({data_classes} classes), so classes {data_classes}..{classes - 1} get no "
              f"training sample (fine for a label space larger than the data, e.g. held-out identities; otherwise set "
              f"num_classes to {data_classes} or leave it out)", file=sys.stderr, flush=True)


def build_job(cfg: dict, announce_plan: bool = True) -> Job:
    """Build backbone, readers, heads, model and schedule; check contracts; return a :class:`Job`.

    ``announce_plan``: print the memory plan (training); tools that rebuild a finished run's job pass False."""
    paddle.seed(cfg["seed"])
    backbone, architecture = _build_backbone_and_architecture(cfg)
    ctx = reader_context(backbone)
    # the per-process memory plan: stop (exit 2) before the heads allocate if it does not fit
    readers = {tcfg["name"]: build_reader(tcfg, None, ctx) for tcfg in cfg["tasks"]}
    verbose = os.environ.get("MTL_VERBOSE") == "1"
    plan = check_job_memory(cfg, backbone, lambda tcfg: readers[tcfg["name"]].sizes(), announce_plan and verbose,
                            architecture)
    warn = announce_plan and distributed.rank() == 0
    tasks = [_build_task(cfg, tcfg, backbone, ctx, readers[tcfg["name"]], warn, architecture.output_size)
             for tcfg in cfg["tasks"]]
    schedule = build_schedule(cfg["schedule"], cfg["tasks"], [len(t.reader) for t in tasks], cfg["seed"],
                              cfg["source"], own_rows(cfg["tasks"]))
    model = JointModel(backbone, {t.name: t.head for t in tasks}, {t.name: t.loss_weight for t in tasks},
                       _step_hooks(cfg, tasks, architecture), architecture, schedule.row_sharing())
    apply_lr_multipliers(model, cfg["optimizer"].get("lr_mult") or {}, cfg["source"])
    apply_layer_decay(model, cfg["optimizer"].get("layer_decay", 1.0), cfg["source"])
    resolve_epochs(cfg, schedule, {t.name: len(t.reader) for t in tasks}, warn)
    if cfg["schedule"]["same_rows"]:
        check_same_inputs([t for t in tasks if schedule.shares_rows(t.name)], backbone, cfg["source"])
        if warn and schedule.own_rows:
            print(own_rows_line(schedule), flush=True)
    if warn and not verbose:
        show_large_plan(plan)
    return Job(cfg=cfg, backbone=backbone, tasks=tasks, model=model, schedule=schedule, reader_context=ctx)


def own_rows_line(schedule) -> str:
    """The start line of a ``schedule.same_rows`` job with tasks on rows of their own (what each step's backbone
    passes read)."""
    shared = schedule.row_sharing()
    own = ", ".join(f"'{t}' reads {schedule.sizes[t]} of its own" for t in schedule.own_rows)
    return (f"schedule.same_rows: {', '.join(repr(t) for t in shared)} read the same {schedule.sizes[shared[0]]} "
            f"samples a step (one backbone pass); {own} through a pass of its own (a reader that alters its inputs)")


def resolve_epochs(cfg, schedule, train_sizes, announce=False):
    """``schedule.epochs`` E of the task T = ``schedule.epochs_of`` (default: the first): set ``schedule.steps`` in
    ``cfg`` to the steps that make E passes over T's training samples (:func:`mtl.data.scheduler.steps_for_epochs`)
    and check the milestones against them; a job counted in steps is left as it is."""
    budget = cfg["schedule"]
    if budget.get("epochs") is None:
        return
    task = budget.get("epochs_of") or cfg["tasks"][0]["name"]
    budget["steps"] = steps_for_epochs(schedule, budget["epochs"], task, train_sizes[task], cfg["source"])
    check_milestones(cfg, cfg["source"])
    if announce:
        print(f"schedule.epochs {budget['epochs']:g}: {budget['steps']} steps ({budget['epochs']:g} passes over the "
              f"{train_sizes[task]} training samples of task '{task}', {schedule.rows_per_step(task):g} a step)",
              flush=True)


def planned_steps(cfg) -> int:
    """The steps the job ``cfg`` trains: ``schedule.steps``, or those its ``schedule.epochs`` make (its backbone
    and readers built for the training splits' sizes, nothing else)."""
    if cfg["schedule"].get("epochs") is None:
        return cfg["schedule"]["steps"]
    backbone = build_backbone(cfg["backbone"], cfg["source"])
    ctx = reader_context(backbone)
    sizes = {t["name"]: len(build_reader(t, None, ctx)) for t in cfg["tasks"]}
    schedule = build_schedule(cfg["schedule"], cfg["tasks"], [sizes[t["name"]] for t in cfg["tasks"]], cfg["seed"],
                              cfg["source"], own_rows(cfg["tasks"]))
    resolved = copy.deepcopy(cfg)
    resolve_epochs(resolved, schedule, sizes)
    return resolved["schedule"]["steps"]


def steps_override(cfg) -> list:
    """``["schedule.steps=N"]``: the steps of the job ``cfg`` when it is given in epochs (:func:`planned_steps`), for
    the runs a report derives from it with other tasks or sub-batches (each task alone, merged heads), which would
    otherwise count the epochs over their own first task; ``[]`` for a job given in steps."""
    return [] if cfg["schedule"].get("epochs") is None else [f"schedule.steps={planned_steps(cfg)}"]


def check_same_inputs(tasks, backbone, source, probes=3):
    """``schedule.same_rows``: the tasks' readers give the same backbone input at the first, middle and last sample
    (a reader of other inputs or another order would pair each task's label with another task's image); ConfigError
    naming the two tasks, the sample and the field. Fewer than two tasks share nothing: nothing to check."""
    if len(tasks) < 2:
        return
    first, size = tasks[0], len(tasks[0].reader)
    fields = [f.name for f in backbone.input_fields()]
    for index in sorted({0, size // 2, size - 1}):
        key = (index, 0) if first.reader.epoch_aware else index
        mine = first.reader[key]
        for task in tasks[1:]:
            theirs = task.reader[(index, 0) if task.reader.epoch_aware else index]
            for name in fields:
                if not np.array_equal(np.asarray(mine[name]), np.asarray(theirs[name])):
                    raise ConfigError(f"every task reads the same samples in each step, but at training sample "
                                      f"{index} the '{name}' of task '{task.name}' differs from that of task "
                                      f"'{first.name}': their readers must hold the same inputs in the same "
                                      f"order (the same data, split and seed)", source, "schedule.same_rows")


def _step_hooks(cfg, tasks, architecture) -> list:
    """The job model's step hooks (:class:`mtl.headkit.step_hooks.StepHook`): its cross-head negatives when on."""
    cross = _cross_negatives(cfg, tasks, architecture)
    return [] if cross is None else [cross]


def _cross_negatives(cfg, tasks, architecture):
    """The job's :class:`mtl.headkit.cross_negatives.CrossNegatives` (attached to its heads), or None when off;
    refused (before any training) under an architecture that gives each task its own embedding."""
    from mtl.headkit.cross_negatives import CrossNegatives

    spec = cfg["cross_negatives"]
    if spec["rate"] <= 0:
        return None
    if not architecture.one_embedding:
        raise ConfigError(f"cross_negatives scores a sample against the other heads' class centres, which needs one "
                          f"embedding shared by every task; the architecture '{architecture.registered_name}' gives "
                          f"each task its own (use hard, task_norm or adapters without towers, or "
                          f"cross_negatives.rate: 0)",
                          cfg["source"], "cross_negatives.rate")
    heads = {t.name: t.head for t in tasks if t.head.cross_negatives}
    people = {t.name: t.reader.class_people(t.head.label_field) for t in tasks if t.name in heads}
    cross = CrossNegatives(spec, heads, task_seed(cfg["seed"], "cross_negatives"), cfg["source"], people)
    for name in cross.tasks:
        heads[name].attach_cross_negatives(cross, name)
    return cross


PLAN_SHOWN_FROM = 1 << 30  # bytes per process from which a training run prints its memory plan (always: --verbose)


def show_large_plan(entries):
    """Print the memory plan of a job that was built (nothing failed) when it needs ``PLAN_SHOWN_FROM`` bytes or
    more per process: a small job's plan is lines of "0.0 MiB" (``--verbose`` prints every plan, before the build)."""
    from mtl.train.memory_plan import available_bytes, format_plan

    if sum(e.total for e in entries) >= PLAN_SHOWN_FROM:
        print(format_plan(entries, available_bytes(), distributed.world_size()), flush=True)


def _checked_eval_reader(task: Task, context):
    """Build the task's evaluation reader now and let the head check its labels, so that a split the head cannot
    evaluate (a typo in ``eval.reader``, one class for a verification head) fails before training. A plug-in's bug
    (:class:`mtl.core.errors.PluginError`) is not turned into a config error."""
    prefix = f"{task.cfg['key']}." if task.cfg["key"] else ""
    overrides = copy.deepcopy(task.cfg["eval"]["reader"])
    try:
        reader = build_reader(task.cfg, overrides, context)
    except (ConfigError, DataError) as exc:
        raise ConfigError(f"task '{task.name}': the evaluation reader (reader + eval.reader {overrides}) fails: "
                          f"{exc.bare_message}", task.source, prefix + "eval.reader") from None
    limit = task.cfg["eval"]["max_samples"]
    try:
        if task.head.label_field == "label":  # class labels: Reader.labels() reads them without decoding images
            labels = np.asarray(reader.labels())[:limit]
            if reader.open_set:  # held-out identities: not head classes, scored by verification pairs
                from mtl.evaluation.pairs import open_set_pairs

                open_set_pairs(labels, reader.max_positive_pairs)
            else:
                if task.head.class_count() is not None:
                    check_labels(task.name, {"label": labels}, "label", task.head.class_count(), split="evaluation")
                task.head.check_eval_labels(labels)
    except (ConfigError, DataError) as exc:  # the head's own sentence (anything else is a bug, reported as one)
        raise ConfigError(f"task '{task.name}': head '{task.head.registered_name}' cannot evaluate the evaluation "
                          f"split: {exc}; fix the split or set eval: {{split: false}}", task.source,
                          prefix + "eval") from None
    return reader
