"""Exact MGDA and the ten newer strategies (nash_mtl ... db_mtl) against independent references of their papers'
formulas.

Gradient strategies get explicit gradient VECTORS (float64 numpy); the references work on the vectors (face
enumeration of the simplex, scipy on the primal problems, SVDs, explicit projections), the strategies on their Gram
matrix or on the [T, P] matrix, as the trainer hands them over. Degenerate inputs: a zero gradient, two identical
gradients, opposite gradients, one task present, T = 1 and very different norms.
"""
import itertools
import json
import os
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import least_squares, minimize

from mtl.core import registry
from mtl.core.errors import ConfigError
from mtl.weighting.matrix_based import GradientMatrixWeighting
from mtl.weighting.upgrad import dual_cone_weights
from tests.dist_scripts import weighting_more
from tests.dist_scripts.weighting_more import STRATEGIES as MORE_RUNS
from tests.dist_util import ROOT
from tests.shared_runs import two_process_run

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


def test_imtl_g_on_the_representation_gram_normalises_each_task_when_no_rows_pair():
    """IMTL-G with ``representation: true`` (Liu et al.'s own variant) on a diagonal Gram matrix (tasks on rows of
    their own, or heads reading different backbone outputs): equal projections of orthogonal gradients mean
    alpha_t ||g_t|| equal, so alpha_t is proportional to 1 / ||g_t|| (summing to 1); on a full one it is the
    parameters' IMTL-G of the same matrix."""
    strategy = make("imtl_g", 3, representation=True)
    assert strategy.uses_representation and not make("imtl_g", 3).uses_representation
    for norms in ([1.0, 2.0, 3.0], [1e-3, 1.0, 1e3]):
        alpha = strategy.combine(np.diag(np.square(norms)), np.ones(3), np.ones(3, bool), 0)
        inverse = 1.0 / np.asarray(norms)
        np.testing.assert_allclose(alpha, inverse / inverse.sum(), rtol=1e-10)
    g = np.random.default_rng(3).standard_normal((3, 7))
    np.testing.assert_allclose(strategy.combine(g @ g.T, np.ones(3), np.ones(3, bool), 0),
                               make("imtl_g", 3).combine(g @ g.T, np.ones(3), np.ones(3, bool), 0), rtol=1e-12)
    with pytest.raises(ConfigError, match="parameter 'representation' must be true or false, got 'yes'"):
        make("imtl_g", 3, representation="yes")


# ---- common -------------------------------------------------------------------------------------------------------
NEW = ["nash_mtl", "imtl_g", "imtl_l", "aligned_mtl", "upgrad", "db_mtl", "gradvac", "graddrop", "stch", "fairgrad"]
GRAM = ["nash_mtl", "imtl_g", "aligned_mtl", "upgrad", "gradvac", "fairgrad"]
MATRIX = ["db_mtl", "graddrop"]
STATEFUL = {"imtl_l": {"lr": 0.1}, "db_mtl": {"beta": 0.8, "beta_sigma": 0.5}, "gradvac": {"beta": 0.3},
            "stch": {"warmup_steps": 2, "nadir_steps": 3}, "nash_mtl": {"update_weights_every": 3}}


def matrix_combined(strategy, g, losses=None, present=None, step=0):
    """The shared gradient a gradient-matrix strategy returns for the rows ``g`` (absent rows zero)."""
    num_tasks = g.shape[0]
    present = np.ones(num_tasks, bool) if present is None else np.asarray(present)
    losses = np.where(present, 1.0 if losses is None else losses, np.nan)
    out = strategy.combine_matrix(np.where(present[:, None], g, 0.0), losses, present, step)
    assert out.shape == (g.shape[1],) and np.all(np.isfinite(out))
    return out


def update(strategy, g, losses=None, present=None, step=0):
    """The shared gradient of any gradient strategy, through the path the trainer uses for it."""
    if strategy.needs_gradient_matrix:
        return matrix_combined(strategy, g, losses, present, step)
    return combined(strategy, g, losses, present, step)


def conflicting(rng, num_tasks, size=20, spread=0.0):
    """Random gradients, task 1 conflicting with task 0, norms spread over 10^-spread .. 10^spread."""
    g = rng.standard_normal((num_tasks, size))
    if num_tasks > 1:
        g[1] = -0.7 * g[0] + 0.5 * g[1]
    return g * 10.0 ** rng.uniform(-spread, spread, (num_tasks, 1))


def test_new_strategies_are_registered_with_capabilities():
    entries = {e.name: e for e in registry.entries("weighting")}
    assert set(NEW) <= set(entries)
    for name in NEW:
        strategy = make(name, 3)
        assert entries[name].description, name
        assert strategy.needs_gradients == (name in GRAM + MATRIX), name
        assert strategy.needs_gradient_matrix == (name in MATRIX), name
        assert not strategy.uses_representation
    assert {n for n in NEW if make(n, 2).sample_mode} == {"imtl_l"}


@pytest.mark.parametrize("name, params", [
    ("nash_mtl", {"max_norm": -1}), ("nash_mtl", {"update_weights_every": 0}), ("imtl_l", {"lr": 0}),
    ("db_mtl", {"beta": 1.0}), ("db_mtl", {"beta_sigma": -0.5}), ("gradvac", {"beta": 0}),
    ("gradvac", {"beta": 1.5}), ("graddrop", {"leak": 2}), ("graddrop", {"leak": [0.1, 0.2]}),
    ("stch", {"mu": 0}), ("stch", {"warmup_steps": 1.5}), ("stch", {"nadir_steps": -1}),
    ("fairgrad", {"alpha": 0}), ("fairgrad", {"max_norm": "big"})])
