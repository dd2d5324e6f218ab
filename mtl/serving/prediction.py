"""Predictions for new inputs (``mtl predict``): a run's or an export's backbone embeds them, and each task's head
weights turn the features into what the head predicts, offline, in float64 numpy:

* ``softmax``: class probabilities ``softmax(x W^T + b)``;
* ``arcface`` / ``cosface``: the cosine of the feature with every class centre, ``x W^T / (|x| |W_c|)`` (the
  margin only shapes training; the nearest centre is the predicted identity of a closed set);
* ``multilabel``: label probabilities ``sigmoid(x W + b)`` (Paddle's ``Linear`` keeps ``W`` as ``[in, out]``), a
  label predicted when it reaches the head's ``threshold``;
* ``regression``: the values ``x W + b``.

A head plug-in of another kind registers its own function with :func:`predictor` (looked up along its class's
bases, so a subclass of a built-in head predicts as it does). Class, label and output names come from the run's
``data.json`` or the export's ``export.json`` (:mod:`mtl.readers.label_names`); inputs are image files (prepared as
the task's training images were), ``.npy`` arrays as the model reads them, or ``.csv`` table rows (standardised with
the task's training statistics).
"""
import csv
import json
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from mtl.core.errors import ConfigError, DataError, require_input_file
from mtl.core.utf8 import open_utf8

PREDICTORS: Dict[str, Callable] = {}  # head type -> function(state, features, head config) -> (kind, score, values)


def predictor(*heads):
    """Register a function ``(head weights, features [N, D] float64, head config) -> (kind, score, values [N, K])``
    as the predictions of the heads named ``heads``; ``kind``: ``classes``, ``labels`` or ``values``; ``score``: what
    the numbers are (``probability``, ``cosine``, ``value``)."""
    def wrap(function):
        for head in heads:
            PREDICTORS[head] = function
        return function
    return wrap


def _rows(x, w, b=None):
    return x @ np.asarray(w, np.float64) + (0.0 if b is None else np.asarray(b, np.float64))


@predictor("softmax")
def softmax_probabilities(state, x, cfg):
    """``softmax(x W^T + b)``, computed as ``exp(z - max z) / sum exp(z - max z)`` per row."""
    z = _rows(x, np.asarray(state["weight"]).T, state.get("bias"))
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return "classes", "probability", z / z.sum(axis=1, keepdims=True)


@predictor("arcface", "cosface")
def centre_cosines(state, x, cfg):
    """The cosine of each feature with each class centre (rows of ``W``)."""
    w = np.asarray(state["weight"], np.float64)
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return "classes", "cosine", unit @ (w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)).T


@predictor("multilabel")
def label_probabilities(state, x, cfg):
    """``sigmoid(x W + b)``, as ``1 / (1 + exp(-z))``."""
    return "labels", "probability", 1.0 / (1.0 + np.exp(-_rows(x, state["linear.weight"], state["linear.bias"])))


@predictor("regression")
def regression_values(state, x, cfg):
    """``x W + b``."""
    return "values", "value", _rows(x, state["linear.weight"], state["linear.bias"])


def predictor_of(head_type: str):
    """The registered function for a head type, looked up along the head class's bases; None if none is."""
    from mtl.core import registry

    registry.load_builtin()
    if head_type in PREDICTORS:
        return PREDICTORS[head_type]
    cls = registry.get("head", head_type).cls
    for klass in cls.__mro__:
        name = vars(klass).get("registered_name")
        if name in PREDICTORS:
            return PREDICTORS[name]
    return None


@dataclass
class Prediction:
    """One task's predictions for every input: ``values [N, K]`` (probabilities, cosines or outputs) and the name of
    each of the K columns."""

    task: str
    head: str
    kind: str
    score: str
    values: np.ndarray
    names: List[str]
    threshold: Optional[float] = None  # labels: the probability from which a label is predicted
    inputs: List[str] = field(default_factory=list)

    def best(self, row: int, top: int) -> List[tuple]:
        """``[(name, value)]`` of input ``row``: the ``top`` best classes, the labels at or above the threshold (the
        best one below it when none is), or every output."""
        values = self.values[row]
        if self.kind == "values":
            return list(zip(self.names, values.tolist()))
        order = np.argsort(-values, kind="stable")
        if self.kind == "labels":
            chosen = [i for i in order if values[i] >= self.threshold][:top] or list(order[:1])
            return [(self.names[i], float(values[i])) for i in chosen]
        return [(self.names[i], float(values[i])) for i in order[:top]]


