"""Backbone base class: reads named input fields, returns one feature vector per sample."""
from typing import List, Optional

import paddle

from mtl.core.contracts import Field
from mtl.core.errors import ParameterError


class Backbone(paddle.nn.Layer):
    """Base class of backbones.

    ``input_fields()`` declares what the backbone reads (name, per-sample shape, dtype); ``feature_size`` is the
    width of the features it returns; ``forward(inputs)`` takes a dict of batched tensors and returns [B, feature_size].
    ``pretrained`` (a ``.pdparams`` path) is loaded by :func:`load_pretrained` after construction.
    """

    feature_size: int = 0
    # the output a head reads when it names none (``Head.reads``), for a backbone that returns a dict of outputs
    default_output: Optional[str] = None
    # the subword tokenizer of a text backbone (mtl.text.tokenizer.TextTokenizer): readers get it from the job
    tokenizer = None
    # the kind of pretrained checkpoint the backbone reads by ``backbone.pretrained: NAME|FOLDER`` (mtl.pretrained):
    # "bert" (weights, config, tokenizer) or "word_vectors" (vectors.npy, words.txt); None: a .pdparams file only
    pretrained_kind: Optional[str] = None

    @classmethod
    def pretrained_options(cls, folder: str) -> dict:
        """The constructor keys that read the pretrained checkpoint ``folder`` (of :attr:`pretrained_kind`), e.g.
        ``{"weights": ..., "tokenizer": ..., "model_config": ...}``."""
        raise NotImplementedError(f"backbone '{cls.__name__}' reads no pretrained checkpoint folder")

    def output_fields(self) -> Optional[dict]:
        """``{name: Field}`` of the outputs when ``forward`` returns a dict (per-row shapes; a ``None`` axis has the
        inputs' variable size, e.g. ``sequence`` ``(None, D)`` and ``pooled`` ``(D,)`` of a text encoder); None (the
        default): ``forward`` returns one tensor ``[B, feature_size]``."""
        return None

    def input_embeddings(self):
        """The input embedding matrix ``[vocab, D]`` a masked-LM head ties its output layer to (text encoders)."""
        raise NotImplementedError(f"backbone '{self.registered_name}' has no input embeddings to tie a head to")

    def save_assets(self, folder: str):
        """Write what the backbone needs besides its weights (a text encoder's ``tokenizer.json``) into ``folder``
        (the run folder, an export). Default: nothing."""

    @classmethod
    def run_config(cls, config: dict, folder: str) -> dict:
        """The constructor config of a backbone read back from ``folder`` (a run or an export), pointing at the
        assets :meth:`save_assets` wrote there. Default: ``config`` as it is."""
        return config

    def planned_bytes(self, optimizer_slots: int) -> dict:
        """Bytes of the parameters, their gradients and ``optimizer_slots`` optimizer copies (activations, which
        depend on the batch, are not counted), for the memory plan (``mtl.train.memory_plan``)."""
        weights = sum(int(p.numel()) * p.element_size() for p in self.parameters())
        return {"parameters": weights, "gradients": weights, "optimizer state": optimizer_slots * weights}

    def activation_bytes(self, rows: int) -> Optional[int]:
        """Bytes of the activations one training forward of ``rows`` samples keeps for its backward, for the memory
        plan; None (the default): the backbone does not say, and the plan does not count them."""
        return None

    def stages(self) -> Optional[list]:
        """The backbone as a chain of functions whose composition is ``forward``: the first takes the inputs dict,
        each later one the tensor the one before returned, the last returns the features. Architectures that run a
        copy of the backbone per task and mix the copies between stages (``cross_stitch_backbone``) call them;
        None (the default): the backbone cannot be split, and such architectures refuse it."""
        return None

    def layer_depths(self) -> Optional[dict]:
        """``{parameter name: depth}`` of a layered backbone, 0 at the input (embeddings) up to the top (the last
        layer, a pooler): what ``optimizer.layer_decay`` scales the learning rates by; None (the default): the
        backbone is not a stack of layers, and layer_decay is refused."""
        return None

    def input_fields(self) -> List[Field]:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, inputs):  # pragma: no cover - abstract
        raise NotImplementedError


class ImageBackbone(Backbone):
    """A backbone that reads one square image field ``(in_channels, input_size, input_size)`` float32.

    Parameters:
        embedding_size (int): width of the features (the embedding) the backbone returns
        input_size (int): side of the square input images
        in_channels (int): channels of the input images (3: RGB, 1: grey)
        input_field (str): the sample field the backbone reads (the reader's image field)
    """

    def set_image_input(self, input_size, in_channels, input_field, embedding_size):
        """Validate and store the image geometry, the field name and the embedding size."""
        for name, value in (("input_size", input_size), ("in_channels", in_channels),
                            ("embedding_size", embedding_size)):
            if isinstance(value, bool) or int(value) != value or int(value) < 1:
                raise ParameterError(f"{name} must be a positive integer, got {value!r}")
        self.input_size = int(input_size)
        self.in_channels = int(in_channels)
        self.feature_size = int(embedding_size)
        self.input_field = input_field

    def input_fields(self):
        """One image field: ``(in_channels, input_size, input_size)`` float32."""
        return [Field(self.input_field, (self.in_channels, self.input_size, self.input_size), "float32")]


# keys of a job's backbone mapping that the job itself reads (mtl.config.keys.BACKBONE), not the backbone type
JOB_KEYS = ("pretrained", "freeze", "freeze_bn")


def constructor_config(cfg: dict) -> dict:
    """The backbone mapping without the job's own keys (``pretrained``, ``freeze``, ``freeze_bn``): what the
    backbone type is built from."""
    return {key: value for key, value in cfg.items() if key not in JOB_KEYS}


def build_backbone(cfg: dict, source=None, key="backbone") -> Backbone:
    """A backbone from a job's backbone mapping (``{type, ..., pretrained}``): built from its constructor keys, then
    its ``pretrained`` weights loaded (:func:`load_pretrained`): the one way a backbone gets pretrained weights. A
    pretrained model or checkpoint folder (``pretrained: minilm``) gives constructor keys instead
    (:func:`mtl.pretrained.cache.expand_backbone`), which load it."""
    from mtl.core import registry
    from mtl.pretrained.cache import expand_backbone

    cfg, loaded = expand_backbone(registry.as_component(cfg), source, key)
    backbone = registry.build("backbone", constructor_config(cfg), source, key)
    if cfg.get("pretrained") and not loaded:
        load_pretrained(backbone, cfg["pretrained"], source, f"{key}.pretrained")
    return backbone


def load_pretrained(backbone: Backbone, path: str, source=None, key=None):
    """Load ``path`` (a ``.pdparams`` file) into ``backbone``; every parameter must match by name and shape."""
    import os

    from mtl.core.errors import ConfigError

    if not os.path.isfile(path):
        raise ConfigError(f"pretrained weights '{path}' do not exist", source, key)
    from mtl.core.errors import DataError
    from mtl.core.safe_pickle import load_state_dict

    try:
        state = load_state_dict(path, "pretrained weights")
    except DataError as exc:  # named with the config's file and key
        raise DataError(exc.bare_message, source, key) from None
    own = backbone.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ConfigError(
            f"pretrained weights '{path}' do not fit backbone '{backbone.registered_name}': "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}",
            source,
            key,
        )
    for name, value in state.items():
        if tuple(value.shape) != tuple(own[name].shape):
            raise ConfigError(
                f"pretrained weights '{path}': '{name}' has shape {list(value.shape)}, "
                f"the backbone expects {list(own[name].shape)}",
                source,
                key,
            )
    backbone.set_state_dict(state)