def test_bad_parameters_are_one_sentence(name, params):
    key = next(iter(params))
    with pytest.raises(ConfigError, match=f"^weighting '{name}': parameter '{key}' must be [^\\n]*$"):
        make(name, 3, **params)


# ---- Nash-MTL and FairGrad -------------------------------------------------------------------------------------
def bargaining_reference(g):
    """Navon et al.'s bargaining problem on the vectors: d = argmax sum_t log <g_t, d> on ||d||^2 <= T (SLSQP),
    started from the min-norm point of the hull (a direction that improves every task)."""
    num_tasks = g.shape[0]
    start = face_min_norm(g)
    start = start / np.linalg.norm(start) * np.sqrt(num_tasks) * 0.999
    with np.errstate(invalid="ignore", divide="ignore"):  # SLSQP's line search may step outside the domain
        run = minimize(lambda d: -np.sum(np.log(g @ d)), start, jac=lambda d: -(g.T @ (1.0 / (g @ d))),
                       method="SLSQP", constraints=[{"type": "ineq", "fun": lambda d: num_tasks - d @ d}],
                       options={"ftol": 1e-16, "maxiter": 2000})
    return run.x


def fair_reference(g, a):
    """Ban & Ji's system G^T G w = w^(-1/a) on the vectors, by the authors' own method (scipy's least_squares from
    w = 1/T with w >= 0) at tight tolerances; the result must solve the system to 1e-9."""
    run = least_squares(lambda w: g @ (g.T @ w) - w ** (-1.0 / a), np.full(g.shape[0], 1.0 / g.shape[0]),
                        bounds=(0, np.inf), xtol=1e-15, ftol=1e-15, gtol=1e-15)
    assert np.abs(run.x ** (1.0 / a) * (g @ (g.T @ run.x)) - 1.0).max() < 1e-9
    return run.x


@pytest.mark.parametrize("num_tasks", [2, 3, 5])
def test_nash_mtl_is_the_bargaining_solution(num_tasks):
    rng = np.random.default_rng(100 + num_tasks)
    strategy = make("nash_mtl", num_tasks)
    for _ in range(4):
        g = conflicting(rng, num_tasks, spread=2.0)
        got = combined(strategy, g)
        np.testing.assert_allclose(got, bargaining_reference(g), rtol=0, atol=1e-6 * np.linalg.norm(got))
        g = g / np.sqrt(np.linalg.norm(g, axis=1))[:, None]  # norms within 1e-1 .. 1e1 for the authors' solver
        got = combined(strategy, g)
        np.testing.assert_allclose(got, fair_reference(g, 1.0) @ g, rtol=0, atol=1e-10 * np.linalg.norm(got))
        alpha = strategy.combine(g @ g.T, np.ones(num_tasks), np.ones(num_tasks, bool), 0)
        np.testing.assert_allclose(g @ got, 1.0 / alpha, rtol=1e-10)  # <g_t, d> = 1 / alpha_t
        assert abs(got @ got - num_tasks) < 1e-9 * num_tasks  # ||d||^2 = T


@pytest.mark.parametrize("a", [0.5, 2.0, 5.0])
def test_fairgrad_solves_the_alpha_fair_system(a):
    rng = np.random.default_rng(int(10 * a))
    for num_tasks in (2, 3, 4):
        strategy = make("fairgrad", num_tasks, alpha=a)
        for _ in range(3):
            g = conflicting(rng, num_tasks, spread=1.0)
            got = combined(strategy, g)
            np.testing.assert_allclose(got, fair_reference(g, a) @ g, rtol=0, atol=1e-10 * np.linalg.norm(got))
    g = conflicting(rng, 3)
    np.testing.assert_allclose(combined(make("fairgrad", 3, alpha=1.0), g), combined(make("nash_mtl", 3), g),
                               rtol=1e-12)  # alpha = 1 is Nash-MTL


@pytest.mark.parametrize("name, a", [("nash_mtl", 1.0), ("fairgrad", 0.5), ("fairgrad", 3.0)])
def test_fair_allocations_degenerate_cases(name, a):
    params = {"alpha": a} if name == "fairgrad" else {}
    rng = np.random.default_rng(7)
    one = rng.standard_normal(20)
    norm = np.linalg.norm(one)
    power = -2.0 * a / (a + 1.0)  # one task, or orthogonal tasks: ||g||^2 w = w^(-1/a)
    np.testing.assert_allclose(combined(make(name, 1, **params), one[None]), norm ** power * one, rtol=1e-12)
    orthogonal = np.diag([1e-3, 1.0, 1e3]) @ np.eye(3, 20)  # very different norms
    expected = (np.array([1e-3, 1.0, 1e3]) ** power)[:, None] * orthogonal
    np.testing.assert_allclose(combined(make(name, 3, **params), orthogonal), expected.sum(axis=0), rtol=1e-12)
    twin = (2.0 * norm ** 2) ** (-a / (a + 1.0))  # identical gradients: 2 ||g||^2 w = w^(-1/a), w equal
    np.testing.assert_allclose(combined(make(name, 2, **params), np.stack([one, one])), 2 * twin * one, rtol=1e-10)
    for stationary in (np.stack([one, -0.5 * one]), np.stack([one, 0 * one, -one])):
        assert np.all(combined(make(name, len(stationary), **params), stationary) == 0)  # no common descent
    with_zero = np.stack([one, 0 * one])
    np.testing.assert_allclose(combined(make(name, 2, **params), with_zero), norm ** power * one, rtol=1e-12)
    g = conflicting(rng, 3)
    present = np.array([True, False, True])
    np.testing.assert_allclose(combined(make(name, 3, **params), g, present=present),
                               combined(make(name, 2, **params), g[present]), rtol=1e-14)


