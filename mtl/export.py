"""Export a trained run for inference, and embed images with the exported model.

``mtl export RUN_DIR OUT_DIR [--task NAME]`` writes ``OUT_DIR/backbone`` (a Paddle inference model from
``paddle.jit.save``, with the averaged weights when the run averaged them; when the run's architecture gives each task
its own embedding, the backbone and the architecture's layers of the task ``--task`` names),
``OUT_DIR/heads/<task>.npz`` (each head's full weights, shards merged along the class axis) and
``OUT_DIR/export.json`` (input field and shape, feature size, step, tasks, architecture and the task embedded for).
With ``--onnx`` it also writes ``OUT_DIR/backbone.onnx`` (through paddle2onnx, batch axis dynamic), for deployment with
onnxruntime and the like; paddle2onnx and onnxruntime are an optional extra (requirements-extras.txt).
``mtl embed OUT_DIR IMAGES... -o emb.npy`` embeds image files (decoded, resized, ``(x/255 - 0.5)/0.5``) or ``.npy``
arrays ``[N, C, H, W]`` with the exported model.
"""
import json
import os

import numpy as np

from mtl.arrays import unit_rows
from mtl.data.preprocess import task_preprocessing
from mtl.errors import ConfigError, DataError


def _load_job_cfg(run_dir):
    path = os.path.join(run_dir, "job.json")
    if not os.path.isfile(path):
        raise ConfigError(f"'{run_dir}' is not a training run: it has no job.json (train with `mtl train` first)")
    with open(path) as f:
        return json.load(f)


def load_run_backbone(run_dir, checkpoint_path=None, averaged=None, task=None):
    """(backbone in eval mode, its config, checkpoint folder, averaged?) of a run's latest (or given) checkpoint.

    ``averaged``: None = averaged weights when the checkpoint has them, True = require them, False = live weights.
    ``task``: a run whose architecture gives each task its own embedding (``mtl.architectures``) embeds for the task
    named (backbone + the architecture's layers for it); required then, ignored under ``hard`` without towers.
    """
    import paddle

    from mtl import registry
    from mtl.low_precision import state_for
    from mtl.train import checkpoint

    cfg = _load_job_cfg(run_dir)
    ckpt = checkpoint_path or checkpoint.latest_checkpoint(run_dir)
    if ckpt is None or not os.path.isfile(os.path.join(ckpt, "state.json")):
        raise ConfigError(f"'{run_dir}' has no complete checkpoint (train it, or pass a checkpoint folder)")
    avg_file = os.path.join(ckpt, "backbone.averaged.pdparams")
    use_avg = os.path.isfile(avg_file) if averaged is None else bool(averaged)
    if use_avg and not os.path.isfile(avg_file):
        raise ConfigError(f"checkpoint '{ckpt}' has no averaged weights (the run did not average)")
    registry.load_all(cfg.get("plugin_folders", []))
    from mtl.backbones.base import constructor_config

    backbone_cfg = constructor_config(registry.as_component(cfg["backbone"]))
    backbone = registry.build("backbone", backbone_cfg, cfg.get("source"), "backbone")
    architecture = _run_architecture(cfg, backbone, task)
    state = paddle.load(avg_file if use_avg else os.path.join(ckpt, "backbone.pdparams"))
    backbone.set_state_dict(state_for(backbone, state))  # an O2 run's older checkpoints hold bfloat16 weights
    backbone.eval()
    if architecture is None:
        return backbone, backbone_cfg, ckpt, use_avg
    from mtl.architectures.base import TaskEmbedder

    if any(True for _ in architecture.parameters()):
        checkpoint.load_architecture(ckpt, architecture, averaged=use_avg)
    architecture.eval()
    return TaskEmbedder(backbone, architecture, task), backbone_cfg, ckpt, use_avg


