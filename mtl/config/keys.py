"""The schema of every key of a job config and of a task file: type, default, allowed values and meaning.

``JOB`` and ``TASK`` are read by the validator (:mod:`mtl.config.schema`) when a job loads, and by the configuration
reference (``docs/configuration.md``, generated from them by :mod:`mtl.config.reference`).
"""
import re

from mtl.config.schema import Opt, Section
from mtl.core.errors import ConfigError

_TASK_NAME = re.compile(r"^\w[\w-]{0,99}$")


def _task_name(value):
    """A task name is a file name of the run (``heads/<task>.pdparams``) and a metric key: letters, digits, ``_``
    and ``-`` only (a name with ``/`` or ``..`` wrote weight files outside the run folder)."""
    if not _TASK_NAME.fullmatch(value):  # not match: "$" lets a trailing newline through
        return (f"a task name may hold letters, digits, '_' and '-' (at most 100, not starting with '-'), got "
                f"{value!r}")
    return None


def _component(value):
    if isinstance(value, str):
        return None
    if not isinstance(value, dict) or "type" not in value:
        return "expected a mapping with a 'type' key naming a registered component"
    return None


def _check_milestones(value):
    """Milestones are all integers >= 1 (steps) or all numbers in (0, 1) (fractions of schedule.steps)."""
    steps = all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in value)
    fractions = all(isinstance(m, float) and 0.0 < m < 1.0 for m in value)
    if not (steps or fractions):
        return (f"expected integers >= 1 (steps) or numbers in (0, 1) (fractions of schedule.steps), not a mix, got "
                f"{value!r}")
    return None


def resolve_milestones(milestones, total_steps: int):
    """Multistep milestones as step numbers: integers as they are, fractions f in (0, 1) as round(f * steps).

    Raises ValueError (with the resolved steps) unless they increase strictly."""
    steps = [int(m) if isinstance(m, int) else int(round(float(m) * total_steps)) for m in milestones]
    if any(b <= a for a, b in zip(steps, steps[1:])) or (steps and steps[0] < 1):
        raise ValueError(f"milestones {list(milestones)} give steps {steps} of {total_steps}, which must be >= 1 and "
                         "increase strictly")
    return steps


SCHEDULE = {
    "mode": Opt(str, "joint", choices=["joint", "sample"], doc="joint: every task in every step; sample: one task"),
    "batch_size": Opt(int, 64, min=1, doc="global batch size of one optimizer step (all processes together)"),
    "accumulate": Opt(int, 1, min=1, doc="read each step's batch as this many micro-batches (gradient "
                                         "accumulation); every task's sub-batch must be a multiple of it x processes"),
    "steps": Opt(int, None, nullable=True, min=1, doc="training steps (1000 when neither steps nor epochs is given)"),
    "epochs": Opt(float, None, nullable=True, min=0.0, min_exclusive=True,
                  doc="or train this many passes over the training split of the task epochs_of: steps = ceil(epochs "
                      "x its training samples / its rows a step), set when the job is built (PaddlePALM's "
                      "num_epochs); a variant config or --set giving steps or epochs replaces the other"),
    "epochs_of": Opt(str, None, nullable=True,
                     doc="the task whose passes schedule.epochs counts (default: the first task; PALM's "
                         "sampling_reference)"),
    "same_rows": Opt(bool, False, doc="joint mode: every task reads the same samples in every step, for tasks whose "
                                      "readers hold the same inputs in the same order with a label each (one image, "
                                      "both MultiMNIST digits; LibMTL's single-input mode); needs the same sub-batch "
                                      "and training-split size for every such task; a task whose reader alters its "
                                      "inputs (masked LM) keeps a sub-batch and a backbone pass of its own"),
    "sampling": Opt(str, "ratio", choices=["ratio", "proportional", "temperature", "uniform"],
                    doc="sample mode: how the task of a step is drawn"),
    "temperature": Opt(float, 1.0, min=0.0, min_exclusive=True, doc="sample mode: p_t ~ size_t^(1/T)"),
}

