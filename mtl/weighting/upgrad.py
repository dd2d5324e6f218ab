"""UPGrad: every task gradient projected onto the dual cone of all of them, then averaged (Quinton & Rey 2024)."""
import numpy as np

from mtl.core.registry import register_weighting
from mtl.weighting.base import on_present, unit_gram
from mtl.weighting.gradient_based import GradientWeighting


def _free_solution(correlation, lower, free):
    """z minimising 1/2 (z + l)^T C (z + l) with z = 0 outside ``free`` (least squares when C_FF is singular)."""
    z = np.zeros(lower.size)
    if free:
        block = correlation[np.ix_(free, free)]
        z[free] = np.linalg.lstsq(block, -(correlation @ lower)[free], rcond=1e-13)[0]
    return z


def _shrink(correlation, lower, z, free):
    """Lawson-Hanson's inner loop: move z towards the free solution, stopping where a free coordinate reaches 0
    (it leaves the free set), until the free solution is positive."""
    for _ in range(len(free) + 1):
        target = _free_solution(correlation, lower, free)
        if all(target[j] > 0.0 for j in free):
            return target, free
        blocking = [j for j in free if target[j] <= 0.0 and z[j] - target[j] > 0.0]
        if blocking:
            ratios = [z[j] / (z[j] - target[j]) for j in blocking]
            z = z + min(ratios) * (target - z)
            z[blocking[int(np.argmin(ratios))]] = 0.0
        free = [j for j in free if z[j] > 0.0]
        z = np.where(np.isin(np.arange(z.size), free), z, 0.0)
    return z, free


def dual_cone_weights(correlation, lower):
    """y = argmin_{y >= l} y^T C y (C positive semi-definite) by Lawson and Hanson's active-set method on
    z = y - l >= 0: add the coordinate of most negative gradient C (z + l), re-solve on the free coordinates,
    step back to the boundary when one turns non-positive. Finite; stops when no gradient is below -1e-13 of
    the scale of C (z + l)."""
    z, free = np.zeros(lower.size), []
    for _ in range(3 * lower.size + 3):
        gradient = correlation @ (z + lower)
        tolerance = 1e-13 * max(1.0, float(np.abs(z + lower).sum()))
        candidates = [j for j in range(lower.size) if j not in free and gradient[j] < -tolerance]
        if not candidates:
            break
        free = free + [min(candidates, key=lambda j: (gradient[j], j))]
        z, free = _shrink(correlation, lower, z, free)
    return z + lower


def upgrad_weights(gram):
    """alpha = (1/m) sum_i w_i with w_i = argmin_{v >= e_i} v^T G v over the m tasks (zero gradients: w_i = e_i)."""
    size = gram.shape[0]
    norms, usable, correlation = unit_gram(gram)
    n = norms[usable]
    alpha = np.zeros(size)
    for i in range(size):
        weights = np.eye(size)[i]
        if norms[i] > 0.0:  # v^T K v = y^T C y with y = n v: the constraint v >= e_i is y >= n_i e_i
            weights[usable] = dual_cone_weights(correlation, n * weights[usable]) / n
        alpha += weights
    return alpha / max(size, 1)


@register_weighting("upgrad")
class UPGrad(GradientWeighting):
    """UPGrad, unconflicting projection of gradients (Quinton & Rey 2024, "Jacobian descent for multi-objective
    optimization"; TorchJD).

    d = (1/m) sum_i pi(g_i) over the m present tasks, pi the projection onto the dual cone
    {x : <g_j, x> >= 0 for all j}, so that d conflicts with no task. By their Proposition 1, pi(g_i) = G w_i with
    w_i = argmin_{v >= e_i} v^T G^T G v, a small quadratic programme solved here exactly by Lawson-Hanson's
    active-set method on the unit gradients' Gram matrix (:func:`dual_cone_weights`); alpha = (1/m) sum_i w_i.
    A zero gradient is its own projection (w_i = e_i); opposite gradients project to 0.

    Differences from the common implementations, where we follow the paper: TorchJD (and LibMTL, which copies it)
    divides the Gram matrix by its trace (harmless: the weights are scale-invariant) and adds 1e-4 I before
    calling quadprog, which moves the projection by about 1e-4 relative and turns exactly opposite gradients into a
    small update instead of 0.
    """

    description = "mean of the task gradients projected onto their dual cone (Quinton & Rey 2024)"

    def combine(self, gram, losses, present, step):
        """alpha of UPGrad over the present tasks (0 for absent ones)."""
        _, _, gram, index = self._combine_inputs(gram, losses, present)
        return on_present(upgrad_weights, gram, index)
