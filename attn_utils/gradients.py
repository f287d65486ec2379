"""Derivatives used to check the hand-derived gradients of the book.

* :func:`numerical_jacobian` — central finite differences, the independent check
  that sits beside ``autograd`` for every hand-derived gradient;
* :func:`softmax_jacobian_from_logits` — ``diag(p) − p pᵀ`` computed from the logits,
  so that its diagonal ``p_i (1 − p_i)`` stays accurate when ``p_i`` is within
  rounding of 1 (where :func:`attn_utils.softmax_jacobian`, which only sees ``p``,
  must return 0).
"""

from __future__ import annotations

import numpy as np

from .validation import as_float_array, positive_scalar


def numerical_jacobian(f, x, h: float = 1e-6) -> np.ndarray:
    """Central-difference Jacobian of ``f`` at ``x``.

    Parameters
    ----------
    f : callable
        Maps an array of shape ``x.shape`` to an array of a fixed shape ``out_shape``.
    x : array, any shape (a scalar is allowed)
        The point; converted to float64.
    h : float > 0
        Step. The error is ``O(h²)`` from truncation plus ``O(ε·|f|/h)`` from rounding
        (ε ≈ 2.2e-16), so ``h = 1e-6`` gives about 1e-9 for functions of size 1.

    Returns
    -------
    jac : array of shape ``out_shape + x.shape``
        ``jac[..., j] = (f(x + h e_j) − f(x − h e_j)) / (2h)`` for every coordinate ``j``
        of ``x`` (one pair of calls per coordinate: ``f`` need not accept a batch).
    """
    if not callable(f):
        raise TypeError(f"f must be callable, received {type(f).__name__}")
    x = as_float_array("x", x, min_ndim=0)
    h = positive_scalar("h", h)
    flat = x.reshape(-1)
    columns = []
    out_shape = None
    for j in range(flat.size):
        step = np.zeros_like(flat)
        step[j] = h
        up = np.asarray(f((flat + step).reshape(x.shape)), dtype=float)
        down = np.asarray(f((flat - step).reshape(x.shape)), dtype=float)
        if out_shape is None:
            out_shape = up.shape
        if up.shape != out_shape or down.shape != out_shape:
            raise ValueError(
                f"f must return one fixed shape; received {out_shape}, then {up.shape} "
                f"and {down.shape} at coordinate {j}"
            )
        columns.append((up - down) / (2 * h))
    jac = np.stack(columns, axis=-1)
    return jac.reshape(out_shape + x.shape)


def softmax_jacobian_from_logits(z) -> np.ndarray:
    """Softmax Jacobian ``J = diag(p) − p pᵀ`` at ``p = softmax(z)``, accurate near one-hot.

    The diagonal ``p_i (1 − p_i)`` is computed as ``p_i · Σ_{j≠i} p_j`` (a sum of
    non-negative terms, no cancellation), so an entry such as ``e^{-95}`` survives even
    though ``1 − p_i`` rounds to 0 in float64. Entries below the smallest subnormal
    (about 4.9e-324) still underflow to exactly 0.

    z : (..., n) finite logits → J : (..., n, n)
    """
    z = as_float_array("z", z)
    e = np.exp(z - np.max(z, axis=-1, keepdims=True))  # the largest term is exactly 1
    total = np.sum(e, axis=-1, keepdims=True)
    p = e / total
    n = z.shape[-1]
    others = np.where(np.eye(n, dtype=bool), 0.0, e[..., None, :])  # row i holds e_j for j ≠ i
    one_minus_p = np.sum(others, axis=-1) / total
    jac = -p[..., :, None] * p[..., None, :]
    idx = np.arange(n)
    jac[..., idx, idx] = p * one_minus_p
    return jac


__all__ = ["numerical_jacobian", "softmax_jacobian_from_logits"]