def test_nash_mtl_reuses_its_weights_and_clips():
    rng = np.random.default_rng(8)
    strategy = make("nash_mtl", 3, update_weights_every=3)
    first = conflicting(rng, 3)
    alpha = strategy.combine(first @ first.T, np.ones(3), np.ones(3, bool), 0)
    for step in (1, 2):  # reused in between, whatever the gradients
        g = conflicting(rng, 3)
        assert np.array_equal(strategy.combine(g @ g.T, np.ones(3), np.ones(3, bool), step), alpha)
    g = conflicting(rng, 3)
    assert not np.array_equal(strategy.combine(g @ g.T, np.ones(3), np.ones(3, bool), 3), alpha)
    for name, params in (("nash_mtl", {}), ("fairgrad", {"alpha": 2.0})):
        g = conflicting(rng, 3)
        free, clipped = (combined(make(name, 3, **params, max_norm=m), g) for m in (0.0, 0.25))
        np.testing.assert_allclose(clipped, 0.25 * free / np.linalg.norm(free), rtol=1e-12)


# ---- IMTL ---------------------------------------------------------------------------------------------------------
def imtl_g_reference(g):
    """Liu et al.'s closed form on the vectors: alpha_{2:T} = g_1 U^T (D U^T)^-1, D = [g_1 - g_t], U = [u_1 - u_t],
    alpha_1 = 1 - sum alpha_{2:T}."""
    units = g / np.linalg.norm(g, axis=1, keepdims=True)
    d, u = g[0] - g[1:], units[0] - units[1:]
    rest = g[0] @ u.T @ np.linalg.inv(d @ u.T)
    return np.concatenate([[1.0 - rest.sum()], rest]) @ g


@pytest.mark.parametrize("num_tasks", [2, 3, 5])
def test_imtl_g_matches_the_closed_form(num_tasks):
    rng = np.random.default_rng(200 + num_tasks)
    strategy = make("imtl_g", num_tasks)
    for _ in range(5):
        g = conflicting(rng, num_tasks, spread=2.0)
        got = combined(strategy, g)
        expected = imtl_g_reference(g)
        units = g / np.linalg.norm(g, axis=1, keepdims=True)
        expected = expected if units[0] @ expected > 0 else -expected  # see the negative-sum case below
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * np.linalg.norm(got))
        assert np.ptp(units @ got) <= 1e-9 * np.abs(units @ got).max() and np.all(units @ got > 0)


def test_imtl_g_degenerate_cases():
    rng = np.random.default_rng(210)
    one = rng.standard_normal(20)
    unit = one / np.linalg.norm(one)
    strategy = make("imtl_g", 2)
    a, b = 1e-3, 1e3  # identical directions, very different norms: alpha = (b, a) / (a + b), the closed form's limit
    np.testing.assert_allclose(combined(strategy, np.stack([a * unit, b * unit])), 2 * a * b / (a + b) * unit,
                               rtol=1e-12)
    assert np.all(combined(strategy, np.stack([one, -2 * one])) == 0)  # opposite: no common projection
    np.testing.assert_allclose(combined(strategy, np.stack([one, 0 * one])), one, rtol=1e-14)  # zero gradient
    np.testing.assert_allclose(combined(make("imtl_g", 1), one[None]), one, rtol=1e-14)
    g = conflicting(rng, 3)
    present = np.array([True, False, True])
    np.testing.assert_allclose(combined(make("imtl_g", 3), g, present=present), imtl_g_reference(g[present]),
                               rtol=1e-10)
    # three unit directions whose closed form sums to a negative s: the paper's alpha would make every task worse
    g = np.array([[1.0, 0, 0], [np.cos(0.3) / np.sqrt(2), np.cos(0.3) / np.sqrt(2), np.sin(0.3)], [0, 1.0, 0]])
    g = g * np.array([[1.0], [0.01], [1.0]])
    reference = imtl_g_reference(g)
    units = g / np.linalg.norm(g, axis=1, keepdims=True)
    assert np.all(units @ reference < 0)
    got = combined(make("imtl_g", 3), g)
    np.testing.assert_allclose(got, -reference, rtol=1e-10)  # the same equal projections, made positive
    assert np.all(units @ got > 0) and np.ptp(units @ got) < 1e-12


@pytest.mark.parametrize("sample", [False, True])
def test_imtl_l_scale_trajectory(sample):
    rng = np.random.default_rng(220)
    loss_weights, lr = np.array([1.0, 0.5, 2.0]), 0.1
    strategy = make("imtl_l", 3, loss_weights=loss_weights, lr=lr)
    s = np.zeros(3)
    for step in range(40):
        present = np.zeros(3, bool)
        present[rng.integers(3)] = True
        present = present if sample else np.ones(3, bool)
        losses = np.where(present, rng.uniform(0.2, 3.0, 3) * np.exp(-0.03 * step), np.nan)
        np.testing.assert_allclose(strategy.weights(losses, present, step),
                                   np.where(present, loss_weights * np.exp(s), 0.0), rtol=1e-14)
        for t in np.flatnonzero(present):
            s[t] -= lr * (np.exp(s[t]) * losses[t] - 1.0)  # d/ds [exp(s) L - s]
    np.testing.assert_allclose(strategy.state_dict()["log_scale"], s, rtol=1e-14)
    constant = make("imtl_l", 2, lr=0.2)
    for step in range(400):
        constant.weights([4.0, 0.25], [True, True], step)
    np.testing.assert_allclose(constant.weights([4.0, 0.25], [True, True], 400) * [4.0, 0.25], 1.0, rtol=1e-6)


