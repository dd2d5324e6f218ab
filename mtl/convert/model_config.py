"""A checkpoint's own description of its encoder: Hugging Face's ``config.json`` or PaddleNLP's ``model_config.json``,
read so that a job need not copy the sizes of a pretrained model by hand.

Both name the sizes alike (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
``max_position_embeddings``, ``vocab_size``, ``type_vocab_size``, ``hidden_act``, ``layer_norm_eps``, the dropouts).
PaddleNLP's older ``model_config.json`` nests them in ``{"init_args": [{...}], "init_class": "ErnieModel"}``;
ERNIE 3.0 adds a task-type embedding (``use_task_id``, ``task_type_vocab_size``, ``task_id``). The file sits beside
the weights (:func:`find_model_config`); :func:`read_model_config` flattens it and :func:`bert_options` gives the
``bert`` backbone's options, each with the key it came from (:meth:`ModelConfig.origin`), so that an error can name
the key to change. :func:`resolve` merges them with what the job gave and the backbone's defaults.
"""
import json
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from mtl.core.errors import ConfigError, DataError
from mtl.core.utf8 import open_utf8

CONFIG_FILES = ("config.json", "model_config.json")  # Hugging Face (and PaddleNLP >= 2.5), PaddleNLP's older name
# the bert backbone's option -> the checkpoint config's key (Hugging Face and PaddleNLP name them alike)
BERT_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
             "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
             "max_position": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
             "activation": "hidden_act", "layer_norm_eps": "layer_norm_eps", "dropout": "hidden_dropout_prob",
             "attention_dropout": "attention_probs_dropout_prob"}
SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position",
         "type_vocab_size", "task_type_vocab_size")
RATES = ("layer_norm_eps", "dropout", "attention_dropout")
ACTIVATIONS = ("gelu", "relu")  # what the bert backbone computes (gelu: the exact, erf form, as BERT's "gelu")
BERT_MODEL_TYPES = ("bert", "ernie")


@dataclass
class ModelConfig:
    """A checkpoint config read from ``path``: its keys flattened (``values``), and for each option taken from it
    the key that gave it (``keys``)."""

    path: str
    values: dict
    keys: Dict[str, str] = field(default_factory=dict)

    def origin(self, option: str) -> str:
        """``config.json's num_hidden_layers``: where option ``option`` came from."""
        return f"{os.path.basename(self.path)}'s {self.keys.get(option, option)}"


def find_model_config(weights: str) -> Optional[str]:
    """The checkpoint config beside the weights file ``weights`` (``config.json``, else ``model_config.json``), or
    None when there is none."""
    folder = os.path.dirname(os.path.abspath(weights))
    for name in CONFIG_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def read_model_config(path: str) -> ModelConfig:
    """The checkpoint config ``path``, PaddleNLP's ``init_args`` nesting flattened; a DataError naming the file when
    it is not a JSON mapping."""
    if not os.path.isfile(path):
        raise ConfigError(f"model config '{path}' does not exist", key="model_config")
    try:
        with open_utf8(path, "model config") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(f"model config '{path}' is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DataError(f"model config '{path}' must be a JSON mapping of the model's sizes (as Hugging Face's "
                        "config.json or PaddleNLP's model_config.json)")
    values = {k: v for k, v in data.items() if k != "init_args"}
    for nested in data.get("init_args") or []:  # PaddleNLP before 2.5: the sizes are the first init argument
        if isinstance(nested, dict):
            values.update({k: v for k, v in nested.items() if k not in values})
    return ModelConfig(path, values)


def _checked(config: ModelConfig, option: str, key: str, value):
    """``value`` of ``key`` as the option's type; a DataError naming the file and the key otherwise."""
    if option in SIZES:
        least = 0 if option == "task_type_vocab_size" else 1
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
        what = "a whole number >= 0" if least == 0 else "a positive whole number"
    elif option in RATES:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1
        what = "a number in [0, 1)"
    else:
        ok, what = value in ACTIVATIONS, f"one of {', '.join(ACTIVATIONS)} (what the bert backbone computes)"
    if not ok:
        raise DataError(f"model config '{config.path}': {key} must be {what}, got {value!r}")
    return value


def bert_options(config: ModelConfig) -> Dict[str, object]:
    """The ``bert`` backbone's options given by a BERT or ERNIE checkpoint config (``config.keys`` filled with the
    key of each); a DataError naming the file and the key for a model the backbone does not compute (another
    ``model_type``, relative positions, an activation other than gelu/relu) or a value of the wrong kind."""
    values = config.values
    kind = values.get("model_type")
    if kind is not None and kind not in BERT_MODEL_TYPES:
        raise DataError(f"model config '{config.path}': model_type {kind!r} is not one of {', '.join(BERT_MODEL_TYPES)}"
                        " (the bert backbone computes BERT's and ERNIE's layers and positions)")
    if values.get("position_embedding_type", "absolute") != "absolute":
        raise DataError(f"model config '{config.path}': position_embedding_type "
                        f"{values['position_embedding_type']!r}: the bert backbone has absolute positions only")
    out = {}
    for option, key in BERT_KEYS.items():
        if key in values and values[key] is not None:
            out[option], config.keys[option] = _checked(config, option, key, values[key]), key
    if "intermediate_size" not in out and "hidden_size" in out:  # PaddleNLP's base configs leave it out: 4 x
        out["intermediate_size"], config.keys["intermediate_size"] = 4 * out["hidden_size"], "hidden_size (x 4)"
    if values.get("use_task_id") is True and "task_type_vocab_size" in values:  # ERNIE 3.0's task embedding
        out["task_type_vocab_size"] = _checked(config, "task_type_vocab_size", "task_type_vocab_size",
                                               values["task_type_vocab_size"])
        config.keys["task_type_vocab_size"] = "task_type_vocab_size"
        out["task_id"], config.keys["task_id"] = int(values.get("task_id") or 0), "task_id"
    elif "use_task_id" in values or "task_type_vocab_size" in values:
        out["task_type_vocab_size"], config.keys["task_type_vocab_size"] = 0, "use_task_id"
    return out


def resolve(given: Dict[str, object], defaults: Dict[str, object], config: Optional[ModelConfig],
            structural=SIZES, prefix: str = "backbone") -> Tuple[Dict[str, object], Dict[str, str]]:
    """(options, origin of each): an option the job gave (``given``, not None) wins, else the checkpoint config's,
    else the default. A size the job gave that differs from the checkpoint config's (``structural``) is a
    ConfigError naming the option and the config key (a dropout may differ: it is a training setting)."""
    from_config = bert_options(config) if config is not None else {}
    options, origins = {}, {}
    for name, default in defaults.items():
        value = given.get(name)
        if value is not None:
            if name in structural and name in from_config and from_config[name] != value:
                raise ConfigError(f"{name} {value} disagrees with the checkpoint's {config.origin(name)} "
                                  f"({from_config[name]}) in '{config.path}': leave {name} out (it is read from "
                                  "there) or make them agree", key=name)
            options[name], origins[name] = value, f"{prefix}.{name}"
        elif name in from_config:
            options[name], origins[name] = from_config[name], config.origin(name)
        else:
            options[name], origins[name] = default, "the default"
    return options, origins
