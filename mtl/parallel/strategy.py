"""The parallel strategy: which parameters are sharded, how gradients and statistics meet across processes.

Data parallel backbone, model parallel heads (PyTorch Lightning's Trainer/Strategy split is the model): the trainer
runs the loop and asks this object everything that involves other processes.

* Parameters split in two: *sharded* ones (class centres of a head that declares ``sharded``: every rank holds
  different classes) and *replicated* ones (the backbone and unsharded heads: equal on every rank).
* Gradients: every head's loss is the loss of the global sub-batch, so the gradient of a replicated parameter is the
  SUM over ranks of the per-rank gradients (one fused all-reduce); sharded gradients stay where they are.
* Clipping: ``||g||^2 = sum of the replicated squares (equal on every rank) + all-reduce SUM of the sharded squares``.
* BatchNorm running statistics follow each rank's rows; before evaluating or saving they are averaged over ranks.
* Agreement: a rank that must stop (a data error) tells every rank in one small all-reduce; checkpoints and the run
  folder use the strategy's barrier, its agreement on errors and rank 0's decisions (``from_main``), so that the
  loop communicates through this object only.
"""
import contextlib
import math
from typing import Optional

import paddle

from mtl.core import activity
from mtl.core.arrays import tensor_from
from mtl.data.steps import check_divisible, task_seed
from mtl.parallel import distributed
from mtl.parallel.sync_bn import ARCHITECTURE_STATISTIC, is_running_statistic


def _squared_norm(tensors) -> paddle.Tensor:
    total = paddle.zeros([], dtype="float32")
    for t in tensors:
        total += paddle.sum(paddle.square(t.astype("float32")))
    return total


def _grads(params):
    return [p.grad for p in params if p.grad is not None]


@paddle.no_grad()
def global_grad_norm(replicated, sharded) -> float:
    """``||g||`` over every rank's parameters: the replicated squares (identical on every rank after the gradient
    sync) plus the all-reduce SUM over ranks of the sharded squares. Equal on every rank (one scalar all-reduce)."""
    norm_sq = _squared_norm(_grads(replicated)) + distributed.all_reduce_sum(_squared_norm(_grads(sharded)))
    return float(paddle.sqrt(norm_sq))


@paddle.no_grad()
def scale_to_norm(tensors, norm: float, max_norm: float):
    """Scale the gradients of ``tensors`` by ``max_norm / norm`` when ``norm > max_norm`` (and finite)."""
    if norm > max_norm and math.isfinite(norm):
        for g in _grads(tensors):
            g.scale_(max_norm / norm)


