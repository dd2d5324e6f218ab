"""Hard parameter sharing (the default): every head reads the backbone's features; optionally shared layers on top
of the backbone (``bottom``) and a tower per task."""
from mtl.architectures.base import Architecture, Tower, positive_ints
from mtl.core.registry import register_architecture


@register_architecture("hard")
class Hard(Architecture):
    """Hard parameter sharing: every head sees the backbone's features (through ``bottom`` and its ``tower``).

    Without ``bottom`` and towers the features reach the heads unchanged (no operation at all: the same model as
    without an architecture layer). ``bottom: [w, ...]`` adds shared ReLU layers after the backbone and
    ``tower: [w, ...]`` a stack of ReLU layers per task: task t's head sees ``tower_t(bottom(z))`` (Ma et al.'s
    shared-bottom model, eq. 1: y_k = h^k(f(x)); Sener and Koltun's LeNet with its per-task layers).

    Parameters:
        bottom (list): widths of shared ReLU layers ``h = relu(h W + b)`` after the backbone, read by every task (Ma et
            al.'s shared bottom f, eq. 1); no dropout (tower_dropout is the towers'); empty (the default): none, the
            towers or heads read the backbone's features
    """

    def __init__(self, feature_size: int, tasks, seed: int = 0, bottom=(), tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        widths = positive_ints(bottom, "bottom")
        self.bottom = Tower(self.rng, self.input_size, widths) if widths else None
        self.build_towers(self.bottom.output_size if self.bottom is not None else self.input_size)

    @property
    def is_identity(self) -> bool:
        """True without bottom and towers: the heads read the backbone's features."""
        return self.towers is None and self.bottom is None

    @property
    def one_embedding(self) -> bool:
        """Without towers every task reads the same features (the shared ``bottom``'s, if any)."""
        return self.towers is None

    def mix(self, task, features):
        """The backbone's features, through the shared ``bottom`` layers if any."""
        return features if self.bottom is None else self.bottom(features)

    def own_shared_parameters(self):
        """The ``bottom`` layers."""
        return [] if self.bottom is None else list(self.bottom.parameters())
