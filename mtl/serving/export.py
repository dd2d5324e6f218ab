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

from mtl.core.arrays import load_problem, unit_rows
from mtl.core.errors import ConfigError, DataError, require_input_file
from mtl.data.preprocess import task_preprocessing


def check_export_dir(out_dir):
    """ConfigError unless ``out_dir`` is new, empty or an earlier export (its ``export.json``): an export replaces
    what is there, and a folder of other files (``.``, a run folder) is not ours to replace."""
    if os.path.isfile(out_dir):
        raise ConfigError(f"'{out_dir}' is a file; the export is a folder", key="OUT_DIR")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(os.path.join(out_dir, "export.json")):
        raise ConfigError(f"'{out_dir}' holds files and is not an export (no export.json); give a new or empty folder",
                          key="OUT_DIR")
    if os.path.islink(out_dir):
        raise ConfigError(f"'{out_dir}' is a symbolic link; give the folder it points to", key="OUT_DIR")


def export(run_dir, out_dir, checkpoint_path=None, weights="auto", trust_plugins=False, task=None, onnx_opset=None):
    """Export the latest (or the given) checkpoint of ``run_dir`` to ``out_dir``; return the export metadata.

    ``weights``: ``auto`` = averaged weights when the checkpoint has them, ``averaged`` = require them, ``live``. The
    run's plug-in files are imported only with ``trust_plugins`` (:func:`mtl.serving.run_plugins.import_plugins`).
    ``task``: the task the exported model embeds for, when the run's architecture gives each its own embedding.
    ``onnx_opset``: also ``backbone.onnx`` (:func:`export_onnx`). Everything is written into a folder beside ``out_dir``
    that replaces it once complete (:func:`mtl.core.staging.staged_folder`): a failure leaves no half export, and an
    earlier export at ``out_dir`` stays until then."""
    from mtl.core.staging import staged_folder
    from mtl.serving.inference import open_run

    check_export_dir(out_dir)
    run = open_run(run_dir, checkpoint_path, weights, trust_plugins)
    _make_parent(out_dir)
    with staged_folder(out_dir, replace=True) as stage:
        meta = _write_export(run, run_dir, stage, task)
        if onnx_opset is not None:
            meta["onnx"] = os.path.basename(export_onnx(stage, onnx_opset))
            meta["onnx_opset"] = onnx_opset
            with open(os.path.join(stage, "export.json"), "w") as f:
                json.dump(meta, f, indent=1)
    return meta


def _make_parent(path: str):
    """Create the folders above ``path`` (``exports/`` of ``exports/v1``), as the export did before it was staged;
    a path through a file is a ConfigError naming it."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder '{parent}' for '{path}': {exc.strerror}", key="OUT_DIR") from None


def _write_export(run, run_dir, out_dir, task):
    """The export's files in ``out_dir``; its metadata (see :func:`export`)."""
    import paddle

    from mtl.serving.inference import field_adapter, read_run_data

    backbone = run.backbone(task)
    fields = backbone.input_fields()
    field = fields[0]
    model = field_adapter(backbone, field.name, to_dict=True) if len(fields) == 1 else fields_adapter(backbone)
    specs = [paddle.static.InputSpec([None] + [d if d is not None else -1 for d in f.shape], f.dtype, name=f.name)
             for f in fields]
    os.makedirs(os.path.join(out_dir, "heads"), exist_ok=True)
    paddle.jit.save(paddle.jit.to_static(model, input_spec=specs, full_graph=True),
                    os.path.join(out_dir, "backbone"))
    backbone.save_assets(out_dir)  # a text encoder's tokenizer.json: `mtl embed` tokenises as training did
    if backbone.tokenizer is not None and "sequence" in (backbone.output_fields() or {}):
        paddle.jit.save(paddle.jit.to_static(text_outputs_adapter(backbone), input_spec=specs, full_graph=True),
                        os.path.join(out_dir, TEXT_PROGRAM))  # word, tree and span heads read the sequence
    heads = {}
    for tcfg in run.cfg["tasks"]:
        name = tcfg["name"]
        state = run.head_state(name)
        np.savez(os.path.join(out_dir, "heads", f"{name}.npz"), **state)
        heads[name] = {k: list(v.shape) for k, v in state.items()}
    meta = {"input_field": field.name, "input_shape": list(field.shape), "input_dtype": field.dtype,
            "input_fields": [f.name for f in fields], "text": backbone.tokenizer is not None,
            "feature_size": int(backbone.feature_size), "backbone": run.backbone_config(), "averaged": run.averaged,
            "step": run.step, "checkpoint": os.path.abspath(run.checkpoint), "heads": heads,
            "preprocess": task_preprocessing(run.cfg["tasks"]),
            "head_configs": {t["name"]: t["head"] for t in run.cfg["tasks"]}, **read_run_data(run_dir)}
    from mtl.architectures.base import TaskEmbedder
    from mtl.architectures.build import architecture_config

    meta["architecture"] = architecture_config(run.cfg)
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
    from mtl.core.console import NativeOutput

    native = NativeOutput()  # its C++ part prints "[Paddle2ONNX] ..." progress lines: shown only on a failure
    try:
        with native:
            paddle2onnx.export(model_file, params_file, path, opset_version=int(opset), optimize_tool="onnxoptimizer")
    except Exception as exc:  # noqa: BLE001 - paddle2onnx reports unsupported operators as assorted exceptions
        raise ConfigError(f"paddle2onnx could not convert '{model_file}' to ONNX: {exc}{_tail(native.text)}") from None
    if not os.path.isfile(path):
        raise ConfigError(f"paddle2onnx could not convert '{model_file}' to ONNX{_tail(native.text)}")
    return path


