"""The memory plan of a job, per process, made before the heads allocate anything: a job that does not fit stops in
one line before it allocates.

Every head declares what it will hold from its options alone (``Head.planned_bytes``: weight, optimizer state,
sampled rows, logits and their gradient per step), the backbone counts its parameters, gradients and optimizer state
(``Backbone.planned_bytes``) and the averager its copies of every tracked tensor (``Averager.peak_copies``). Rank 0
prints the plan of the process with the largest shard (rank 0: the balanced split gives it the most classes) next to
the memory one process may use: host RAM (``MemAvailable`` shared by this machine's processes) on CPU, the device's
memory on GPU. A plan that does not fit stops the job before it allocates, with one line naming the largest head
and the figures (a ``ConfigError``: exit status 2), instead of the system killing it minutes later.
Not counted: the Paddle runtime itself, and the activations of backbones that do not estimate them
(``Backbone.activation_bytes``: the ViT does).
"""
from dataclasses import dataclass
from typing import Dict, List

import paddle

from mtl.core.errors import ConfigError
from mtl.parallel import distributed

OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adamw": 2}  # float copies per parameter: velocity / two moments


@dataclass
class PlanEntry:
    """What one part of the job (the backbone, a task's head, the averager) will hold in one process, by part."""

    name: str
    key: str
    parts: Dict[str, int]
    note: str = ""  # printed after the parts, e.g. "at the peak; 2 copies per parameter in steady state"
    advice: str = ""  # how to make this part smaller, with the --set command that does it (a refusal's advice)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def gib(count: int) -> str:
    """Bytes as GiB with two decimals (``'1.50 GiB'``), or MiB below 1 GiB (``'12.3 MiB'``)."""
    return f"{count / 2 ** 30:.2f} GiB" if count >= 2 ** 30 else f"{count / 2 ** 20:.1f} MiB"


def head_options(tcfg: dict, backbone, seed: int, reader_sizes, feature_size=None) -> dict:
    """The keyword arguments the head of task ``tcfg`` will be built with (``num_classes`` from the reader if
    the config does not give it: ``reader_sizes()`` is only called then; ``feature_size``: the architecture's
    output, default the backbone's)."""
    from mtl.core import registry

    options = {k: v for k, v in tcfg["head"].items() if k != "type"}
    options.update(feature_size=feature_size or backbone.feature_size, seed=seed)
    head_cls = registry.get("head", tcfg["head"]["type"]).cls
    missing = {param: size for param, size in head_cls.reader_sizes.items() if param not in options}
    if missing:
        sizes = reader_sizes()
        options.update({param: sizes[size] for param, size in missing.items() if sizes.get(size) is not None})
    return options


def backbone_parts(backbone, optimizer_slots: int, rows: int) -> Dict[str, int]:
    """The backbone's parameters, gradients and optimizer state, and the activations of a forward of ``rows``
    samples when the backbone estimates them (``Backbone.activation_bytes``)."""
    parts = dict(backbone.planned_bytes(optimizer_slots))
    activations = backbone.activation_bytes(rows)
    if activations is not None:
        parts[f"activations ({rows} rows, estimate)"] = int(activations)
    return parts