class ParallelStrategy:
    """Data-parallel backbone and class-sharded heads of one joint model: placement, gradient sync, statistics."""

    def __init__(self, model):
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.tasks = list(model.heads.keys())  # job order: the layout of the per-step row check (agree)
        self.sharded = [p for head in model.heads.values() if head.sharded for p in head.parameters()]
        ids = {id(p) for p in self.sharded}
        self.replicated = [p for p in model.parameters() if id(p) not in ids]
        # the backbone's under their own names, an architecture's (its backbone copies) under ARCHITECTURE_STATISTIC
        tensors = list(model.backbone.named_parameters()) + list(model.backbone.named_buffers())
        tensors += [(ARCHITECTURE_STATISTIC + name, t) for name, t in
                    list(model.architecture.named_parameters()) + list(model.architecture.named_buffers())]
        self.statistics = {name: t for name, t in tensors if is_running_statistic(name, t) and math.prod(t.shape) > 0}

    @property
    def is_main(self) -> bool:
        """True on the rank that writes shared files and prints (rank 0)."""
        return self.rank == 0

    def check_batch_split(self, schedule, source=None, accumulate: int = 1):
        """Start-up check: every sub-batch splits evenly into ``accumulate`` micro-batches and each over the processes
        (a ConfigError suggests sizes)."""
        check_divisible(schedule, self.world, source, accumulate)

    def seed_random(self, seed: int):
        """Seed this rank's own random stream (dropout masks) from (seed, rank); checkpoints restore it."""
        paddle.seed(task_seed(seed, f"rank{self.rank}"))

    def reduce_gradients(self):
        """SUM of every replicated parameter's gradient over ranks, in one fused all-reduce."""
        if self.world > 1:
            with activity.collective("the all-reduce of the replicated gradients"):
                self.fill_missing_gradients()
                distributed.all_reduce_flat([p.grad for p in self.replicated if p.grad is not None])

    def fill_missing_gradients(self):
        """A replicated parameter that got a gradient on some rank but not on this one (its use depended on this
        rank's rows: a CRF's transitions for a slice of one-word sentences) gets a zero gradient here, so that
        every rank all-reduces the same tensors; one all-reduce of a flag per parameter. A parameter no rank used
        keeps no gradient, as at one process."""
        params = list(self.replicated)
        if not params:
            return
        flags = tensor_from([0.0 if p.grad is None else 1.0 for p in params], dtype="float32")
        anywhere = distributed.all_reduce_sum(flags).numpy() > 0
        missing = [p for p, used in zip(params, anywhere) if used and p.grad is None]
        if missing:
            paddle.autograd.backward([paddle.add_n([(p * 0.0).sum() for p in missing])])

    @paddle.no_grad()
    @contextlib.contextmanager
    def agreed_statistics(self):
        """Inside: the backbone's BatchNorm running statistics averaged over ranks; after: each rank's own again.

        Without synchronised BatchNorm each rank's running mean and variance follow its own rows; evaluation (every
        rank embeds the eval split for the model-parallel heads), checkpoints (rank 0 saves the backbone) and export
        must all see one set, the same on every rank: their mean over ranks. Each rank's own statistics come back
        afterwards, so that evaluating or saving never changes the training that follows (a run saved at step N
        and resumed equals one that was not saved there).
        """
        if self.world <= 1 or not self.statistics:
            yield
            return
        tensors = list(self.statistics.values())
        own = [t.clone() for t in tensors]
        with activity.collective("the all-reduce of the BatchNorm statistics"):
            distributed.all_reduce_flat(tensors, divisor=self.world)
        try:
            yield
        finally:
            for tensor, value in zip(tensors, own):
                tensor.set_value(value)

    def grad_norm(self, row_gradients=()) -> float:
        """Global norm of every gradient of this step, equal on every rank (one scalar all-reduce).

        ``row_gradients`` (:class:`mtl.headkit.row_gradients.RowGradient`) are the row-sparse gradients heads hand
        to the
        optimizer (sharded: each rank holds its own rows); they count in the norm.
        """
        with activity.collective("the all-reduce of the gradient norm"):
            return global_grad_norm(self.replicated, self.sharded + list(row_gradients))

    @paddle.no_grad()
    def unscale_gradients(self, factor: float, row_gradients=()):
        """Multiply every gradient of this step by ``factor`` (``1 / loss scale`` after an fp16 backward)."""
        for grad in _grads(self.replicated + self.sharded + list(row_gradients)):
            grad.scale_(factor)

    def clip_gradients(self, max_norm: Optional[float], norm: float, row_gradients=()):
        """Scale every gradient of this step (row-sparse ones too) to the global norm ``max_norm`` (None: no
        clipping); ``norm`` is :meth:`grad_norm`'s."""
        if max_norm:
            scale_to_norm(self.replicated + self.sharded + list(row_gradients), norm, max_norm)

    def barrier(self):
        """Wait until every rank gets here (checkpoint writing and clearing a run folder)."""
        distributed.barrier()

    def wait_for_all(self, name: str):
        """Wait until every rank gets here however long one takes (no collective: gloo's 30 s do not apply), before
        a collective that follows work some ranks finish long before the others (:func:`distributed.wait_for_all`)."""
        distributed.wait_for_all(name)

    def agree_on_error(self, text: Optional[str]) -> Optional[str]:
        """The first error text any rank met (the lowest rank's), or None, equal on every rank: every rank then stops
        together instead of leaving the others waiting in the next collective."""
        return distributed.lowest_rank_text(text)

    def gather_texts(self, text: str) -> list:
        """Every rank's ``text`` in rank order, on every rank (results each rank holds alone, merged once)."""
        return distributed.gather_texts(text)

    def from_main(self, text: Optional[str]) -> Optional[str]:
        """Rank 0's ``text`` on every rank (the other ranks' values are ignored): one rank decides, all follow."""
        return distributed.lowest_rank_text(text if self.is_main else None)

    def agree(self, text: Optional[str], stop: bool = False, batch=None):
        """``(error, stop)`` agreed by every rank in one small all-reduce per step: the first error any rank met
        (``kind\nmessage`` text, or None) and whether any rank was asked to stop (a pre-emption signal). With the
        step's ``batch`` the same all-reduce checks that every rank holds as many rows of each task, before any head
        gathers them (RuntimeError on every rank alike otherwise)."""
        if self.world <= 1:
            return text, bool(stop)
        if text:
            kind, message = text.split("\n", 1)
            text = f"{kind}\nrank {self.rank} met: {message}"
        rows = self.batch_rows(batch) if batch is not None and not text else [0] * len(self.tasks)
        with activity.collective("the per-step agreement of the ranks (an all-reduce)"):
            text, stop, uneven = distributed.agree(text, stop, counts=rows)
        if uneven and not text:
            raise RuntimeError(f"the ranks hold different numbers of rows of task(s) "
                               f"{[self.tasks[i] for i in uneven]} in this step (this rank: "
                               f"{[rows[i] for i in uneven]}); gathering them would hang or corrupt the batch")
        return text, stop

    def batch_rows(self, batch):
        """This rank's row count of every task of the job in ``batch`` (0 for a task absent from the step)."""
        return [len(next(iter(batch[t].values()))) if t in batch and batch[t] else 0 for t in self.tasks]

    # ---- sums the weighting step asks for (mtl.train.balancing does the arithmetic) -----------------------------
    def sum_over_ranks(self, tensor):
        """A new tensor: ``tensor`` summed over ranks (one all-reduce; itself at world 1)."""
        return distributed.all_reduce_sum(tensor) if self.world > 1 else tensor

    def sum_over_ranks_(self, tensor):
        """``tensor`` summed over ranks in place (one all-reduce): the per-task gradient matrix."""
        if self.world > 1:
            distributed.all_reduce_flat([tensor])

    def reduce_gradients_except(self, skip):
        """SUM over ranks of the replicated gradients, leaving ``skip`` (already global) untouched."""
        if self.world > 1:
            self.fill_missing_gradients()
            ids = {id(p) for p in skip}
            distributed.all_reduce_flat([p.grad for p in self.replicated if p.grad is not None and id(p) not in ids])