# ---- inputs ------------------------------------------------------------------------------------------------------
def read_table(path: str, spec: dict) -> np.ndarray:
    """``[rows, width]`` float32 model inputs of a CSV file: the columns the task trained on (by name), standardised
    with its training split's mean and std, zero-padded as it was (:meth:`TableReader.input_spec`)."""
    with open_utf8(path, "input", newline="") as f:
        lines = [row for row in csv.reader(f) if any(cell.strip() for cell in row)]
    if len(lines) < 2:
        raise DataError(f"input '{path}': a CSV input needs a header row naming its columns and one row or more")
    header = [c.strip() for c in lines[0]]
    missing = [c for c in spec["columns"] if c not in header]
    if missing:
        raise DataError(f"input '{path}' has no column '{missing[0]}'; the task trained on the columns "
                        f"{', '.join(spec['columns'])}")
    index = [header.index(c) for c in spec["columns"]]
    try:
        x = np.array([[float(row[i]) for i in index] for row in lines[1:]], dtype=np.float64)
    except (ValueError, IndexError):
        raise DataError(f"input '{path}': the columns {', '.join(spec['columns'])} must hold numbers") from None
    if spec.get("mean") is not None:
        x = (x - np.asarray(spec["mean"])) / np.asarray(spec["std"])
    if spec.get("pad_to"):
        x = np.pad(x, ((0, 0), (0, int(spec["pad_to"]) - x.shape[1])))
    return x.astype(np.float32)


def read_gray(path: str, shape) -> np.ndarray:
    """A one-channel image file as ``[1, S, S]``: grey levels, resized, scaled to [-1, 1] (``(x / 255 - 0.5) / 0.5``,
    as the RGB images are)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            grey = image.convert("L").resize((int(shape[2]), int(shape[1])), Image.BILINEAR)
    except OSError as exc:
        raise DataError(f"input '{path}' could not be decoded as an image: {exc}") from None
    return ((np.asarray(grey, dtype=np.float32) / 255.0 - 0.5) / 0.5)[None]


def read_for_task(paths, model, task: str):
    """The inputs ``paths`` as the model's input for ``task`` and a name for each sample (``file``, ``file row 2``,
    ``file[3]``): ``.csv`` rows prepared as the task's table was, ``.npy`` arrays as they are, image files as the
    task's training images were prepared."""
    from mtl.serving.export import export_preprocess, read_inputs

    shape, spec = model.loaded.input_shape, (model.data.get("inputs") or {}).get(task)
    out = []
    for path in paths:
        require_input_file(path)
        if path.endswith(".csv"):
            if not spec or spec.get("kind") != "table":
                raise DataError(f"input '{path}' is a table, but task '{task}' does not read table rows")
            out.append(read_table(path, spec))
        elif path.endswith(".npy") or (len(shape) == 3 and shape[0] == 3):
            prepare = None if path.endswith(".npy") else \
                export_preprocess({"preprocess": model.loaded.preprocessing}, path, task)
            out.append(read_inputs([path], shape, prepare))
        elif len(shape) == 3 and shape[0] == 1:
            out.append(read_gray(path, shape)[None])
        else:
            raise DataError(f"input '{path}': this model reads {list(shape)} arrays; give .npy or .csv inputs")
    named = [name for path, x in zip(paths, out) for name in _sample_names(path, len(x))]
    return np.concatenate(out).astype(np.float32), named


def _sample_names(path: str, count: int) -> List[str]:
    """How the samples of one input file are named in the predictions."""
    if path.endswith(".csv"):
        return [f"{path} row {k + 1}" for k in range(count)]
    if path.endswith(".npy") and count > 1:
        return [f"{path}[{k}]" for k in range(count)]
    return [path]


def csv_header(path: str) -> List[str]:
    """The column names of a CSV file's first row (none when it cannot be read)."""
    try:
        with open_utf8(path, "input", newline="") as f:
            return [c.strip() for c in next(csv.reader(f), [])]
    except (OSError, DataError):  # not UTF-8: read_table names the line
        return []


def fits(path: str, model, task: str) -> bool:
    """Whether ``task`` can read the input ``path``: table rows that hold every column the task trained on go to
    that table task, everything else to the tasks that do not read tables."""
    spec = (model.data.get("inputs") or {}).get(task) or {}
    if not path.endswith(".csv"):
        return spec.get("kind") != "table"
    return spec.get("kind") == "table" and set(spec["columns"]) <= set(csv_header(path))


