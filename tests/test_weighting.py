"""Task-weighting strategies against independent numpy references of their papers' formulas.

Gradient methods get random per-task gradient VECTORS with conflicts; the references work on the vectors
(explicit projections, scipy on the simplex, closed forms for two tasks) and we compare sum_t alpha_t g_t.
Loss-based methods are replayed step by step with hand-written formula loops.
"""
import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

from mtl.core import registry
from mtl.core.errors import ConfigError

registry.load_builtin()

NAMES = ["static", "uncertainty", "dwa", "rlw", "famo", "gradnorm", "pcgrad", "cagrad", "mgda"]
GRADIENT_NAMES = ["gradnorm", "pcgrad", "cagrad", "mgda"]


def make(name, num_tasks, loss_weights=None, seed=0, **params):
    """Build a strategy through the registry, as the trainer will."""
    weights = np.ones(num_tasks) if loss_weights is None else np.asarray(loss_weights, dtype=float)
    tasks = [f"task{t}" for t in range(num_tasks)]
    return registry.build("weighting", {"type": name, **params}, tasks=tasks, loss_weights=weights, seed=seed)


def conflicting(rng, num_tasks, size=50):
    """Random gradients where task 1 conflicts with task 0 (and the rest are random)."""
    g = rng.standard_normal((num_tasks, size))
    g[1] = -0.7 * g[0] + 0.5 * g[1]
    return g


def combined(strategy, g, losses=None, present=None, step=0):
    """sum_t alpha_t g_t as the trainer applies it (absent rows are zero in the Gram matrix)."""
    num_tasks = g.shape[0]
    present = np.ones(num_tasks, bool) if present is None else np.asarray(present)
    losses = np.where(present, 1.0 if losses is None else losses, np.nan)
    alpha = strategy.combine(g @ g.T * np.outer(present, present), losses, present, step)
    assert np.all(np.isfinite(alpha)) and np.all(alpha[~present] == 0)
    return alpha @ g


def all_present(num_tasks):
    """Every task present."""
    return np.ones(num_tasks, bool)


# ---- registry -----------------------------------------------------------------------------------------------------
def test_every_strategy_is_registered_with_capabilities():
    entries = {e.name: e for e in registry.entries("weighting")}
    assert set(NAMES) <= set(entries)
    for name in NAMES:
        assert entries[name].description, name
        strategy = make(name, 3)
        assert strategy.needs_gradients == (name in GRADIENT_NAMES)
    assert {n for n in NAMES if make(n, 2).sample_mode} == {"static", "uncertainty", "rlw"}
    assert make("mgda", 2, representation=True).uses_representation
    assert not make("mgda", 2).uses_representation and not make("pcgrad", 2).uses_representation


def test_unknown_and_bad_parameters_are_refused():
    with pytest.raises(ConfigError, match="weighting 'dwa' has no parameter 'temprature'.*did you mean 'temperature'"):
        make("dwa", 2, temprature=1.0)
    with pytest.raises(ConfigError, match="unknown weighting 'pcgard'.*did you mean 'pcgrad'"):
        registry.build("weighting", {"type": "pcgard"}, tasks=["a"], loss_weights=np.ones(1))
    bad = [("uncertainty", {"lr": 0}), ("dwa", {"temperature": -1}), ("dwa", {"window": 0}),
           ("famo", {"gamma": -0.1}), ("famo", {"min_losses": [0, 1, 2]}), ("gradnorm", {"alpha": "x"}),
           ("cagrad", {"c": -1}), ("mgda", {"normalization": "l1"}), ("mgda", {"representation": "yes"})]
    for name, params in bad:
        key = next(iter(params))
        with pytest.raises(ConfigError, match=f"weighting '{name}': parameter '{key}' must be"):
            make(name, 2, **params)


def test_bad_inputs_and_foreign_state_are_refused():
    strategy = make("uncertainty", 2)
    with pytest.raises(ValueError, match="loss of task 'task1' is not finite"):
        strategy.weights([1.0, np.nan], [True, True], 0)
    with pytest.raises(ValueError, match="length 2"):
        strategy.weights([1.0], [True], 0)
    with pytest.raises(ConfigError, match="saved state holds"):
        strategy.set_state_dict(make("famo", 2).state_dict())
    with pytest.raises(ConfigError, match="shape"):
        strategy.set_state_dict(make("uncertainty", 3).state_dict())


