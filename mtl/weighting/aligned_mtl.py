"""Aligned-MTL: the task gradients' principal components rescaled to one length (Senushkin et al., CVPR 2023)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import on_present
from mtl.weighting.gradient_based import GradientWeighting

FLOAT32_EPS = float(np.finfo(np.float32).eps)  # the gradients reach the strategy as float32


def aligned_weights(gram):
    """alpha = B 1 with B = sqrt(lambda_R) V_R Lambda_R^(-1/2) V_R^T from the eigen-decomposition of the Gram matrix
    (the R eigenvalues above lambda_max * T * float32 eps; none: alpha = 1, the update is 0 anyway)."""
    size = gram.shape[0]
    if size == 0:
        return np.ones(0)
    values, vectors = np.linalg.eigh(gram)
    if values.max() <= 0.0:
        return np.ones(size)
    keep = values > values.max() * size * FLOAT32_EPS
    values, vectors = values[keep], vectors[:, keep]
    balance = np.sqrt(values.min()) * (vectors / np.sqrt(values)) @ vectors.T
    return balance @ np.ones(size)


@register_weighting("aligned_mtl")
class AlignedMTL(GradientWeighting):
    """Aligned-MTL (Senushkin, Patakin, Kuznetsov, Konushin, CVPR 2023, "Independent component alignment for
    multi-task learning"), Algorithm 1.

    With M = G^T G = V Lambda V^T (the Gram matrix of the present tasks' gradients), R its numerical rank and
    lambda_R its smallest kept eigenvalue, B = sqrt(lambda_R) V Lambda^(-1/2) V^T and alpha = B w with w = 1
    (equal task weights). The update G alpha = sigma_min U V^T w (G = U Sigma V^T) has all singular values equal to
    the smallest one: condition number 1, no dominating or conflicting component. Eigenvalues at most
    lambda_max T eps(float32) count as 0 (the gradients are float32, as in LibMTL and TorchJD): a component below
    about sqrt(T eps32) ~ 6e-4 of the largest singular value is dropped instead of setting the length of the whole
    update (orthogonal gradients of norms 1e-2, 1 and 1e2: the first is left out, the update is u_2 + u_3).
    Collinear gradients (identical, opposite) have rank 1, where the update is the plain sum: 2 g for two identical
    ones, 0 for opposite ones of equal norm.

    Where the common implementations differ: LibMTL uses w = 1 and the smallest eigenvalue, as here (its
    ``torch.symeig`` no longer exists in current PyTorch); TorchJD uses w = 1/T (the update divided by T) and
    documents that the authors' released code scaled by the mean eigenvalue instead of the paper's smallest.
    """

    description = "principal components of the gradients rescaled to the smallest one (Senushkin et al. 2023)"

    def combine(self, gram, losses, present, step):
        """alpha = B 1 over the present tasks (0 for absent ones)."""
        _, _, gram, index = self._combine_inputs(gram, losses, present)
        return on_present(aligned_weights, gram, index)
