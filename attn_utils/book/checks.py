"""Checks that print one verdict line and raise when a claim fails.

Every check in the book goes through :func:`check`, :func:`check_bound`,
:func:`check_allclose`, :func:`check_seeds` or :func:`check_count`, so a reader sees
the same line everywhere: what was measured, what theory says, the tolerance, and
✓ (or a cross when the check fails).

Portable output
---------------
A printed line must be the same on every machine. Exact and closed-form results,
and Monte Carlo estimates in float64, are printed to 4 significant digits: their
rounding differences across BLAS kernels sit ~12 digits below that. A *trained*
model is different: training is chaotic, and a last-bit difference in one matrix
product (another CPU, BLAS kernel or thread count) grows into a different model.
Such numbers are printed with a leading ``≈`` (``approx=True``, and always in
:func:`check_seeds` / :func:`check_count`) at the precision they deserve; the test
suite treats the digits after ``≈`` as machine dependent (``tests/nbval_sanitize.cfg``)
and compares everything else on the line: the claim, the bound, the verdict. What
makes a trained claim hold on every machine is its *margin*, which
:func:`check_seeds` asserts: the mean over seeds must clear the bound by ``z``
standard errors, not just clear it.

What a check rules out
----------------------
A check is evidence only if the wrong answer would fail it. Every check takes
``rules_out={"what the wrong answer is": value_it_would_give}``; the check refuses, when it
is *defined* (before anything is compared), a tolerance or bound that would also accept
one of those values (``ValueError``), and prints each beside the verdict::

    Var(q·k)/d_k = 1.003 (theory 1, tol 0.05; scaling by 1/d_k would give 0.125)  ✓

A wrong answer's value measured on trained models is machine dependent like the
measurement itself: wrap it in :func:`measured` and it is printed with ``≈`` too.

A random statistic gets its tolerance from its own sampling error: pass ``se=`` (the
standard error computed in the same cell, e.g. from :func:`mc_moments`) and the check uses
``z·se`` (``z = 5`` by default: a false failure about once in a million draws), so the check holds
for any seed base (``attn_utils.book.seeding``), not only the committed draw. Exact comparisons of two
independent computations need neither.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

#: Set to a file path and every check appends one JSON line saying how close it came to failing
#: (``tools/reseed.py`` reads it to estimate each check's false-failure rate over many seed bases).
LOG_VARIABLE = "ATTN_CHECK_LOG"


def _log_closeness(
    name: str,
    *,
    used: float,
    spare_se: float | None = None,
    dev_se: float | None = None,
    z: float | None = None,
    **counts: int | None,
) -> None:
    """Record how much of its allowance a check used (it fails when ``used > 1``) and, for a
    tolerance made of standard errors, how many standard errors it had to spare (``spare_se``) of
    the ``z`` it needs, and, for a two-sided one, its signed deviation from theory in standard
    errors (``dev_se``). A count of seeds logs its raw numbers (``counts``: count, seeds and
    bounds), from which ``tools/reseed.py`` estimates how often the count would miss its range."""
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    record = {"name": name}
    for key, value in (("used", used), ("spare_se", spare_se), ("dev_se", dev_se), ("z", z)):
        record[key] = round(float(value), 4) if value is not None and np.isfinite(value) else None
    record.update(counts)
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(record) + "\n")


def _ratio(part: float, whole: float) -> float:
    """part / whole for a non-negative part, with 0/0 = 0 and x/0 = ∞."""
    if whole > 0:
        return part / whole
    return 0.0 if part == 0 else np.inf


def _fmt(x, spec: str) -> str:
    return format(float(x), spec)


def _measured(x, spec: str, approx: bool) -> str:
    """The measured value as printed; ``≈`` marks digits that vary by machine (module docstring)."""
    return ("≈" if approx else "") + _fmt(x, spec)


class Measured(float):
    """A number measured on trained models (see :func:`measured`)."""


def measured(value) -> Measured:
    """Mark a ``rules_out`` value that comes from trained models: printed with ``≈``, like them.

    ``rules_out={"trained as far as the scaled model": au.measured(acc.mean())}``. Training is
    chaotic, so those digits differ between machines (module docstring, "Portable output").
    """
    return Measured(value)


def _wrong_answers(rules_out) -> dict[str, float]:
    """``rules_out`` as {description: value}; refuses anything else with a clear error."""
    if rules_out is None:
        return {}
    if not isinstance(rules_out, dict) or not rules_out:
        raise TypeError(
            "rules_out must be a non-empty dict {'what the wrong answer is': the value it would give}, "
            f"received {rules_out!r}"
        )
    return {str(k): v for k, v in rules_out.items()}


def _rules_out_text(wrong: dict, fmt: str) -> str:
    return "".join(
        f"; {what} would give {_measured(value, fmt, isinstance(value, Measured))}" for what, value in wrong.items()
    )


def _refuse_accepting(name: str, accepts, wrong: dict, fmt: str, what: str) -> None:
    """Raise ValueError at definition time when the check would accept a wrong answer."""
    for desc, value in wrong.items():
        if accepts(value):
            raise ValueError(
                f"check {name!r}: {what} also accepts {_fmt(value, fmt)}, the value of the wrong answer "
                f"({desc}); tighten it or measure something that separates the two"
            )


def _interval_wrong_answers(
    func: str, name: str, lower, upper, rules_out, fmt: str, lo: str = "lower", hi: str = "upper"
) -> dict:
    """Validate an interval check's bounds and its ``rules_out`` (refused if a value lies inside)."""
    if upper is None and lower is None:
        raise ValueError(f"{func} needs {hi}, {lo} or both")
    if upper is not None and lower is not None and not lower <= upper:
        raise ValueError(f"{func} {name!r}: {lo} ({lower}) must be ≤ {hi} ({upper})")
    wrong = _wrong_answers(rules_out)
    _refuse_accepting(
        name,
        lambda v: (lower is None or float(v) >= lower) and (upper is None or float(v) <= upper),
        wrong,
        fmt,
        "the bound",
    )
    return wrong