def plan_job(cfg: dict, backbone, reader_sizes, world_size: int, rank: int = 0, architecture=None) -> List[PlanEntry]:
    """The plan of process ``rank``: backbone, architecture, every head, averager. ``reader_sizes(tcfg)`` -> the
    reader's sizes. ``architecture`` (:class:`mtl.architectures.base.Architecture`, None: ``hard``): its own
    parameters count next to the backbone's (its task layers inside the backbone count as the backbone's).

    Per-step figures are those of one micro-batch (``schedule.accumulate`` K: the step's batch is read as K
    micro-batches, each through the backbone and the heads before the next): the backbone's activations for
    ``batch_size / (K W)`` rows, the heads' buffers for a sub-batch of at most ``batch_size / K`` global rows."""
    from mtl.config.averaging import averaging_options
    from mtl.core import registry
    from mtl.data.steps import task_seed
    from mtl.train.averaging.config import KINDS

    slots = OPTIMIZER_SLOTS.get(cfg["optimizer"]["type"], 2)
    accumulate = int(cfg["schedule"].get("accumulate", 1))
    micro = int(cfg["schedule"]["batch_size"]) // accumulate
    rows = max(1, micro)  # a task's sub-batch of a micro-batch is at most the micro-batch
    entries = [PlanEntry("backbone", "backbone", backbone_parts(backbone, slots, max(1, micro // world_size)))]
    if architecture is not None and any(True for _ in architecture.parameters()):
        entries.append(PlanEntry(f"architecture '{architecture.registered_name}'", "architecture",
                                 architecture.planned_bytes(slots)))
    heads_from = len(entries)
    feature_size = architecture.output_size if architecture is not None else None
    for index, tcfg in enumerate(cfg["tasks"]):
        options = head_options(tcfg, backbone, task_seed(cfg["seed"], tcfg["name"]), lambda t=tcfg: reader_sizes(t),
                               feature_size)
        head_cls = registry.get("head", tcfg["head"]["type"]).cls
        parts = head_cls.planned_bytes(options, rows, world_size, rank, slots, accumulate)
        key = f"tasks.{index}.head"  # the --set path of the job's task, inline or from a task file alike
        entries.append(PlanEntry(f"task '{tcfg['name']}' head '{tcfg['head']['type']}'", key, parts,
                                 advice=head_advice(head_cls, key, options)))
    entries += _cross_entries(cfg, backbone, reader_sizes, rows, world_size, rank)
    kind, _ = averaging_options(cfg.get("averaging"), cfg["source"])
    if kind != "none":
        tracked = sum(e.parts["parameters"] for e in entries[:heads_from]) + \
            sum(e.parts.get("weight", 0) for e in entries[heads_from:])
        copies = KINDS[kind].peak_copies
        entries.append(PlanEntry(f"averager '{kind}'", "averaging", {f"{copies} copies": copies * tracked},
                                 KINDS[kind].copies_note(), averager_advice(kind, KINDS)))
    return entries


def _cross_entries(cfg, backbone, reader_sizes, rows, world_size, rank) -> List[PlanEntry]:
    """What cross-head negatives add to each task's step (:func:`mtl.headkit.cross_negatives.planned_bytes`)."""
    from mtl.core import registry
    from mtl.data.steps import task_seed
    from mtl.headkit.cross_negatives import planned_bytes

    cross = cfg.get("cross_negatives") or {}
    if float(cross.get("rate", 0.0)) <= 0:
        return []
    classes, ratios = {}, {}
    for tcfg in cfg["tasks"]:
        if registry.get("head", tcfg["head"]["type"]).cls.cross_negatives:
            options = head_options(tcfg, backbone, task_seed(cfg["seed"], tcfg["name"]),
                                   lambda t=tcfg: reader_sizes(t))
            if options.get("num_classes"):
                classes[tcfg["name"]] = int(options["num_classes"])
                ratios[tcfg["name"]] = float(options.get("sample_ratio", 1.0))
    parts = planned_bytes(cross, classes, rows, backbone.feature_size, world_size, rank, ratios)
    smaller = ("sample fewer of the other heads' classes (a lower head sample_ratio, or cross_negatives.rows: drawn "
               "with a rate below 1)" if cross.get("rows") == "shared" else
               f"sample fewer other classes (--set cross_negatives.rate={min(0.1, float(cross['rate']) / 2):g})")
    return [PlanEntry(f"task '{task}' cross-head negatives", "cross_negatives.rate", p, advice=smaller)
            for task, p in parts.items()]


def head_advice(head_cls, key: str, options: dict) -> str:
    """How to shrink a head, as ``--set`` commands that the job accepts: a smaller ``sample_ratio`` when the head
    takes one (Partial FC), more processes when its classes are split across them (``sharded``)."""
    import inspect

    ways = []
    if "sample_ratio" in inspect.signature(head_cls.__init__).parameters:
        ratio = float(options.get("sample_ratio", 1.0))
        smaller = 0.1 if ratio > 0.1 else round(ratio / 2, 6)
        ways.append(f"set a smaller sample_ratio (--set {key}.sample_ratio={smaller:g})")
    if head_cls.sharded:
        ways.append("run more processes (its classes are split across them)")
    return " or ".join(ways) or "give the head fewer outputs (its weights are on every process)"


def averager_advice(kind: str, kinds) -> str:
    """How to shrink the averager's copies, as ``--set`` commands that the job accepts (a whole new ``averaging``
    mapping: the keys of one type are refused by another)."""
    ways = [f"--set 'averaging={{type: {other}}}' ({kinds[other].peak_copies} copies)" for other in ("ema",)
            if other != kind and kinds[other].peak_copies < kinds[kind].peak_copies]
    ways.append("--set 'averaging={type: none}'")
    if paddle.get_device().startswith("gpu"):
        ways.append("--set averaging.offload=cpu (the copies in host memory)")
    return f"keep fewer averaged copies ({' or '.join(ways)})"


def available_bytes() -> int:
    """Memory one process may use: the device's on GPU, else ``MemAvailable`` / processes on this machine."""
    if paddle.get_device().startswith("gpu"):
        return int(paddle.device.cuda.get_device_properties().total_memory)
    from mtl.core.runtime import local_process_count

    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // local_process_count()
    return 1 << 62  # no /proc: nothing to check against


def format_plan(entries: List[PlanEntry], available: int, world_size: int) -> str:
    """The plan as text: one line per entry with its parts, the total and the memory available."""
    where = "device memory" if paddle.get_device().startswith("gpu") else "host RAM"
    lines = [f"memory plan per process ({world_size} process(es), largest shard):"]
    for entry in entries:
        parts = " ".join(filter(None, [", ".join(f"{part} {gib(n)}" for part, n in entry.parts.items() if n),
                                       entry.note]))
        lines.append(f"  {entry.name}: {gib(entry.total)}" + (f" ({parts})" if parts else ""))
    total = sum(e.total for e in entries)
    lines.append(f"  total {gib(total)} of {gib(available)} {where} available to this process")
    return "\n".join(lines)


def check_job_memory(cfg: dict, backbone, reader_sizes, announce: bool = True, architecture=None):
    """Print the plan on rank 0 (if ``announce``) and raise a one-line ``ConfigError`` when it does not fit, on
    every rank alike."""
    world = distributed.world_size()
    entries = plan_job(cfg, backbone, reader_sizes, world, architecture=architecture)
    available = available_bytes()
    if distributed.is_distributed():  # the smallest figure of all ranks, so that every rank decides the same
        available = int(distributed.min_over_ranks(available))
    if announce and distributed.rank() == 0:
        print(format_plan(entries, available, world), flush=True)
    total = sum(e.total for e in entries)
    if total <= available:
        return entries
    largest = max(entries[1:] or entries, key=lambda e: e.total)
    parts = ", ".join(f"{part} {gib(n)}" for part, n in largest.parts.items() if n)
    raise ConfigError(f"{largest.name} needs {gib(largest.total)} per process ({parts}); the job needs {gib(total)}, "
                      f"more than the {gib(available)} available to each of {world} process(es); {largest.advice}",
                      cfg["source"], largest.key)
