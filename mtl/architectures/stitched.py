"""Cross-stitch networks as Misra et al. build them ("Cross-stitch Networks for Multi-task Learning", CVPR 2016):
one copy of the whole backbone per task (a column), and a cross-stitch unit after each of the backbone's stages.

Column s runs the backbone's stages (``Backbone.stages``) with its own weights; after stage l the units mix the
columns' activations linearly, channel and position alike (eq. 1 of the paper, for T tasks):
    a_s^l = stage_l^(s)(h_s^(l-1)),    h_t^l = sum_s alpha^l_(t,s) a_s^l,    h_t^0 = x,
and task t's head reads tower_t(h_t^L). alpha starts as the paper's convex combination (``init: [0.9, 0.1]``:
alpha_tt = 0.9, the rest split evenly over the other columns). The columns are drawn independently (task 0's
column is the job's backbone; each other column a backbone built from the same config, drawn from the job's seed
and its index, with the same pretrained weights if any): at the start the network is T single-task networks mixed
by 0.1. With each task's own rows, every task's rows run every column (the stitch units need them all); the
backbone's output is then the T columns' last mixtures side by side, ``[n, T * D]``, and task t reads its slice.

Cost: T times the backbone's parameters and compute (docs/architectures.md). ``cross_stitch`` is the light form:
MLP columns on top of one shared backbone.

Shared parameters: every column (each reaches every task's output through the stitch units) and the stitch rows
of every stage but the last; the last stage's row alpha^L_(t,.) is task t's own.
"""
import numpy as np
import paddle

from mtl.architectures.base import Architecture
from mtl.architectures.cross_stitch import check_init
from mtl.core.errors import ConfigError
from mtl.core.registry import register_architecture


@register_architecture("cross_stitch_backbone")
class CrossStitchBackbone(Architecture):
    """A copy of the backbone per task, its stages stitched by learned linear mixes (Misra et al.'s networks).

    Parameters:
        init (list): [alpha_same, alpha_others]: the start of every cross-stitch unit (trained): alpha_tt =
            alpha_same, alpha_others split evenly over the other columns (the paper's convex combination [0.9,
            0.1]); Misra et al. train alpha with a larger learning rate (optimizer.lr_mult: {architecture.stitches:
            ...})
    """

    shares_backbone_output = False  # each task reads its own column's slice

    def __init__(self, feature_size: int, tasks, seed: int = 0, init=(0.9, 0.1), tower=(), tower_dropout: float = 0.0):
        super().__init__(feature_size, tasks, seed, tower, tower_dropout)
        self.same, self.others = check_init(init)
        self.columns = paddle.nn.LayerList()
        self.stitches = paddle.nn.LayerList()
        self.build_towers(self.input_size)

    def attach(self, backbone):
        """One cross-stitch unit per stage of ``backbone``; ConfigError when it cannot be split into stages."""
        stages = backbone.stages()
        if not stages:
            raise ConfigError(f"architecture 'cross_stitch_backbone' stitches copies of the backbone between its "
                              f"stages, but backbone '{backbone.registered_name}' does not declare them (lenet and "
                              f"cnn do)", key="type")
        count = len(self.tasks)
        if count < 2:
            raise ConfigError("architecture 'cross_stitch_backbone' stitches a copy of the backbone per task, and "
                              "this job has one task: use architecture: hard", key="type")
        for _ in stages:
            rows = paddle.nn.ParameterList()
            for t in range(count):
                row = np.full([count], self.others / max(count - 1, 1), np.float32)
                row[t] = self.same
                rows.append(self.create_parameter([count], dtype="float32",
                                                  default_initializer=paddle.nn.initializer.Assign(row)))
            self.stitches.append(rows)

    def backbone_copies_needed(self) -> int:
        """Columns besides the job's backbone: one per task but the first."""
        return len(self.tasks) - 1

    def adopt_backbone_copies(self, copies):
        """The columns of tasks 1..T-1 (task 0's column is the job's backbone)."""
        for copy in copies:
            self.columns.append(copy)

    def backbone_copies(self):
        """The columns of tasks 1..T-1."""
        return list(self.columns)

    def run_backbone(self, backbone, inputs):
        """Every column over every row, stitched after each stage: ``[n, T * D]``, column t's last mixture in
        columns ``t*D .. (t+1)*D - 1``."""
        count = len(self.tasks)
        stages = [backbone.stages()] + [column.stages() for column in self.columns]
        h = [inputs] * count
        for layer, rows in enumerate(self.stitches):
            a = paddle.stack([stages[s][layer](h[s]) for s in range(count)])  # [T, n, ...]
            # [T, T]: row t mixes the columns into column t (rows reshaped one by one: paddle.stack of parameters
            # fails when an export traces it)
            alpha = paddle.concat([rows[t].reshape([1, count]) for t in range(count)]).astype(a.dtype)
            mixed = paddle.matmul(alpha, a.reshape([count, -1])).reshape(a.shape)
            h = paddle.unbind(mixed, axis=0)
        return paddle.concat(list(h), axis=1)

    def mix(self, task, features):
        """Task t's slice of :meth:`run_backbone`'s output: column t's last mixture."""
        t, width = self.index(task), self.input_size
        return features[:, t * width:(t + 1) * width]

    def own_shared_parameters(self):
        """Every column but the job's backbone (counted with it), the stitch rows of every stage but the last."""
        rows = [p for layer in list(self.stitches)[:-1] for p in layer]
        return list(self.columns.parameters()) + rows

    def own_task_parameters(self, task):
        """Task t's row of the last stitch unit."""
        return [self.stitches[len(self.stitches) - 1][self.index(task)]]
