"""Customized gate control (CGC) and progressive layered extraction (PLE) (Tang et al., "Progressive Layered
Extraction (PLE): A Novel Multi-Task Learning (MTL) Model for Personalized Recommendations", RecSys 2020).

CGC (one extraction level): task k has m_k experts of its own, every task reads m_s shared experts, and task k's
gate mixes only its own and the shared ones (eqs. 2-4 of the paper, with the backbone's z as the input):
    g^k(z) = w^k(z) S^k(z),  w^k(z) = softmax(W_g^k z),  S^k(z) = [E_(k,1)(z), .., E_(k,m_k)(z), E_(s,1)(z), ..]
PLE stacks N levels (eq. 5): level j's experts of task k read task k's output of level j - 1, its shared experts
read the shared output of level j - 1 (experts: ReLU MLPs, ``last_relu: false`` their last layer linear), and every
level but the last has a shared gate over ALL its experts (every
task's and the shared ones) that makes the next level's shared input:
    g^(k,j) = w^(k,j)(g^(k,j-1)) S^(k,j),    g^(s,j) = w^(s,j)(g^(s,j-1)) [E_(1,.)^j, .., E_(T,.)^j, E_(s,.)^j]
    g^(k,0) = g^(s,0) = z;   task k's head reads tower_k(g^(k,N)).
Experts are addressed by (owner, level) (no flat index arithmetic: PaddleRec's PLE slices one flat list of experts
so that a task gate takes an expert of another task). With each task's own rows, task t's rows run every task's
branch below the last level (the shared gates need them) and only task t's branch at the last level.

Shared parameters (several tasks' losses reach them): every shared expert and shared gate; task k's experts of
every level but the last (the shared gate of their level reads them); task k's gates of levels below N - 1 (their
output feeds task k's experts of the next level, which a shared gate reads). The rest are task k's own.
"""
import paddle

from mtl.architectures.base import Architecture, ExpertBank, Gate, mix_experts, positive_int, positive_ints
from mtl.core.registry import register_architecture


class ExtractionLevel(paddle.nn.Layer):
    """One level: every task's experts and gate, the shared experts, and (below the last level) the shared gate."""

    def __init__(self, rng, tasks: int, in_features: int, task_experts: int, shared_experts: int, widths,
                 last: bool, last_relu: bool = True):
        super().__init__()
        self.task_experts = paddle.nn.LayerList([ExpertBank(rng, task_experts, in_features, widths, last_relu)
                                                 for _ in range(tasks)])
        self.shared_experts = ExpertBank(rng, shared_experts, in_features, widths, last_relu)
        self.task_gates = paddle.nn.LayerList([Gate(rng, in_features, task_experts + shared_experts)
                                               for _ in range(tasks)])
        self.shared_gate = None if last else Gate(rng, in_features, tasks * task_experts + shared_experts)
        self.output_size = self.shared_experts.output_size

    def forward(self, inputs, shared_input, branches):
        """``inputs``: ``{k: task k's input}`` for every task of ``branches``; returns (``{k: task k's output}``, the
        shared output or None at the last level)."""
        shared = self.shared_experts(shared_input)
        own = {k: self.task_experts[k](inputs[k]) for k in branches}
        outputs = {k: mix_experts(self.task_gates[k](inputs[k]), paddle.concat([own[k], shared], axis=1))
                   for k in branches}
        if self.shared_gate is None:
            return outputs, None
        everything = paddle.concat([own[k] for k in range(len(self.task_experts))] + [shared], axis=1)
        return outputs, mix_experts(self.shared_gate(shared_input), everything)


class StackedExtraction(Architecture):
    """Base of ``cgc`` and ``ple``: ``levels`` stacked extraction levels (:class:`ExtractionLevel`), task t's head
    reading task t's output of the last one (the module docstring).

    Parameters:
        task_experts (int): m_k, the experts of each task's own at every level (Tang et al., eq. 4; the same count
            for every task)
        shared_experts (int): m_s, the shared experts at every level (eq. 4), read by every task's gate
        expert_layers (list): widths of the layers of each expert (every level's), an MLP ``h = relu(h W + b)`` per
            width (at least one); the last width is a level's output, what the next level, the towers or the heads
            read
        last_relu (bool): ReLU after the experts' last layer too (true, ReLU experts); false: their last layer
            linear, for embeddings a cosine head scores (ReLU would confine them to the positive orthant)
    """

    def __init__(self, feature_size: int, tasks, seed: int = 0, levels: int = 2, task_experts: int = 1,
                 shared_experts: int = 1, expert_layers=(16,), last_relu: bool = True, tower=(),
                 tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        count = positive_int(levels, "levels")
        own = positive_int(task_experts, "task_experts")
        shared = positive_int(shared_experts, "shared_experts")
        widths = positive_ints(expert_layers, "expert_layers")
        self.levels = paddle.nn.LayerList()
        width = self.input_size
        for j in range(count):
            self.levels.append(ExtractionLevel(self.rng, len(self.tasks), width, own, shared, widths, j == count - 1,
                                               last_relu))
            width = self.levels[-1].output_size
        self.build_towers(width)

    def mix(self, task, features):
        """Task t's output of the last level (every task's branch below it, only t's at the last)."""
        t, every = self.index(task), list(range(len(self.tasks)))
        inputs, shared = {k: features for k in every}, features
        for j, level in enumerate(self.levels):
            inputs, shared = level(inputs, shared, [t] if j == len(self.levels) - 1 else every)
        return inputs[t]

    def _level_parts(self, task=None):
        """(shared parameters, ``task``'s own) of the levels (module docstring)."""
        shared, own, last = [], [], len(self.levels) - 1
        for j, level in enumerate(self.levels):
            shared += list(level.shared_experts.parameters())
            shared += list(level.shared_gate.parameters()) if level.shared_gate is not None else []
            for k in range(len(self.tasks)):
                experts, gate = list(level.task_experts[k].parameters()), list(level.task_gates[k].parameters())
                shared += (experts if j < last else []) + (gate if j < last - 1 else [])
                if task is not None and k == self.index(task):
                    own += ([] if j < last else experts) + ([] if j < last - 1 else gate)
        return shared, own

    def own_shared_parameters(self):
        return self._level_parts()[0]

    def own_task_parameters(self, task):
        return self._level_parts(task)[1]


@register_architecture("ple")
class PLE(StackedExtraction):
    """Progressive layered extraction: ``levels`` stacked CGC levels with shared gates between them.

    Parameters:
        levels (int): N, the number of stacked extraction levels (Tang et al., eq. 5): every level but the last has
            a shared gate over all its experts that makes the next level's shared input; 1 is cgc
    """


@register_architecture("cgc")
class CGC(StackedExtraction):
    """Customized gate control: one extraction level, task experts and shared experts, one gate per task."""

    def __init__(self, feature_size: int, tasks, seed: int = 0, task_experts: int = 1, shared_experts: int = 1,
                 expert_layers=(16,), last_relu: bool = True, tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, 1, task_experts, shared_experts, expert_layers, last_relu, tower,
                         tower_dropout)
