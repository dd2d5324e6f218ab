"""Model-parallel ArcFace-family margin head (ArcFace, CosFace, combined margins) with Partial FC sampling.

One step, as named pieces:
1. gather: features and labels of every rank, in one all-gather (``mtl.parallel.collective.gather_batch``);
2. sample (Partial FC, ``sample_ratio < 1``): every positive class of the gathered batch plus random negatives, up
   to ``ceil(sample_ratio * C)`` classes drawn over all C classes from (seed, step); each rank keeps its own range;
3. cosine: ``cos = normalize(x) W^T * (1 / ||W_row||)`` on the kept rows of the shard (cheaper to differentiate
   than normalising W, see docs/paddle-notes.md);
4. margin: on the owner rank of each label only, the target cosine becomes ``cos(m1*theta + m2) - m3``
   (``mtl.headkit.margin``), then everything is multiplied by ``scale``;
5. negatives of other heads (cross-head negatives, ``mtl.headkit.cross_negatives``): the rows of the job's other face
   heads on this rank, scored after the own ones, without their same-person classes;
6. loss: the softmax cross-entropy across shards, loss only (``mtl.headkit.chunked_softmax``: one MAX and one SUM
   all-reduce); steps 3-6 run in one autograd function over blocks of class rows: the per-class work stays in cache,
   and Partial FC allocates nothing of size ``[K, D]`` but the sampled rows' gradient, declared in the head's output
   for the optimizer (:class:`mtl.headkit.row_gradients.RowGradient`, ``HeadOutput.rows``). On CPU tensors the chunk
   passes run in numpy on the tensors' own memory (``mtl.headkit.host_chunks``: Paddle's CPU element-wise and matmul
   kernels are 2-15x slower there). Inter-class filtering (``interclass_filtering_threshold``,
   ``interclass_filtering_mode``) and known same-person class pairs (``same_person``) take negatives out of a
   sample's softmax inside those passes (``mtl.headkit.filtering``);
7. top-1: the training accuracy, from the best own logit each rank saw in the passes, settled across shards outside
   the loss (``mtl.parallel.topk.top1_across_shards``).
The fused path (``fused: true``) replaces 4-5 by Paddle's ``margin_cross_entropy`` (CUDA only, no Partial FC, no
inter-class filtering, and no fallback past ``m1*theta + m2 > pi``); the composed path is the reference, runs on
every device and is the default everywhere (``fused: auto``): the fused one has not run in this project yet
(``tools/gpu_check.py`` compares it with the composed one on a GPU), holds dense ``[N, C_k]`` logits, softmax and
gradients plus a dense weight gradient (the memory plan counts them), and adds one all-gather per step for its top-1.
"""
import math

import numpy as np
import paddle
import paddle.nn.functional as F

from mtl.core.arrays import tensor_from, to_numpy, unit_rows
from mtl.core.errors import ParameterError
from mtl.core.registry import register_head
from mtl.evaluation.pairs import score_pairs, verification_pairs
from mtl.headkit.base import HeadOutput
from mtl.headkit.chunked_softmax import Statistics, chunked_margin_softmax, inverse_norm
from mtl.headkit.class_rows import RowSource, ScoredRows, Workspace, chunk_rows
from mtl.headkit.filtering import ChunkMask, check_filtering, own_segment
from mtl.headkit.margin import check_margin, margin_transform
from mtl.headkit.row_gradients import RowGradient, dense_gradient
from mtl.headkit.sharded import ShardedClassHead, sample_classes_globally, shard_of_sample
from mtl.headkit.sharded_loss import local_targets
from mtl.parallel import distributed
from mtl.parallel.collective import all_gather_rows
from mtl.parallel.topk import sharded_topk, top1_across_shards


