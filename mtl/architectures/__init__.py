"""Architectures: the layer between the backbone and the heads, chosen per job (``architecture:``).

Every task brings its own rows to a joint step. The backbone computes features per input signature; the architecture
turns task t's features (its rows only) into what task t's head sees:

* ``hard`` (the default): the heads read the backbone's features as they are (hard parameter sharing);
* ``mmoe``: experts shared by every task, one softmax gate per task (Ma et al., KDD 2018); ``gates: one`` is their
  one-gate MoE baseline;
* ``cgc``, ``ple``: task-specific and shared experts, stacked extraction levels (Tang et al., RecSys 2020);
* ``cross_stitch``: one column per task with learned linear combinations between columns (Misra et al., CVPR 2016);
* ``cross_stitch_backbone``: their network as the paper builds it, a copy of the whole backbone per task, stitched
  after each of its stages;
* ``task_norm``: every BatchNorm of the backbone becomes one per task (statistics and affine), the rest shared;
* ``adapters``: residual adapters, a task's 1x1 convolution after every shared convolution plus task BatchNorms
  (Rebuffi et al., NeurIPS 2017).

Each declares its shared parameters (the ones gradient-based task weighting combines) and each task's own
(:class:`mtl.architectures.base.Architecture`); docs/architectures.md has the formulas, costs and benchmarks.
"""
