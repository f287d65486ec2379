"""Argument checks shared by every public function.

Each check names the argument and says what was expected and what was received,
so a wrong shape fails loudly instead of broadcasting into a wrong answer.
"""

from __future__ import annotations

import numbers

import numpy as np


def as_float_array(name: str, x, *, min_ndim: int = 1, allow_neg_inf: bool = False) -> np.ndarray:
    """Return ``x`` as a floating array with at least ``min_ndim`` axes.

    Raises ``TypeError`` for non-numeric input and ``ValueError`` for too few
    axes or for NaN / infinite entries (``-inf`` is accepted when
    ``allow_neg_inf``, because it is a legitimate "masked" logit).
    """
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must be a numeric array, received dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, received dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, received shape {arr.shape} ({arr.ndim} axes)")
    if np.isfinite(arr).all():  # the common case, in one pass over the data
        return arr
    bad = np.isnan(arr) | (arr == np.inf) | ((arr == -np.inf) & (not allow_neg_inf))
    if bad.any():
        raise ValueError(f"{name} contains {int(bad.sum())} non-finite value(s) (NaN or inf); shape {arr.shape}")
    return arr


def check_axis_size(name: str, arr: np.ndarray, axis: int, expected: int, what: str) -> None:
    """Raise ``ValueError`` unless ``arr.shape[axis] == expected``."""
    if arr.shape[axis] != expected:
        raise ValueError(f"{name} axis {axis} ({what}) must have size {expected}, received shape {arr.shape}")


def check_same_leading(names: tuple[str, ...], arrays: tuple[np.ndarray, ...], n_trailing: int) -> None:
    """Require identical leading (batch/head) axes, so nothing broadcasts silently."""
    leads = [a.shape[: a.ndim - n_trailing] for a in arrays]
    if any(lead != leads[0] for lead in leads[1:]):
        got = ", ".join(f"{n} {a.shape}" for n, a in zip(names, arrays))
        raise ValueError(f"leading (batch/head) axes must be identical; received {got}")


def positive_scalar(name: str, value) -> float:
    """Return ``value`` as a float, requiring a finite positive real number."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, received {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, received {value}")
    return value


def _integer(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an integer, received {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, received {value}")
    return int(value)


def int_at_least(name: str, value, minimum: int) -> int:
    """Return ``value`` as an int, requiring an integer ≥ ``minimum``."""
    return _integer(name, value, minimum)


def positive_int(name: str, value) -> int:
    """Return ``value`` as an int, requiring an integer ≥ 1."""
    return _integer(name, value, 1)


def nonneg_int(name: str, value) -> int:
    """Return ``value`` as an int, requiring an integer ≥ 0."""
    return _integer(name, value, 0)
