"""Chapter 2 — where floating point rounds the largest softmax probability to exactly 1.

Logits ``x`` are scaled by a factor ``a`` (an inverse temperature): ``softmax(a · x)``. The mass
left outside the largest logit, which chapters 2 and 3 both use, is the core's
:func:`attn_utils.log_tail_mass`. The gap between the two largest of ``n`` independent standard
normal logits, which decides how saturated a random attention row is, has the distribution
:func:`top_two_gap_cdf` (and quantiles :func:`top_two_gap_quantile`).
"""

from __future__ import annotations

import math

import numpy as np

from ..softmax import softmax_core
from ..validation import as_float_array


def first_exact_one(x, scales, dtype=np.float64) -> float:
    """Smallest grid scale from which on the largest entry of ``softmax(a · x)`` is exactly 1.

    For each ``a`` in ``scales`` the logits ``a · x`` are formed in float64, cast to ``dtype``
    and passed through the max-subtracted softmax in that precision.

    x : (n,) logits with a unique maximum (otherwise the maximum can never reach 1)
    scales : (m,) strictly increasing positive scales
    dtype : a numpy floating type, e.g. ``np.float16``, ``np.float32``, ``np.float64``

    Returns the smallest ``scales[i]`` such that the largest probability equals 1.0 for
    ``scales[i]`` and for every larger scale in the grid, or ``nan`` if it is below 1 at the
    last scale.
    """
    x = as_float_array("x", x)
    if x.ndim != 1 or x.shape[0] < 2:
        raise ValueError(f"x must have shape (n,) with n >= 2, received shape {x.shape}")
    scales = as_float_array("scales", scales)
    if scales.ndim != 1:
        raise ValueError(f"scales must have shape (m,), received shape {scales.shape}")
    if np.any(scales <= 0) or np.any(np.diff(scales) <= 0):
        raise ValueError("scales must be positive and strictly increasing")
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"dtype must be a floating type, received {dtype}")
    if np.sum(x == x.max()) > 1:
        raise ValueError(f"x must have a unique maximum; {int(np.sum(x == x.max()))} entries tie at {x.max():g}")
    with np.errstate(over="ignore"):
        logits = (scales[:, None] * x).astype(dtype)
    if not np.all(np.isfinite(logits)):
        raise ValueError(f"a · x overflows {dtype.name}; reduce the largest scale ({scales[-1]:g})")
    is_one = softmax_core(logits, axis=-1).max(axis=-1) == 1
    if not is_one[-1]:
        return float("nan")
    below = np.flatnonzero(~is_one)
    return float(scales[0] if below.size == 0 else scales[below[-1] + 1])


_V = np.linspace(-9.0, 9.0, 18001)  # integration grid for the order statistics of standard normals
_PHI = np.exp(-(_V**2) / 2) / math.sqrt(2 * math.pi)
_CDF = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in _V])


def top_two_gap_cdf(t, n: int) -> np.ndarray:
    """``P(Δ ≤ t)`` for the gap ``Δ = x_(n) − x_(n−1)`` between the two largest of ``n`` i.i.d. N(0, 1).

    The runner-up sits at ``v`` with density ``n(n−1) F(v)^{n−2} φ(v)`` times the chance that the
    largest lies in ``(v, v + t]``, ``F(v + t) − F(v)`` (``F``, ``φ``: the normal CDF and density);
    integrated over ``v`` on a grid of step 1e-3 (error below 1e-6).

    t : scalar or (m,) gaps ≥ 0;  n : number of logits, ≥ 2.  Returns an array shaped like ``t``.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer ≥ 2, received {n!r}")
    t = np.asarray(t, dtype=float)
    if np.any(t < 0) or not np.all(np.isfinite(t)):
        raise ValueError("t must be finite gaps ≥ 0")
    weight = n * (n - 1) * _CDF ** (n - 2) * _PHI
    shifted = np.interp(_V[None, :] + t.reshape(-1, 1), _V, _CDF, right=1.0)
    out = np.trapezoid(weight * (shifted - _CDF), _V, axis=-1)
    return out.reshape(t.shape)


def top_two_gap_quantile(prob: float, n: int) -> float:
    """The ``prob`` quantile of the top-two gap of ``n`` i.i.d. N(0, 1) (bisection on :func:`top_two_gap_cdf`)."""
    if not 0 < prob < 1:
        raise ValueError(f"prob must lie in (0, 1), received {prob}")
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if top_two_gap_cdf(mid, n) < prob else (lo, mid)
    return 0.5 * (lo + hi)


def median_se(values) -> float:
    """Standard error of the sample median of ``values``, from its order statistics (no model).

    The rank of the sample median has standard deviation ``√N/2``, so half the distance between
    the order statistics at ranks ``N/2 ± √N/2`` estimates one standard error. values : (N,), N ≥ 16.
    """
    v = np.sort(as_float_array("values", values).ravel())
    if v.size < 16:
        raise ValueError(f"values must hold at least 16 draws, received {v.size}")
    half = int(math.ceil(math.sqrt(v.size) / 2))
    mid = v.size // 2
    return float((v[min(mid + half, v.size - 1)] - v[mid - half]) / 2)


__all__ = ["first_exact_one", "median_se", "top_two_gap_cdf", "top_two_gap_quantile"]
