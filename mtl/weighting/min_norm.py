"""Gradient-based weighting through points of the convex hull of the task gradients: CAGrad and MGDA.

Both are solved on the Gram matrix of the present tasks' gradients (see ``mtl.weighting.simplex``); the result is
alpha with the applied shared gradient sum_t alpha_t g_t.
"""
import numpy as np

from mtl.core.errors import ParameterError
from mtl.core.registry import register_weighting
from mtl.weighting.base import check_range, check_representation
from mtl.weighting.gradient_based import GradientWeighting
from mtl.weighting.simplex import wolfe_min_norm

NORMALIZATIONS = ("none", "l2", "loss", "loss+")


def cagrad_dual(gram, c):
    """Weights w of min_{w in simplex} <g_w, g0> + k ||g_w||, k = c ||g0||, g0 = mean g (CAGrad's dual problem).

    Solved exactly by a one-dimensional search: for t > 0 let y(t) be the projection of -t g0 onto conv{g_i}
    (Wolfe's algorithm on the Gram matrix of the points g_i + t g0). The projection's optimality condition
    <g0 + y/t, z - y> >= 0 for all z of the hull is the optimality condition of the dual objective at y exactly when
    ||y(t)|| = k t. h(t) = ||y(t)|| - k t is continuous, h(0) >= 0 and h(max_i ||g_i|| / k) <= 0, so a bracketing
    root search (regula falsi, Illinois variant) on t to machine precision finds such a t. Returns (w, ||g_w||).
    """
    m = gram.shape[0]
    mean = np.full(m, 1.0 / m)
    gram_mean = gram @ mean  # <g_i, g0>
    g0_squared = float(mean @ gram_mean)
    k = c * np.sqrt(max(g0_squared, 0.0))

    def project(t):
        shifted = gram + t * (gram_mean[:, None] + gram_mean[None, :]) + t * t * g0_squared  # <g_i+t g0, g_j+t g0>
        w = wolfe_min_norm(shifted)
        return w, np.sqrt(max(float(w @ gram @ w), 0.0))

    largest = np.sqrt(np.max(np.diag(gram)))
    low, high = 0.0, largest / k
    w, norm = project(low)
    h_low, h_high, side = norm, largest - k * high, 0  # h(low) >= 0 >= h(high)
    for _ in range(200):  # regula falsi, Illinois variant: superlinear and always bracketed
        t = (low * h_high - high * h_low) / (h_high - h_low) if h_high < h_low else low
        if not low < t < high:
            t = 0.5 * (low + high)
            if not low < t < high:
                break
        w, norm = project(t)
        h = norm - k * t
        if h > 0.0:
            low, h_low, h_high, side = t, h, h_high * (0.5 if side > 0 else 1.0), 1
        else:
            high, h_high, h_low, side = t, h, h_low * (0.5 if side < 0 else 1.0), -1
        if abs(h) <= 1e-15 * largest or high - low <= 4 * np.finfo(float).eps * high:
            break
    return w, norm


@register_weighting("cagrad")
class CAGrad(GradientWeighting):
    """Conflict-averse gradient descent (Liu, Liu, Jin, Stone, Liu, NeurIPS 2021).

    g0 = mean_t g_t over the present tasks, phi = c^2 ||g0||^2. Dual: w* = argmin_{w in simplex}
    <g_w, g0> + sqrt(phi) ||g_w||, g_w = sum_t w_t g_t; update d = g0 + sqrt(phi) / ||g_w*|| g_w*, divided by
    (1 + c^2) when ``rescale`` (the authors' code, rescale=1). alpha = (1/T + sqrt(phi) / ||g_w*|| w*) / (1 + c^2).
    The dual is solved exactly (see :func:`cagrad_dual`) instead of by SLSQP as in the authors' code. When
    g_w* = 0 (the origin is the optimum of the dual), d = g0; when g0 = 0 or c = 0, d = g0 too.

    Parameters:
        c (float): radius of the ball around the mean gradient, relative to its norm (0: the mean gradient)
        rescale (bool): divide the update by 1 + c^2 (the authors' code)
    """

    description = "mean gradient corrected towards the worst task, radius c (Liu et al. 2021)"

    def __init__(self, tasks, loss_weights, seed=0, c=0.4, rescale=True):
        super().__init__(tasks, loss_weights, seed)
        self.c = check_range("c", c, 0.0)
        if not isinstance(rescale, bool):
            raise ParameterError(f"parameter 'rescale' must be true or false, got {rescale!r}")
        self.rescale = rescale

    def combine(self, gram, losses, present, step):
        """alpha of the CAGrad direction over the present tasks (0 for absent tasks)."""
        losses, present, gram, index = self._combine_inputs(gram, losses, present)
        alpha = np.zeros(self.num_tasks)
        if index.size == 0:
            return alpha
        sub = gram[np.ix_(index, index)]
        coefficients = np.full(index.size, 1.0 / index.size)  # g0
        radius = self.c * np.sqrt(max(float(coefficients @ sub @ coefficients), 0.0))  # sqrt(phi)
        if radius > 0.0:
            w, norm = cagrad_dual(sub, self.c)
            if norm > 1e-12 * np.sqrt(np.max(np.diag(sub))):
                coefficients = coefficients + radius / norm * w
        alpha[index] = coefficients / (1.0 + self.c ** 2 if self.rescale else 1.0)
        return alpha


