"""Scheduler: exact joint sizes (largest remainder against an independent computation) and drawn proportions."""
import numpy as np
import pytest

from mtl.data.scheduler import JointSchedule, SampleSchedule, largest_remainder, sampling_probabilities


def reference_largest_remainder(total, weights):
    """Hamilton's method written out with fractions, for comparison."""
    from fractions import Fraction

    s = sum(Fraction(w).limit_denominator(10**9) for w in weights)
    quotas = [Fraction(total) * Fraction(w).limit_denominator(10**9) / s for w in weights]
    floors = [q.numerator // q.denominator for q in quotas]
    left = total - sum(floors)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    return floors


@pytest.mark.parametrize("total,weights", [(10, [1, 1, 1]), (64, [1, 1, 0.5]), (100, [3, 2, 5]), (7, [0.1, 0.2, 0.7]),
                                           (33, [1, 2, 3, 4, 5]), (256, [0.33, 0.33, 0.34])])
def test_largest_remainder_matches_hamilton(total, weights):
    got = largest_remainder(total, weights)
    assert got == reference_largest_remainder(total, weights)
    assert sum(got) == total


def test_every_task_gets_at_least_one():
    sizes = largest_remainder(5, [100, 1, 1])
    assert sizes == [3, 1, 1]
    with pytest.raises(ValueError):
        largest_remainder(2, [1, 1, 1])


def test_joint_plan_is_constant_and_pure():
    s = JointSchedule(["a", "b", "c"], [1, 1, 0.5], 64, seed=3)
    assert s.plan(0) == {"a": 26, "b": 25, "c": 13}
    assert s.plan(12345) == s.plan(0)
    assert s.consumed("c", 10) == 130


@pytest.mark.parametrize("strategy", ["ratio", "proportional", "temperature", "uniform"])
def test_sample_proportions(strategy):
    ratios, sizes = [1.0, 2.0, 5.0], [100, 400, 1600]
    p = sampling_probabilities(strategy, ratios, sizes, temperature=2.0)
    expected = {"ratio": np.array(ratios) / 8, "proportional": np.array(sizes) / 2100,
                "temperature": np.sqrt(sizes) / np.sqrt(sizes).sum(), "uniform": np.ones(3) / 3}[strategy]
    np.testing.assert_allclose(p, expected)
    s = SampleSchedule(["a", "b", "c"], p, 16, seed=7)
    n = 20000
    draws = np.array([s.tasks.index(next(iter(s.plan(k)))) for k in range(n)])
    freq = np.bincount(draws, minlength=3) / n
    # 5 standard deviations of a binomial proportion
    assert np.all(np.abs(freq - expected) < 5 * np.sqrt(expected * (1 - expected) / n))


def test_sample_is_pure_and_consumed_counts_draws():
    p = [0.2, 0.8]
    a = SampleSchedule(["x", "y"], p, 8, seed=11)
    b = SampleSchedule(["x", "y"], p, 8, seed=11)
    assert [a.plan(k) for k in range(50)] == [b.plan(k) for k in reversed(range(50))][::-1]
    draws = [next(iter(a.plan(k))) for k in range(5000)]
    assert a.consumed("x", 5000) == 8 * draws.count("x")
    assert a.consumed("y", 1234) == 8 * draws[:1234].count("y")
    c = SampleSchedule(["x", "y"], p, 8, seed=12)
    assert [c.plan(k) for k in range(50)] != [a.plan(k) for k in range(50)]