# ---- PCGrad -------------------------------------------------------------------------------------------------------
def pcgrad_reference(g, present, seed, step):
    """Yu et al. 2020 Algorithm 1 on the vectors, with the documented order draw (one permutation per task i)."""
    rng = np.random.default_rng([seed, step, 0x9C6])
    orders = [rng.permutation(g.shape[0]) for _ in range(g.shape[0])]
    total = np.zeros(g.shape[1])
    for i in np.flatnonzero(present):
        projected = g[i].copy()
        for j in orders[i]:
            if j != i and present[j] and projected @ g[j] < 0:
                projected = projected - (projected @ g[j]) / (g[j] @ g[j]) * g[j]
        total += projected
    return total


@pytest.mark.parametrize("num_tasks", [2, 3, 4])
def test_pcgrad_matches_explicit_projections(num_tasks):
    rng = np.random.default_rng(num_tasks)
    strategy = make("pcgrad", num_tasks, seed=7)
    for step in range(5):
        g = conflicting(rng, num_tasks)
        np.testing.assert_allclose(combined(strategy, g, step=step), pcgrad_reference(g, all_present(num_tasks), 7,
                                                                                       step), rtol=1e-12, atol=1e-12)


def test_pcgrad_order_matters_and_degenerate_cases():
    rng = np.random.default_rng(3)
    g = conflicting(rng, 4)
    g[2] = -0.6 * g[0] - 0.6 * g[1] + 0.2 * g[2]  # many conflicts: the order of projections changes the result
    results = {tuple(np.round(combined(make("pcgrad", 4, seed=s), g), 9)) for s in range(8)}
    assert len(results) > 1
    one = rng.standard_normal(50)
    pc = make("pcgrad", 2)
    np.testing.assert_allclose(combined(pc, np.stack([one, -one])), 0.0, atol=1e-12)  # opposite: both cancel
    np.testing.assert_allclose(combined(pc, np.stack([one, one])), 2 * one, rtol=1e-14)  # identical: no conflict
    np.testing.assert_allclose(combined(pc, np.stack([one, 0 * one])), one, rtol=1e-14)  # zero gradient
    np.testing.assert_allclose(combined(make("pcgrad", 1), one[None]), one, rtol=1e-14)  # one task
    present = np.array([True, False, True])
    g = conflicting(rng, 3)
    np.testing.assert_allclose(combined(make("pcgrad", 3), g, present=present),
                               pcgrad_reference(g, present, 0, 0), rtol=1e-12)


# ---- CAGrad -------------------------------------------------------------------------------------------------------
def cagrad_reference(g, c=0.4):
    """Liu et al. 2021 on the vectors: the dual by scipy (bounded scalar search for 2 tasks, SLSQP else)."""
    g0 = g.mean(axis=0)
    radius = c * np.linalg.norm(g0)

    def dual(w):
        gw = w @ g
        return gw @ g0 + radius * np.linalg.norm(gw)

    if g.shape[0] == 2:
        s = minimize_scalar(lambda s: dual(np.array([s, 1 - s])), bounds=(0, 1), method="bounded",
                            options={"xatol": 1e-13}).x
        w = np.array([s, 1 - s])
    else:
        starts = [np.full(g.shape[0], 1 / g.shape[0])] + list(0.1 + 0.8 * np.eye(g.shape[0]))
        runs = [minimize(dual, x / x.sum(), method="SLSQP", bounds=[(0, 1)] * g.shape[0], options={"ftol": 1e-16,
                "maxiter": 2000}, constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}]) for x in starts]
        w = min(runs, key=lambda r: r.fun).x
    gw = w @ g
    return (g0 + radius / np.linalg.norm(gw) * gw) / (1 + c * c)


