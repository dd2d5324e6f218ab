"""Multi-gate mixture of experts (Ma et al., "Modeling Task Relationships in Multi-task Learning with Multi-gate
Mixture-of-Experts", KDD 2018) and its one-gate baseline.

For task k and its rows' backbone features z (eqs. 6-8 of the paper, with the backbone's z in place of the input x):
    f^k(z) = sum_{i=1..n} g^k(z)_i f_i(z),   g^k(z) = softmax(W_gk z + b_gk),   head_k(tower_k(f^k(z)))
f_i are n experts shared by every task (MLPs with ReLU; ``last_relu: false``: their last layer linear), g^k one
gate per task that sees only task k's rows.
``gates: one`` uses a single gate g for every task (the paper's one-gate MoE, "OMoE", eq. 5).
"""
from mtl.architectures.base import Architecture, ExpertBank, Gate, mix_experts, positive_int, positive_ints
from mtl.core.errors import ConfigError
from mtl.core.registry import register_architecture


@register_architecture("mmoe")
class MMoE(Architecture):
    """Experts shared by every task mixed by one softmax gate per task (``gates: task``) or one for all (``one``).

    Parameters:
        experts (int): n, the number of experts f_i shared by every task (the sum over i = 1..n of Ma et al.'s eq. 7)
        expert_layers (list): widths of the layers of each expert, an MLP ``h = relu(h W + b)`` per width on the
            backbone's features (at least one); the last width is the mixture's, what the towers or heads read
        gates (str): task (one softmax gate g^k per task, each seeing only its task's rows: MMoE, eqs. 6-8) or one
            (a single gate g for every task: the one-gate mixture of experts, OMoE, eq. 5)
        last_relu (bool): ReLU after the experts' last layer too (true, the paper's ReLU experts); false: their last
            layer linear, for embeddings a cosine head scores (ReLU would confine them to the positive orthant)
    """

    def __init__(self, feature_size: int, tasks, seed: int = 0, experts: int = 8, expert_layers=(16,),
                 gates: str = "task", last_relu: bool = True, tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        count = positive_int(experts, "experts")
        if gates not in ("task", "one"):
            raise ConfigError(f"gates must be 'task' (one gate per task, MMoE) or 'one' (one gate for every task, "
                              f"OMoE), got {gates!r}", key="gates")
        self.one_gate = gates == "one"
        self.experts = ExpertBank(self.rng, count, self.input_size, positive_ints(expert_layers, "expert_layers"),
                                  last_relu)
        self.gates = self._gates(count)
        self.build_towers(self.experts.output_size)

    def _gates(self, count):
        import paddle

        return paddle.nn.LayerList([Gate(self.rng, self.input_size, count)
                                    for _ in range(1 if self.one_gate else len(self.tasks))])

    def gate(self, task):
        """The gate task ``task`` reads its mixture from."""
        return self.gates[0 if self.one_gate else self.index(task)]

    def mix(self, task, features):
        """``sum_i g^k(z)_i f_i(z)`` over task k's rows."""
        return mix_experts(self.gate(task)(features), self.experts(features))

    def own_shared_parameters(self):
        """The experts (and the one gate of ``gates: one``)."""
        return list(self.experts.parameters()) + (list(self.gates.parameters()) if self.one_gate else [])

    def own_task_parameters(self, task):
        """Task ``task``'s gate (``gates: task``)."""
        return [] if self.one_gate else list(self.gate(task).parameters())
