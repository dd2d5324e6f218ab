"""Fine-tuning controls, applied once when a job is built: frozen parameters, frozen BatchNorm statistics and
per-module learning-rate multipliers (``backbone.freeze``, ``backbone.freeze_bn``, ``optimizer.lr_mult``).

A prefix names a module or a parameter by its dotted name (``layer1`` covers ``layer1.0.conv1.weight`` but not
``layer10.*``). A frozen parameter is ``stop_gradient``: it gets no gradient, so no gradient sync, no norm share, no
update, and the optimizer never holds state for it (:class:`mtl.optimizer.joint.JointOptimizer` leaves it out).
A multiplier m scales a parameter's learning rate (Paddle's per-parameter ``optimize_attr['learning_rate']``, which
its SGD / Momentum / AdamW kernels multiply into the step, weight decay included; the row-sparse update reads it too).
"""
from mtl.core.errors import ConfigError


def matches(name: str, prefix: str) -> bool:
    """``prefix`` is ``name`` or one of its leading dotted components."""
    return name == prefix or name.startswith(prefix + ".")


def _batchnorm_layers(layer):
    """(name, layer) of every BatchNorm of ``layer`` (Paddle's and our synchronised one)."""
    from mtl.parallel.sync_bn import BATCH_NORM_TYPES, SyncBatchNorm

    return [(name, sub) for name, sub in layer.named_sublayers() if isinstance(sub, (*BATCH_NORM_TYPES, SyncBatchNorm))]


def freeze_parameters(backbone, prefixes, source=None):
    """Make every parameter of ``backbone`` under one of ``prefixes`` ``stop_gradient``; a prefix that names nothing,
    or one that freezes a BatchNorm's scale without its shift (Paddle 3.3 then gives the shift no gradient either),
    is a ConfigError naming ``backbone.freeze.<i>``."""
    params = dict(backbone.named_parameters())
    for i, prefix in enumerate(prefixes):
        chosen = [name for name in params if matches(name, prefix)]
        if not chosen:
            top = sorted({name.split(".")[0] for name in params})
            raise ConfigError(f"'{prefix}' names no parameter of the backbone (its top-level modules: "
                              f"{', '.join(top)})", source, f"backbone.freeze.{i}")
        for name in chosen:
            params[name].stop_gradient = True
    for name, layer in _batchnorm_layers(backbone):
        affine = [p for p in (layer.weight, layer.bias) if p is not None]
        if len({bool(p.stop_gradient) for p in affine}) > 1:
            raise ConfigError(f"freezes one of the scale and shift of BatchNorm '{name}' but not the other; freeze "
                              f"both (prefix '{name}')", source, "backbone.freeze")


def freeze_batchnorm(backbone):
    """Every BatchNorm of ``backbone`` normalises with its running statistics and never updates them, in training
    as in evaluation (``use_global_stats``, which ``train()`` / ``eval()`` do not touch)."""
    for _, layer in _batchnorm_layers(backbone):
        layer._use_global_stats = True


def apply_layer_decay(model, decay: float, source=None) -> dict:
    """Multiply each backbone parameter's learning rate by ``decay^(top - depth)`` (layer-wise decay: Clark et al.,
    2020; Bao et al., 2022), the depths from the backbone (:meth:`mtl.backbones.base.Backbone.layer_depths`: BERT's
    embeddings 0, layer i i + 1, the pooler the top); call after :func:`apply_lr_multipliers`, which resets the
    rates. Heads and architecture layers keep theirs. Returns ``{backbone parameter name: factor}``; a backbone
    without layers and ``decay`` < 1 is a ConfigError naming ``optimizer.layer_decay``."""
    if decay == 1.0:
        return {}
    depths = model.backbone.layer_depths()
    if depths is None:
        raise ConfigError(f"backbone '{model.backbone.registered_name}' has no layers to decay (bert has); leave "
                          "layer_decay at 1", source, "optimizer.layer_decay")
    top = max(depths.values())
    factors = {}
    for name, param in model.backbone.named_parameters():
        factors[name] = float(decay) ** (top - depths[name])
        param.optimize_attr["learning_rate"] *= factors[name]
    return factors


def apply_lr_multipliers(model, table: dict, source=None) -> dict:
    """Scale each parameter's learning rate by the multiplier of the longest prefix of ``table`` (flattened, see
    :func:`mtl.config.keys.flat_multipliers`) that matches its name in ``model`` (or, for a parameter of an
    architecture's copy of the backbone, the backbone parameter's name it copies); return ``{name: multiplier}``.

    Idempotent: the parameter's own rate (a ParamAttr's, e.g. 0 for IResNet's fixed BatchNorm scale) is kept as the
    base. A prefix that names no parameter is a ConfigError naming ``optimizer.lr_mult.<prefix>``."""
    from mtl.config.keys import flat_multipliers

    table = flat_multipliers(table)
    params = dict(model.named_parameters())
    # an architecture's copies of the backbone (a column per task) answer to the backbone's names as well
    alias = {id(p): f"backbone.{n}" for copy in model.architecture.backbone_copies()
             for n, p in copy.named_parameters()}
    for prefix in table:
        if not any(matches(name, prefix) for name in params):
            top = sorted({".".join(name.split(".")[:2]) for name in params})
            raise ConfigError(f"'{prefix}' names no parameter of the model (it has {', '.join(top)})", source,
                              f"optimizer.lr_mult.{prefix}")
    chosen = {}
    for name, param in params.items():
        prefixes = [p for p in table if matches(name, p) or (id(param) in alias and matches(alias[id(param)], p))]
        attr = param.optimize_attr
        base = attr.setdefault("base_learning_rate", attr.get("learning_rate", 1.0))
        mult = float(table[max(prefixes, key=len)]) if prefixes else 1.0
        attr["learning_rate"] = base * mult
        if prefixes:
            chosen[name] = mult
    return chosen
