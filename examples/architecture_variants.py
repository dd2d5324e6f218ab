"""The architecture configurations of the three benchmarks (``--set`` overrides of each recipe), in one place for
the reports (examples/multimnist_report.py, examples/mmoe_synthetic_report.py, examples/architectures_report.py)
and the cost benchmark (bench/bench_architectures.py). Every setting here was fixed before its benchmark ran
(docs/architectures.md says how each was chosen)."""

MNIST_TOWER = "tower: [50], tower_dropout: 0.5"  # as wide as Sener and Koltun's task layer (fc 50 -> 50, dropout)
MULTIMNIST = {  # on the trunk's 50 features
    "mmoe": ["architecture={type: mmoe, experts: 4, expert_layers: [50], " + MNIST_TOWER + "}"],
    "cgc": ["architecture={type: cgc, task_experts: 2, shared_experts: 2, expert_layers: [50], " + MNIST_TOWER + "}"],
    "ple": ["architecture={type: ple, levels: 2, task_experts: 1, shared_experts: 2, expert_layers: [50], "
            + MNIST_TOWER + "}"],
    "cross_stitch": ["architecture={type: cross_stitch, layers: [50]}"],  # the columns are the task layers
    "hard_bn": ["backbone.batch_norm=true"],  # the baseline of the two below: LeNet with BatchNorm
    "task_norm": ["backbone.batch_norm=true", "architecture={type: task_norm, " + MNIST_TOWER + "}"],
    "adapters": ["backbone.batch_norm=true", "architecture={type: adapters, " + MNIST_TOWER + "}"],
    # a LeNet trunk per digit, stitched after each of its three stages (Misra et al.'s networks), then the task layers
    "cross_stitch_backbone": ["architecture={type: cross_stitch_backbone, " + MNIST_TOWER + "}"],
}

FACE_EXPERTS = "expert_layers: [128], last_relu: false"  # linear experts: the ArcFace heads score by cosine
FACES = {  # on the recipe's 128-d embedding (after its BN-neck), or inside the CNN
    "mmoe": ["architecture={type: mmoe, experts: 4, " + FACE_EXPERTS + "}"],
    "cgc": ["architecture={type: cgc, task_experts: 1, shared_experts: 2, " + FACE_EXPERTS + "}"],
    "ple": ["architecture={type: ple, levels: 2, task_experts: 1, shared_experts: 2, " + FACE_EXPERTS + "}"],
    "cross_stitch": ["architecture={type: cross_stitch, layers: [128], last_relu: false}"],
    "task_norm": ["architecture={type: task_norm}"],
    "adapters": ["architecture={type: adapters}"],
    "cross_stitch_backbone": ["architecture={type: cross_stitch_backbone}"],  # a CNN per dataset, stitched
}

SYNTHETIC = {  # about the same number of parameters (13-15 thousand); Ma et al.'s sizes as we read them
    "shared_bottom": {"type": "hard", "bottom": [113], "tower": [8]},
    "omoe": {"type": "mmoe", "experts": 8, "expert_layers": [16], "gates": "one", "tower": [8]},
    "mmoe": {"type": "mmoe", "experts": 8, "expert_layers": [16], "tower": [8]},
}
