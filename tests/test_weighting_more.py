"""Exact MGDA and the ten strategies of issue #21 against independent references of their papers' formulas.

Gradient strategies get explicit gradient VECTORS (float64 numpy); the references work on the vectors (face
enumeration of the simplex, scipy on the primal problems, SVDs, explicit projections), the strategies on their Gram
matrix or on the [T, P] matrix, as the trainer hands them over. Degenerate inputs: a zero gradient, two identical
gradients, opposite gradients, one task present, T = 1 and very different norms.
"""
import itertools
from fractions import Fraction

import numpy as np
import pytest

from mtl import registry

registry.load_builtin()


def make(name, num_tasks, loss_weights=None, seed=0, **params):
    """Build a strategy through the registry, as the trainer will."""
    weights = np.ones(num_tasks) if loss_weights is None else np.asarray(loss_weights, dtype=float)
    tasks = [f"task{t}" for t in range(num_tasks)]
    return registry.build("weighting", {"type": name, **params}, tasks=tasks, loss_weights=weights, seed=seed)


def combined(strategy, g, losses=None, present=None, step=0):
    """sum_t alpha_t g_t as the trainer applies it (absent rows are zero in the Gram matrix)."""
    num_tasks = g.shape[0]
    present = np.ones(num_tasks, bool) if present is None else np.asarray(present)
    losses = np.where(present, 1.0 if losses is None else losses, np.nan)
    alpha = strategy.combine(g @ g.T * np.outer(present, present), losses, present, step)
    assert np.all(np.isfinite(alpha)) and np.all(alpha[~present] == 0)
    return alpha @ g


# ---- MGDA: exact min-norm point -------------------------------------------------------------------------------
def exact_affine_minimiser(x):
    """Weights (summing to 1) of the min-norm point of the affine hull of the rows of ``x``, in exact rational
    arithmetic from the float64 vectors: the KKT system [X X^T 1; 1^T 0] [w; mu] = [0; 1] by Gauss-Jordan
    elimination over fractions (None when singular)."""
    rows = [[Fraction(float(v)) for v in row] for row in x]
    m = len(rows)
    system = [[sum(a * b for a, b in zip(rows[i], rows[j])) for j in range(m)] + [Fraction(1), Fraction(0)]
              for i in range(m)] + [[Fraction(1)] * m + [Fraction(0), Fraction(1)]]
    for col in range(m + 1):
        pivot = next((r for r in range(col, m + 1) if system[r][col] != 0), None)
        if pivot is None:
            return None
        system[col], system[pivot] = system[pivot], system[col]
        for r in range(m + 1):
            if r != col and system[r][col] != 0:
                factor = system[r][col] / system[col][col]
                system[r] = [a - factor * b for a, b in zip(system[r], system[col])]
    return np.array([float(system[i][m + 1] / system[i][i]) for i in range(m)])


def face_min_norm(g):
    """Min-norm point of conv{g_t} by enumerating the faces of the simplex: for every support S, the affine
    minimiser of {sum_S w_s g_s : sum w = 1} (least squares on the vectors, in the null space of the constraint);
    the feasible (w >= 0) one of least norm wins, and its weights are then recomputed in exact arithmetic."""
    best, best_support = None, None
    for size in range(1, g.shape[0] + 1):
        for support in itertools.combinations(range(g.shape[0]), size):
            x = g[list(support)]
            w = np.full(size, 1.0 / size)
            if size > 1:
                null = np.linalg.svd(np.ones((1, size)))[2][1:].T  # orthonormal basis of {z : sum z = 0}
                w = w + null @ np.linalg.lstsq(x.T @ null, -(x.T @ w), rcond=None)[0]
            if np.all(w >= -1e-12) and (best is None or np.linalg.norm(w @ x) < np.linalg.norm(best)):
                best, best_support = w @ x, list(support)
    exact = exact_affine_minimiser(g[best_support])
    return best if exact is None or np.any(exact < 0) else exact @ g[best_support]


def hard_gradients(rng, kind, num_tasks, size=20):
    """Gradients of norms spread over 1e-3 .. 1e3 with a zero, a duplicate or a (same or opposite) collinear row."""
    g = rng.standard_normal((num_tasks, size)) * 10.0 ** rng.uniform(-3, 3, (num_tasks, 1))
    if kind == "zero":
        g[rng.integers(num_tasks)] = 0.0
    elif kind == "duplicate":
        g[-1] = g[0]
    elif kind == "collinear":
        g[-1] = g[0] * 10.0 ** rng.uniform(-2, 2)
    elif kind == "opposite":
        g[-1] = -g[0] * 10.0 ** rng.uniform(-2, 2)
    return g


def mgda_error(got, expected, g):
    """||got - expected|| / ||expected||, or / max_t ||g_t|| when the exact point is within 1e-6 max_t ||g_t|| of
    the origin (tasks nearly Pareto stationary): a Gram matrix holds ||x||^2 only to ~1e-16 max_t ||g_t||^2, so a
    point that close to 0 is only known to ~1e-8 max_t ||g_t||, whatever the solver."""
    largest = np.linalg.norm(g, axis=1).max()
    scale = np.linalg.norm(expected) if np.linalg.norm(expected) > 1e-6 * largest else largest
    return np.linalg.norm(got - expected) / scale


@pytest.mark.parametrize("normalization", ["none", "l2", "loss", "loss+"])
@pytest.mark.parametrize("kind", ["random", "zero", "duplicate", "collinear", "opposite"])
def test_mgda_is_the_exact_min_norm_point(normalization, kind):
    rng = np.random.default_rng(["random", "zero", "duplicate", "collinear", "opposite"].index(kind))
    worst = 0.0
    for trial in range(40):
        num_tasks = 2 + trial % 5
        g = hard_gradients(rng, kind, num_tasks)
        losses = 10.0 ** rng.uniform(-2, 2, num_tasks)
        norms = np.linalg.norm(g, axis=1)
        n = {"none": np.ones(num_tasks), "l2": norms, "loss": losses, "loss+": losses * norms}[normalization]
        n = np.where(n > 0, n, 1.0)
        expected = face_min_norm(g / n[:, None])
        worst = max(worst, mgda_error(combined(make("mgda", num_tasks, normalization=normalization), g, losses),
                                      expected, g / n[:, None]))
    assert worst <= 1e-6, worst


def test_mgda_ub_is_exact_on_the_representation_gram():
    """MGDA-UB gets a diagonal Gram matrix (every task scores its own rows): min-norm weights proportional to
    1 / ||g_t||^2, whatever the norms."""
    strategy = make("mgda", 3, representation=True)
    for norms in ([1.0, 2.0, 3.0], [1e-3, 1.0, 1e3], [0.0, 1.0, 2.0]):
        squares = np.square(norms)
        alpha = strategy.combine(np.diag(squares), np.ones(3), np.ones(3, bool), 0)
        inverse = np.where(squares > 0, 1.0 / np.where(squares > 0, squares, 1.0), 0.0)
        expected = inverse / inverse.sum() if np.all(squares > 0) else (squares == 0).astype(float)
        np.testing.assert_allclose(alpha, expected, rtol=1e-12, atol=1e-15)
