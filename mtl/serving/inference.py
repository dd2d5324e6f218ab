"""A trained model for inference, read through one small loader: a run's weights, an export, or converted weights.

Inference never goes through the training checkpoint's loader: no optimizer, averager sums, random state or re-sharding.
A run is read as the weight files of one checkpoint folder (the newest that verifies, or the one given), each checked
against the folder's manifest before it is read with the safe reader (:mod:`mtl.core.safe_pickle`); an export as its
Paddle inference program (``export.json`` beside it); converted weights (``mtl convert``) as their ``.pdparams`` with
the backbone config beside them.

Plug-in code of a run is imported only when trusted (:mod:`mtl.serving.run_plugins`).
"""
import json
import os
import zipfile
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from mtl.core.arrays import load_problem
from mtl.core.errors import ConfigError, DataError
from mtl.core.safe_pickle import load_paddle_file
from mtl.core.utf8 import read_json
from mtl.serving.run_plugins import import_plugins

WEIGHTS = ("auto", "averaged", "live")


RUN_DATA = "data.json"  # a run's label names and input preparation, per task (written when training starts)


def run_data(job) -> dict:
    """What predictions need to know of a built job's data: ``{"label_names": {task: {field: names}}, "inputs":
    {task: input spec}}`` from its training readers (:meth:`mtl.readers.base.Reader.label_names`, ``input_spec``)."""
    return {"label_names": {t.name: names for t in job.tasks if (names := t.reader.label_names())},
            "inputs": {t.name: spec for t in job.tasks if (spec := t.reader.input_spec())}}


def write_run_data(job, folder: str):
    """Write :func:`run_data` of ``job`` to ``folder/data.json``."""
    with open(os.path.join(folder, RUN_DATA), "w") as f:
        json.dump(run_data(job), f, indent=1)


def read_run_data(folder: str) -> dict:
    """A run's ``data.json`` (``{}`` for a run trained before it was written)."""
    path = os.path.join(folder, RUN_DATA)
    data = read_json(path, "run data") if os.path.isfile(path) else {}
    for key in ("label_names", "inputs"):
        value = data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise DataError(f"run data '{path}': '{key}' must map each task to a mapping, got {str(value)[:60]}")
    return data


def _check_job(cfg: dict, path: str):
    """DataError unless a run's ``job.json`` lists its tasks as mappings with names (what inference reads first)."""
    tasks = cfg.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                           for t in tasks):
        raise DataError(f"job config '{path}': 'tasks' must be a list of task mappings with a 'name', got "
                        f"{str(tasks)[:60]} (a run's job.json is written by mtl train)")