@pytest.mark.parametrize("num_tasks", [2, 3, 4])
def test_cagrad_matches_a_generic_solver(num_tasks):
    rng = np.random.default_rng(10 + num_tasks)
    for c in (0.4, 0.9):
        strategy = make("cagrad", num_tasks, c=c)
        for _ in range(4):
            g = conflicting(rng, num_tasks)
            reference = cagrad_reference(g, c)
            # two tasks: a 1-d search to 1e-13; more: SLSQP's own accuracy (measured ~1e-8 relative) limits the check
            tolerance = 1e-7 if num_tasks == 2 else 1e-6
            scale = np.abs(reference).max()
            np.testing.assert_allclose(combined(strategy, g), reference, rtol=0, atol=tolerance * scale)


def test_cagrad_degenerate_cases():
    one = np.random.default_rng(5).standard_normal(50)
    c = 0.4
    strategy = make("cagrad", 2, c=c)
    expected = (1 + c) * one / (1 + c * c)  # g0 = g_w = g: d = g + c ||g|| g / ||g||
    np.testing.assert_allclose(combined(strategy, np.stack([one, one])), expected, rtol=1e-12)
    np.testing.assert_allclose(combined(make("cagrad", 1, c=c), one[None]), expected, rtol=1e-12)
    np.testing.assert_allclose(combined(strategy, np.stack([one, -one])), 0.0, atol=1e-14)  # g0 = 0
    zero = np.stack([one, 0 * one])  # the dual's optimum is the zero gradient: d = g0
    np.testing.assert_allclose(combined(strategy, zero), one / 2 / (1 + c * c), rtol=1e-12)
    np.testing.assert_allclose(combined(make("cagrad", 2, c=0.0), np.stack([one, -0.5 * one])), 0.25 * one,
                               rtol=1e-14)  # c = 0: the mean gradient
    rng = np.random.default_rng(6)
    g = conflicting(rng, 3)
    present = np.array([True, False, True])
    np.testing.assert_allclose(combined(make("cagrad", 3, c=c), g, present=present),
                               cagrad_reference(g[present], c), rtol=1e-6)


# ---- MGDA ---------------------------------------------------------------------------------------------------------
def min_norm_reference(g):
    """Min-norm point of conv{g_t}: closed form for two vectors, SLSQP on the simplex otherwise."""
    if g.shape[0] == 2:
        gamma = np.clip((g[1] - g[0]) @ g[1] / max((g[0] - g[1]) @ (g[0] - g[1]), 1e-300), 0, 1)
        return np.array([gamma, 1 - gamma])
    run = minimize(lambda w: (w @ g) @ (w @ g), np.full(g.shape[0], 1 / g.shape[0]), method="SLSQP",
                   bounds=[(0, 1)] * g.shape[0], constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
                   options={"ftol": 1e-16, "maxiter": 2000})
    return run.x


@pytest.mark.parametrize("num_tasks", [2, 3, 4])
@pytest.mark.parametrize("normalization", ["none", "l2", "loss", "loss+"])
def test_mgda_matches_the_min_norm_point(num_tasks, normalization):
    rng = np.random.default_rng(20 + num_tasks)
    strategy = make("mgda", num_tasks, normalization=normalization)
    for _ in range(3):
        g = conflicting(rng, num_tasks) * rng.uniform(0.5, 3.0, size=(num_tasks, 1))
        losses = rng.uniform(0.2, 3.0, size=num_tasks)
        norms = np.linalg.norm(g, axis=1)
        n = {"none": np.ones(num_tasks), "l2": norms, "loss": losses, "loss+": losses * norms}[normalization]
        normalised = g / n[:, None]
        expected = min_norm_reference(normalised) @ normalised
        tolerance = 1e-12 if num_tasks == 2 else 1e-6  # Wolfe is exact; SLSQP's own accuracy ~1e-8
        np.testing.assert_allclose(combined(strategy, g, losses), expected, rtol=0,
                                   atol=tolerance * np.abs(expected).max())


