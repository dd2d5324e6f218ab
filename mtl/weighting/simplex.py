"""Deterministic solvers over the probability simplex, written against a Gram matrix Q_ij = <x_i, x_j>.

The points x_i are never materialised: a convex combination x_w = sum_i w_i x_i has ||x_w||^2 = w^T Q w and
<x_w, x_j> = (Q w)_j. All loops are plain float64 numpy with fixed iteration orders, so equal inputs give
bit-identical outputs on every process.
"""
import numpy as np


def segment_min_norm(xx, xv, vv):
    """gamma in [0, 1] minimising ||(1 - gamma) x + gamma v||^2 given <x,x>, <x,v>, <v,v> (exact line search).

    d/dgamma = 0 at gamma = (<x,x> - <x,v>) / (<x,x> - 2 <x,v> + <v,v>) = <x, x - v> / ||x - v||^2, clipped to
    [0, 1] (Sener & Koltun 2018, Algorithm 1). Equal points (||x - v|| = 0) give 0.
    """
    denominator = xx - 2.0 * xv + vv
    if denominator <= 0.0:
        return 0.0
    return float(min(max((xx - xv) / denominator, 0.0), 1.0))


def frank_wolfe_min_norm(gram, max_iter=250, tolerance=1e-5):
    """Min-norm point of conv{x_i} by Frank-Wolfe (Sener & Koltun 2018, Algorithm 2); returns (w, iterations).

    Start at w = 1/n; each iteration moves towards the vertex e_t with t = argmin_r (Q w)_r (the linear minimiser
    of the gradient 2 Q w over the simplex) by the exact two-point line search, and stops when the step gamma is
    at most ``tolerance`` or after ``max_iter`` iterations.
    """
    n = gram.shape[0]
    w = np.full(n, 1.0 / n)
    for iteration in range(1, max_iter + 1):
        qw = gram @ w
        t = int(np.argmin(qw))
        gamma = segment_min_norm(float(w @ qw), float(qw[t]), float(gram[t, t]))
        if gamma <= tolerance:
            return w, iteration
        w = (1.0 - gamma) * w
        w[t] += gamma
    return w, max_iter


def _affine_minimiser(gram, support):
    """Weights v (summing to 1) of the min-norm point of the affine hull of the support's points.

    KKT of min v^T Q_SS v s.t. 1^T v = 1:  [Q_SS 1; 1^T 0] [v; mu] = [0; 1] (least squares if singular).
    """
    m = len(support)
    system = np.zeros((m + 1, m + 1))
    system[:m, :m] = gram[np.ix_(support, support)]
    system[:m, m] = 1.0
    system[m, :m] = 1.0
    rhs = np.zeros(m + 1)
    rhs[m] = 1.0
    return np.linalg.lstsq(system, rhs, rcond=None)[0][:m]


def _minor_cycle(gram, w, support):
    """Wolfe's minor cycle: move w to the affine minimiser of the support, or stop where the segment leaves the
    hull (theta = min over leaving points of w_i / (w_i - v_i)) and drop the point that reached 0; repeat."""
    for _ in range(len(support) + 1):
        v = _affine_minimiser(gram, support)
        if np.all(v > 0.0):
            w = np.zeros_like(w)
            w[support] = v
            break
        current = w[support]
        leaving = np.flatnonzero((v <= 0.0) & (current - v > 0.0))
        ratios = current[leaving] / (current[leaving] - v[leaving])
        theta = float(np.min(ratios)) if leaving.size else 0.0
        moved = current + theta * (v - current)
        if leaving.size:
            moved[leaving[int(np.argmin(ratios))]] = 0.0  # the point that reached the boundary leaves S
        moved[moved <= 1e-15] = 0.0
        w = np.zeros_like(w)
        w[support] = moved
        support = [i for i in support if w[i] > 0.0]
    return w, support


def wolfe_min_norm(gram, tolerance=1e-12):
    """Exact min-norm point of conv{x_i} by Wolfe's algorithm (Wolfe 1976, "Finding the nearest point in a polytope").

    Keeps a "corral" S of affinely independent points whose affine min-norm point lies inside their hull. Major
    cycle: add the vertex j minimising <x, x_j>, unless <x, x_j> >= ||x||^2 - tolerance max_i ||x_i||^2 (then x is
    optimal). Minor cycle: move to the affine minimiser of S; if it leaves the hull, stop at the hull's boundary
    and drop the points whose weight became 0. Finite; returns w on the simplex.
    """
    n = gram.shape[0]
    scale = max(float(np.max(np.diag(gram))), np.finfo(float).tiny)
    first = int(np.argmin(np.diag(gram)))
    w, support = np.zeros(n), [first]
    w[first] = 1.0
    for _ in range(10 * n + 10):
        qw = gram @ w
        j = int(np.argmin(qw))
        if qw[j] >= float(w @ qw) - tolerance * scale or j in support:
            break
        support.append(j)
        w, support = _minor_cycle(gram, w, support)
        w /= w.sum()
    return w
