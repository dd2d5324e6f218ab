"""The margin head written out in float64 numpy (ArcFace / CosFace / combined margins, the SphereFace-like fallback
past pi), its gradients by hand, and a small driver that runs one of our margin heads forward and backward: the
reference of tests/test_margin_heads.py, tests/test_margin_speed.py, tests/test_interclass_filtering.py and
tests/test_sharded_heads.py."""
import numpy as np
import paddle

from mtl.headkit.margin import MIN_SIN_THETA

MARGINS = {
    "arcface": (1.0, 0.5, 0.0),
    "cosface": (1.0, 0.0, 0.35),
    "combined": (1.2, 0.3, 0.2),
    "sphere_fallback": (2.0, 0.3, 0.1),
}


def np_psi(c, m1, m2, m3):
    """cos(m1*theta + m2) - m3, continued past pi as (-1)^k cos(phi) - 2k (SphereFace)."""
    theta = np.arccos(np.clip(c, -1, 1))
    phi = m1 * theta + m2
    k = np.floor(phi / np.pi)
    return np.where(phi <= np.pi, np.cos(phi), (-1.0) ** k * np.cos(phi) - 2 * k) - m3


def np_dpsi(c, m1, m2, m3):
    """d psi / d cos = m1 |sin(phi)| / sin(theta) (1 for CosFace)."""
    if m1 == 1.0 and m2 == 0.0:
        return np.ones_like(c)
    theta = np.arccos(np.clip(c, -1, 1))
    return m1 * np.abs(np.sin(m1 * theta + m2)) / np.maximum(np.sin(theta), MIN_SIN_THETA)


def np_ce(z, labels):
    """Mean softmax cross-entropy and its gradient with respect to the logits."""
    n = len(labels)
    zmax = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - zmax).sum(axis=1)) + zmax[:, 0]
    loss = np.mean(lse - z[np.arange(n), labels])
    grad = np.exp(z - lse[:, None])
    grad[np.arange(n), labels] -= 1.0
    return loss, grad / n


def np_margin_head(x, w, labels, margin, scale):
    """Loss and gradients (features, centres) of the margin head; ``labels`` index the rows of ``w``."""
    n = len(labels)
    xn, wn = np.linalg.norm(x, axis=1, keepdims=True), np.linalg.norm(w, axis=1, keepdims=True)
    xh, wh = x / xn, w / wn
    c = xh @ wh.T
    z = scale * c
    rows = np.arange(n)
    z[rows, labels] = scale * np_psi(c[rows, labels], *margin)
    loss, dz = np_ce(z, labels)
    dc = scale * dz
    dc[rows, labels] *= np_dpsi(c[rows, labels], *margin)
    dxh, dwh = dc @ wh, dc.T @ xh
    dx = (dxh - xh * (xh * dxh).sum(1, keepdims=True)) / xn
    dw = (dwh - wh * (wh * dwh).sum(1, keepdims=True)) / wn
    return loss, dx, dw, c


def run_head(head, x, y, step=0):
    """One forward and backward of a margin head (``arcface`` / ``cosface``) on ``(x, y)`` at training step ``step``
    (Partial FC's sample): (its output, the feature
    gradient, the dense class-centre gradient of :meth:`weight_gradient`, which covers Partial FC's sampled rows)."""
    feats = paddle.to_tensor(x.astype(paddle.get_default_dtype()), stop_gradient=False)
    out = head(feats, paddle.to_tensor(y), step)
    out.loss.backward()
    return out, feats.grad.numpy(), head.weight_gradient(out)


def assert_close(actual, expected, rtol, what):
    """The largest difference relative to the largest reference value is at most ``rtol``."""
    err = np.max(np.abs(actual - expected))
    rel = err / max(np.max(np.abs(expected)), 1e-30)
    assert rel <= rtol, f"{what}: max abs diff {err:.3e}, rel {rel:.3e} > {rtol}"