def test_mgda_default_settings_and_degenerate_cases():
    rng = np.random.default_rng(30)
    g = conflicting(rng, 3)
    alpha = make("mgda", 3).combine(g @ g.T, np.ones(3), all_present(3), 0)
    reference = min_norm_reference(g)
    assert abs(np.linalg.norm(alpha @ g) - np.linalg.norm(reference @ g)) < 1e-3 * np.linalg.norm(g, axis=1).max()
    one = rng.standard_normal(50)
    strategy = make("mgda", 2, normalization="l2")
    unit = one / np.linalg.norm(one)
    np.testing.assert_allclose(combined(strategy, np.stack([one, 2 * one])), unit, rtol=1e-14)  # identical directions
    np.testing.assert_allclose(combined(strategy, np.stack([one, -3 * one])), 0.0, atol=1e-14)  # normalised: 1/2 each
    np.testing.assert_allclose(combined(strategy, np.stack([one, 0 * one])), 0.0, atol=1e-14)  # zero: Pareto stationary
    np.testing.assert_allclose(combined(make("mgda", 1), one[None]), one, rtol=1e-14)
    present = np.array([False, True, True])
    np.testing.assert_allclose(combined(make("mgda", 3), g, present=present),
                               min_norm_reference(g[present]) @ g[present], rtol=1e-12)


# ---- GradNorm -----------------------------------------------------------------------------------------------------
def test_gradnorm_weight_trajectory_matches_the_paper_formulas():
    rng = np.random.default_rng(40)
    num_tasks, alpha, lr = 3, 1.5, 0.05
    strategy = make("gradnorm", num_tasks, loss_weights=[1.0, 0.5, 2.0], alpha=alpha, lr=lr)
    w, initial = np.ones(num_tasks), None
    for step in range(25):
        g = conflicting(rng, num_tasks) * np.array([[1.0], [3.0], [0.3]])
        losses = rng.uniform(0.5, 2.0, num_tasks) * np.exp(-0.05 * step * np.arange(1, num_tasks + 1))
        np.testing.assert_allclose(strategy.weights(losses, all_present(num_tasks), step), [1.0, 0.5, 2.0] * w,
                                   rtol=1e-13)
        np.testing.assert_allclose(combined(strategy, g, losses, step=step), w @ g, rtol=1e-13, atol=1e-13)
        initial = losses if initial is None else initial
        norms = np.linalg.norm(g, axis=1)  # ||grad of loss_weight_t L_t||
        grad_norm = w * norms
        rate = (losses / initial) / np.mean(losses / initial)
        target = grad_norm.mean() * rate ** alpha
        w = np.maximum(w - lr * np.sign(grad_norm - target) * norms, 1e-6)
        w = num_tasks * w / w.sum()
    assert np.ptp(w) > 0.1  # the weights did move


def test_gradnorm_degenerate_cases():
    one = np.random.default_rng(41).standard_normal(50)
    strategy = make("gradnorm", 1)
    for step in range(3):
        np.testing.assert_allclose(combined(strategy, one[None], [2.0 - step], step=step), one, rtol=1e-15)
    strategy = make("gradnorm", 3, lr=10.0)  # a huge step: weights stay positive and sum to T
    present = np.array([True, True, False])
    for step in range(4):
        combined(strategy, np.stack([one, 0 * one, one]), [1.0, 0.5 + step, np.nan], present, step)
        w = strategy.state_dict()["task_weights"]
        assert np.all(w > 0) and abs(w.sum() - 3) < 1e-12


# ---- loss-based ---------------------------------------------------------------------------------------------------
def loss_sequence(rng, num_tasks, steps, sample=False):
    """(losses with NaN where absent, present) per step; ``sample``: one task per step."""
    for step in range(steps):
        present = np.zeros(num_tasks, bool)
        if sample:
            present[rng.integers(num_tasks)] = True
        else:
            present[:] = True
        losses = rng.uniform(0.2, 3.0, num_tasks) * np.exp(-0.03 * step)
        yield step, np.where(present, losses, np.nan), present


@pytest.mark.parametrize("sample", [False, True])
def test_uncertainty_log_variance_trajectory(sample):
    rng = np.random.default_rng(50)
    loss_weights, lr = np.array([1.0, 0.5, 2.0]), 0.1
    strategy = make("uncertainty", 3, loss_weights=loss_weights, lr=lr)
    s = [0.0, 0.0, 0.0]
    for step, losses, present in loss_sequence(rng, 3, 40, sample):
        expected = [loss_weights[t] * np.exp(-s[t]) if present[t] else 0.0 for t in range(3)]
        np.testing.assert_allclose(strategy.weights(losses, present, step), expected, rtol=1e-14)
        for t in np.flatnonzero(present):
            s[t] = s[t] - lr * (1.0 - np.exp(-s[t]) * losses[t])  # d/ds [exp(-s) L + s]
    np.testing.assert_allclose(strategy.state_dict()["log_variance"], s, rtol=1e-14)
    constant = make("uncertainty", 2, lr=0.2)
    for step in range(400):
        constant.weights([4.0, 0.25], [True, True], step)
    np.testing.assert_allclose(constant.weights([4.0, 0.25], [True, True], 400), [0.25, 4.0], rtol=1e-6)  # 1 / L


