"""Two ranks: a replicated parameter that only rank 1 uses in a step (as a CRF's transitions for a slice of one-word
sentences) must not desynchronise the fused gradient all-reduce; it gets rank 1's gradient on both ranks, and a
parameter no rank used keeps no gradient. ``main(OUT_DIR)`` writes ``OUT_DIR/rank{k}.npz``
(tests/test_text_training.py)."""
import os

import numpy as np


def main(out_dir):
    import paddle

    from mtl.core.runtime import init_distributed

    rank, _ = init_distributed()
    from mtl.architectures.hard import Hard
    from mtl.headkit.base import Head
    from mtl.parallel.strategy import ParallelStrategy

    class TinyHead(Head):
        def __init__(self):
            super().__init__(2)
            self.linear = paddle.nn.Linear(2, 2)

        def forward(self, x):
            return self.linear(x)

    class Model(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.backbone = paddle.nn.Linear(3, 2)
            self.architecture = Hard(2, ["t"])  # a joint model's parts, as ParallelStrategy reads them
            self.heads = paddle.nn.LayerDict({"t": TinyHead()})
            self.extra = paddle.nn.Linear(2, 5)   # used by rank 1 only
            self.unused = paddle.nn.Linear(2, 4)  # used by no rank

    paddle.seed(0)
    model = Model()
    strategy = ParallelStrategy(model)
    x = paddle.to_tensor(np.full((2, 3), float(rank + 1), np.float32))
    loss = model.heads["t"](model.backbone(x)).sum()
    if rank == 1:
        loss = loss + model.extra(model.backbone(x)).sum()
    loss.backward()
    strategy.reduce_gradients()
    out = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **out)
