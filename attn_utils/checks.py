"""Checks that print one verdict line and raise when a claim fails.

Every check in the book goes through :func:`check` or :func:`check_bound`, so a
reader sees the same line everywhere: what was measured, what theory says, the
tolerance, and ✓ or ✗.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _fmt(x, spec: str) -> str:
    return format(float(x), spec)


def check(name: str, measured, theory, tol: float, *, rel: bool = False, fmt: str = ".4g") -> float:
    """Assert ``|measured − theory| ≤ tol`` (or ``≤ tol·|theory|`` when ``rel``).

    Prints e.g. ``Var(q·k)/d_k = 1.003 (theory 1, tol 0.05)  ✓`` and raises
    ``AssertionError`` with the same line marked ✗ when it fails. Returns the
    measured value as a Python float (ready for ``glue``).
    """
    measured, theory = float(measured), float(theory)
    bound = tol * abs(theory) if rel else tol
    ok = np.isfinite(measured) and abs(measured - theory) <= bound
    kind = "rel tol" if rel else "tol"
    line = f"{name} = {_fmt(measured, fmt)} (theory {_fmt(theory, fmt)}, {kind} {tol:g})"
    print(f"{line}  {'✓' if ok else '✗'}")
    if not ok:
        raise AssertionError(f"check failed: {line}")
    return measured


def check_bound(name: str, measured, *, upper=None, lower=None, fmt: str = ".4g") -> float:
    """Assert ``lower ≤ measured ≤ upper`` (either bound optional) and print a verdict."""
    if upper is None and lower is None:
        raise ValueError("check_bound needs upper, lower or both")
    measured = float(measured)
    ok = not np.isnan(measured)
    parts = []
    if lower is not None:
        ok = ok and measured >= lower
        parts.append(f"≥ {_fmt(lower, fmt)}")
    if upper is not None:
        ok = ok and measured <= upper
        parts.append(f"≤ {_fmt(upper, fmt)}")
    line = f"{name} = {_fmt(measured, fmt)} (expected {' and '.join(parts)})"
    print(f"{line}  {'✓' if ok else '✗'}")
    if not ok:
        raise AssertionError(f"check failed: {line}")
    return measured


def check_allclose(name: str, measured, expected, *, atol: float = 0.0, rtol: float = 1e-7) -> float:
    """Assert two arrays agree elementwise (``np.allclose``) and print a verdict.

    On success the line states the tolerance, not the measured difference: differences at
    rounding level (1e-16 … 1e-13) change with the BLAS build, and the printed line must be
    identical on every machine. On failure the largest difference is printed. Returns it.
    """
    measured, expected = np.asarray(measured, float), np.asarray(expected, float)
    if measured.shape != expected.shape:
        raise AssertionError(f"check failed: {name}: shapes differ, {measured.shape} vs {expected.shape}")
    diff = float(np.max(np.abs(measured - expected))) if measured.size else 0.0
    ok = bool(np.allclose(measured, expected, atol=atol, rtol=rtol))
    if ok:
        print(f"{name}: equal within atol {atol:g}, rtol {rtol:g}  ✓")
        return diff
    line = f"{name}: max |difference| = {diff:.3g} exceeds atol {atol:g}, rtol {rtol:g}"
    print(f"{line}  ✗")
    raise AssertionError(f"check failed: {line}")


@dataclass(frozen=True)
class MonteCarloMoments:
    """Sample mean and variance along one axis with normal-approximation confidence intervals."""

    mean: np.ndarray
    var: np.ndarray
    mean_halfwidth: np.ndarray
    var_halfwidth: np.ndarray
    n: int


def mc_moments(samples, axis: int = 0, z: float = 1.96) -> MonteCarloMoments:
    """Mean and variance of ``samples`` along ``axis`` with ±z·SE half-widths.

    SE(mean) = sqrt(var/N); SE(var) = sqrt((m4 − var²)/N) with m4 the fourth
    central moment (valid for any finite-kurtosis distribution, not only normal).
    """
    x = np.asarray(samples, dtype=float)
    n = x.shape[axis]
    if n < 2:
        raise ValueError(f"samples needs at least 2 draws along axis {axis}, received shape {x.shape}")
    mean = x.mean(axis=axis)
    centred = x - np.expand_dims(mean, axis)
    var = (centred**2).sum(axis=axis) / (n - 1)
    m4 = (centred**4).mean(axis=axis)
    return MonteCarloMoments(mean, var, z * np.sqrt(var / n), z * np.sqrt(np.maximum(m4 - var**2, 0) / n), n)