@dataclass
class RunWeights:
    """One checkpoint of a finished run, for inference: its job config, folder, step and which weights it reads."""

    run_dir: str
    cfg: dict
    checkpoint: str
    step: int
    averaged: bool

    @property
    def description(self) -> str:
        """``<checkpoint> (averaged weights)`` or ``(live weights)``."""
        return f"{self.checkpoint} ({'averaged' if self.averaged else 'live'} weights)"

    def _file(self, name: str) -> str:
        from mtl.store import integrity

        problem = integrity.verify(self.checkpoint, [name])
        if problem:
            raise ConfigError(f"checkpoint '{self.checkpoint}' is damaged: {problem}")
        return os.path.join(self.checkpoint, name)

    def job_config(self) -> dict:
        """The run's job config for rebuilding its job around this checkpoint (``mtl eval RUN``, ``mtl overlap``):
        the backbone's ``pretrained`` dropped, since every weight comes from the checkpoint and the file may be
        gone since the run trained."""
        from mtl.core import registry

        backbone = {k: v for k, v in registry.as_component(self.cfg["backbone"]).items() if k != "pretrained"}
        return {**self.cfg, "backbone": backbone}

    def backbone_config(self) -> dict:
        """The backbone's constructor config (the job's ``pretrained``/``freeze`` keys removed), pointed at the run's
        own assets where the backbone has some (a text encoder's tokenizer: ``Backbone.run_config``)."""
        from mtl.backbones.base import constructor_config
        from mtl.core import registry

        cfg = constructor_config(registry.as_component(self.cfg["backbone"]))
        entry, _ = registry.split_cfg("backbone", cfg, self.cfg.get("source"), "backbone")
        return entry.cls.run_config(cfg, self.run_dir)

    def load_into(self, backbone):
        """Load this checkpoint's backbone weights into ``backbone`` (cast to its dtypes) and set eval mode."""
        from mtl.core.low_precision import state_for

        name = "backbone.averaged.pdparams" if self.averaged else "backbone.pdparams"
        backbone.set_state_dict(state_for(backbone, load_paddle_file(self._file(name), "backbone weights")))
        backbone.eval()
        return backbone

    def backbone(self, task: Optional[str] = None):
        """What embeds the run's samples, with this checkpoint's weights, in eval mode: the backbone, or, when the
        run's architecture gives each task its own embedding (:mod:`mtl.architectures`), backbone + the
        architecture's layers for ``task`` (required then; under ``hard`` without towers any task of the run, or
        None)."""
        from mtl.architectures.base import TaskEmbedder
        from mtl.core import registry

        built = registry.build("backbone", self.backbone_config(), self.cfg.get("source"), "backbone")
        architecture = self.architecture(built, task)  # its layers inside the backbone: before the weights load
        self.load_into(built)
        if architecture is None:
            return built
        return TaskEmbedder(built, self.load_architecture_into(architecture), task)

    def load_architecture_into(self, architecture):
        """Load this checkpoint's weights of the architecture's own layers (towers, experts, gates; none for layers
        inside the backbone, which :meth:`load_into` loads) into ``architecture`` and set eval mode."""
        from mtl.core.low_precision import state_for

        if any(True for _ in architecture.parameters()):
            name = "architecture.averaged.pdparams" if self.averaged else "architecture.pdparams"
            state = load_paddle_file(self._file(name), "architecture weights")
            architecture.set_state_dict(state_for(architecture, state))
        architecture.eval()
        return architecture

    def architecture(self, backbone, task: Optional[str]):
        """The run's architecture attached to ``backbone`` (None under ``hard`` without towers); ConfigError when it
        embeds per task and ``task`` does not name one of the run's tasks, or when ``task`` names none of them."""
        from mtl.architectures.build import architecture_config, build_architecture

        architecture = build_architecture(self.cfg, backbone)
        names = [t["name"] for t in self.cfg["tasks"]]
        if architecture.is_identity:
            if task is not None and task not in names:  # one embedding for all, but a misspelt task is still a slip
                raise ConfigError(f"task '{task}' is not a task of the run ({', '.join(names)})")
            return None
        if task not in names:
            kind = architecture_config(self.cfg)["type"]
            what = f"task '{task}' is not one of them" if task is not None else \
                "name the task to embed for (mtl export RUN OUT --task NAME; mtl eval and mtl embed read the export)"
            raise ConfigError(f"the run's architecture '{kind}' gives each task its own embedding "
                              f"({', '.join(names)}): {what}")
        return architecture

    def load_heads_into(self, heads: dict):
        """Load this checkpoint's weights of every head of ``{task: head}`` (heads built in one process, which hold
        every class: the shards are merged) and set eval mode."""
        from mtl.core.low_precision import state_for

        for task, head in heads.items():
            head.set_state_dict(state_for(head, self.head_state(task)))
            head.eval()

    def head_state(self, task: str) -> dict:
        """A head's full weights as numpy (shards merged along the class axis), each file verified first."""
        from mtl.store import layout

        for path in layout.head_files(self.checkpoint, task, self.averaged):
            self._file(os.path.relpath(path, self.checkpoint).replace(os.sep, "/"))
        return layout.merged_head_state(self.checkpoint, task, self.averaged)