# ---- predictions ---------------------------------------------------------------------------------------------------
def features(model, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The backbone's features ``[N, D]`` (float64) of model inputs ``x``."""
    import paddle

    out = []
    with paddle.no_grad():
        for start in range(0, len(x), batch_size):
            batch = paddle.to_tensor(np.ascontiguousarray(x[start:start + batch_size]))
            out.append(paddle.cast(model.loaded.model({model.loaded.input_field: batch}), "float32").numpy())
    return np.concatenate(out).astype(np.float64)


def chosen_tasks(model, inputs, task=None) -> List[str]:
    """``[task]`` when given (checked), else every task whose head predicts and that reads these inputs."""
    if task is not None:
        if task not in model.head_configs:
            raise ConfigError(f"the model has no task '{task}' (its tasks: {', '.join(model.tasks)})")
        head = model.head_configs[task]["type"]
        if predictor_of(head) is None:
            raise ConfigError(f"task '{task}' has a '{head}' head, which makes no predictions mtl predict knows "
                              f"(heads it knows: {', '.join(sorted(PREDICTORS))})")
        return [task]
    found = [t for t in model.tasks if predictor_of(model.head_configs[t]["type"]) is not None
             and all(fits(p, model, t) for p in inputs)]
    if not found:
        raise ConfigError(f"no task of the model reads these inputs with a head that predicts (tasks: "
                          f"{', '.join(model.tasks)}); name one with --task")
    return found


def predict(path: str, inputs, task=None, weights="auto", trust_plugins=False, model=None) -> List[Prediction]:
    """Every chosen task's :class:`Prediction` for the input files ``inputs`` of the run or export ``path`` (or of
    ``model``, the same opened already)."""
    from mtl.readers.label_names import field_names
    from mtl.serving.inference import open_for_prediction

    model = model or open_for_prediction(path, weights, trust_plugins)
    results = []
    for name in chosen_tasks(model, list(inputs), task):
        cfg = model.head_configs[name]
        x, samples = read_for_task(list(inputs), model, name)
        kind, score, values = predictor_of(cfg["type"])(model.head_state(name), features(model, x), cfg)
        label_field = cfg.get("label_field") or {"classes": "label", "labels": "labels", "values": "target"}[kind]
        names = field_names(model.data.get("label_names"), name, label_field)
        names = names if names and len(names) == values.shape[1] else [str(i) for i in range(values.shape[1])]
        threshold = float(cfg.get("threshold", 0.5)) if kind == "labels" else None
        results.append(Prediction(name, cfg["type"], kind, score, values, names, threshold, samples))
    return results


def prediction_table(results: List[Prediction], top: int = 3) -> str:
    """One row per input and task: the best classes, the predicted labels or the values, with their numbers."""
    from tabulate import tabulate

    rows = []
    for i, path in enumerate(results[0].inputs if results else []):
        for result in results:
            shown = ", ".join(f"{name} {value:.3f}" if result.kind != "values" else f"{name}={value:.4g}"
                              for name, value in result.best(i, top))
            rows.append([path if result is results[0] else "", f"{result.task} ({result.head}: {_what(result, top)})",
                         shown])
    return tabulate(rows, headers=["input", "task", "prediction"], tablefmt="github", disable_numparse=True)


def _what(result: Prediction, top: int) -> str:
    """What a prediction row shows: ``top 3 classes by probability``, the labels predicted, or the values."""
    if result.kind == "classes":
        return f"top {top} classes by {result.score}"
    if result.kind == "labels":
        return f"labels with {result.score} >= {result.threshold:g}"
    return "values"


def predictions_json(results: List[Prediction], top: int) -> list:
    """The predictions as JSON records: one per input, each task's best names and values and all its values."""
    return [{"input": path, "tasks": {r.task: {"kind": r.kind, "score": r.score,
                                               "best": [{"name": n, "value": v} for n, v in r.best(i, top)],
                                               "values": dict(zip(r.names, map(float, r.values[i])))}
                                      for r in results}}
            for i, path in enumerate(results[0].inputs if results else [])]


def write_predictions(results, top: int, path: str):
    """Write :func:`predictions_json` to ``path``."""
    with open(path, "w") as f:
        json.dump(predictions_json(results, top), f, indent=1)