def dwa_reference(history, step, window, temperature):
    """Liu et al. 2019: T softmax(r / temperature), r = mean loss of window k-1 over that of window k-2."""
    k = step // window
    if k < 2:
        return np.ones(history.shape[1])
    previous, before = (history[j * window:(j + 1) * window].mean(axis=0) for j in (k - 1, k - 2))
    e = np.exp(previous / before / temperature)
    return history.shape[1] * e / e.sum()


@pytest.mark.parametrize("window", [1, 3])
def test_dwa_windows_and_first_steps(window):
    rng = np.random.default_rng(60 + window)
    loss_weights = np.array([1.0, 0.5, 2.0, 1.0])
    strategy = make("dwa", 4, loss_weights=loss_weights, temperature=0.5, window=window)
    history = rng.uniform(0.2, 3.0, (7 * window, 4))
    for step, losses in enumerate(history):
        got = strategy.weights(losses, all_present(4), step)
        np.testing.assert_allclose(got, loss_weights * dwa_reference(history, step, window, 0.5), rtol=1e-13)
        if step < 2 * window:
            assert np.array_equal(got, loss_weights)
    assert not np.allclose(got, loss_weights)


def test_rlw_draws_from_seed_and_step():
    loss_weights = np.array([1.0, 2.0, 0.5])
    strategy = make("rlw", 3, loss_weights=loss_weights, seed=11)
    draws = []
    for step in range(5):
        z = np.random.default_rng([11, step, 0x5217]).standard_normal(3)
        got = strategy.weights([1.0, 1.0, 1.0], all_present(3), step)
        np.testing.assert_allclose(got, loss_weights * np.exp(z) / np.exp(z).sum(), rtol=1e-14)
        draws.append(got)
    assert len({tuple(d) for d in draws}) == 5  # differs by step
    again = make("rlw", 3, loss_weights=loss_weights, seed=11)
    assert np.array_equal(again.weights([1.0, 1.0, 1.0], all_present(3), 3), draws[3])  # repeats for (seed, step)
    assert not np.array_equal(make("rlw", 3, loss_weights=loss_weights, seed=12).weights(
        [1.0, 1.0, 1.0], all_present(3), 3), draws[3])
    present = np.array([True, False, True])
    z = np.random.default_rng([11, 3, 0x5217]).standard_normal(3)[[0, 2]]
    got = strategy.weights([1.0, np.nan, 1.0], present, 3)
    np.testing.assert_allclose(got, [1.0, 0.0, 0.5] * np.insert(np.exp(z) / np.exp(z).sum(), 1, 0.0), rtol=1e-14)
    assert np.array_equal(make("rlw", 3).weights([np.nan, 2.0, np.nan], [False, True, False], 9), [0, 1, 0])


def test_famo_logit_trajectory():
    rng = np.random.default_rng(70)
    loss_weights, minimum = np.array([1.0, 0.5, 2.0]), np.array([0.0, 0.1, 0.05])
    w_lr, gamma = 0.5, 0.01
    strategy = make("famo", 3, loss_weights=loss_weights, w_lr=w_lr, gamma=gamma, min_losses=minimum.tolist())
    xi, previous = np.zeros(3), None
    for step in range(30):
        losses = minimum + rng.uniform(0.1, 2.0, 3) * np.exp(-np.array([0.01, 0.05, 0.1]) * step)
        shifted = losses - minimum + 1e-8
        if previous is not None:
            z = np.exp(xi) / np.exp(xi).sum()
            jacobian = np.diag(z) - np.outer(z, z)  # dz / dxi
            xi = xi - w_lr * (jacobian.T @ (np.log(previous) - np.log(shifted)) + gamma * xi)
        z = np.exp(xi) / np.exp(xi).sum()
        c = 1.0 / np.sum(z / shifted)
        np.testing.assert_allclose(strategy.weights(losses, all_present(3), step), loss_weights * c * z / shifted,
                                   rtol=1e-12)
        np.testing.assert_allclose(strategy.state_dict()["logits"], xi, rtol=1e-12, atol=1e-15)
        previous = shifted
    assert np.ptp(xi) > 0.05