def _tolerance(tol, se, z: float, approx: bool = False) -> tuple[float, str]:
    """The tolerance and how it is printed: a typed ``tol``, or ``z`` standard errors of the statistic."""
    if (tol is None) == (se is None):
        raise TypeError("give exactly one of tol (a number) or se (the statistic's standard error, tol = z·se)")
    if se is not None:
        se = float(se)
        if not (np.isfinite(se) and se >= 0):
            raise ValueError(f"se must be a finite standard error ≥ 0, received {se}")
        if not z > 0:
            raise ValueError(f"z must be > 0, received {z}")
        return z * se, f"{z:g} SE = {_measured(z * se, '.3g', approx)}"
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"tol must be ≥ 0, received {tol}")
    return tol, f"{tol:g}"


def check(
    name: str,
    measured,
    theory,
    tol: float | None = None,
    *,
    se: float | None = None,
    z: float = 5.0,
    rel: bool = False,
    fmt: str = ".4g",
    approx: bool = False,
    rules_out: dict | None = None,
) -> float:
    """Assert ``|measured − theory| ≤ tol`` (or ``≤ tol·|theory|`` when ``rel``).

    Prints e.g. ``Var(q·k)/d_k = 1.003 (theory 1, tol 0.05)  ✓`` and raises
    ``AssertionError`` with the same line marked with a cross when it fails. Returns the
    measured value as a Python float (ready for ``glue``). ``approx=True`` marks a
    measurement of a trained model (``≈``, see the module docstring).

    se : float, optional
        Instead of ``tol``, the standard error of ``measured`` over its random draw; the
        tolerance is then ``z·se`` and printed as such (module docstring).
    rules_out : dict, optional
        {wrong answer: the value it would give}; refused at once if within the tolerance.
    """
    wrong = _wrong_answers(rules_out)
    tol, tol_text = _tolerance(tol, se, z, approx)
    measured, theory = float(measured), float(theory)
    bound = tol * abs(theory) if rel else tol
    _refuse_accepting(name, lambda v: abs(float(v) - theory) <= bound, wrong, fmt, f"the tolerance ±{bound:.3g}")
    ok = np.isfinite(measured) and abs(measured - theory) <= bound
    off = abs(measured - theory) if np.isfinite(measured) else np.inf
    if se is not None and float(se) > 0:
        _log_closeness(
            name,
            used=_ratio(off, bound),
            spare_se=(bound - off) / float(se),
            dev_se=(measured - theory) / float(se),
            z=bound / float(se),
        )
    else:
        _log_closeness(name, used=_ratio(off, bound))
    kind = "rel tol" if rel else "tol"
    line = (
        f"{name} = {_measured(measured, fmt, approx)} (theory {_fmt(theory, fmt)}, {kind} {tol_text}"
        f"{_rules_out_text(wrong, fmt)})"
    )
    print(f"{line}  {'✓' if ok else '✗'}")
    if not ok:
        raise AssertionError(f"check failed: {line}")
    return measured