def _run_architecture(cfg, backbone, task):
    """The run's architecture attached to ``backbone`` (None under ``hard`` without towers); ConfigError when it
    embeds per task and ``task`` does not name one of the run's tasks."""
    from mtl.architectures.build import architecture_config, build_architecture

    architecture = build_architecture(cfg, backbone)
    if architecture.is_identity:
        return None
    names = [t["name"] for t in cfg["tasks"]]
    if task not in names:
        kind = architecture_config(cfg)["type"]
        what = f"task '{task}' is not one of them" if task is not None else \
            "name the task to embed for (mtl export RUN OUT --task NAME; mtl eval and mtl embed read such an export)"
        raise ConfigError(f"the run's architecture '{kind}' gives each task its own embedding ({', '.join(names)}): "
                          f"{what}")
    return architecture


def export(run_dir, out_dir, checkpoint_path=None, averaged=None, task=None):
    """Export the latest (or the given) checkpoint of ``run_dir`` to ``out_dir``; return the export metadata.

    ``averaged``: None = averaged weights when the checkpoint has them, True = require them, False = live weights.
    ``task``: the task the exported model embeds for, when the run's architecture gives each its own embedding.
    """
    import paddle

    from mtl.train import checkpoint

    cfg = _load_job_cfg(run_dir)
    backbone, backbone_cfg, ckpt, use_avg = load_run_backbone(run_dir, checkpoint_path, averaged, task)
    field = backbone.input_fields()[0]
    model = field_adapter(backbone, field.name, to_dict=True)
    spec = paddle.static.InputSpec([None] + [d if d is not None else -1 for d in field.shape], field.dtype,
                                   name=field.name)
    os.makedirs(os.path.join(out_dir, "heads"), exist_ok=True)
    paddle.jit.save(paddle.jit.to_static(model, input_spec=[spec], full_graph=True),
                    os.path.join(out_dir, "backbone"))
    heads = {}
    for task in cfg["tasks"]:
        name = task["name"]
        state = checkpoint.merged_head_state(ckpt, name, averaged=use_avg)
        np.savez(os.path.join(out_dir, "heads", f"{name}.npz"), **state)
        heads[name] = {k: list(v.shape) for k, v in state.items()}
    with open(os.path.join(ckpt, "state.json")) as f:
        step = json.load(f)["step"]
    meta = {"input_field": field.name, "input_shape": list(field.shape), "input_dtype": field.dtype,
            "feature_size": int(backbone.feature_size), "backbone": backbone_cfg, "averaged": use_avg, "step": step,
            "checkpoint": os.path.abspath(ckpt), "heads": heads, "preprocess": task_preprocessing(cfg["tasks"])}
    from mtl.architectures.base import TaskEmbedder
    from mtl.architectures.build import architecture_config

    meta["architecture"] = architecture_config(cfg)
    meta["task"] = backbone.task if isinstance(backbone, TaskEmbedder) else None  # the task it embeds for
    with open(os.path.join(out_dir, "export.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def export_onnx(out_dir, opset=13):
    """Convert ``out_dir/backbone`` (the Paddle inference model) to ``out_dir/backbone.onnx``; return its path.

    The input's batch axis stays dynamic (the InputSpec's ``None``), so one file serves any batch size. The
    optimisation pass is onnxoptimizer's: paddle2onnx's default (polygraphy) installs packages at run time.
    """
    try:
        import paddle2onnx
        from paddle2onnx.utils import logging as p2o_logging
    except ImportError:
        raise ConfigError("--onnx needs paddle2onnx, which is not installed (pip install -r "
                          "requirements-extras.txt)") from None
    model_file = os.path.join(out_dir, "backbone.json")
    params_file = os.path.join(out_dir, "backbone.pdiparams")
    if not os.path.isfile(model_file):
        raise ConfigError(f"'{out_dir}' holds no Paddle inference model backbone.json to convert to ONNX")
    if os.environ.get("MTL_VERBOSE") != "1":
        p2o_logging.log_level = 0  # its errors only
    path = os.path.join(out_dir, "backbone.onnx")
    if os.path.exists(path):
        os.remove(path)
    try:
        paddle2onnx.export(model_file, params_file, path, opset_version=int(opset), optimize_tool="onnxoptimizer")
    except Exception as exc:  # noqa: BLE001 - paddle2onnx reports unsupported operators as assorted exceptions
        raise ConfigError(f"paddle2onnx could not convert '{model_file}' to ONNX: {exc}") from None
    if not os.path.isfile(path):
        raise ConfigError(f"paddle2onnx could not convert '{model_file}' to ONNX (see its error above)")
    return path


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


def export_preprocess(meta, where, task=None):
    """The :class:`mtl.data.preprocess.Preprocess` of an export's (or run's) ``preprocess`` record, for ``task`` or
    the one all its tasks share (exports written before the record existed prepared nothing)."""
    from mtl.data.preprocess import choose

    try:
        return choose(meta.get("preprocess") or {}, task, f"'{where}'")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def read_inputs(paths, shape, preprocess=None):
    """Stack inputs for the exported model: ``.npy`` arrays [N, *shape] or image files decoded to ``shape`` and
    prepared as the model's training images were (``preprocess``: crop, equalisation, standardisation)."""
    from mtl.data.transforms import FaceTransform

    batches = []
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"input '{path}' does not exist")
        if path.endswith(".npy"):
            arr = np.load(path).astype(np.float32)
            if arr.ndim == len(shape):
                arr = arr[None]
            if tuple(arr.shape[1:]) != tuple(shape):
                raise DataError(f"input '{path}' holds arrays of shape {list(arr.shape[1:])}, the model expects "
                                f"{list(shape)}")
            batches.append(arr)
            continue
        if len(shape) != 3 or shape[0] != 3:
            raise DataError(f"input '{path}': image files need a model with RGB input, this one expects "
                            f"{list(shape)}; pass .npy arrays instead")
        with open(path, "rb") as f:
            data = f.read()
        try:
            image = FaceTransform(int(shape[1]), preprocess=preprocess)(data)
        except Exception as exc:
            raise DataError(f"input '{path}' could not be decoded as an image: {exc}") from None
        batches.append(image[None])
    return np.concatenate(batches).astype(np.float32)


def embed(export_dir, inputs, batch_size=64, flip=False, normalize_output=False, preprocess_task=None):
    """Embeddings [N, D] of ``inputs`` (paths) with the exported model; ``flip`` adds f(mirrored x).

    ``flip`` is for image inputs ``[C, H, W]`` only (mirroring a feature vector would reverse its features). Image
    files are prepared as the training images of ``preprocess_task`` were (default: the way all tasks share).
    """
    import paddle

    meta_path = os.path.join(export_dir, "export.json")
    if not os.path.isfile(meta_path):
        raise ConfigError(f"'{export_dir}' is not an export folder (no export.json); run `mtl export` first")
    with open(meta_path) as f:
        meta = json.load(f)
    if flip and len(meta["input_shape"]) != 3:
        raise ConfigError(f"--flip mirrors images, but this model's input '{meta['input_field']}' has shape "
                          f"{meta['input_shape']}, not [channels, height, width]: drop --flip")
    model = paddle.jit.load(os.path.join(export_dir, "backbone"))
    model.eval()
    x = read_inputs(inputs, meta["input_shape"], export_preprocess(meta, export_dir, preprocess_task))
    out = []
    with paddle.no_grad():
        for start in range(0, len(x), batch_size):
            chunk = x[start:start + batch_size]
            f = model(paddle.to_tensor(chunk)).numpy()
            if flip:
                f = f + model(paddle.to_tensor(np.ascontiguousarray(chunk[..., ::-1]))).numpy()
            out.append(f)
    emb = np.concatenate(out)
    if normalize_output:
        emb = unit_rows(emb)
    return emb
