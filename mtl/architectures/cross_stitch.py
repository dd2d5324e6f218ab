"""Cross-stitch networks (Misra et al., "Cross-stitch Networks for Multi-task Learning", CVPR 2016), as layers
between the backbone and the heads.

One column per task (an MLP on the backbone's features); after every layer l a cross-stitch unit mixes the columns'
activations linearly (eq. 1 of the paper, for T tasks):
    a_s^l = relu(W_s^l h_s^(l-1) + b_s^l),    h_t^l = sum_s alpha^l_(t,s) a_s^l,    h_t^0 = z,
and task t's head reads tower_t(h_t^L) (``last_relu: false``: no ReLU in the last layer, for embeddings that
cosine heads score). alpha starts as the paper's convex combination (``init: [0.9, 0.1]``:
alpha_tt = 0.9, the other 0.1 split evenly over the other columns); Misra et al. train alpha with a larger
learning rate (``optimizer.lr_mult: {architecture.stitches: ...}``). With each task's own rows, task t's rows run
every column (the stitch units need them) and read column t's last mixture.

Shared parameters: every column (each reaches every task's output through the stitch units) and the stitch rows
of every layer but the last; the last layer's row alpha^L_(t,.) is task t's own.
"""
import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.architectures.base import Architecture, SeededLinear, positive_ints
from mtl.core.errors import ConfigError
from mtl.core.registry import register_architecture


def check_init(init):
    """``init`` as (alpha_same, alpha_others); ConfigError naming ``init`` unless it is two numbers."""
    values = tuple(init) if isinstance(init, (list, tuple)) else ()
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"expected [alpha_same, alpha_others] (two numbers, e.g. [0.9, 0.1]), got {init!r}",
                          key="init")
    return float(values[0]), float(values[1])


@register_architecture("cross_stitch")
class CrossStitch(Architecture):
    """One MLP column per task with a learned linear mix of the columns after every layer (cross-stitch units).

    Parameters:
        layers (list): widths of the layers l = 1..L of each task's column ``a_s^l = relu(W_s^l h_s^(l-1) + b_s^l)``
            (Misra et al., eq. 1), a cross-stitch unit after each; at least one; the last width is what the towers
            or heads read
        init (list): [alpha_same, alpha_others]: the start of the cross-stitch units' alpha^l (trained): alpha_tt =
            alpha_same, alpha_others split evenly over the other columns (the paper's convex combination [0.9, 0.1]);
            Misra et al. train alpha with a larger learning rate (optimizer.lr_mult: {architecture.stitches: ...})
        last_relu (bool): ReLU after the columns' last layer too (true, the paper's); false: their last layer
            linear, for embeddings a cosine head scores (ReLU would confine them to the positive orthant)
    """

    def __init__(self, feature_size: int, tasks, seed: int = 0, layers=(64,), init=(0.9, 0.1), last_relu: bool = True,
                 tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        widths = positive_ints(layers, "layers")
        if not widths:
            raise ConfigError("cross_stitch needs at least one layer per column", key="layers")
        same, others = check_init(init)
        self.last_relu = bool(last_relu)
        count = len(self.tasks)
        self.columns = paddle.nn.LayerList()
        for _ in self.tasks:
            column, width = paddle.nn.LayerList(), self.input_size
            for out in widths:
                column.append(SeededLinear(self.rng, width, out))
                width = out
            self.columns.append(column)
        self.stitches = paddle.nn.LayerList()
        for _ in widths:
            rows = paddle.nn.ParameterList()
            for t in range(count):
                row = np.full([count], others / max(count - 1, 1), np.float32)
                row[t] = same
                rows.append(self.create_parameter([count], dtype="float32",
                                                  default_initializer=paddle.nn.initializer.Assign(row)))
            self.stitches.append(rows)
        self.build_towers(widths[-1])

    def mix(self, task, features):
        """Column t's last mixture ``h_t^L`` of task t's rows (every column runs: the stitch units read them all)."""
        t, count, last = self.index(task), len(self.tasks), len(self.stitches) - 1
        h = {s: features for s in range(count)}
        for layer in range(len(self.stitches)):
            stacked = paddle.stack([self.activation(layer, h[s], s) for s in range(count)])  # [T, n, w]
            rows = [t] if layer == last else range(count)
            h = {s: paddle.sum(self.stitches[layer][s].reshape([count, 1, 1]) * stacked, axis=0) for s in rows}
        return h[t]

    def activation(self, layer, x, column):
        """``a_s^l``: column s's layer l on its input, ReLU but at the last layer with ``last_relu`` False."""
        a = self.columns[column][layer](x)
        return F.relu(a) if self.last_relu or layer < len(self.stitches) - 1 else a

    def own_shared_parameters(self):
        """Every column, the stitch rows of every layer but the last."""
        rows = [p for layer in list(self.stitches)[:-1] for p in layer]
        return list(self.columns.parameters()) + rows

    def own_task_parameters(self, task):
        """Task t's row of the last stitch unit."""
        return [self.stitches[len(self.stitches) - 1][self.index(task)]]