# ---- Aligned-MTL ------------------------------------------------------------------------------------------------
def aligned_reference(g):
    """Senushkin et al. on the vectors: the SVD G = U S V^T of the [P, T] gradient matrix, the singular values above
    sqrt(s_max^2 T eps32) kept; the update sigma_min U V^T 1 (all kept singular values set to the smallest)."""
    u, singular, vt = np.linalg.svd(g.T, full_matrices=False)
    keep = singular ** 2 > singular.max() ** 2 * g.shape[0] * np.finfo(np.float32).eps
    return singular[keep].min() * u[:, keep] @ (vt[keep] @ np.ones(g.shape[0]))


@pytest.mark.parametrize("num_tasks", [2, 3, 5])
def test_aligned_mtl_matches_the_svd(num_tasks):
    rng = np.random.default_rng(300 + num_tasks)
    strategy = make("aligned_mtl", num_tasks)
    for _ in range(5):
        g = conflicting(rng, num_tasks, spread=1.0)
        got = combined(strategy, g)
        np.testing.assert_allclose(got, aligned_reference(g), rtol=0, atol=1e-10 * np.linalg.norm(got))


def test_aligned_mtl_degenerate_cases():
    rng = np.random.default_rng(310)
    one = rng.standard_normal(20)
    strategy = make("aligned_mtl", 2)
    np.testing.assert_allclose(combined(strategy, np.stack([one, one])), 2 * one, rtol=1e-12)  # rank 1
    np.testing.assert_allclose(combined(strategy, np.stack([one, -one])), 0.0, atol=1e-12 * np.linalg.norm(one))
    np.testing.assert_allclose(combined(strategy, np.stack([one, -3 * one])), -2 * one, rtol=1e-12)  # rank 1: the sum
    np.testing.assert_allclose(combined(strategy, np.stack([one, 0 * one])), one, rtol=1e-12)
    np.testing.assert_allclose(combined(make("aligned_mtl", 1), one[None]), one, rtol=1e-14)
    g = np.array([[0.1], [1.0], [10.0]]) * np.eye(3, 20)  # orthogonal, different norms: all scaled to the smallest
    np.testing.assert_allclose(combined(make("aligned_mtl", 3), g), 0.1 * np.eye(3, 20).sum(axis=0), rtol=1e-12)
    g = np.array([[1e-2], [1.0], [1e2]]) * np.eye(3, 20)  # 1e-8 of the largest eigenvalue: below float32's rank
    np.testing.assert_allclose(combined(make("aligned_mtl", 3), g), np.eye(3, 20)[1:].sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(aligned_reference(g), np.eye(3, 20)[1:].sum(axis=0), rtol=1e-12)
    assert np.all(combined(make("aligned_mtl", 2), np.zeros((2, 20))) == 0)
    g = conflicting(rng, 3)
    present = np.array([True, False, True])
    np.testing.assert_allclose(combined(make("aligned_mtl", 3), g, present=present), aligned_reference(g[present]),
                               rtol=1e-10)


# ---- UPGrad -------------------------------------------------------------------------------------------------------
def dual_cone_projection(g, x):
    """argmin_y ||y - x||^2 subject to <g_j, y> >= 0 for every j, on the vectors (SLSQP)."""
    run = minimize(lambda y: 0.5 * (y - x) @ (y - x), np.zeros_like(x), jac=lambda y: y - x, method="SLSQP",
                   constraints=[{"type": "ineq", "fun": lambda y: g @ y, "jac": lambda y: g}],
                   options={"ftol": 1e-16, "maxiter": 2000})
    return run.x


def upgrad_reference(g):
    """Quinton & Rey's UPGrad on the vectors: the mean of the dual-cone projections of the gradients."""
    return np.mean([dual_cone_projection(g, row) for row in g], axis=0)


def check_projection_conditions(g, i, weights):
    """The projection's optimality on the vectors: y = G^T w is in the cone, w - e_i >= 0 (the multipliers), and
    a positive multiplier only on a constraint that is tight (complementary slackness), to rounding."""
    y = weights @ g
    scale = np.linalg.norm(g, axis=1).max() * max(np.linalg.norm(y), 1e-300)
    multipliers = weights - np.eye(g.shape[0])[i]
    assert np.all(g @ y >= -1e-12 * scale) and np.all(multipliers >= -1e-12)
    assert np.all(np.abs(multipliers * (g @ y)) <= 1e-10 * scale * max(1.0, multipliers.max()))


@pytest.mark.parametrize("num_tasks", [2, 3, 5])
def test_upgrad_projects_onto_the_dual_cone(num_tasks):
    rng = np.random.default_rng(400 + num_tasks)
    strategy = make("upgrad", num_tasks)
    for _ in range(4):
        g = conflicting(rng, num_tasks, spread=2.0)
        got = combined(strategy, g)
        np.testing.assert_allclose(got, upgrad_reference(g), rtol=0, atol=1e-6 * np.linalg.norm(g, axis=1).max())
        norms = np.linalg.norm(g, axis=1)
        unit_gram = g @ g.T / np.outer(norms, norms)
        for i in range(num_tasks):
            check_projection_conditions(g, i, dual_cone_weights(unit_gram, norms[i] * np.eye(num_tasks)[i]) / norms)


def test_upgrad_degenerate_cases():
    rng = np.random.default_rng(410)
    one = rng.standard_normal(20)
    strategy = make("upgrad", 2)
    np.testing.assert_allclose(combined(strategy, np.stack([one, one])), one, rtol=1e-14)  # no conflict: the mean
    np.testing.assert_allclose(combined(strategy, np.stack([one, -0.5 * one])), 0.0, atol=1e-14)  # opposite: 0
    np.testing.assert_allclose(combined(strategy, np.stack([one, 0 * one])), one / 2, rtol=1e-14)
    np.testing.assert_allclose(combined(make("upgrad", 1), one[None]), one, rtol=1e-14)
    g = np.abs(rng.standard_normal((3, 20))) * np.array([[1e-3], [1.0], [1e3]])  # no conflicts: the plain mean
    np.testing.assert_allclose(combined(make("upgrad", 3), g), g.mean(axis=0), rtol=1e-14)
    g = conflicting(rng, 3)
    present = np.array([True, False, True])
    np.testing.assert_allclose(combined(make("upgrad", 3), g, present=present), upgrad_reference(g[present]),
                               rtol=0, atol=1e-7 * np.linalg.norm(g, axis=1).max())


# ---- GradVac ------------------------------------------------------------------------------------------------------
def gradvac_reference(g, targets, seed, step, beta):
    """Wang et al.'s Algorithm 1 on the vectors with the documented order draw; returns (update, new targets)."""
    rng = np.random.default_rng([seed, step, 0x6FAC])
    orders = [rng.permutation(g.shape[0]) for _ in range(g.shape[0])]
    targets = targets.copy()
    total = np.zeros(g.shape[1])
    for i in range(g.shape[0]):
        vaccinated = g[i].copy()
        for j in orders[i]:
            if j == i or not np.any(vaccinated) or not np.any(g[j]):
                continue
            a, b = np.linalg.norm(vaccinated), np.linalg.norm(g[j])
            cosine = np.clip(vaccinated @ g[j] / (a * b), -1.0, 1.0)
            goal = targets[i, j]
            if cosine < goal < 1.0:
                vaccinated = vaccinated + a * (goal * np.sqrt(1 - cosine ** 2) - cosine * np.sqrt(1 - goal ** 2)) / (
                    b * np.sqrt(1 - goal ** 2)) * g[j]
                assert abs(vaccinated @ g[j] / (np.linalg.norm(vaccinated) * b) - goal) < 1e-9  # reaches the goal
            targets[i, j] = (1 - beta) * goal + beta * cosine
        total += vaccinated
    return total, targets


@pytest.mark.parametrize("num_tasks", [2, 3, 4])
def test_gradvac_matches_the_vector_algorithm_over_steps(num_tasks):
    rng = np.random.default_rng(500 + num_tasks)
    strategy = make("gradvac", num_tasks, seed=3, beta=0.3)
    targets = np.zeros((num_tasks, num_tasks))
    for step in range(12):
        g = conflicting(rng, num_tasks, spread=1.0)
        if step % 4 == 3:
            g[0] = -g[0]  # a sudden conflict: the targets, by now positive, pull hard
        expected, targets = gradvac_reference(g, targets, 3, step, 0.3)
        np.testing.assert_allclose(combined(strategy, g, step=step), expected, rtol=0,
                                   atol=1e-10 * np.linalg.norm(g, axis=1).max())
        np.testing.assert_allclose(strategy.state_dict()["targets"], targets, rtol=0, atol=1e-12)
    assert np.abs(targets).max() > 0.1


def test_gradvac_degenerate_cases():
    rng = np.random.default_rng(510)
    one = rng.standard_normal(20)
    np.testing.assert_allclose(combined(make("gradvac", 2), np.stack([one, one])), 2 * one, rtol=1e-14)
    np.testing.assert_allclose(combined(make("gradvac", 2), np.stack([one, -3 * one])), 0.0, atol=1e-12)
    strategy = make("gradvac", 2)
    np.testing.assert_allclose(combined(strategy, np.stack([one, 0 * one])), one, rtol=1e-14)
    assert np.all(strategy.state_dict()["targets"] == 0)  # no angle with a zero gradient: targets untouched
    np.testing.assert_allclose(combined(make("gradvac", 1), one[None]), one, rtol=1e-14)
    g = conflicting(rng, 3, spread=3.0)  # first step: targets 0, the correction is PCGrad's
    np.testing.assert_allclose(combined(make("gradvac", 3, seed=4), g),
                               combined(make("pcgrad", 3, seed=4), g), rtol=0, atol=1e-12 * np.abs(g).max())


# ---- GradDrop -----------------------------------------------------------------------------------------------------
def graddrop_reference(g, seed, step, leak):
    """Chen et al.'s Algorithm 1 (f = identity) on the vectors, coordinate by coordinate, with the documented draw."""
    draw = np.random.default_rng([seed, step, 0x6D0]).random(g.shape[1])
    out = np.zeros(g.shape[1])
    for k in range(g.shape[1]):
        column = g[:, k]
        mass = np.abs(column).sum()
        purity = 0.5 * (1 + column.sum() / mass) if mass > 0 else 0.5
        for i, value in enumerate(column):
            kept = (purity > draw[k] and value > 0) or (purity < draw[k] and value < 0)
            out[k] += (leak[i] + (1 - leak[i]) * kept) * value
    return out


def test_graddrop_matches_the_coordinate_rule():
    rng = np.random.default_rng(600)
    leak = np.array([0.0, 0.3, 1.0])
    strategy = make("graddrop", 3, seed=9, leak=leak.tolist())
    for step in range(5):
        g = conflicting(rng, 3, size=200, spread=2.0)
        g[:, :10] = 0.0  # coordinates no task touches
        np.testing.assert_allclose(matrix_combined(strategy, g.astype(np.float32), step=step),
                                   graddrop_reference(g.astype(np.float32).astype(np.float64), 9, step, leak),
                                   rtol=1e-15, atol=0)


def test_graddrop_degenerate_cases_and_draws():
    rng = np.random.default_rng(610)
    one = rng.standard_normal(1000)
    strategy = make("graddrop", 2, seed=1)
    np.testing.assert_array_equal(matrix_combined(strategy, np.stack([one, one])), 2 * one)  # same signs: all kept
    np.testing.assert_array_equal(matrix_combined(strategy, np.stack([one, 0 * one])), one)
    np.testing.assert_array_equal(matrix_combined(make("graddrop", 1), one[None]), one)
    opposite = matrix_combined(strategy, np.stack([one, -one]), step=4)  # purity 1/2: one sign per coordinate
    assert np.all((opposite == one) | (opposite == -one)) and 0.4 < np.mean(opposite == one) < 0.6
    heavy = matrix_combined(strategy, np.stack([3 * np.abs(one), -np.abs(one)]), step=5)  # purity 3/4
    assert 0.7 < np.mean(heavy > 0) < 0.8
    np.testing.assert_array_equal(matrix_combined(make("graddrop", 2, leak=1.0), np.stack([one, -one])), 0.0)
    draws = [matrix_combined(make("graddrop", 2, seed=s), np.stack([one, -one]), step=t) for s, t in
             ((1, 4), (1, 4), (2, 4), (1, 5))]
    assert np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[0], draws[2])
    assert not np.array_equal(draws[0], draws[3])
    present = np.array([True, False, True])
    g = conflicting(rng, 3, size=50)
    np.testing.assert_array_equal(matrix_combined(make("graddrop", 3, seed=2), g, present=present, step=1),
                                  graddrop_reference(g * present[:, None], 2, 1, np.zeros(3)))


