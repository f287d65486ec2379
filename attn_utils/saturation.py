"""Softmax saturation: the probability mass left outside the largest logits, and where
floating point rounds the largest probability to exactly 1.

Both functions work on logits ``x`` scaled by a factor ``a`` (an inverse temperature):
``softmax(a · x)``. They are used by the chapter on softmax saturation.
"""

from __future__ import annotations

import numpy as np

from .softmax import softmax_core
from .validation import as_float_array


def log_tail_mass(x) -> np.ndarray:
    """``log(1 − Σ_{i∈S} softmax(x)_i)``, the log of the mass *outside* the largest logits.

    ``S`` is the set of positions that attain the maximum of each row (all of them when the
    maximum is tied). The value is computed from the shifted logits ``x − max x`` in the log
    domain, so it stays accurate when ``1 − p_max`` is far below the float64 resolution near
    1 (e.g. ``ln 2 − 100 ≈ -99.31`` for ``x = (100, 100, 200)``, where ``1 − p_max`` itself rounds to 0).

    x : (..., n) finite logits; returns (...). A row whose entries are all equal has no mass
    outside ``S`` and returns ``-inf``.
    """
    x = as_float_array("x", x)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    is_max = shifted == 0
    m = np.sum(is_max, axis=-1)  # size of S
    # r = Σ_{j∉S} exp(x_j − max x) as a log-sum-exp over the non-maximal entries, shifted by
    # the largest of them (−Δ) so that nothing underflows even for gaps far beyond 745.
    masked = np.where(is_max, -np.inf, shifted)
    top = np.max(masked, axis=-1)
    top = np.where(np.isfinite(top), top, 0.0)  # every entry in S: r = 0 below
    with np.errstate(divide="ignore"):
        log_r_over_m = top + np.log(np.sum(np.exp(masked - top[..., None]), axis=-1)) - np.log(m)
    # 1 − Σ_S p = r/(m + r) = (r/m) / (1 + r/m)
    return log_r_over_m - np.log1p(np.exp(log_r_over_m))


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


__all__ = ["log_tail_mass", "first_exact_one"]
