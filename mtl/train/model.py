"""The joint model: one backbone, one head per task, one forward for a whole multi-task step.

Sub-batches whose backbone inputs have the same signature (field names, per-sample shapes, dtypes) are concatenated
and go through the backbone in one pass; the features are split back per task and each head scores its own rows.
Text sub-batches of different lengths share a signature: they are padded to the longest and each task's sequence
features are cut back to its own length; a head reads the backbone output it names (``Head.reads``: ``sequence``
[B, T, D] or ``pooled`` [B, D] of a text encoder) (:mod:`mtl.backbones.rows`).
Between the backbone and the heads sits the job's architecture (:mod:`mtl.architectures`): task t's features (its
rows only) become what task t's head sees; ``hard`` (the default, no towers) hands them over unchanged. An
architecture with task layers inside the backbone (``per_task_backbone``) gets one backbone pass per task.
Total loss = sum_t loss_weight_t * loss_t over the tasks present in the step; absent tasks cost nothing.

The forward returns one typed value, :class:`ForwardPass` (outputs, each task's features and their detached
leaves, the backbone passes, the present tasks); the backward phases take it and return typed values
(:class:`HeadGradients`); nothing of a step is kept in the model between them.

Backward (:meth:`JointModel.backward`) runs in two phases: each head's loss is differentiated alone, in job order, down
to its (detached) features; then the backbone is differentiated once from all the feature gradients. The reason is
communication: a model-parallel head all-reduces inside its backward, and Paddle's autograd engine orders
independent branches differently on different ranks (seen on Paddle 3.3 with four heads: rank 0 ran soft3, cos5,
arc7, arc1, rank 1 soft3, arc1, cos5, arc7), which pairs up the wrong tensors in the all-reduce. Job order makes
the collective sequence identical on every rank.
"""
import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import paddle

from mtl.backbones import rows
from mtl.headkit.base import HeadOutput


def micro_batches(batch, accumulate: int):
    """A step's batch ``{task: {field: [K m, ...]}}`` (this rank's rows of K micro-batches, in micro-batch order:
    ``mtl.data.steps.rank_rows``) as the list of its K micro-batches ``{task: {field: [m, ...]}}``."""
    if accumulate == 1:
        return [batch]
    out = [{} for _ in range(accumulate)]
    for task, sub in batch.items():
        for name, value in sub.items():
            rows = int(value.shape[0]) // accumulate
            for k in range(accumulate):
                out[k].setdefault(task, {})[name] = value[k * rows:(k + 1) * rows]
    return out


def _one_gradient_each(outputs, grads):
    """``(outputs, grads)`` with a tensor that several tasks read (``same_rows`` without task layers) once, its
    gradients summed."""
    unique, summed = [], []
    for out, grad in zip(outputs, grads):
        index = next((i for i, seen in enumerate(unique) if seen is out), None)
        if index is None:
            unique.append(out)
            summed.append(grad)
        else:
            summed[index] = summed[index] + grad
    return unique, summed


@dataclass
class TaskFeatures:
    """What a task's head scored in a forward: ``feature`` (what the architecture handed it, in the graph of the
    backbone), ``leaf`` (its detached copy the head differentiated down to) and ``shared`` (the backbone's output of
    the task's rows, before the architecture's task layers)."""

    feature: object
    leaf: object
    shared: object


@dataclass
class ForwardPass:
    """One joint forward (:meth:`JointModel.forward`): ``total`` = sum_t loss_weight_t * loss_t (None: no task),
    ``outputs`` ``{task: HeadOutput}`` and ``features`` ``{task: TaskFeatures}`` of the tasks present, in job
    order, and ``groups``: the tasks of each backbone pass, in order."""

    total: Optional[paddle.Tensor]
    outputs: Dict[str, HeadOutput]
    features: Dict[str, TaskFeatures] = field(default_factory=dict)
    groups: List[List[str]] = field(default_factory=list)

    @property
    def present(self) -> List[str]:
        """The tasks present, in job order."""
        return list(self.outputs)

    def rows(self) -> list:
        """The heads' row declarations (``HeadOutput.rows``), in job order."""
        return [row for out in self.outputs.values() for row in out.rows]


