"""Chapter 3 — the softmax Jacobian where ``p`` is within rounding of one-hot.

(The finite-difference check every chapter uses, :func:`attn_utils.numerical_jacobian`, lives in
:mod:`attn_utils.book.measuring`.)

* :func:`softmax_jacobian_from_logits` — ``diag(p) − p pᵀ`` computed from the logits,
  so that its diagonal ``p_i (1 − p_i)`` stays accurate when ``p_i`` is within
  rounding of 1 (where :func:`attn_utils.softmax_jacobian`, which only sees ``p``,
  must return 0).
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


__all__ = ["softmax_jacobian_from_logits"]
