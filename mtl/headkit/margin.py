"""ArcFace-family additive/multiplicative angular margin as a function of cos(theta), with its exact derivative.

Target logit (before the scale ``s``): ``psi(theta) - m3`` with ``phi = m1 * theta + m2`` and ``theta = acos(cos)``:

* ArcFace ``(1, m, 0)``, CosFace ``(1, 0, m)``, SphereFace-like ``m1 > 1`` and their combinations.
* Where ``phi <= pi``: ``psi = cos(phi)``, the textbook formula.
* Fallback where ``phi > pi`` (``cos(phi)`` would rise again with theta, rewarding a worse angle): SphereFace's
  (Liu et al. 2017) monotone continuation ``psi = (-1)**k * cos(phi) - 2k`` with ``k = floor(phi / pi)``.
  It equals ``cos(phi)`` for ``k = 0``, is continuous at every ``phi = k*pi`` (both sides give ``1 - 2k``),
  has a continuous derivative there (zero on both sides), and decreases in theta everywhere:
  ``d psi / d phi = -|sin(phi)|``. (insightface's ``cos(theta) - m*sin(m)`` jumps at ``theta = pi - m``;
  Paddle's fused ``margin_cross_entropy`` has no fallback.) This needs ``m2 >= 0`` so that ``k >= 0``.

Derivative with respect to the cosine: ``d psi / d cos = m1 * |sin(phi)| / sin(theta)``. The cosine is clipped to
[-1, 1] (the derivative at the boundary is passed through for inputs outside it, which only rounding produces) and
``sin(theta)`` is floored at ``MIN_SIN_THETA`` so the derivative stays finite at ``cos = +-1``; in float32 the
nearest cosine below 1 already has ``sin(theta) ~ 3.5e-4``, so the floor only acts at exactly +-1. The gradient
that reaches the features stays bounded: ``d cos / d x`` vanishes like ``sin(theta)`` at the poles.
"""
import functools
import math

import paddle

from mtl.core.errors import ParameterError

MIN_SIN_THETA = 1e-4


def margin_value_and_slope(cos: paddle.Tensor, m1: float, m2: float, m3: float):
    """``(psi(m1 * acos(c) + m2) - m3, d/dc of it)`` without autograd; see the module docstring."""
    if m1 == 1.0 and m2 == 0.0:  # CosFace: cos - m3, slope 1
        return cos - m3, paddle.ones_like(cos)
    c = paddle.clip(cos, -1.0, 1.0)
    theta = paddle.acos(c)
    phi = m1 * theta + m2
    k = paddle.floor(phi / math.pi)
    sign = 1.0 - 2.0 * paddle.remainder(k, paddle.full_like(k, 2.0))  # (-1)**k
    value = sign * paddle.cos(phi) - 2.0 * k - m3
    # d psi / d cos = (-1)**k * (-sin(phi)) * m1 * d theta / d cos = m1 * (-1)**k * sin(phi) / sin(theta)
    slope = m1 * sign * paddle.sin(phi) / paddle.clip(paddle.sin(theta), min=MIN_SIN_THETA)
    return value, slope


def check_margin(margin):
    """Validate ``[m1, m2, m3]``: three numbers, ``m1 > 0`` and ``m2 >= 0``; return them as floats."""
    try:
        m1, m2, m3 = (float(v) for v in margin)
    except (TypeError, ValueError):
        raise ParameterError(f"margin must be three numbers [m1, m2, m3], got {margin!r}") from None
    if not m1 > 0:
        raise ParameterError(f"margin m1 (multiplicative) must be > 0, got {m1}")
    if m2 < 0:
        raise ParameterError(f"margin m2 (additive angular) must be >= 0, got {m2}")
    return m1, m2, m3


def margin_transform(m1: float = 1.0, m2: float = 0.5, m3: float = 0.0):
    """The margin as a ``target_transform`` for ``mtl.headkit.chunked_softmax.chunked_margin_softmax``."""
    m1, m2, m3 = check_margin([m1, m2, m3])
    return functools.partial(margin_value_and_slope, m1=m1, m2=m2, m3=m3)