def open_run(run_dir: str, checkpoint: Optional[str] = None, weights: str = "auto",
             trust_plugins: bool = False) -> RunWeights:
    """A run's weights for inference: the newest checkpoint that verifies (or ``checkpoint``), the averaged weights
    when it has them and ``weights`` is ``auto`` (``averaged`` requires them, ``live`` takes the live ones); its
    plug-ins registered (:func:`mtl.serving.run_plugins.import_plugins`)."""
    from mtl.store import layout

    job_json = os.path.join(run_dir, "job.json")
    if not os.path.isfile(job_json):
        raise ConfigError(f"'{run_dir}' is not a training run: it has no job.json (train with `mtl train` first)")
    cfg = read_json(job_json, "job config")
    _check_job(cfg, job_json)
    if checkpoint and not os.path.isfile(os.path.join(checkpoint, "state.json")):  # named, not found: say which
        why = "is not a checkpoint folder (no state.json)" if os.path.isdir(checkpoint) else "does not exist"
        raise ConfigError(f"checkpoint '{checkpoint}' {why}")
    folder = checkpoint or layout.latest_checkpoint(run_dir)
    if folder is None or not os.path.isfile(os.path.join(folder, "state.json")):
        raise ConfigError(f"'{run_dir}' has no complete checkpoint (train it, or pass a checkpoint folder)")
    has_average = os.path.isfile(os.path.join(folder, "backbone.averaged.pdparams"))
    if weights not in WEIGHTS:
        raise ConfigError(f"weights '{weights}': expected one of {', '.join(WEIGHTS)}")
    if weights == "averaged" and not has_average:
        raise ConfigError(f"checkpoint '{folder}' has no averaged weights (the run did not average)")
    import_plugins(cfg, run_dir, trust_plugins)
    step = read_json(os.path.join(folder, "state.json"), "checkpoint state").get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise DataError(f"checkpoint state '{os.path.join(folder, 'state.json')}' has no whole number under 'step', "
                        f"got {step!r}")
    return RunWeights(run_dir, cfg, folder, step, has_average and weights != "live")


@dataclass
class LoadedModel:
    """What an evaluation or embedding needs of a model: a layer taking ``{field: batch}``, its input, step, what it
    is, and how the training images were prepared (``{task: preprocess mapping}``)."""

    model: object
    input_field: str
    input_shape: list
    step: int
    description: str
    preprocessing: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # an export's export.json


def field_adapter(model, field, to_dict):
    """A Layer between the backbone interface (a dict of fields) and a single-tensor model.

    ``to_dict``: ``forward(x) = model({field: x})`` (a backbone made exportable by ``jit.save``); otherwise
    ``forward(inputs) = model(inputs[field])`` (an exported model used where a backbone is expected).
    """
    import paddle

    class FieldAdapter(paddle.nn.Layer):
        """Converts the input between one tensor and ``{field: tensor}``."""

        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner({field: x}) if to_dict else self.inner(x[field])

    return FieldAdapter()


def export_meta(folder: str) -> dict:
    """An export folder's ``export.json`` (input field and shape, step, heads, preprocessing)."""
    meta_path = os.path.join(folder, "export.json")
    if not os.path.isfile(meta_path):
        raise ConfigError(f"'{folder}' is not an export folder (no export.json); run `mtl export` first")
    meta = read_json(meta_path, "export metadata")
    shape = meta.get("input_shape")
    if not isinstance(meta.get("input_field"), str) or not isinstance(shape, list) or \
            not all(d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0) for d in shape):
        raise DataError(f"export metadata '{meta_path}' has no 'input_field' name with an 'input_shape' of positive "
                        f"whole numbers (got {meta.get('input_field')!r}, {shape!r}); export the run again")
    return meta


def open_export(folder: str) -> LoadedModel:
    """An export folder (``mtl export``): its inference program behind the ``{field: batch}`` interface."""
    import paddle

    meta = export_meta(folder)
    if not os.path.isfile(os.path.join(folder, "backbone.json")):
        raise ConfigError(f"export '{folder}' holds no inference program backbone.json (export it again with "
                          "`mtl export`)")
    try:
        program = paddle.jit.load(os.path.join(folder, "backbone"))
    except Exception as exc:  # noqa: BLE001 - Paddle reports a damaged program as RuntimeError, KeyError, ValueError...
        raise DataError(f"export '{folder}': its inference program (backbone.json, backbone.pdiparams) cannot be "
                        f"loaded ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); export the run "
                        "again") from None
    model = field_adapter(program, meta["input_field"], to_dict=False)
    model.eval()
    kind = "averaged" if meta.get("averaged") else "live"
    return LoadedModel(model, meta["input_field"], meta["input_shape"], meta["step"], f"export ({kind} weights)",
                       meta.get("preprocess") or {}, meta)