@pytest.mark.parametrize("name", NAMES)
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
            assert np.all(np.isfinite(combined(strategy, g, np.where(present, losses, 1.0), present, step)))
    single = make(name, 1, loss_weights=[0.5])
    for step in range(3):
        assert np.isfinite(single.weights([1.0 + step], [True], step)).all()


# ---- state round trip ---------------------------------------------------------------------------------------------
def run_steps(strategy, steps, seed=90):
    """Weights (and alphas) of ``steps`` consecutive steps on a reproducible input stream."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps.stop):
        g = conflicting(rng, 3)
        losses = rng.uniform(0.2, 3.0, 3) * np.exp(-0.05 * step)
        if step < steps.start:
            continue
        out.append(strategy.weights(losses, all_present(3), step))
        if strategy.needs_gradients:
            out.append(strategy.combine(g @ g.T, losses, all_present(3), step))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip_is_bit_identical(name):
    params = {"dwa": {"window": 2}, "famo": {"w_lr": 0.5}, "uncertainty": {"lr": 0.1}}.get(name, {})
    uninterrupted = make(name, 3, seed=5, **params)
    expected = run_steps(uninterrupted, range(0, 12))
    first = make(name, 3, seed=5, **params)
    run_steps(first, range(0, 7))
    saved = first.state_dict()
    run_steps(first, range(7, 9))  # the saved copy must not follow the live state
    resumed = make(name, 3, seed=5, **params)
    resumed.set_state_dict(saved)
    got = run_steps(resumed, range(7, 12))
    tail = expected[-len(got):]
    assert all(np.array_equal(a, b) for a, b in zip(got, tail))
    final, reference = resumed.state_dict(), uninterrupted.state_dict()
    assert final.keys() == reference.keys()
    assert all(np.array_equal(final[k], reference[k], equal_nan=True) for k in final)


@pytest.mark.parametrize("name, sign, key", [("uncertainty", -1.0, "log_variance"), ("imtl_l", 1.0, "log_scale")])
def test_one_huge_loss_does_not_zero_a_task_for_thousands_of_steps(name, sign, key):
    """A loss of 5e4 once (lr 0.01): the paper's update would move s_t by 500 (weight exp(-500) = 0, back after
    about 50,000 steps); clipped to max_step 1 per step and |s_t| <= bound 10, the task keeps a weight of exp(-1)
    of its own and is back within 10 % of it after 300 steps. Ordinary steps stay the paper's update exactly."""
    strategy = make(name, 2, lr=0.01)
    s = np.zeros(2)
    for step in range(20):  # ordinary losses: lr * |gradient| < 1, the unclipped update
        losses = np.array([1.5, 0.7])
        np.testing.assert_allclose(strategy.weights(losses, [True, True], step), np.exp(sign * s), rtol=1e-14)
        s = s - 0.01 * sign * (np.exp(sign * s) * losses - 1.0)
    np.testing.assert_allclose(strategy.state_dict()[key], s, rtol=1e-14)
    before = strategy.weights([1.0, 1.0], [True, True], 20)[0]
    spiked = strategy.weights([5e4, 1.0], [True, True], 21)  # the step with the huge loss takes its weight first
    after = strategy.weights([1.0, 1.0], [True, True], 22)[0]
    assert abs(strategy.state_dict()[key][0] - s[0]) <= 1.0 + 0.02 and after >= np.exp(-1.0) * before * 0.97
    assert spiked[0] > 0
    for step in range(23, 23 + 300):
        weight = strategy.weights([1.0, 1.0], [True, True], step)[0]
    assert abs(weight - before) < 0.1 * before, (weight, before)
    bounded = make(name, 1, lr=1.0)
    for step in range(50):
        bounded.weights([1e-12 if sign < 0 else 1e12], [True], step)
    assert abs(bounded.state_dict()[key][0]) <= 10.0