def fields_adapter(backbone):
    """A Layer ``forward(token_ids, segment_ids)`` over a text encoder (the backbones of two input fields),
    returning its default output (the pooled vector)."""
    import paddle

    from mtl.backbones.rows import select

    names = [f.name for f in backbone.input_fields()]
    if names != ["token_ids", "segment_ids"]:
        raise ConfigError(f"export of a backbone with the inputs {names}: only one input, or a text encoder's "
                          "token_ids and segment_ids, can be exported")

    class TextAdapter(paddle.nn.Layer):
        """Two tensors -> ``{field: tensor}``; a dict of outputs -> the default one."""

        def __init__(self):
            super().__init__()
            self.inner = backbone

        def forward(self, token_ids, segment_ids):
            outputs = self.inner({"token_ids": token_ids, "segment_ids": segment_ids})
            return select(outputs, None, backbone.default_output)

    return TextAdapter()


TEXT_PROGRAM = "text_encoder"  # a text export's second program: (token_ids, segment_ids) -> (sequence, pooled)


def text_outputs_adapter(backbone):
    """A Layer ``forward(token_ids, segment_ids) -> (sequence, pooled)`` over a text encoder: what the word, tree
    and span heads of ``mtl predict`` read from an export (its ``backbone`` program gives the pooled vector only)."""
    import paddle

    class TextOutputs(paddle.nn.Layer):
        """Two tensors in, the encoder's two outputs out."""

        def __init__(self):
            super().__init__()
            self.inner = backbone

        def forward(self, token_ids, segment_ids):
            outputs = self.inner({"token_ids": token_ids, "segment_ids": segment_ids})
            return outputs["sequence"], outputs["pooled"]

    return TextOutputs()


def _tail(text: str) -> str:
    """`` (it said: <its last line>)`` of a converter's captured output, or nothing."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f" (it said: {lines[-1]})" if lines else ""


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
        require_input_file(path)
        if path.endswith(".npy"):
            arr = _numeric_array(path)
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


def _numeric_array(path: str) -> np.ndarray:
    """The numbers of the ``.npy`` input ``path`` as float32, at least one input; a DataError naming the file for a
    pickle or object array (never loaded), an ``.npz`` archive, other bytes, or no input at all."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"input '{path}' is not a numpy array file ({load_problem(exc)})") from None
    if not isinstance(arr, np.ndarray):  # np.load of an .npz archive
        arr.close()
        raise DataError(f"input '{path}' is an .npz archive; give each array as its own .npy file")
    if arr.dtype.kind not in "biuf":
        raise DataError(f"input '{path}' holds {arr.dtype} values, not numbers")
    if arr.size == 0:
        raise DataError(f"input '{path}' holds no input (shape {list(arr.shape)})")
    return arr.astype(np.float32)


def embed(export_dir, inputs, batch_size=64, flip=False, normalize_output=False, preprocess_task=None):
    """Embeddings [N, D] of ``inputs`` (paths) with the exported model; ``flip`` adds f(mirrored x).

    ``flip`` is for image inputs ``[C, H, W]`` only (mirroring a feature vector would reverse its features). Image
    files are prepared as the training images of ``preprocess_task`` were (default: the way all tasks share).
    """
    import paddle

    from mtl.serving.inference import export_meta, open_export

    meta = export_meta(export_dir)
    if flip and len(meta["input_shape"]) != 3:
        raise ConfigError(f"--flip mirrors images, but this model's input '{meta['input_field']}' has shape "
                          f"{meta['input_shape']}, not [channels, height, width]: drop --flip")
    model = open_export(export_dir).model.inner  # the inference program itself
    if meta.get("text"):  # text files, one text per line, tokenised with the export's own tokenizer.json
        from mtl.text.embed import embed_texts

        emb = embed_texts(model, export_dir, inputs, batch_size)
        return unit_rows(emb) if normalize_output else emb
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