# ---- DB-MTL -------------------------------------------------------------------------------------------------------
def test_db_mtl_matches_the_moving_average_algorithm():
    rng = np.random.default_rng(700)
    loss_weights, beta, sigma = np.array([1.0, 0.5, 2.0]), 0.8, 0.5
    strategy = make("db_mtl", 3, loss_weights=loss_weights, beta=beta, beta_sigma=sigma)
    average = np.zeros((3, 40))
    for k in range(1, 16):
        g = conflicting(rng, 3, size=40, spread=2.0).astype(np.float32).astype(np.float64)  # float32 rows, as the
        if k == 7:  # trainer hands them over: gradients of loss_weight_t L_t
            g[1] = 0.0
        losses = rng.uniform(0.05, 3.0, 3)
        np.testing.assert_allclose(strategy.weights(losses, np.ones(3, bool), k), loss_weights / (losses + 1e-8),
                                   rtol=1e-15)
        rate = beta / k ** sigma
        average = rate * average + (1 - rate) * g / (losses + 1e-8)[:, None]  # EMA of grad log(L_t + eps)
        norms = np.linalg.norm(average, axis=1)
        expected = sum(norms.max() / norms[t] * average[t] for t in range(3))
        np.testing.assert_allclose(matrix_combined(strategy, g.astype(np.float32), losses), expected, rtol=0,
                                   atol=1e-13 * np.abs(expected).max())
    np.testing.assert_allclose(strategy.state_dict()["average"], average, rtol=0, atol=1e-14 * np.abs(average).max())


