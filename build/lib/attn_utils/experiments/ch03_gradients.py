"""Chapter 3 — the softmax Jacobian where ``p`` is within rounding of one-hot.

(The finite-difference check every chapter uses, :func:`attn_utils.numerical_jacobian`, lives in
:mod:`attn_utils.book.measuring`.)

* :func:`softmax_jacobian_from_logits` — ``diag(p) − p pᵀ`` computed from the logits,
  so that its diagonal ``p_i (1 − p_i)`` stays accurate when ``p_i`` is within
  rounding of 1 (where :func:`attn_utils.softmax_jacobian`, which only sees ``p``,
  must return 0).
* :func:`ols` — least-squares coefficients with their standard errors, for the chapter's claim that
  the log of the Jacobian falls with the top-two gap and not with the size of the logits.
"""

from __future__ import annotations

import numpy as np

from ..validation import as_float_array


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


def ols(X, y) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary least squares ``y ≈ X β`` with the classical standard errors of ``β``.

    X : (N, k) design matrix (include a column of ones for an intercept), N > k, full column rank
    y : (N,) responses → (β, se), each (k,); ``se = sqrt(diag(σ̂² (XᵀX)⁻¹))``, ``σ̂²`` the residual
    variance with N − k degrees of freedom.
    """
    X, y = as_float_array("X", X), as_float_array("y", y)
    if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] <= X.shape[1]:
        raise ValueError(f"X must be (N, k) with N > k and y (N,); received X {X.shape}, y {y.shape}")
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    sigma2 = resid @ resid / (X.shape[0] - X.shape[1])
    cov = sigma2 * np.linalg.inv(X.T @ X)
    return beta, np.sqrt(np.diag(cov))


__all__ = ["ols", "softmax_jacobian_from_logits"]