def open_converted(path: str) -> LoadedModel:
    """Converted weights (``mtl convert``'s ``.pdparams``) with the backbone config written beside them."""
    from mtl.backbones.base import load_pretrained
    from mtl.convert.weights import sidecar_path
    from mtl.core import registry

    config_path = sidecar_path(path)
    if not os.path.isfile(config_path):
        raise ConfigError(f"'{path}' needs its backbone config '{config_path}' beside it (mtl convert writes it)")
    config = read_json(config_path, "backbone config")["backbone"]
    registry.load_builtin()
    backbone = registry.build("backbone", config, config_path, "backbone")
    load_pretrained(backbone, path, config_path, "backbone")
    backbone.eval()
    shape = backbone.input_fields()[0]
    return LoadedModel(backbone, shape.name, list(shape.shape), 0, f"{path} (converted weights)")


def load_model(path: str, weights: str = "auto", trust_plugins: bool = False) -> LoadedModel:
    """A run folder, an export folder or converted weights, for evaluation or embedding."""
    from mtl.data.preprocess import task_preprocessing

    if os.path.isfile(os.path.join(path, "export.json")):
        if weights != "auto":
            raise ConfigError(f"--weights {weights} applies to a run; the export '{path}' holds the weights it was "
                              "exported with (see its export.json)")
        return open_export(path)
    if os.path.isfile(path) and path.endswith(".pdparams"):
        if weights != "auto":
            raise ConfigError(f"--weights {weights} applies to a run, not to the weights file '{path}'")
        return open_converted(path)
    if os.path.isfile(os.path.join(path, "job.json")):
        run = open_run(path, None, weights, trust_plugins)
        backbone = run.backbone()
        shape = backbone.input_fields()[0]
        return LoadedModel(backbone, shape.name, list(shape.shape), run.step, run.description,
                           task_preprocessing(run.cfg["tasks"]))
    raise ConfigError(f"'{path}' is neither a training run (job.json), an export (export.json) nor converted weights "
                      "(a .pdparams file from mtl convert)")


@dataclass
class PredictionModel:
    """What predictions need of a run or an export: the backbone behind ``{field: batch}``, each task's head config
    and weights (numpy, shards merged), the data record (label names, input preparation: :func:`run_data`) and how
    each task's images were prepared."""

    loaded: LoadedModel
    head_configs: dict
    data: dict
    head_weights: object  # task -> {name: array}

    @property
    def tasks(self) -> List[str]:
        return list(self.head_configs)

    def head_state(self, task: str) -> dict:
        """The head of ``task``'s full weights as numpy arrays."""
        return self.head_weights(task)


def _export_head_state(folder: str, task: str) -> dict:
    """``heads/<task>.npz`` of an export (plain arrays: read without pickle)."""
    path = os.path.join(folder, "heads", f"{task}.npz")
    if not os.path.isfile(path):
        raise ConfigError(f"export '{folder}' has no head weights for task '{task}' ({path})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            state = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # garbage, object arrays, a truncated zip
        raise DataError(f"head weights '{path}' cannot be read as plain arrays ({load_problem(exc)}); export the "
                        "run again") from None
    return state


def open_for_prediction(path: str, weights: str = "auto", trust_plugins: bool = False) -> PredictionModel:
    """A run folder or an export folder, ready for :mod:`mtl.serving.prediction`: the same backbone :func:`load_model`
    gives, and the heads' weights of the same checkpoint (a run) or the export's ``heads/<task>.npz``."""
    from mtl.data.preprocess import task_preprocessing

    if os.path.isfile(os.path.join(path, "export.json")):
        loaded = load_model(path, weights, trust_plugins)
        meta = loaded.meta
        if "head_configs" not in meta:
            raise ConfigError(f"export '{path}' was written before exports recorded their heads: export the run "
                              "again with `mtl export` to predict with it")
        data = {"label_names": meta.get("label_names") or {}, "inputs": meta.get("inputs") or {}}
        return PredictionModel(loaded, meta["head_configs"], data, lambda task: _export_head_state(path, task))
    if os.path.isfile(os.path.join(path, "job.json")):
        run = open_run(path, None, weights, trust_plugins)
        backbone = run.backbone()
        shape = backbone.input_fields()[0]
        loaded = LoadedModel(backbone, shape.name, list(shape.shape), run.step, run.description,
                             task_preprocessing(run.cfg["tasks"]))
        return PredictionModel(loaded, {t["name"]: t["head"] for t in run.cfg["tasks"]}, read_run_data(path),
                               run.head_state)
    raise ConfigError(f"'{path}' is neither a training run (job.json) nor an export (export.json)")