def test_db_mtl_degenerate_cases_and_state_shape():
    rng = np.random.default_rng(710)
    one = rng.standard_normal(30)
    losses = np.array([2.0, 0.5])
    expected = (1 - 0.9) * one / (2.0 + 1e-8)  # first step: hhat = (1 - beta) h, its own norm is the largest
    np.testing.assert_allclose(matrix_combined(make("db_mtl", 1), one[None], losses[:1]), expected, rtol=1e-14)
    got = matrix_combined(make("db_mtl", 2), np.stack([one, 0 * one]), losses)
    np.testing.assert_allclose(got, expected, rtol=1e-14)  # a zero gradient contributes nothing
    got = matrix_combined(make("db_mtl", 2), np.stack([one, one]), losses)
    largest = (1 - 0.9) * one / (0.5 + 1e-8)  # the second task's log-gradient is 4 times longer
    np.testing.assert_allclose(got, 2 * largest, rtol=1e-14)  # identical directions: both rescaled to the largest
    got = matrix_combined(make("db_mtl", 2), np.stack([one, -one]), losses)
    np.testing.assert_allclose(got, 0.0, atol=1e-15)  # opposite directions, rescaled to equal norms: they cancel
    strategy = make("db_mtl", 2)
    matrix_combined(strategy, np.stack([one, one]), losses)
    with pytest.raises(ValueError, match="the saved moving average has 30 shared parameters, the backbone 20"):
        matrix_combined(strategy, np.ones((2, 20)), losses)
    with pytest.raises(ConfigError, match="expected 3 rows"):
        make("db_mtl", 3).set_state_dict(strategy.state_dict())
    assert np.all(make("db_mtl", 2).weights([0.0, 1e30], [True, True], 0) > 0)


# ---- STCH ---------------------------------------------------------------------------------------------------------
def stch_objective(losses, nadir, preference, mu):
    """Lin et al.'s smooth Tchebycheff value m mu log sum_t exp(lambda_t log(L_t / nadir_t + 1e-20) / mu)."""
    terms = preference * np.log(losses / nadir + 1e-20) / mu
    return len(losses) * mu * (terms.max() + np.log(np.sum(np.exp(terms - terms.max()))))


def numeric_gradient(function, losses):
    """Central differences of ``function`` at ``losses`` (relative step 1e-6)."""
    out = np.zeros_like(losses)
    for t in range(losses.size):
        h = 1e-6 * losses[t]
        up, down = losses.copy(), losses.copy()
        up[t] += h
        down[t] -= h
        out[t] = (function(up) - function(down)) / (2 * h)
    return out