@dataclass
class HeadGradients:
    """After the heads' backward (:meth:`JointModel.backward_heads`): ``{task: gradient of its weighted loss w.r.t.
    its features}`` (this rank's rows), with the forward they belong to; ``direct``: what a head whose output layer
    is the backbone's input embeddings (masked LM) gave that backbone parameter directly, kept apart per task when
    asked (each task's own share of the shared gradient), added back by the backbone's backward."""

    forward: ForwardPass
    grads: Dict[str, paddle.Tensor]
    direct: Dict[str, paddle.Tensor] = field(default_factory=dict)


class JointModel(paddle.nn.Layer):
    """Backbone + ``{task: head}``; ``forward(batch)`` returns a :class:`ForwardPass`.

    ``step_hooks``: what joins several heads inside a step (:class:`mtl.headkit.step_hooks.StepHook`, e.g. cross-head
    negatives), which the step, the weighting and the checkpoint iterate."""

    def __init__(self, backbone, heads: Dict[str, paddle.nn.Layer], loss_weights: Dict[str, float],
                 step_hooks=(), architecture=None, same_rows=()):
        super().__init__()
        # schedule.same_rows: the tasks whose rows are the same inputs in every step, so that a backbone pass over
        # them runs once, on the first one's rows, and every one gets its features (one dropout mask an input, half
        # the compute); a task outside (a reader that alters its inputs: masked LM) gets a pass of its own
        self.same_rows = [t for t in heads if t in set(same_rows)]
        self.backbone = backbone
        if architecture is None:  # hard parameter sharing without towers: the heads read the backbone's features
            from mtl.architectures.hard import Hard

            architecture = Hard(backbone.feature_size, list(heads))
        self.architecture = architecture
        self.step_hooks = list(step_hooks)
        self.heads = paddle.nn.LayerDict(heads)
        for task, head in heads.items():  # every rank gets n / W rows of a task's sub-batch (steps.check_divisible)
            head.equal_rows = True
            head.task = task
        self.loss_weights = dict(loss_weights)
        # the backbone parameter a head's output layer is (masked LM's tied input embeddings), per such task
        self.tied = {task: backbone.input_embeddings() for task, head in heads.items() if head.ties_input_embeddings}
        self._input_fields = list(backbone.input_fields())
        self.autocast = contextlib.nullcontext  # the backbone's precision context (mtl.train.precision.Autocast)

    def reads_output(self, task: str):
        """The name of the backbone output ``task``'s head reads (a text encoder's ``sequence`` or ``pooled``; its
        default for a head that names none)."""
        return self.heads[task].reads or self.backbone.default_output

    def signature(self, sub_batch) -> tuple:
        """(name, per-row shape, dtype) of every backbone input of a sub-batch; declared variable axes (token
        length) are None, so text sub-batches of any length share one pass (:mod:`mtl.backbones.rows`)."""
        return rows.input_signature(self._input_fields, sub_batch)

    def backbone_passes(self, batch):
        """The tasks of each backbone pass: one pass per input signature (per task with a ``per_task_backbone``
        architecture), in the batch's order."""
        groups = OrderedDict()
        for task, sub in batch.items():
            if self.architecture.per_task_backbone or (self.same_rows and task not in self.same_rows):
                key = (task,)  # its own layers, or its own rows beside rows that several tasks share
            else:
                key = self.signature(sub)
            groups.setdefault(key, []).append(task)
        return list(groups.values())

    def features(self, batch) -> Dict[str, object]:
        """What every task's head sees (a tensor, or ``{name: tensor}`` of a text encoder): the backbone's output per
        pass, split per task, through the architecture's layers for the task (its rows only)."""
        return self.passes(batch)[0]

    def passes(self, batch):
        """``(features, shared, groups)``: :meth:`features`, the backbone's output of every task's rows (before the
        architecture's layers) and the tasks of each backbone pass."""
        out, shared = {}, {}
        groups = self.backbone_passes(batch)
        fields = self._input_fields
        for tasks in groups:
            subs = [batch[t] for t in tasks]
            paired = tasks[0] in self.same_rows
            if paired:  # the same inputs in every task's rows: one pass over the first task's
                subs = subs[:1]
            self.architecture.select(tasks[0])  # per_task_backbone: the task whose layers this pass uses
            with self.autocast():
                feats = self.architecture.run_backbone(self.backbone, rows.concat_rows(fields, subs))
            feats = rows.to_float32(feats) if paddle.get_default_dtype() == "float32" else feats
            groups_of = [rows.group_size(fields, sub) for sub in subs]
            counts = [int(sub[fields[0].name].shape[0]) * k for sub, k in zip(subs, groups_of)]
            sizes = [rows.variable_size(fields, sub) for sub in subs]
            split = rows.split_outputs(feats, self.backbone.output_fields(), counts, groups_of, sizes)
            for t, f in zip(tasks, split * len(tasks) if paired else split):
                shared[t] = f
                out[t] = f if self.architecture.is_identity else self.architecture(t, f)
        return out, shared, groups

    def prepare_step(self, batch, step: int, accumulate: int):
        """Before a training step: the step hooks begin it; read as ``accumulate`` > 1 micro-batches, or when a hook
        reads the step's samples, every head present gets this rank's labels of the whole step (``Head.prepare_step``:
        Partial FC draws one class sample for the step), in job order."""
        for hook in self.step_hooks:
            hook.begin_step(step)
        if accumulate == 1 and not any(hook.needs_step_samples for hook in self.step_hooks):
            return
        for task in self.heads.keys():
            if task in batch:
                head = self.heads[task]
                head.prepare_step(step, batch[task][head.label_field], accumulate)

    def forward(self, batch, step=None) -> ForwardPass:
        """Joint forward; returns a :class:`ForwardPass`. Call :meth:`backward` with it afterwards.

        ``step`` (the global 0-based step, in training) reaches every head that declares ``uses_step``.
        Each head sees its features through a detached leaf, so ``total.backward()`` alone would not reach the
        backbone; :meth:`backward` does both phases.
        """
        feats, shared, groups = self.passes(batch)
        outputs: Dict[str, HeadOutput] = {}
        features: Dict[str, TaskFeatures] = {}
        total = None
        for task in self.heads.keys():  # job order, the same on every rank
            if task not in feats:
                continue
            head = self.heads[task]
            feature = rows.select(feats[task], head.reads, self.backbone.default_output)
            leaf = feature.detach()
            leaf.stop_gradient = False
            labels = head.labels_of(batch[task])
            out = head(leaf, labels, step) if head.uses_step else head(leaf, labels)
            for row in out.rows:  # the weighting rescales a declaration by the task whose loss it is
                row.source = row.source or task
            outputs[task] = out
            term = out.loss * self.loss_weights[task]
            features[task] = TaskFeatures(feature, leaf, shared[task])
            total = term if total is None else total + term
        return ForwardPass(total, outputs, features, groups)

    def backward(self, forward: ForwardPass, weights=None):
        """Differentiate ``forward``: every head in job order, then each backbone pass once, in order.

        ``weights`` (``{task: float}``, default the static ``loss_weights``) multiply each task's loss.
        Backbone passes are differentiated one at a time (not in one call) because synchronised BatchNorm
        all-reduces in its backward; separate calls fix the order of those collectives on every rank.
        """
        self.backward_backbone(self.backward_heads(forward, weights))

    def backward_heads(self, forward: ForwardPass, weights=None, apart=False) -> HeadGradients:
        """Phase 1: each head's ``weight * loss`` differentiated alone, in job order, down to its features.
        ``apart``: what a head tied to the backbone's input embeddings gives them directly is kept per task
        (``HeadGradients.direct``) instead of summed into their gradient, so that the backbone's backward can
        hand each task its own share (the weighting's per-task gradients)."""
        weights = self.loss_weights if weights is None else weights
        grads, direct = {}, {}
        for task, seen in forward.features.items():
            tied = self.tied.get(task) if apart else None
            before = None if tied is None or tied.grad is None else tied.grad.clone()
            if tied is not None:
                tied.clear_gradient(set_to_zero=True)
            (forward.outputs[task].loss * float(weights[task])).backward()
            grads[task] = seen.leaf.grad if seen.leaf.grad is not None else paddle.zeros_like(seen.feature)
            if tied is not None and tied.grad is not None:
                direct[task] = tied.grad.clone()  # a copy: the parameter's gradient storage is reused below
                with paddle.no_grad():
                    tied.grad = before if before is not None else paddle.zeros_like(tied.grad)
        return HeadGradients(forward, grads, direct)

    def shared_gradients(self, heads: HeadGradients) -> Dict[str, paddle.Tensor]:
        """``{task: gradient of its weighted loss w.r.t. the backbone's output of its rows}``: where every task meets
        (Sener and Koltun's Z), before the architecture's task layers (through them by one more autograd pass each,
        the graph kept for phase 2)."""
        out = {}
        for task, grad in heads.grads.items():
            if self.architecture.is_identity:
                out[task] = grad
                continue
            seen = heads.forward.features[task]
            shared = rows.select(seen.shared, self.heads[task].reads, self.backbone.default_output)
            (found,) = paddle.grad([seen.feature], [shared], [grad], retain_graph=True, allow_unused=True)
            out[task] = paddle.zeros_like(shared) if found is None else found
        return out

    def backward_backbone(self, heads: HeadGradients, scales=None):
        """Phase 2: each backbone pass once, from the feature gradients (times ``scales[task]`` if given)."""
        features = heads.forward.features
        for tasks in heads.forward.groups:
            present = [t for t in tasks if t in heads.grads]
            if present:
                grads = [heads.grads[t] if scales is None else heads.grads[t] * float(scales[t]) for t in present]
                paddle.autograd.backward(*_one_gradient_each([features[t].feature for t in present], grads))
        for task, grad in heads.direct.items():  # a tied head's own share, scaled as its task's
            self._add_direct(task, grad if scales is None else grad * float(scales[task]))

    def backward_backbone_per_task(self, heads: HeadGradients):
        """Phase 2 task by task, in job order: yields each task after the backbone's gradients hold the gradient
        of that task's weighted loss alone (the caller reads and clears them before the next one)."""
        for tasks in heads.forward.groups:
            present = [t for t in tasks if t in heads.grads]
            for i, task in enumerate(present):
                feat, grad = heads.forward.features[task].feature, heads.grads[task]
                if i < len(present) - 1:  # the pass's graph is needed again by the next task
                    self._accumulate_keeping_graph(feat, grad)
                else:
                    paddle.autograd.backward([feat], [grad])
                if task in heads.direct:
                    self._add_direct(task, heads.direct[task])
                yield task

    @paddle.no_grad()
    def _add_direct(self, task: str, grad):
        """Add what ``task``'s tied head gave the backbone's input embeddings directly to their gradient."""
        tied = self.tied[task]
        tied.grad = grad.astype(tied.dtype) if tied.grad is None else tied.grad + grad.astype(tied.grad.dtype)

    def _accumulate_keeping_graph(self, feat, grad):
        """Add the gradient of ``feat`` (seeded with ``grad``) to the backbone's and architecture's parameters,
        keeping the graph. Not ``paddle.autograd.backward(..., retain_graph=True)``: on Paddle 3.3 the next backward
        through a PyLayer of that graph (synchronised BatchNorm at 2 processes) then dies with a segmentation fault;
        ``paddle.grad`` keeps the graph usable."""
        trainable = [p for p in list(self.backbone.parameters()) + list(self.architecture.parameters())
                     if not p.stop_gradient]
        found = paddle.grad([feat], trainable, [grad], retain_graph=True, allow_unused=True)
        with paddle.no_grad():
            for p, g in zip(trainable, found):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g

    def shared_parameters(self):
        """The trainable parameters several tasks' losses reach: the ones whose per-task gradients a gradient-based
        weighting combines (the backbone's under ``hard``; ``Architecture.shared_parameters``)."""
        return self.architecture.shared_parameters(self.backbone)

    def task_parameters(self, task):
        """The parameters only ``task``'s loss reaches: its head's and its own layers of the architecture."""
        return list(self.heads[task].parameters()) + self.architecture.task_parameters(task, self.backbone)

    def embedder(self, task):
        """What embeds ``task``'s samples (evaluation, export): the backbone itself when the architecture hands its
        features over unchanged, else backbone + the architecture's layers for ``task``."""
        if self.architecture.is_identity:
            return self.backbone
        from mtl.architectures.base import TaskEmbedder

        return TaskEmbedder(self.backbone, self.architecture, task)
