"""All held-out people of a run scored together: every task's held-out people (the evaluation split that
``holdout_classes`` leaves) embedded by the run and pooled into one set of people, then verified on every pair of
images (:mod:`mtl.evaluation.all_pairs`) and identified 1:N (:mod:`mtl.evaluation.identification`). This is what
``mtl eval RUN --all-people`` and the face report (``examples/faces_report.py``) print as "all held-out people".

Pooling: task k's labels are offset past those of tasks 0..k-1, so that people of two tasks are two people, except
where two tasks hold out the same image file: an image is one image however many tasks hold it (kept once, with
the embedding of the first task that holds it), and the people of two tasks that share an image file are one
person (union-find, so chains join). Images that are not files (a RecordIO pack's records) are never shared: a
person held out by two packs counts as two people. Pooled people are numbered in the order of their first image
(task order, then each split's order), which is the order the identification gallery takes its images in.
"""
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from mtl.core.errors import DataError
from mtl.core.union_find import DisjointSets


def embed_tasks(run, readers, batch_size: int = 256) -> Dict[str, tuple]:
    """``{task: (features [N, D] float64, labels [N])}`` of every reader of ``{task: reader}``, embedded by the run
    (:class:`mtl.serving.inference.RunWeights`: its checkpoint's averaged weights when it averaged); when the run's
    architecture gives each task its own embedding, each reader's through its task's (a run of one task: that one
    for every reader)."""
    from mtl.architectures.base import TaskEmbedder
    from mtl.evaluation.evaluator import embed

    tasks = [t["name"] for t in run.cfg["tasks"]]
    built, out = {}, {}
    for name, reader in readers.items():
        task = name if name in tasks else tasks[0] if len(tasks) == 1 else None
        if task not in built:
            built[task] = run.backbone(task)
        backbone = built[task]
        if not isinstance(backbone, TaskEmbedder):  # one embedding for every task: built once
            built = {key: backbone for key in [*tasks, None]}
        features, rest = embed(backbone, reader, batch_size)
        out[name] = (features.numpy().astype(np.float64), np.asarray(rest["label"]).reshape(-1))
    return out


@dataclass
class Pooled:
    """The held-out images of several tasks as one set: ``features`` [N, D], pooled person ``labels`` [N], and per
    task the rows of its split that were kept (``kept``: a shared file is kept at its first task only)."""

    features: np.ndarray
    labels: np.ndarray
    kept: Dict[str, np.ndarray]
    shared_images: int

    def take(self, per_task: Dict[str, Optional[np.ndarray]], fill) -> np.ndarray:
        """Per-image values given per task (``{task: [n_task]}``, None: unknown, ``fill``), in the pooled order."""
        parts = [np.full(len(rows), fill) if per_task.get(task) is None else np.asarray(per_task[task])[rows]
                 for task, rows in self.kept.items()]
        return np.concatenate(parts)

    @property
    def people(self) -> int:
        """Number of pooled people."""
        return int(len(np.unique(self.labels)))


def pool_people(embedded: Dict[str, tuple], files: Optional[Dict[str, Optional[list]]] = None) -> Pooled:
    """The images of ``{task: (features, labels)}`` pooled (module docstring); ``files``: ``{task: the file of every
    image of its split, or None}`` (what tells a shared image; none given: nothing is shared)."""
    files = files or {}
    offset, groups, seen = 0, DisjointSets(), {}
    kept, nodes = {}, []
    for task, (_, labels) in embedded.items():
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        paths = files.get(task)
        if paths is not None and len(paths) != len(labels):
            raise DataError(f"task '{task}': {len(paths)} image files for {len(labels)} held-out images")
        rows = []
        for i, label in enumerate(labels):
            node = offset + int(label)
            groups.find(node)
            key = None if paths is None else paths[i]
            if key is not None and key in seen:  # the same image under another task: one image, one person
                groups.union(node, seen[key])
                continue
            if key is not None:
                seen[key] = node
            rows.append(i)
            nodes.append(node)
        kept[task] = np.asarray(rows, dtype=np.int64)
        offset += int(labels.max()) + 1 if len(labels) else 0
    roots = np.array([groups.find(node) for node in nodes], dtype=np.int64)
    _, first, inverse = np.unique(roots, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # number people by their first image
    features = np.concatenate([np.asarray(embedded[task][0])[rows] for task, rows in kept.items()])
    total = sum(len(np.asarray(labels).reshape(-1)) for _, labels in embedded.values())
    return Pooled(features, order[inverse.reshape(-1)], kept, int(total - len(nodes)))


def score_all_people(features, labels, sides=None, plot_fars=None) -> dict:
    """:func:`mtl.evaluation.all_pairs.all_people` of the pooled images (10-fold accuracy, TAR at FAR 1e-2 and
    1e-3, ...) and their 1:N identification under ``"identification"`` (rank-1, rank-5, CMC)."""
    from mtl.evaluation.all_pairs import all_people
    from mtl.evaluation.identification import identification

    out = all_people(features, labels, sides, plot_fars=plot_fars)
    out["identification"] = identification(features, labels)
    return out
