"""Chapter 2 — where floating point rounds the largest softmax probability to exactly 1.

Logits ``x`` are scaled by a factor ``a`` (an inverse temperature): ``softmax(a · x)``. The mass
left outside the largest logit, which chapters 2 and 3 both use, is the core's
:func:`attn_utils.log_tail_mass`.
"""

from __future__ import annotations

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


__all__ = ["first_exact_one"]
