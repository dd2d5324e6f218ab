"""Building a job's architecture (``architecture:`` in the job, default ``hard``) for its backbone."""
from mtl.core import registry
from mtl.core.errors import ConfigError
from mtl.data.steps import task_seed


def architecture_config(cfg: dict) -> dict:
    """The job's ``architecture`` component (``{"type": "hard"}`` for runs written before the key existed)."""
    return registry.as_component(cfg.get("architecture") or "hard")


def _backbone_copy(cfg: dict, index: int, backbone):
    """Backbone copy ``index`` of the job (an architecture's column): built from the job's backbone constructor
    config, drawn on the CPU's generator from the job's seed and the index; with ``pretrained`` in the job, a copy
    of ``backbone``'s weights (already loaded from that file: the file is read once, and a run's export or
    evaluation, whose checkpoint holds every weight, does not need it any more)."""
    import paddle

    from mtl.backbones.base import constructor_config
    from mtl.core import registry
    from mtl.core.runtime import on_host_generator

    spec = registry.as_component(cfg["backbone"])
    paddle.seed(task_seed(cfg["seed"], f"backbone copy {index + 1}"))
    copy = on_host_generator(lambda: registry.build("backbone", constructor_config(spec), cfg.get("source"),
                                                    "backbone"))
    if spec.get("pretrained"):
        copy.set_state_dict(backbone.state_dict())
    return copy


def build_architecture(cfg: dict, backbone):
    """The architecture of job ``cfg`` on ``backbone`` (its layers inside the backbone attached, the backbone copies
    it runs built), drawn from the job's seed; errors name ``architecture.<key>``."""
    spec = architecture_config(cfg)
    architecture = registry.build("architecture", spec, cfg.get("source"), "architecture",
                                  feature_size=backbone.feature_size, tasks=[t["name"] for t in cfg["tasks"]],
                                  seed=task_seed(cfg["seed"], "architecture"))
    if not architecture.is_identity and backbone.output_fields() is not None:
        raise ConfigError(f"architecture '{spec['type']}' mixes one feature vector per sample, but backbone "
                          f"'{backbone.registered_name}' gives several outputs "
                          f"({', '.join(backbone.output_fields())}): use architecture: hard with it",
                          cfg.get("source"), "architecture.type")
    architecture.adopt_backbone_copies([_backbone_copy(cfg, k, backbone)
                                        for k in range(architecture.backbone_copies_needed())])
    try:
        architecture.attach(backbone)
    except ConfigError as exc:
        if exc.source is None:
            raise ConfigError(exc.bare_message, cfg.get("source"), f"architecture.{exc.key}") from None
        raise
    return architecture