def test_stch_weights_are_the_gradient_of_the_scalarization():
    rng = np.random.default_rng(800)
    preference, mu = np.array([1.0, 0.5, 2.0]), 0.3
    strategy = make("stch", 3, loss_weights=preference, mu=mu, warmup_steps=3, nadir_steps=4)
    window = []
    for step in range(12):
        losses = rng.uniform(0.2, 3.0, 3) * np.exp(-0.1 * step)
        got = strategy.weights(losses, np.ones(3, bool), step)
        if step < 7:  # warm-up: the gradient of sum_t lambda_t log(L_t + 1e-20)
            expected = numeric_gradient(lambda x: np.sum(preference * np.log(x + 1e-20)), losses)
            window += [losses] if step >= 3 else []
        else:
            nadir = np.mean(window, axis=0)
            expected = numeric_gradient(lambda x, n=nadir: stch_objective(x, n, preference, mu), losses)
        np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-8 * np.abs(expected).max())  # finite diffs
    np.testing.assert_allclose(strategy.state_dict()["loss_sums"], np.sum(window, axis=0), rtol=1e-15)
    plain = make("stch", 2, mu=1.0)  # no nadir span: nadir 1, and mu = 1 gives the mean loss's gradient times T
    np.testing.assert_allclose(plain.weights([1.0, 3.0], [True, True], 0), [0.5, 0.5], rtol=1e-15)
    sharp = make("stch", 2, mu=1e-3).weights([1.0, 3.0], [True, True], 0)  # mu -> 0: all on the worst task
    np.testing.assert_allclose(sharp, [0.0, 2.0 / 3.0], atol=1e-15)
    assert np.all(np.isfinite(make("stch", 3).weights([0.0, 1e30, 1.0], [True, True, False], 0)))


# ---- state, degenerate losses, the trainer's matrix path --------------------------------------------------------
def run_steps(strategy, steps, seed=90):
    """Weights and shared gradients of ``steps`` consecutive steps on a reproducible input stream."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps.stop):
        g = conflicting(rng, 3, size=30)
        losses = rng.uniform(0.2, 3.0, 3) * np.exp(-0.05 * step)
        if step < steps.start:
            continue
        out.append(strategy.weights(losses, np.ones(3, bool), step))
        if strategy.needs_gradients:
            out.append(update(strategy, g, losses, step=step))
    return out


@pytest.mark.parametrize("name", NEW + ["nash_mtl_every"])
def test_state_round_trip_is_bit_identical(name):
    name, params = ("nash_mtl", STATEFUL["nash_mtl"]) if name == "nash_mtl_every" else (name, STATEFUL.get(name, {}))
    uninterrupted = make(name, 3, seed=5, **params)
    expected = run_steps(uninterrupted, range(0, 12))
    first = make(name, 3, seed=5, **params)
    run_steps(first, range(0, 7))
    saved = first.state_dict()
    run_steps(first, range(7, 9))  # the saved copy must not follow the live state
    resumed = make(name, 3, seed=5, **params)
    resumed.set_state_dict(saved)
    got = run_steps(resumed, range(7, 12))
    assert all(np.array_equal(a, b) for a, b in zip(got, expected[-len(got):]))
    final, reference = resumed.state_dict(), uninterrupted.state_dict()
    assert final.keys() == reference.keys() and (name not in STATEFUL or final)
    assert all(np.array_equal(final[k], reference[k], equal_nan=True) for k in final)


@pytest.mark.parametrize("name", NEW)
def test_degenerate_losses_give_finite_weights(name):
    strategy = make(name, 3, loss_weights=[1.0, 0.5, 2.0])
    rng = np.random.default_rng(80)
    inputs = [([1.0, 2.0, 3.0], [True, True, True]), ([0.0, 2.0, np.nan], [True, True, False]),
              ([np.nan, 0.0, np.nan], [False, True, False]), ([1e-30, 1e30, 0.0], [True, True, True])]
    for step, (losses, present) in enumerate(inputs * 3):
        present = np.array(present)
        weights = strategy.weights(losses, present, step)
        assert np.all(np.isfinite(weights)) and np.all(weights[~present] == 0) and np.all(weights >= 0)
        if strategy.needs_gradients:
            g = rng.standard_normal((3, 50)) * np.array([[1.0], [0.0], [1e3]])
            assert np.all(np.isfinite(update(strategy, g, np.where(present, losses, 1.0), present, step)))
    single = make(name, 1, loss_weights=[0.5])
    for step in range(3):
        assert np.isfinite(single.weights([1.0 + step], [True], step)).all()


def test_balancer_state_json_is_exact():
    from mtl.train.balancing import _from_json, _to_json

    large = np.random.default_rng(1).standard_normal((3, 5000))
    encoded = json.loads(json.dumps(_to_json(large)))
    assert set(encoded) == {"base64", "dtype", "shape"} and np.array_equal(_from_json(encoded), large)
    assert _to_json(np.arange(3.0)) == [0.0, 1.0, 2.0] and _from_json([0.0, 1.0]) == [0.0, 1.0]


class _TwoTaskModel:
    """What the weighting step reads of a joint model: two tasks, static weights 1, one shared parameter of 2."""

    def __init__(self):
        import paddle

        self.heads = {"a": None, "b": None}
        self.loss_weights = {"a": 1.0, "b": 1.0}
        self.shared = paddle.create_parameter([2], "float32")

    def shared_parameters(self):
        return [self.shared]


def test_balancer_hands_the_unscaled_matrix_and_writes_the_scaled_result():
    """TaskBalancer.apply with a loss scale: the strategy sees gradients / scale, the shared parameters get its
    result * scale (the trainer divides every gradient by the scale afterwards), the rest is summed over ranks."""
    import paddle

    from mtl.train.balancing import TaskBalancer

    written = {}

    class Recorder:
        def reduce_gradients_except(self, skip):
            written["skipped"] = list(skip)

    class Echo(GradientMatrixWeighting):
        def combine_matrix(self, matrix, losses, present, step):
            written["matrix"] = matrix
            return matrix.sum(axis=0).astype(np.float64)

    rows = np.array([[1.0, -2.0], [4.0, 8.0]], dtype=np.float32)
    model = _TwoTaskModel()
    balancer = TaskBalancer(Echo(["a", "b"], [1.0, 1.0]), Recorder(), model)
    assert balancer.apply(paddle.to_tensor(rows * 8.0), np.ones(2), np.ones(2, bool), 0, 8.0) is None
    np.testing.assert_array_equal(written["matrix"], rows)
    np.testing.assert_array_equal(model.shared.grad.numpy(), rows.sum(axis=0) * 8.0)
    assert written["skipped"] == [model.shared]


def test_the_gram_matrix_is_float64_of_the_float32_rows():
    """The exact strategies get ``G = g g^T`` computed in float64 (docs/architecture.md), not a float32 product
    cast afterwards: against numpy float64 on rows whose float32 product loses digits."""
    import paddle

    from mtl.train.balancing import gram_float64

    rng = np.random.default_rng(4)
    rows = (rng.standard_normal((3, 20000)) * np.array([[1.0], [1e3], [1e-3]])).astype(np.float32)
    expected = rows.astype(np.float64) @ rows.astype(np.float64).T
    got = gram_float64(paddle.to_tensor(rows))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    float32 = paddle.matmul(paddle.to_tensor(rows), paddle.to_tensor(rows), transpose_y=True).numpy()
    assert np.max(np.abs(float32 - expected) / np.abs(expected)) > 1e-9  # what the float32 product would give


def test_balancer_snapshot_undoes_an_in_place_update():
    """The trainer's roll-back of a step with a non-finite gradient: DB-MTL passes the non-finite gradient on and
    updates its T x P average in place; the snapshot taken before the step must not follow it."""
    from mtl.train.balancing import TaskBalancer

    balancer = TaskBalancer(make("db_mtl", 2), None, _TwoTaskModel())
    g = np.random.default_rng(3).standard_normal((2, 10))
    matrix_combined(balancer.weighting, g, [1.0, 2.0])
    before = balancer.snapshot()
    kept = {k: np.array(v, copy=True) for k, v in before.items()}
    out = balancer.weighting.combine_matrix(np.full((2, 10), np.nan), [1.0, 2.0], np.ones(2, bool), 1)
    assert np.all(np.isnan(out))  # passed on, so that the guard sees it
    balancer.restore(before)
    assert all(np.array_equal(balancer.weighting.state_dict()[k], kept[k]) for k in kept)


def test_a_non_finite_gram_matrix_reaches_the_guard():
    """The balancer does not hand a non-finite Gram matrix to the strategy (which would refuse it): alpha is NaN,
    the shared gradient non-finite, and the trainer's guard skips or stops the step."""
    from mtl.train.balancing import TaskBalancer

    balancer = TaskBalancer(make("gradvac", 2), None, _TwoTaskModel())
    before = balancer.weighting.state_dict()
    alpha = balancer.combine(np.array([[1.0, np.inf], [np.inf, 1.0]]), np.ones(2), np.ones(2, bool), 0)
    assert np.all(np.isnan(alpha)) and np.array_equal(balancer.weighting.state_dict()["targets"], before["targets"])