@register_weighting("mgda")
class MGDA(GradientWeighting):
    """Multiple-gradient descent as multi-objective optimisation (Sener & Koltun, NeurIPS 2018).

    lambda = argmin_{lambda in simplex} ||sum_t lambda_t g_t / n_t||^2, the min-norm point of the convex hull of the
    normalised gradients, solved exactly by Wolfe's algorithm (:func:`mtl.weighting.simplex.wolfe_min_norm`: finite,
    to rounding) instead of the paper's Frank-Wolfe loop (their Algorithm 2, 250 iterations in their code and
    LibMTL's, 100 in TorchJD's), which stops up to 14 % away from the min-norm point when the gradients' norms
    differ a lot. ``normalization`` n_t as in their code: none (1), l2 (||g_t||), loss (L_t), loss+
    (L_t ||g_t||); a zero or non-finite n_t counts as 1. The applied gradient is that min-norm point,
    alpha_t = lambda_t / n_t, so that it is a common descent direction of the normalised tasks (as LibMTL does; the
    authors' code instead multiplies the un-normalised losses by lambda, which for l2 and opposite gradients of
    norms 1 and 3 gives -g_1 instead of 0). ``representation: true`` is MGDA-UB: the trainer then passes the Gram
    matrix of the gradients with respect to the shared representation (the upper bound's gradients, one T x T
    all-reduce) instead of the shared parameters; the math here is unchanged. That matrix is diagonal when each task
    scores its own rows, and their Eq. 10's (every pair of tasks on the same inputs and reading the same output of
    the backbone) under ``schedule.same_rows``.

    Parameters:
        normalization (str): how each task's gradient is scaled before the min-norm point: none, l2, loss, loss+
        representation (bool): MGDA-UB: the Gram matrix of the gradients of the shared features, not parameters
    """

    description = "exact min-norm point of the task gradients' hull (Sener & Koltun 2018)"

    def __init__(self, tasks, loss_weights, seed=0, normalization="none", representation=False):
        super().__init__(tasks, loss_weights, seed)
        if normalization not in NORMALIZATIONS:
            raise ParameterError(f"parameter 'normalization' must be one of {', '.join(NORMALIZATIONS)}, "
                                 f"got {normalization!r}")
        self.normalization = normalization
        self.uses_representation = check_representation(representation)

    def _normalizers(self, gram, losses):
        """n_t for every task (1 where the chosen normaliser is zero or not finite)."""
        norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
        values = {"none": np.ones_like(norms), "l2": norms, "loss": losses, "loss+": losses * norms}
        n = values[self.normalization]
        return np.where(np.isfinite(n) & (n > 0), n, 1.0)

    def combine(self, gram, losses, present, step):
        """alpha_t = lambda_t / n_t from the exact min-norm weights lambda (0 for absent tasks)."""
        losses, present, gram, index = self._combine_inputs(gram, losses, present)
        alpha = np.zeros(self.num_tasks)
        if index.size == 0:
            return alpha
        n = self._normalizers(gram, losses)[index]
        normalised = gram[np.ix_(index, index)] / np.outer(n, n)
        weights = wolfe_min_norm(normalised)
        alpha[index] = weights / n
        return alpha
