"""The architecture base class and the pieces architectures share: seeded layers, task towers, expert banks, gates.

An :class:`Architecture` sits between the backbone and the heads of a :class:`mtl.train.model.JointModel`:
``forward(task, features)`` turns the backbone's features of task t's rows (``[n_t, D]``, only that task's rows)
into what task t's head sees (``[n_t, output_size]``). Architectures whose task-specific layers live inside the
backbone (task BatchNorms, adapters) declare ``per_task_backbone``: the joint model then runs the backbone once per
task with :meth:`Architecture.select` naming it.

Every architecture declares which trainable parameters are shared (:meth:`Architecture.shared_parameters`: those
that receive gradient from more than one task, the ones a gradient-based weighting combines) and which are task
t's own (:meth:`Architecture.task_parameters`: scaled with task t's weight, like its head); the two cover every
trainable parameter once (tests check both against the gradients each task's loss actually sends).

Initialisation: every weight is drawn from a numpy generator seeded by the job (uniform in +-1/sqrt(fan_in), the
bound of Paddle's and PyTorch's Linear default), never a constant: with constant weights (PaddleRec's MMoE and PLE
layers) the units of an expert get identical gradients and never diverge.
"""
import math
from typing import List, Sequence

import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.errors import ConfigError


def positive_ints(value, key) -> tuple:
    """``value`` (an int or a list of them) as a tuple of positive ints; ConfigError naming ``key`` otherwise."""
    items = (value,) if isinstance(value, int) and not isinstance(value, bool) else tuple(value or ())
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        raise ConfigError(f"expected a list of positive integers, got {value!r}", key=key)
    return items