# keys that say one thing two ways: a layer that gives one of them a value (a variant config over its base, --set
# over the file) replaces what the layers below it gave for the other way (steps replaces epochs with the task they
# count); one layer giving both is a ConfigError
ALTERNATIVES = {("schedule", "steps"): (("schedule", "epochs"), ("schedule", "epochs_of")),
                ("schedule", "epochs"): (("schedule", "steps"),)}
DEFAULT_STEPS = 1000


def _check_budget(schedule, source, path):
    """``steps`` and ``epochs`` are one setting: both given is a ConfigError; neither gives the default steps."""
    if schedule["steps"] is not None and schedule["epochs"] is not None:
        raise ConfigError(f"steps ({schedule['steps']}) and epochs ({schedule['epochs']:g}) both say how long the job "
                          f"trains: give one of them (a variant config or --set that gives one replaces the other)",
                          source, f"{path}.epochs")
    if schedule["epochs"] is None:
        if schedule["epochs_of"] is not None:
            raise ConfigError(f"names the task whose passes schedule.epochs counts ({schedule['epochs_of']!r}), but "
                              f"the job gives no epochs", source, f"{path}.epochs_of")
        if schedule["steps"] is None:
            schedule["steps"] = DEFAULT_STEPS


def _check_prefixes(value):
    if all(isinstance(p, str) and p.strip() and p == p.strip(".") for p in value):
        return None
    return f"expected a list of parameter-name prefixes (e.g. [conv1, bn1, layer1]), got {value!r}"


def flat_multipliers(table, prefix=""):
    """``{a: {b: 0.1}}`` and ``{a.b: 0.1}`` alike as ``{"a.b": 0.1}`` (``--set optimizer.lr_mult.a.b=0.1`` nests)."""
    out = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flat_multipliers(value, name) if isinstance(value, dict) else {name: value})
    return out


def _check_lr_mult(value):
    for name, mult in flat_multipliers(value).items():
        if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult < 0:
            return f"'{name}': expected a learning-rate multiplier >= 0, got {mult!r}"
    return None


# keys of the backbone mapping that the job reads (the others are the backbone type's own parameters)
BACKBONE = {
    "pretrained": Opt(str, None, nullable=True,
                      doc="a .pdparams of this backbone's weights (e.g. from mtl convert), loaded before training; "
                          "heads start fresh"),
    "freeze": Opt(list, [], check=_check_prefixes,
                  doc="parameter-name prefixes of the backbone (conv1, layer1, layer2.0.bn1) that do not train: no "
                      "gradient, no update, no optimizer state"),
    "freeze_bn": Opt(bool, False, doc="BatchNorm layers of the backbone use and keep their running statistics "
                                      "(eval-mode BatchNorm while training); their scale and shift still train"),
}

OPTIMIZER = {
    "type": Opt(str, "momentum", choices=["sgd", "momentum", "adamw"], doc="paddle.optimizer class"),
    "lr": Opt(float, 0.1, min=0.0, min_exclusive=True, doc="peak learning rate"),
    "momentum": Opt(float, 0.9, min=0.0, max=1.0, doc="momentum (momentum only)"),
    "weight_decay": Opt(float, 5e-4, min=0.0, doc="L2 (sgd/momentum) or decoupled (adamw) weight decay"),
    "betas": Opt(list, [0.9, 0.999], check=lambda v: None if len(v) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v)
        else f"expected two numbers in [0, 1), got {v!r}", doc="adamw betas"),
    "warmup_steps": Opt(int, 0, min=0, doc="linear warm-up steps"),
    "decay": Opt(str, "cosine", choices=["none", "cosine", "linear", "step", "poly", "multistep"],
                 doc="learning-rate decay after warm-up (docs/large-scale.md has the formulas; linear: to min_lr at "
                     "the last step, as BERT's fine-tuning)"),
    "min_lr": Opt(float, 0.0, min=0.0, doc="cosine, poly: final learning rate"),
    "step_size": Opt(int, 1000, min=1, doc="step decay: steps between decays"),
    "gamma": Opt(float, 0.1, min=0.0, max=0.999999, doc="step, multistep decay: factor (< 1)"),
    "power": Opt(float, 1.0, min=0.0, min_exclusive=True,
                 doc="poly: lr_t = (lr - min_lr) (1 - (t - warmup) / (steps - warmup))^power + min_lr"),
    "milestones": Opt(list, [], check=_check_milestones,
                      doc="multistep: steps where the rate is multiplied by gamma (integers >= 1, counted from step "
                          "0 with the warm-up), or fractions of schedule.steps (numbers in (0, 1))"),
    "clip_norm": Opt(float, None, nullable=True, min=0.0, min_exclusive=True, doc="global-norm gradient clipping"),
    "lr_mult": Opt(dict, {}, check=_check_lr_mult,
                   doc="learning-rate multipliers by parameter-name prefix of the joint model, the longest prefix "
                       "applying: {backbone.layer1: 0.1, backbone: 0.5, heads: 1.0}; weight decay scales alike"),
    "layer_decay": Opt(float, 1.0, min=0.0, max=1.0, min_exclusive=True,
                       doc="layer-wise learning-rate decay of a layered backbone (bert): a parameter k levels below "
                           "the top (embeddings lowest, the pooler top) gets layer_decay^k times its rate, on top of "
                           "lr_mult; heads keep theirs; 1: off"),
}