def check_bound(
    name: str,
    measured,
    *,
    upper=None,
    lower=None,
    se: float | None = None,
    z: float = 5.0,
    fmt: str = ".4g",
    approx: bool = False,
    rules_out: dict | None = None,
) -> float:
    """Assert ``lower ≤ measured ≤ upper`` (either bound optional) and print a verdict.

    se : float, optional
        The standard error of a random ``measured``; the bound must then be cleared by
        ``z·se`` (``measured − z·se ≥ lower``, ``measured + z·se ≤ upper``), so the verdict
        does not depend on the draw.
    rules_out : dict, optional
        {wrong answer: the value it would give}; refused at once if inside the bounds.

    ``approx=True`` marks a measurement of a trained model (``≈``, see the module docstring);
    for a statistic over seeds prefer :func:`check_seeds`, which also asserts a margin.
    """
    wrong = _interval_wrong_answers("check_bound", name, lower, upper, rules_out, fmt)
    margin, margin_text = (0.0, "") if se is None else _tolerance(None, se, z, approx)
    if se is not None:
        margin_text = f", by {margin_text}"
    measured = float(measured)
    ok = not np.isnan(measured)
    parts = []
    if lower is not None:
        ok = ok and measured - margin >= lower
        parts.append(f"≥ {_fmt(lower, fmt)}")
    if upper is not None:
        ok = ok and measured + margin <= upper
        parts.append(f"≤ {_fmt(upper, fmt)}")
    if se is not None:
        gap = min(measured - lower if lower is not None else np.inf, upper - measured if upper is not None else np.inf)
        gap = gap if np.isfinite(measured) else -np.inf
        _log_closeness(
            name,
            used=_ratio(margin, gap) if gap > 0 else np.inf,
            spare_se=(gap - margin) / float(se) if float(se) > 0 else None,
            z=z,
        )
    line = (
        f"{name} = {_measured(measured, fmt, approx)} (expected {' and '.join(parts)}{margin_text}"
        f"{_rules_out_text(wrong, fmt)})"
    )
    print(f"{line}  {'✓' if ok else '✗'}")
    if not ok:
        raise AssertionError(f"check failed: {line}")
    return measured


def check_allclose(
    name: str, measured, expected, *, atol: float = 0.0, rtol: float = 1e-7, rules_out: dict | None = None
) -> float:
    """Assert two arrays agree elementwise (``np.allclose``) and print a verdict.

    On success the line states the tolerance, not the measured difference: differences at
    rounding level (1e-16 … 1e-13) change with the BLAS build, and the printed line must be
    identical on every machine. On failure the largest difference is printed. Returns it.

    rules_out : {wrong answer: the array it would give}; refused at once if it is within the
        tolerance of ``expected``, and named on the line (without its values).
    """
    if atol < 0 or rtol < 0:
        raise ValueError(f"check_allclose {name!r}: atol and rtol must be ≥ 0, received {atol}, {rtol}")
    measured, expected = np.asarray(measured, float), np.asarray(expected, float)
    wrong = _wrong_answers(rules_out)
    for desc, value in wrong.items():
        value = np.asarray(value, float)
        if value.shape != expected.shape or np.allclose(value, expected, atol=atol, rtol=rtol):
            raise ValueError(
                f"check {name!r}: the tolerance (atol {atol:g}, rtol {rtol:g}) also accepts the wrong answer "
                f"({desc}), or its shape {value.shape} is not expected's {expected.shape}"
            )
    rules = "".join(f"; rules out {desc}" for desc in wrong)
    if measured.shape != expected.shape:
        raise AssertionError(f"check failed: {name}: shapes differ, {measured.shape} vs {expected.shape}")
    diff = float(np.max(np.abs(measured - expected))) if measured.size else 0.0
    ok = bool(np.allclose(measured, expected, atol=atol, rtol=rtol))
    if ok:
        print(f"{name}: equal within atol {atol:g}, rtol {rtol:g}{rules}  ✓")
        return diff
    line = f"{name}: max |difference| = {diff:.3g} exceeds atol {atol:g}, rtol {rtol:g}{rules}"
    print(f"{line}  ✗")
    raise AssertionError(f"check failed: {line}")


@dataclass(frozen=True)
class SeedSummary:
    """What :func:`check_seeds` measured: mean, sd and standard error over seeds, and the
    margin to the nearest bound in standard errors (``inf`` when every seed agrees)."""

    mean: float
    sd: float
    se: float
    margin: float
    n: int


MIN_SEEDS = 8
"""The fewest seeds a claim about trained models may rest on."""