def positive_int(value, key) -> int:
    """``value`` as a positive int (a count: experts, levels); ConfigError naming ``key`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"expected a positive integer (a count), got {value!r}", key=key)
    return value


def seeded_parameter(layer, rng, shape, fan_in, zero=False):
    """A float32 parameter of ``layer`` drawn uniformly in +-1/sqrt(fan_in) from ``rng`` (zeros with ``zero``)."""
    bound = 1.0 / math.sqrt(max(int(fan_in), 1))
    value = np.zeros(shape, np.float32) if zero else rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return layer.create_parameter(list(shape), dtype="float32",
                                  default_initializer=paddle.nn.initializer.Assign(value))


class SeededLinear(paddle.nn.Layer):
    """``y = x W + b`` with W [in, out] and b [out] drawn from a numpy generator (:func:`seeded_parameter`)."""

    def __init__(self, rng, in_features: int, out_features: int):
        super().__init__()
        self.weight = seeded_parameter(self, rng, (in_features, out_features), in_features)
        self.bias = seeded_parameter(self, rng, (out_features,), in_features)

    def forward(self, x):
        return paddle.matmul(x, self.weight) + self.bias


class Tower(paddle.nn.Layer):
    """A stack of ReLU layers ``h = dropout(relu(h W_l + b_l))``, one per width: a task's tower (Ma et al.'s towers
    h^k, the task layers of Sener and Koltun's LeNet) or ``hard``'s shared bottom; no widths: the identity."""

    def __init__(self, rng, in_features: int, widths: Sequence[int], dropout: float = 0.0):
        super().__init__()
        self.layers = paddle.nn.LayerList()
        for width in widths:
            self.layers.append(SeededLinear(rng, in_features, width))
            in_features = width
        self.output_size = in_features
        self.dropout = paddle.nn.Dropout(dropout) if dropout else None

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
            if self.dropout is not None:
                x = self.dropout(x)
        return x


class ExpertBank(paddle.nn.Layer):
    """``count`` experts that read the same input, each an MLP ``h = relu(h W + b)`` per width (Ma et al.'s experts:
    ReLU layers; ``last_relu`` False: the last layer linear, for embeddings that cosine heads score, which ReLU would
    confine to the positive orthant). ``forward(x [n, d]) -> [n, count, width]``; the experts' weights are stacked
    ``[count, d, width]`` so that all of them run in one matmul (first layer) or one batched matmul (later layers)."""

    def __init__(self, rng, count: int, in_features: int, widths: Sequence[int], last_relu: bool = True):
        super().__init__()
        self.count = int(count)
        self.last_relu = bool(last_relu)
        self.weights, self.biases = paddle.nn.ParameterList(), paddle.nn.ParameterList()
        for width in widths:
            self.weights.append(seeded_parameter(self, rng, (self.count, in_features, width), in_features))
            self.biases.append(seeded_parameter(self, rng, (self.count, width), in_features))
            in_features = width
        self.output_size = in_features

    def forward(self, x):
        weights, biases = list(self.weights), list(self.biases)
        first, rest = weights[0], list(zip(weights[1:], biases[1:]))
        d, width = first.shape[1], first.shape[2]
        # x [n, d] @ [d, count * width]: every expert's first layer at once
        h = paddle.matmul(x, first.transpose([1, 0, 2]).reshape([d, self.count * width]))
        h = h.reshape([x.shape[0], self.count, width]) + biases[0]
        for weight, bias in rest:
            h = paddle.bmm(F.relu(h).transpose([1, 0, 2]), weight).transpose([1, 0, 2]) + bias
        return F.relu(h) if self.last_relu else h


class Gate(paddle.nn.Layer):
    """A softmax gate over ``count`` experts: ``g(x) = softmax(x W_g + b_g)`` (Ma et al., eq. 8, with a bias)."""

    def __init__(self, rng, in_features: int, count: int):
        super().__init__()
        self.linear = SeededLinear(rng, in_features, count)

    def forward(self, x):
        return F.softmax(self.linear(x), axis=-1)


def mix_experts(gate, experts):
    """``sum_i g_i(x) e_i(x)``: gate weights ``[n, m]`` times expert outputs ``[n, m, w]`` -> ``[n, w]``."""
    return paddle.bmm(gate.unsqueeze(1), experts).squeeze(1)


class Architecture(paddle.nn.Layer):
    """Base class: the layer between the backbone and the heads (module docstring).

    Subclasses implement :meth:`mix` (task t's rows of backbone features -> its representation) and declare their
    own shared and task parameters; the base adds the optional per-task towers (``tower``: widths, ReLU after each,
    ``tower_dropout``) after :meth:`mix`.

    Parameters:
        seed (int): set by the job: drawn from the job's seed (and the name architecture); every weight of the
            architecture's own layers is drawn from it
        tower (list): widths of the layers of each task's tower, ``h = dropout(relu(h W + b))`` per width, after
            the architecture's own layers (on the backbone's features for task_norm and adapters; Ma et al.'s towers
            h^k); the last width is what the task's head reads (its feature_size); empty (the default): no tower
        tower_dropout (float): dropout rate in [0, 1) after every layer of the towers (training only); 0: none
    """

    per_task_backbone = False  # True: task-specific layers inside the backbone; it runs once per task (select)
    # True: the backbone's output is one representation every task reads (MGDA-UB's Z, Sener and Koltun); False when
    # task layers sit inside the backbone (task BatchNorms, adapters) or every task has a column of its own
    shares_backbone_output = True

    def __init__(self, feature_size: int, tasks: Sequence[str], seed: int = 0, tower=(), tower_dropout: float = 0.0):
        super().__init__()
        self.tasks = list(tasks)
        if not self.tasks:
            raise ConfigError("an architecture needs at least one task")
        self.input_size = int(feature_size)
        self.tower_widths = positive_ints(tower, "tower")
        if not 0.0 <= float(tower_dropout) < 1.0:
            raise ConfigError(f"expected a dropout rate in [0, 1), got {tower_dropout!r}", key="tower_dropout")
        self.tower_dropout = float(tower_dropout)
        self.rng = np.random.RandomState(int(seed) % (2 ** 32))
        self.towers = None

    def build_towers(self, width: int):
        """The per-task towers on ``width``-wide representations (call once the mixing layers exist)."""
        self.mix_size = int(width)
        if self.tower_widths:
            self.towers = paddle.nn.LayerList([Tower(self.rng, width, self.tower_widths, self.tower_dropout)
                                               for _ in self.tasks])

    @property
    def output_size(self) -> int:
        """Width of what the heads see (the heads' ``feature_size``)."""
        return self.tower_widths[-1] if self.tower_widths else self.mix_size

    @property
    def is_identity(self) -> bool:
        """True when every head sees the backbone's features unchanged (``hard`` without towers)."""
        return False

    @property
    def one_embedding(self) -> bool:
        """True when every task's embedding comes out of the same weights, so that one task's samples can be scored
        against another task's class centres (cross-head negatives): ``hard`` without towers, and task BatchNorms
        or adapters without towers (every weight shared but a task's normalisation or its residual adapter, which
        starts as the identity of the shared path). Towers, experts, gates and stitch columns give each task
        coordinates of its own, where another head's centres mean nothing. A task BatchNorm on the embedding
        itself (the faces CNN's ``embedding_bn``) is a per-task diagonal affine map of it: one space still, but
        an image embeds differently through each task's norms (docs/architectures.md measures what that costs
        when an image's task is unknown)."""
        return self.is_identity

    def index(self, task: str) -> int:
        """Position of ``task`` among the architecture's tasks (job order)."""
        return self.tasks.index(task)

    def attach(self, backbone):
        """Called once, before BatchNorms are synchronised and parameters frozen: architectures with layers inside
        the backbone put them there; the others leave it as it is."""

    def backbone_copies_needed(self) -> int:
        """How many more backbones of the job's config the architecture runs beside the job's own (a column per
        task); the job builds them, drawn from its seed, and hands them to :meth:`adopt_backbone_copies`."""
        return 0

    def adopt_backbone_copies(self, copies):
        """Take the :meth:`backbone_copies_needed` backbones the job built (they become sub-layers)."""
        if copies:
            raise ValueError(f"architecture '{self.registered_name}' runs no copy of the backbone")

    def backbone_copies(self) -> list:
        """The copies of the backbone the architecture holds: the job synchronises their BatchNorms and freezes
        their parameters as the backbone's."""
        return []

    def run_backbone(self, backbone, inputs):
        """The backbone's output for ``inputs`` (every pass of the joint model and of an embedder goes through
        here): ``backbone(inputs)``; architectures with a column per task run them all."""
        return backbone(inputs)

    def select(self, task: str):
        """``per_task_backbone`` architectures: the task whose layers the next backbone pass uses."""

    def mix(self, task: str, features):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, task: str, features):
        """Task ``task``'s representation of its rows' backbone ``features``: :meth:`mix`, then its tower."""
        h = self.mix(task, features)
        return self.towers[self.index(task)](h) if self.towers is not None else h

    # ---- which parameters are shared -------------------------------------------------------------------------
    def own_shared_parameters(self) -> List:
        """The architecture's own parameters that several tasks' losses reach (subclasses)."""
        return []

    def own_task_parameters(self, task: str) -> List:
        """The architecture's own parameters that only ``task``'s loss reaches, besides its tower (subclasses)."""
        return []

    def backbone_task_parameters(self, backbone, task: str) -> List:
        """Parameters inside the backbone that are ``task``'s own (``per_task_backbone`` architectures)."""
        return []

    def shared_parameters(self, backbone) -> List:
        """Every trainable shared parameter: the backbone's (but for task layers inside it), then the architecture's."""
        own = {id(p) for t in self.tasks for p in self.backbone_task_parameters(backbone, t)}
        shared = [p for p in backbone.parameters() if id(p) not in own] + self.own_shared_parameters()
        return [p for p in shared if not p.stop_gradient]

    def task_parameters(self, task: str, backbone) -> List:
        """Every trainable parameter only ``task``'s loss reaches, outside its head."""
        params = self.backbone_task_parameters(backbone, task) + self.own_task_parameters(task)
        if self.towers is not None:
            params += list(self.towers[self.index(task)].parameters())
        return [p for p in params if not p.stop_gradient]

    def planned_bytes(self, optimizer_slots: int) -> dict:
        """Bytes of the architecture's own parameters, gradients and optimizer state, for the memory plan."""
        weights = sum(int(p.numel()) * p.element_size() for p in self.parameters())
        return {"parameters": weights, "gradients": weights, "optimizer state": optimizer_slots * weights}


class TaskEmbedder(paddle.nn.Layer):
    """Backbone + architecture for one named task: ``forward(inputs) -> [N, output_size]``, the embedding task's head
    sees (evaluation, export). It reads the backbone's input fields."""

    def __init__(self, backbone, architecture: Architecture, task: str):
        super().__init__()
        self.backbone = backbone
        self.architecture = architecture
        self.task = task
        self.feature_size = architecture.output_size
        self.tokenizer = backbone.tokenizer  # None: architectures refuse text encoders' several outputs
        self.training = backbone.training  # embed() restores the mode it found

    def input_fields(self):
        """The backbone's input fields."""
        return self.backbone.input_fields()

    def save_assets(self, folder: str):
        """The backbone's assets besides its weights (``Backbone.save_assets``)."""
        self.backbone.save_assets(folder)

    def forward(self, inputs):
        self.architecture.select(self.task)
        features = self.architecture.run_backbone(self.backbone, inputs)
        if features.dtype != paddle.float32:
            features = features.astype("float32")
        return self.architecture(self.task, features)