def _check_averaging(section, source, key):
    """The averaging keys fit its type (imported late: Paddle must not start before the thread count is set)."""
    from mtl.config.averaging import check_averaging

    check_averaging(section, source, key)


def _below_one(value):
    return None if value < 1.0 else f"expected a number in [0, 1), got {value!r}"


AVERAGING = {
    "type": Opt(str, "none", nullable=True, choices=["window", "ema", "none"],
                doc="window: Paddle's sliding-window average (WindowAverage); ema: exponential moving average"),
    "average_window_rate": Opt(float, None, nullable=True, min=0.0, doc="window (required): window / updates"),
    "min_average_window": Opt(int, None, nullable=True, min=0, doc="window: smallest window (default 10000)"),
    "max_average_window": Opt(int, None, nullable=True, min=0, doc="window: largest window (default 10000)"),
    "decay": Opt(float, None, nullable=True, min=0.0, check=_below_one, doc="ema: decay in [0, 1) (default 0.999)"),
    "warmup": Opt(bool, None, nullable=True, doc="ema: decay min(decay, (1 + t) / (10 + t)) (default true)"),
    "bias_correction": Opt(bool, None, nullable=True, doc="ema: divide by 1 - decay^t (default true)"),
    "offload": Opt(str, None, nullable=True, choices=["cpu", "none"], doc="cpu: keep the sums in host memory"),
    "average_batchnorm": Opt(bool, None, nullable=True, doc="also average BatchNorm statistics (default false)"),
}

def _check_cross_tasks(value):
    if value == "all" or (isinstance(value, list) and len(value) >= 2 and all(isinstance(t, str) for t in value)):
        return None
    return f"expected 'all' or a list of at least two task names, got {value!r}"


CROSS_NEGATIVES = {
    "rate": Opt(float, 0.0, min=0.0, max=1.0,
                doc="fraction of the other face heads' classes scored as negatives of a sample per step (0: off, "
                    "separate heads; 1: all; DAIL's crossing dropout: 1e-4); docs/faces.md"),
    "tasks": Opt((str, list), "all", check=_check_cross_tasks,
                 doc="'all': every head that can (arcface, cosface); or a list of at least two task names"),
    "mask": Opt(str, "online", choices=["online", "pairs", "none"],
                doc="which other-head classes are the sample's person and leave its softmax: online (a cosine "
                    "rule calibrated on the target cosines), pairs (a same-person JSON), none"),
    "pairs": Opt(str, None, nullable=True, doc="mask pairs: a same-person JSON in the form mtl overlap --json writes"),
    "rows": Opt(str, "drawn", choices=["drawn", "shared"],
                doc="which rows of another head a sample scores: drawn (rate of its classes, drawn from seed and step "
                    "for every two heads); shared (rate 1.0: the rows that head scores itself this step, its Partial "
                    "FC sample, as one merged head over both would: no other rows learn)"),
    "update": Opt(str, "both", choices=["own", "both"],
                  doc="both: the other heads' scored rows get the gradient of this head's samples too, as one merged "
                      "head's rows would (chosen on validation people, docs/faces.md); own: negatives without "
                      "gradient (a memory bank)"),
    "warmup": Opt(int, 100, min=0, doc="steps of separate heads before the heads score each other's classes"),
    "quantile": Opt(float, 0.05, min=0.0, max=0.5, min_exclusive=True,
                    doc="online: a class of another head is the sample's person when their cosine is at least this "
                        "quantile of the target cosines (mean - z_q std of their average)"),
    "momentum": Opt(float, 0.9, min=0.0, max=0.999999, doc="online: exponential average of the target cosines"),
    "floor": Opt(float, 0.2, min=-1.0, max=1.0, doc="online: the cosine threshold is at least this"),
}

