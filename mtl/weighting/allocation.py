"""Fair allocation of the update among tasks: the weights w > 0 with G^T G w = w^(-1/a), shared by Nash-MTL (a = 1)
and FairGrad (any a > 0).

With K = G^T G the Gram matrix of the task gradients, the update d = G w = sum_t w_t g_t gives every task the
improvement <g_t, d> = (K w)_t = w_t^(-1/a): the alpha-fair allocation of Ban & Ji (ICML 2024), which for a = 1 is
the Nash bargaining solution of Navon et al. (ICML 2022). The system is the stationarity condition of the strictly
convex f(w) = 1/2 w^T K w + sum_t phi(w_t) with phi'(w) = -w^(-1/a) (phi = -log w for a = 1), solved here by a
damped Newton iteration to rounding (no cvxpy, no ECOS): deterministic float64, equal on every process.

Numerics: with n_t = ||g_t|| and C = K / (n n^T) (unit diagonal), w_t = beta_t / n_t turns the system into
C beta = r * beta^(-1/a), r_t = n_t^((1-a)/a) (r = 1 for a = 1): the iteration sees angles, not norms, so gradients
of very different norms are solved as well as equal ones. A task with a zero gradient gets w_t = 0 (its weight
cannot change the update). When the origin lies in the convex hull of the remaining unit gradients (within
``STATIONARY``: opposite gradients, for instance), no direction improves every task, the system has no solution
(f is unbounded below), and the update is 0: the tasks are Pareto stationary, as MGDA would conclude.
"""
import numpy as np

from mtl.weighting.base import unit_gram
from mtl.weighting.simplex import wolfe_min_norm

STATIONARY = 1e-6  # distance of the unit gradients' hull to the origin below which no update is made
NEWTON_STEPS = 200
QUADRATIC = 1e-6  # Newton decrement below which the full step is taken (quadratic convergence)


def _objective(correlation, r, a, beta):
    """f(beta) = 1/2 beta^T C beta + sum_t r_t phi(beta_t) (+inf outside beta > 0)."""
    if np.any(beta <= 0.0):
        return np.inf
    barrier = -np.log(beta) if a == 1.0 else -beta ** (1.0 - 1.0 / a) / (1.0 - 1.0 / a)
    return 0.5 * float(beta @ correlation @ beta) + float(r @ barrier)


def _start(correlation, r, a):
    """The diagonal solution beta_t = r_t^(a/(a+1)), scaled by the exact minimiser of f along its ray."""
    beta = r ** (a / (a + 1.0))
    quadratic = float(beta @ correlation @ beta)
    return beta * (float(r @ beta ** (1.0 - 1.0 / a)) / quadratic) ** (a / (a + 1.0))


def _step_length(correlation, r, a, beta, step, decrement):
    """At most 99 % of the way to the boundary beta = 0; the whole Newton step in its region of quadratic
    convergence (decrement < ``QUADRATIC``: f no longer resolves the decrease there), else Armijo backtracking
    on f (0 when no step lowers f)."""
    shrinking = step < 0.0
    t = min(1.0, 0.99 * float(np.min(beta[shrinking] / -step[shrinking]))) if shrinking.any() else 1.0
    if decrement < QUADRATIC:
        return t
    value = _objective(correlation, r, a, beta)
    while t > 1e-20:
        if _objective(correlation, r, a, beta + t * step) <= value - 1e-4 * t * decrement:
            return t
        t *= 0.5
    return 0.0


def _newton(correlation, r, a):
    """Damped Newton on f: step -H^-1 grad, H = C + diag(r / a beta^(-1/a-1)), shortened by :func:`_step_length`.
    Stops when the Newton decrement lambda^2 = grad^T H^-1 grad (lambda bounds the error of the update
    d = sum_t beta_t u_t in unit-gradient terms) no longer decreases in the quadratic phase (the rounding floor)
    or when no step lowers f."""
    beta = _start(correlation, r, a)
    previous = np.inf
    for _ in range(NEWTON_STEPS):
        gradient = correlation @ beta - r * beta ** (-1.0 / a)
        hessian = correlation + np.diag(r / a * beta ** (-1.0 / a - 1.0))
        step = np.linalg.solve(hessian, -gradient)
        decrement = -float(gradient @ step)
        if not decrement > 0.0 or (decrement < QUADRATIC and decrement >= previous):
            break
        t = _step_length(correlation, r, a, beta, step, decrement)
        if t == 0.0:
            break
        beta, previous = beta + t * step, decrement
    return beta


def fair_weights(gram, a=1.0):
    """w >= 0 with (K w)_t = w_t^(-1/a) for every task of non-zero gradient (0 for the others); all 0 when the
    tasks are Pareto stationary. ``gram``: the T x T Gram matrix of the tasks to weigh. Solved for K / N^2
    (N = max_t ||g_t||, so that r stays representable), then w(K) = N^(-2a/(a+1)) w(K / N^2)."""
    norms, usable, correlation = unit_gram(gram)
    w = np.zeros(gram.shape[0])
    if usable.size == 0:
        return w
    n = norms[usable]
    nearest = wolfe_min_norm(correlation)
    if float(nearest @ correlation @ nearest) <= STATIONARY ** 2:
        return w
    largest = float(np.max(n))
    relative = n / largest
    beta = _newton(correlation, relative ** ((1.0 - a) / a), a)
    w[usable] = beta / relative * largest ** (-2.0 * a / (a + 1.0))
    return w
