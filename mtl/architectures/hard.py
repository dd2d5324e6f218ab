"""Hard parameter sharing (the default): every head reads the backbone's features; optionally a tower per task."""
from mtl.architectures.base import Architecture
from mtl.registry import register_architecture


@register_architecture("hard")
class Hard(Architecture):
    """Hard parameter sharing: every head sees the backbone's features (through its own ``tower`` if given).

    Without towers the features reach the heads unchanged (no operation at all: the same model as without an
    architecture layer); with ``tower: [w, ...]`` task t's head sees ``tower_t(z)`` (Ma et al.'s shared-bottom
    model, Sener and Koltun's LeNet with its per-task layers).
    """

    def __init__(self, feature_size: int, tasks, seed: int = 0, tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        self.build_towers(self.input_size)

    @property
    def is_identity(self) -> bool:
        """True without towers: the heads read the backbone's features."""
        return self.towers is None

    def mix(self, task, features):
        """The backbone's features as they are."""
        return features