JOB = {
    "base": Opt(str, None, nullable=True, doc="another job config this one starts from (its keys merged under these)"),
    "seed": Opt(int, 0, min=0, doc="seed of the schedule, the sample order and the initialisation"),
    "output_dir": Opt(str, "runs/job", doc="where metrics, checkpoints and plots go"),
    "device": Opt(str, "auto", choices=["auto", "cpu", "gpu"], doc="auto: GPU when Paddle has CUDA, else CPU"),
    "threads": Opt(int, None, nullable=True, min=1,
                   doc="intra-op CPU threads (default: a user's own OMP_NUM_THREADS, else the cores the loader "
                       "workers leave, split over the local processes, at least 1)"),
    "blas_threads": Opt(int, None, nullable=True, min=1,
                        doc="numpy's BLAS threads: the CPU margin heads' chunk passes (default: a user's own "
                            "OPENBLAS_NUM_THREADS, else 1, beside Paddle's pool; more only when they are most of the "
                            "step: docs/benchmarks.md)"),
    "tune_malloc": Opt(bool, True, doc="glibc: keep freed memory for reuse: faster large CPU steps, higher RSS"),
    "plugins": Opt(list, [], doc="extra folders whose .py files are imported as plug-ins"),
    "tasks": Opt(list, doc="task files (YAML or Python), task names found in tasks/, or inline task mappings"),
    "backbone": Opt((dict, str), check=_component, doc="backbone component: {type: name, ...params}"),
    "precision": Opt(str, "fp32", choices=["fp32", "bf16", "fp16"],
                     doc="backbone compute precision (heads stay float32); float32 on the CPU"),
    "amp_level": Opt(str, "O1", choices=["O1", "O2"], doc="paddle.amp level of the backbone (O2: float32 masters)"),
    "loss_scale": Section({
        "init": Opt(float, 32768.0, min=0.0, min_exclusive=True, doc="initial loss scale"),
        "growth": Opt(float, 2.0, min=1.0, min_exclusive=True, doc="factor after growth_interval good steps"),
        "backoff": Opt(float, 0.5, min=0.0, max=0.999999, min_exclusive=True, doc="factor on an overflow"),
        "growth_interval": Opt(int, 1000, min=1, doc="good steps in a row before the scale grows"),
        "min": Opt(float, 1.0, min=0.0, min_exclusive=True, doc="below it a non-finite gradient is not an overflow"),
    }, doc="fp16: dynamic loss scaling, the same decision on every rank"),
    "on_nonfinite": Opt(str, "stop", choices=["stop", "skip"],
                        doc="a step with a NaN/inf loss or gradient: stop the job, or skip the step's update"),
    "max_consecutive_nonfinite": Opt(int, 10, min=1, doc="skip: stop after this many bad steps in a row"),
    "on_save_error": Opt(str, "stop", choices=["stop", "retry"],
                         doc="a checkpoint that cannot be written (full disk, read-only, I/O error; nothing of it is "
                             "kept): stop the job, or train on and try again at the next checkpoint.every"),
    "weighting": Opt((dict, str), "static", check=_component,
                     doc="task weighting strategy: {type: name, ...params} (mtl plugins lists them)"),
    "architecture": Opt((dict, str), "hard", check=_component,
                        doc="the layer between backbone and heads: hard (shared backbone), mmoe, cgc, ple, "
                            "cross_stitch, cross_stitch_backbone, task_norm, adapters; {type: name, ...params} "
                            "(docs/architectures.md)"),
    "schedule": Section(SCHEDULE, check=_check_budget, doc="how steps are composed, and how many"),
    "optimizer": Section(OPTIMIZER, doc="optimizer and learning-rate schedule"),
    "log": Section({
        "every": Opt(int, 10, min=1, doc="write metrics.jsonl (one record per step), the log and the progress bar "
                                         "every N steps"),
        "progress": Opt(bool, True, doc="show a progress bar (rank 0)"),
        "plot": Opt(bool, True, doc="write loss_curves.png at the end"),
        "visualdl": Opt(bool, False, doc="write every logged scalar to output_dir/vdl/ (VisualDL, optional extra)"),
    }, doc="logging"),
    "eval": Section({
        "every": Opt(int, 0, min=0, doc="evaluate every N steps (0: only at the end)"),
        "batch_size": Opt(int, 256, min=1, doc="evaluation batch size"),
    }, doc="evaluation"),
    "checkpoint": Section({
        "every": Opt(int, 0, min=0, doc="save every N steps (0: only the final step)"),
        "keep": Opt(int, 3, min=1, doc="how many checkpoints to keep"),
    }, doc="checkpoints"),
    "cross_negatives": Section(CROSS_NEGATIVES, doc="cross-head negatives: face heads score each other's classes as "
                                                    "negatives, except the same person (mtl.headkit.cross_negatives)"),
    "averaging": Section(AVERAGING, check=_check_averaging,
                         doc="averaged weights for evaluation, checkpoints and export"),
    "data": Section({
        "num_workers": Opt(int, 2, min=0, doc="DataLoader worker processes per rank (each is left a core: fewer "
                                                  "intra-op threads by default; data in memory: 0)"),
        "check_batches": Opt(bool, True, doc="check the first batch of every task against the declared fields"),
        "bucket_batches": Opt(int, 20, min=0, doc="readers that know their samples' lengths (text): the samples of "
                                                   "every N steps are sorted by length, so a step pads little "
                                                   "(mtl.data.buckets); 0: plain random batches"),
    }, doc="data loading"),
    "distributed": Section({
        "sync_bn": Opt(bool, False, doc="synchronised BatchNorm across processes"),
    }, doc="multi-process settings"),
    "watchdog": Section({
        "timeout": Opt(float, None, nullable=True, min=0.0,
                       doc="seconds a step may make no progress on any process before the job stops, naming that "
                           "process (null: multiple x the slowest step seen, at least floor, at most long_timeout; "
                           "0: no watchdog)"),
        "multiple": Opt(float, 10.0, min=1.0, doc="timeout null: this many times the slowest step seen"),
        "floor": Opt(float, 60.0, min=0.0, min_exclusive=True, doc="timeout null: at least this many seconds"),
        "long_timeout": Opt(float, 1800.0, min=0.0, min_exclusive=True,
                            doc="seconds the long waits may take: start-up and the first step, saving a "
                                "checkpoint, evaluating; NCCL's own timeout is set 60 s above it"),
    }, doc="the progress watchdog (docs/reliability.md)"),
}

TASK = {
    "name": Opt(str, check=_task_name, doc="task name (unique in the job; letters, digits, _ and -)"),
    "reader": Opt((dict, str), check=_component, doc="reader component"),
    "head": Opt((dict, str), check=_component, doc="head component"),
    "ratio": Opt(float, 1.0, min=0.0, min_exclusive=True, doc="share of the batch (joint) or draw weight (sample)"),
    "loss_weight": Opt(float, 1.0, min=0.0, doc="weight of this task's loss in the total"),
    "eval": Section({
        "enabled": Opt(bool, True, doc="evaluate this task"),
        "reader": Opt(dict, {"split": "eval"}, doc="overrides of the reader config for evaluation"),
        "max_samples": Opt(int, None, nullable=True, min=1, doc="evaluate at most this many samples"),
        "sets": Opt(list, [], doc="verification sets: .bin files or pairs lists (path, or {path, root, name})"),
        "split": Opt(bool, True, doc="also evaluate the head on the reader's eval split"),
    }, nullable=True, doc="evaluation of the task"),
}
