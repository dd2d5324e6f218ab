"""Parallelism: the process group, collectives with autograd, synchronised BatchNorm and the parallel strategy."""