def check_seeds(
    name: str,
    per_seed,
    *,
    lower=None,
    upper=None,
    z: float = 3.0,
    fmt: str = ".2f",
    min_seeds: int = MIN_SEEDS,
    rules_out: dict | None = None,
) -> SeedSummary:
    """Assert that the mean over seeds clears its bound(s) by ``z`` standard errors.

    per_seed : (S,) one value per independently trained model (an accuracy, a paired
        difference between two methods trained from the same seed, …), S ≥ ``min_seeds``.

    Passes when ``mean − z·SE ≥ lower`` and ``mean + z·SE ≤ upper`` with
    ``SE = sd/√S`` (sd with ``ddof=1``), so a claim that barely clears its bound in this
    draw of seeds fails instead of passing by luck. Prints e.g.::

        1/√d_k: mean accuracy = ≈0.98 ± ≈0.01 (mean ± SE of 8 seeds; expected ≥ 0.9, margin ≈8.0 SE ≥ 3)  ✓

    The numbers after ``≈`` depend on the machine; the claim and the verdict do not.
    rules_out : {wrong answer: the mean it would give}; refused at once if inside the bounds.
    Returns a :class:`SeedSummary` (glue its ``mean`` with ``approx=True``).
    """
    wrong = _interval_wrong_answers("check_seeds", name, lower, upper, rules_out, fmt)
    if not z > 0:
        raise ValueError(f"z must be > 0, received {z}")
    values = np.asarray(per_seed, dtype=float)
    if values.ndim != 1:
        raise ValueError(f"per_seed must be one value per seed, shape (S,); received shape {values.shape}")
    if values.size < min_seeds:
        raise ValueError(f"per_seed must hold at least {min_seeds} seeds, received {values.size}")
    mean = float(values.mean())
    sd = float(values.std(ddof=1))
    se = sd / np.sqrt(values.size)
    gaps = []
    parts = []
    if lower is not None:
        gaps.append(mean - lower)
        parts.append(f"≥ {_fmt(lower, fmt)}")
    if upper is not None:
        gaps.append(upper - mean)
        parts.append(f"≤ {_fmt(upper, fmt)}")
    gap = min(gaps)
    margin = gap / se if se > 0 else (np.inf if gap >= 0 else -np.inf)
    ok = bool(np.isfinite(mean)) and gap >= 0 and margin >= z
    _log_closeness(name, used=_ratio(z, margin) if margin > 0 else np.inf, spare_se=margin - z, z=z)
    shown = "≈∞" if np.isinf(margin) else _measured(margin, ".1f", True)
    line = (
        f"{name} = {_measured(mean, fmt, True)} ± {_measured(se, fmt, True)} (mean ± SE of {values.size} seeds; "
        f"expected {' and '.join(parts)}, margin {shown} SE ≥ {z:g}{_rules_out_text(wrong, fmt)})"
    )
    print(f"{line}  {'✓' if ok else '✗'}")
    if not ok:
        raise AssertionError(f"check failed: {line}")
    return SeedSummary(mean, sd, se, float(margin), int(values.size))


def check_count(
    name: str, flags, *, at_least=None, at_most=None, min_seeds: int = MIN_SEEDS, rules_out: dict | None = None
) -> int:
    """Assert how many seeds satisfy a condition: ``at_least ≤ count ≤ at_most``.

    flags : (S,) bools, one per seed (e.g. ``accuracy ≥ 0.99``). Prints
    ``name: ≈7 of 8 seeds (expected ≥ 6)  ✓``; returns the count.
    rules_out : {wrong answer: the count it would give}; refused at once if inside the range.
    """
    wrong = _interval_wrong_answers("check_count", name, at_least, at_most, rules_out, "g", "at_least", "at_most")
    flags = np.asarray(flags)
    if flags.ndim != 1 or flags.dtype != bool:
        raise TypeError(
            f"flags must be a 1-d bool array (one per seed), received dtype {flags.dtype}, shape {flags.shape}"
        )
    if flags.size < min_seeds:
        raise ValueError(f"flags must hold at least {min_seeds} seeds, received {flags.size}")
    count = int(flags.sum())
    ok = (at_least is None or count >= at_least) and (at_most is None or count <= at_most)
    # the share of its room a count used: the seeds it could still lose (or gain) before failing, plus a half
    room = ([(flags.size - count) / (flags.size - at_least + 0.5)] if at_least is not None else []) + (
        [count / (at_most + 0.5)] if at_most is not None else []
    )
    _log_closeness(name, used=max(room), count=count, seeds=int(flags.size), at_least=at_least, at_most=at_most)
    parts = ([f"≥ {at_least}"] if at_least is not None else []) + ([f"≤ {at_most}"] if at_most is not None else [])
    line = f"{name}: ≈{count} of {flags.size} seeds (expected {' and '.join(parts)}{_rules_out_text(wrong, 'g')})"
    print(f"{line}  {'✓' if ok else '✗'}")
    if not ok:
        raise AssertionError(f"check failed: {line}")
    return count


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