@register_head("arcface")
class ArcFaceHead(ShardedClassHead):
    """Additive angular margin head, class centres sharded across ranks, optional Partial FC (sample_ratio).

    Parameters:
        margin (list): [m1, m2, m3]: the target cosine becomes cos(m1 theta + m2) - m3 (default: arcface's
            [1, 0.5, 0], cosface's [1, 0, 0.35])
        scale (float): s, every cosine is multiplied by it before the softmax
        sample_ratio (float): Partial FC: the share of the classes scored per step (the batch's own classes and
            random others); 1: every class
        fused (str): auto or false: the composed path (every device); true: Paddle's margin_cross_entropy (CUDA
            only; no Partial FC, no filtering)
        interclass_filtering_threshold (float): a negative class whose cosine with the sample exceeds this is taken
            for the sample's own person (Partial FC v2's filtering); 0: off
        interclass_filtering_mode (str): what becomes of such a negative: zero (its logit is 0, arcface_torch's) or
            remove (it leaves the softmax)
        same_person (mapping): people of this head known to be one person (a merged head over a concat reader),
            {pairs: FILE or list (mtl overlap --json's file: each person by name_x or label_x, the dataset's label),
            offsets: {task of the pairs: the first class id of its source in this head}}: negatives treated as
            interclass_filtering_mode says
    """

    primary_metric = "verification_accuracy"
    higher_is_better = True
    cross_negatives = True
    uses_step = True  # Partial FC draws its sample from (seed, step)
    reads_people = True  # same_person's pairs name people as the reader's sources know them
    default_margin = (1.0, 0.5, 0.0)

    def __init__(self, num_classes=None, feature_size=None, margin=None, scale=64.0, sample_ratio=1.0,
                 label_field="label", fused="auto", seed=0, interclass_filtering_threshold=0.0,
                 interclass_filtering_mode="zero", same_person=None, people=None):
        super().__init__(num_classes, feature_size, label_field, seed)
        self.filtering = check_filtering(interclass_filtering_threshold, interclass_filtering_mode, same_person,
                                         self.num_classes, people)
        self.margin = check_margin(self.default_margin if margin is None else margin)
        self.scale = float(scale)
        if not self.scale > 0:
            raise ParameterError(f"scale must be > 0, got {scale!r}")
        self.sample_ratio = float(sample_ratio)
        if not 0.0 < self.sample_ratio <= 1.0:
            raise ParameterError(f"sample_ratio must be in (0, 1], got {sample_ratio!r}")
        self.fused = self._resolve_fused(fused)
        self._margin = margin_transform(*self.margin)
        self.row_sparse = self.sample_ratio < 1.0  # the optimizer updates only the sampled rows
        self.last_sampled_classes = None  # global ids of the classes scored at the last step (for inspection)
        self._workspace = Workspace()  # Partial FC: the step's work buffer, reused from step to step
        self._step_sample = None  # accumulated step: (step, sorted global ids) drawn over all its micro-batches
        self.cross = None  # the job's CrossNegatives (mtl.headkit.cross_negatives), attached when built

    @classmethod
    def step_bytes(cls, options, shard, global_rows, dim, item):
        """One ``[K_k, max(N, D)]`` buffer (exp values, then the gradient: ``mtl.headkit.chunked_softmax``) and its
        chunk buffers (about four ``[chunk rows, max(N, D)]`` blocks, ``chunk_rows`` of the device). K_k = C_k, or
        with Partial FC ``ceil(r * C_k)`` expected plus one per batch row (positives), in the head's reused
        :class:`Workspace` (with its headroom)."""
        ratio = float(options.get("sample_ratio", 1.0))
        if str(options.get("fused", "auto")).lower() == "true":  # Paddle's margin_cross_entropy: dense tensors
            return {"logits, softmax and their gradients": 4 * global_rows * shard * item,
                    "dense weight gradient": shard * dim * item}
        scored = shard if ratio >= 1.0 else min(shard, math.ceil(ratio * shard) + int(global_rows))
        width = max(global_rows, dim)
        chunks = 4 * min(scored, chunk_rows(width, paddle.get_device().startswith("gpu"))) * width * item
        if scored == shard:
            return {"exp values, then the gradient": scored * width * item, "chunk buffers": chunks}
        return {"sampled rows: exp values, then gradient": Workspace.capacity(scored * width) * item,
                "chunk buffers": chunks}

    @classmethod
    def planned_bytes(cls, options, global_rows, world_size, rank, optimizer_slots, accumulate=1):
        """The sharded head's plan; with Partial FC under AdamW (2 optimizer slots) also the rows' own step counts
        (``[C_k]`` int32, ``mtl.optimizer.sparse``), and over ``accumulate`` > 1 micro-batches the sampled rows'
        gradient summed over them (``[K_k, D]``, as the step's sample)."""
        plan = super().planned_bytes(options, global_rows, world_size, rank, optimizer_slots, accumulate)
        ratio = float(options.get("sample_ratio", 1.0))
        if not plan or ratio >= 1.0:
            return plan
        shard = distributed.shard_range(int(options["num_classes"]), world_size, rank)[1]
        if optimizer_slots == 2:
            plan["row step counts"] = 4 * shard
        if accumulate > 1:
            sampled = min(shard, math.ceil(ratio * shard) + int(global_rows) * int(accumulate))
            item = np.dtype(paddle.get_default_dtype()).itemsize
            plan["summed rows' gradient"] = sampled * int(options["feature_size"]) * item
        return plan

    def _resolve_fused(self, fused) -> bool:
        """``fused: auto`` is the composed path on every device (the fused one has not run here yet); ``true`` opts
        in on a GPU, refused with a sentence where Paddle's kernel cannot compute this head's function."""
        choice = str(fused).lower()
        if choice not in ("auto", "true", "false"):
            raise ParameterError(f"fused must be 'auto', true or false, got {fused!r}")
        if choice != "true":
            return False
        if not (paddle.is_compiled_with_cuda() and paddle.get_device().startswith("gpu")):
            raise ParameterError("fused=true needs a CUDA device (margin_cross_entropy has no CPU kernel); "
                                 "use 'auto' or false")
        if self.sample_ratio < 1.0 or self.filtering.active:
            raise ParameterError("fused=true does not support Partial FC (sample_ratio < 1) nor inter-class "
                                 "filtering (interclass_filtering_threshold, same_person)")
        return True

    def cosine(self, normalized_features, weight):
        """``cos = x_hat W^T * (1 / ||W_row||)``: ``[N, K]`` for ``weight [K, D]``."""
        return paddle.matmul(normalized_features, weight, transpose_y=True) * inverse_norm(weight)

    def shard_logits(self, features):
        """Cosine of ``features`` with every class centre of this shard (no margin)."""
        return self.cosine(F.normalize(features, axis=1), self.weight)

    def sample_classes(self, labels, step: int = 0):
        """The own class rows this rank scores for the gathered ``labels`` at ``step``: ``(RowSource, global ids
        [K_k], target [N])``
        with ``target`` = the label's column among the rows, or -1 (another rank's class).

        Without sampling K_k = C_k. With sampling, the sample is drawn over all C classes from (seed, step)
        (:func:`mtl.headkit.sharded.sample_classes_globally`: every positive of the gathered batch, negatives up to
        ``ceil(sample_ratio * C)`` in all) and this rank keeps those in its range, so the run does not depend on the
        process count. The labels are read on the host (N ids) to find the positives.
        """
        target = local_targets(labels, self.shard_start, self.shard_size)
        count = min(self.num_classes, math.ceil(self.sample_ratio * self.num_classes))
        if count >= self.num_classes:
            return RowSource(self.weight, None, self.shard_start, self.task), self.class_ids, target
        if self.training and self._step_sample is not None and self._step_sample[0] == step:
            sampled = self._step_sample[1]  # an accumulated step: the sample drawn over all its micro-batches
        else:
            sampled = sample_classes_globally(labels.numpy(), self.num_classes, count, self.seed, step)
        local = shard_of_sample(sampled, self.shard_start, self.shard_size)
        index = tensor_from(local, dtype="int64")
        column = paddle.searchsorted(index, paddle.clip(target, min=0))
        target = paddle.where(target >= 0, column, paddle.full_like(column, -1))
        return (RowSource(self.weight, index, self.shard_start, self.task, host_index=local), index + self.shard_start,
                target)

    def prepare_step(self, step: int, labels, accumulate: int):
        """Partial FC: one class sample for the step before its forward, drawn from (seed, step) with the labels of
        every micro-batch (``accumulate`` of them) and rank as positives (one all-gather of the labels), which every
        micro-batch then scores (the optimizer sums the sampled rows' gradient over the micro-batches) and other
        heads read (:meth:`step_rows`). The same sample the forward would draw alone: its positives are a set."""
        self._step_sample = None
        if self.sample_ratio >= 1.0 or not self.training:
            return
        labels = labels if isinstance(labels, paddle.Tensor) else tensor_from(labels)
        labels = labels.reshape([-1]).astype("int64")
        if distributed.is_distributed():
            labels = all_gather_rows(labels, [labels.shape[0]] * distributed.world_size())
        count = min(self.num_classes, math.ceil(self.sample_ratio * self.num_classes))
        self._step_sample = (int(step), sample_classes_globally(labels.numpy(), self.num_classes, count, self.seed,
                                                                int(step)))

    def step_rows(self, step: int):
        """This rank's rows of the head's own sample at ``step`` (sorted local ids), None without Partial FC; no rows
        when the head drew no sample for ``step`` (its task has no samples in the step: the joint model draws every
        present head's sample before the forwards when a step hook needs them)."""
        if self.sample_ratio >= 1.0 or math.ceil(self.sample_ratio * self.num_classes) >= self.num_classes:
            return None
        if self._step_sample is None or self._step_sample[0] != int(step):
            return np.zeros(0, dtype=np.int64)
        return shard_of_sample(self._step_sample[1], self.shard_start, self.shard_size)

    def attach_cross_negatives(self, cross, task: str):
        """Score the other face heads' classes as negatives too (the job's ``cross_negatives``)."""
        self.cross, self.task = cross, task

    def forward(self, features, labels, step=None) -> HeadOutput:
        """Loss of the gathered batch (equal on every rank) and top-1 accuracy of the cosine logits; ``step``: the
        global 0-based step (Partial FC draws its sample from it: required in training; outside training None is
        step 0). Partial FC in training declares its sampled rows (``HeadOutput.rows``): the optimizer updates them
        only."""
        if step is None and self.training and self.sample_ratio < 1.0:
            raise ValueError("a Partial FC head draws its class sample from the training step: call "
                             "forward(features, labels, step) (the joint model passes it)")
        step = 0 if step is None else int(step)
        x, y = self.gather_batch(features, labels)  # 1. gather
        own, class_ids, target = self.sample_classes(y, step)  # 2. sample
        self.last_sampled_classes = class_ids
        x_hat = F.normalize(x, axis=1)
        if self.fused:
            return self._fused(x_hat, y, class_ids)
        others = self.cross.sources(self.task, step) if self.cross is not None and self.training else []
        rows = ScoredRows([own] + others, self._workspace if own.index is not None else None)  # 5. other heads
        mask = self.negative_mask(y.numpy(), rows) if self.filtering.active or others else None
        stats, declared = Statistics(), []
        if self.training and own.index is not None:  # Partial FC: the optimizer updates the sampled rows
            stats.gradient = RowGradient(self.weight, own.index, source=self.task, host_index=own.host_index)
            declared.append(stats.gradient)
        loss = chunked_margin_softmax(x_hat, rows, target, self.scale, self._margin, mask=mask, stats=stats)  # 3-6
        if self.cross is not None and self.training:
            self.cross.observe(self.task, step, y.numpy(), stats.target_cosine, rows, mask)
        predicted = top1_across_shards(stats.best, rows.global_ids(stats.best_column))  # 7. top-1
        return HeadOutput(loss=loss, metrics={"accuracy": (predicted == y).astype("float32").mean()}, rows=declared)

    def negative_mask(self, labels: np.ndarray, rows: ScoredRows):
        """What the passes filter (:class:`mtl.headkit.filtering.ChunkMask`): the head's own filtering on its rows,
        the same-person classes of the other heads on theirs; None when nothing can be."""
        index = None if rows.index is None else rows.index.numpy()
        segment, columns, batch = own_segment(self.filtering if self.filtering.active else None, labels, self.scale,
                                              self.shard_start, rows.own_count, index)
        segments, cross_columns, cross_batch = [segment], np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(rows.sources) > 1:
            extra, cross_columns, cross_batch = self.cross.segments(self.task, labels, rows, self.scale)
            segments += extra
        mask = ChunkMask(segments, np.concatenate([columns, cross_columns]), np.concatenate([batch, cross_batch]))
        return None if mask.empty else mask

    def _fused(self, x_hat, y, class_ids) -> HeadOutput:
        """Paddle's ``margin_cross_entropy`` on the dense logits (``fused: true``, GPU only)."""
        m1, m2, m3 = self.margin
        cos = self.cosine(x_hat, self.weight)
        group = None if distributed.is_distributed() else False
        loss = F.margin_cross_entropy(cos, y, margin1=m1, margin2=m2, margin3=m3, scale=self.scale, group=group,
                                      reduction="mean")
        predicted = sharded_topk(cos.detach(), class_ids, 1)[:, 0]
        return HeadOutput(loss=loss, metrics={"accuracy": (predicted == y).astype("float32").mean()})

    def check_eval_labels(self, labels):
        """Verification needs pairs: at least two classes in the split and one class with two samples."""
        verification_pairs(np.asarray(labels))

    def weight_gradient(self, output: HeadOutput) -> np.ndarray:
        """The class-centre gradient of the backward of ``output`` as a dense ``[C_k, D]`` array, for inspection and
        tests: with Partial FC in training only its declared rows have one (the others are zero here); otherwise
        ``weight.grad``."""
        return dense_gradient(self.weight, output.rows)

    def evaluate(self, features, labels):
        """1:1 verification on pairs drawn from the split's labels, and classification accuracy over all shards."""
        feats = to_numpy(features).astype(np.float32)
        labels = to_numpy(labels).reshape(-1).astype(np.int64)
        predicted = self.predict_topk(feats, 1)[:, 0]
        embeddings = unit_rows(feats)
        metrics = score_pairs(embeddings, *verification_pairs(labels))
        metrics["accuracy"] = float(np.mean(predicted == labels))
        return metrics


@register_head("cosface")
class CosFaceHead(ArcFaceHead):
    """Additive cosine margin head (CosFace): the arcface head with margin [1, 0, 0.35] by default."""

    default_margin = (1.0, 0.0, 0.35)
