"""Deterministic solvers over the probability simplex, written against a Gram matrix Q_ij = <x_i, x_j>.

The points x_i are never materialised: a convex combination x_w = sum_i w_i x_i has ||x_w||^2 = w^T Q w and
<x_w, x_j> = (Q w)_j. All loops are plain float64 numpy with fixed iteration orders, so equal inputs give
bit-identical outputs on every process.
"""
import numpy as np

GAP_TOLERANCE = 1e-13  # Wolfe's optimality test, relative to the rounding error of <x, x_j> (see wolfe_min_norm)


def _affine_minimiser(gram, support):
    """Weights v (summing to 1) of the min-norm point of the affine hull of the support's points.

    With r the support's shortest point and d_i = x_i - x_r for the others, x = x_r + sum_i z_i d_i is closest to
    the origin when M z = -b, M_ij = <d_i, d_j> = Q_ij - Q_ir - Q_jr + Q_rr, b_i = <d_i, x_r> = Q_ir - Q_rr. The
    system is solved after a symmetric diagonal scaling (unit diagonal: its conditioning depends on the angles
    between the d_i, not on their lengths), by least squares when it is singular. v_r = 1 - sum_i z_i.
    """
    support = list(support)
    r = min(support, key=lambda i: (gram[i, i], i))
    others = [i for i in support if i != r]
    v = np.zeros(len(support))
    if others:
        block = gram[np.ix_(others, others)]
        cross = gram[others, r]
        m = block - cross[:, None] - cross[None, :] + gram[r, r]
        b = cross - gram[r, r]
        s = np.sqrt(np.maximum(np.diag(m), 0.0))
        s = np.where(s > 0.0, s, 1.0)
        z = np.linalg.lstsq(m / np.outer(s, s), -b / s, rcond=1e-13)[0] / s
        v[[support.index(i) for i in others]] = z
    v[support.index(r)] = 1.0 - v.sum()
    return v


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
    return w / w.sum(), support


def _is_optimal(gram, w, j, qw, tolerance):
    """Wolfe's test <x, x_j> >= ||x||^2 (x = x_w) up to the rounding of both sides: the error of (Q w)_j is about
    eps ||x_j|| sum_i w_i ||x_i||, that of ||x||^2 about eps (sum_i w_i ||x_i||)^2."""
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    spread = float(w @ norms)
    return qw[j] >= float(w @ qw) - tolerance * spread * (spread + norms[j])


def wolfe_min_norm(gram, tolerance=GAP_TOLERANCE):
    """Exact min-norm point of conv{x_i} by Wolfe's algorithm (Wolfe 1976, "Finding the nearest point in a polytope").

    Keeps a "corral" S of affinely independent points whose affine min-norm point lies inside their hull. Major
    cycle: add the vertex j minimising <x, x_j>, unless <x, x_j> >= ||x||^2 up to rounding (then x is optimal:
    <x, y - x> >= 0 for every y of the hull). Minor cycle: move to the affine minimiser of S; if it leaves the
    hull, stop at the hull's boundary and drop the points whose weight became 0. Finite; starts at the shortest
    point; returns w on the simplex. Every test is relative to the points' own lengths, so gradients of very
    different norms (1e-4 next to 1e4) are solved as accurately as equal ones.
    """
    n = gram.shape[0]
    first = int(np.argmin(np.diag(gram)))
    w, support = np.zeros(n), [first]
    w[first] = 1.0
    best = float(gram[first, first])
    for _ in range(10 * n + 10):
        qw = gram @ w
        j = int(np.argmin(qw))
        if j in support or _is_optimal(gram, w, j, qw, tolerance):
            break
        candidate, candidate_support = _minor_cycle(gram, w, support + [j])
        value = float(candidate @ gram @ candidate)
        if value >= best:  # no progress in floating point: w is the minimum to working precision
            break
        w, support, best = candidate, candidate_support, value
    return w