# ---- training: 1 vs 2 processes, stopped and resumed -------------------------------------------------------------
SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "weighting_more.py")
STEPS = 12  # a resume is exact or not at 12 steps as at 20; 1 vs 2 processes differ from step 1 if they differ
UNTIL = 6  # the resumed runs stop after this step
TWO_STEPS = 6  # the 2-process runs: the first 6 steps of the 1-process runs (constant lr; every strategy's phases)


def records(out, name):
    """The per-step records of one run's metrics.jsonl."""
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    """Every configuration of weighting_more.py trained once, uninterrupted, at 1 process (in this process)."""
    out = str(tmp_path_factory.mktemp("weighting_more") / "one")
    weighting_more.main(out, STEPS)
    return out


@two_process_run("weighting_more")
def _two_processes(folder):
    return {"call": [SCRIPT, "main", str(folder), str(TWO_STEPS)]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("weighting_more")
def test_new_strategies_agree_between_one_and_two_processes(single_runs, two_process):
    """The same per-step losses and weights to 1e-4 (float32 sums in another order are all that differs); the
    gradient-matrix strategies get the matrix summed over both processes, so they agree too."""
    two = two_process["weighting_more"]
    worst = {}
    for name in MORE_RUNS:
        a, b = records(single_runs, name)[:TWO_STEPS], records(two, name)
        assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, TWO_STEPS + 1)), name
        keys = [k for k in a[0] if k.startswith(("loss/", "weight/"))]
        assert len([k for k in keys if k.startswith("weight/")]) == 3, name
        worst[name] = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-6) for ra, rb in zip(a, b) for k in keys)
    assert max(worst.values()) <= 1e-4, worst


@pytest.mark.slow  # every configuration trained STEPS steps, then again stopped at UNTIL and resumed
def test_stopped_and_resumed_runs_are_bit_identical(single_runs, tmp_path):
    """Every configuration stopped after step UNTIL (a real checkpoint, the strategy's state in its state.json) and
    resumed in fresh Trainers gives the uninterrupted run's losses, weights and alphas bit for bit."""
    out = str(tmp_path / "resumed")
    weighting_more.main(out, STEPS, UNTIL)
    for name in MORE_RUNS:
        a, b = records(single_runs, name), records(out, name)
        assert [r["step"] for r in b] == list(range(1, STEPS + 1)), name
        mismatches = [(ra["step"], key) for ra, rb in zip(a, b) for key, value in ra.items()
                      if key.startswith(("loss", "weight/", "alpha/")) and rb.get(key) != value]
        assert not mismatches, (name, mismatches[:5])
