"""Training: the joint model, the loop, optimizers (dense and row-sparse), checkpoints, run folders, averaging."""
