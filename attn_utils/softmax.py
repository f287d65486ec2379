"""Softmax, its logarithm, entropy and Jacobian, and the log of the mass outside the largest logit.

Softmax has two implementations with one set of semantics, and the tests hold them equal
(``tests/core/test_softmax.py``): ``softmax_core``, written with ``autograd.numpy`` so the training
code can differentiate through it, and ``softmax_inplace``, a numpy fast path that overwrites
its input (what :func:`softmax` and the attention functions use). Both treat ``-inf`` as masked and
return zeros for a row with nothing left. They differ only on input that has no softmax: a row
holding NaN or ``+inf`` comes out of the traced core as NaN (so a diverged training run shows up
as a NaN loss), and makes the fast path raise. The public functions validate their arguments
first, so they never see such input.
"""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np
from autograd.extend import defvjp, primitive
from autograd.tracer import getval
from numpy.lib.array_utils import normalize_axis_index

from .validation import as_float_array


def _reduce(ufunc, x, axis=-1) -> np.ndarray:
    """``ufunc.reduce(x, axis, keepdims=True)``, fast for short rows.

    numpy spends about 0.1–0.2 µs per row on a reduction over a short last axis, and training
    reduces tens of thousands of rows of 5–16 entries every step (the keys of a short sequence,
    the classes of a small task): there, a chain of elementwise operations over the columns is
    3–10× faster. The chain adds the columns left to right, the same order on every machine.
    float16 sums keep numpy's reduction, whose pairwise order loses less to rounding.
    """
    x = np.asarray(x)
    if isinstance(axis, (int, np.integer)) and x.ndim:
        axis = normalize_axis_index(int(axis), x.ndim)  # a bad axis raises AxisError, a ValueError
        width = x.shape[axis]
        if 0 < width <= 16 and not (ufunc is np.add and x.dtype == np.float16):
            columns = np.moveaxis(x, axis, 0)
            acc = np.array(columns[0])  # a copy, and a 0-d array (not a scalar) for a single row
            for column in columns[1:]:
                ufunc(acc, column, out=acc)
            return np.expand_dims(acc, axis)
    return ufunc.reduce(x, axis=axis, keepdims=True)


@primitive
def _shifted_softmax(x, big, axis):
    e = np.exp(x - big)
    e /= _reduce(np.add, e, axis)
    return e


# The vector-Jacobian product of chapter 3: with J = diag(p) − p pᵀ, Jᵀg = p ⊙ (g − ⟨g, p⟩).
# One node with this rule instead of autograd's exp, sum and divide: a third of the softmax's cost.
defvjp(_shifted_softmax, lambda p, x, big, axis: lambda g: p * (g - _reduce(np.add, g * p, axis)))


@primitive
def _shifted_log_softmax(x, big, axis):
    shifted = x - big
    return shifted - np.log(_reduce(np.add, np.exp(shifted), axis))


# d log p_i / d z_j = δ_ij − p_j, so the product with g is g − p ⟨g, 1⟩.
defvjp(_shifted_log_softmax, lambda lp, x, big, axis: lambda g: g - np.exp(lp) * _reduce(np.add, g, axis))


def softmax_core(x, axis: int = -1, mask=None):
    """Max-subtracted softmax without argument checks (autograd-friendly; the training harness uses it).

    ``mask`` is boolean, ``True`` = keep; it must broadcast against ``x``. Entries equal to
    ``-inf`` count as masked. A row with nothing left returns all zeros (not NaN): it contributes
    nothing to an attention output. A row holding NaN or ``+inf`` has no softmax and returns all
    NaN (never a mixture of numbers and NaN that looks like a distribution).

    When every row keeps a key, autograd sees one node whose gradient is chapter 3's
    ``Jᵀg = p ⊙ (g − ⟨g, p⟩)``; the shift by the row maximum changes no value and is a constant of
    that node. Consequence: the derivative of an entry within rounding of 1 comes out as
    ``p (1 − p)``, which is 0; keep the shift in the graph when that entry matters (chapter 3's
    ``softmax_traced``). The rule is first-order reverse mode only: no Hessians or forward mode
    through it (the book trains with gradients and needs neither).
    """
    if mask is not None:
        x = anp.where(mask, x, -anp.inf)
    big = _reduce(np.maximum, getval(x), axis)
    if np.isfinite(big).all():  # every row keeps a key, so every sum is >= 1: the lean graph
        return _shifted_softmax(x, big, axis)
    undefined = np.isnan(big) | (big == np.inf)  # the max propagates NaN, and +inf is a logit that overflowed
    big = np.where(np.isfinite(big), big, 0.0)  # a fully masked row: every exp below is exp(-inf) = 0
    with np.errstate(over="ignore", invalid="ignore"):
        e = anp.exp(x - big)
        total = anp.sum(e, axis=axis, keepdims=True)
        p = e / anp.where(total > 0, total, 1.0)
    return p + np.where(undefined, np.nan, 0.0) if undefined.any() else p  # a constant: gradients still flow


def log_softmax_core(x, axis: int = -1):
    """``log(softmax(x))`` without argument checks (autograd-friendly; the training loss uses it).

    Computed from the shifted logits, never as the log of a probability, so a large gap gives a
    large negative number instead of ``log(0)``. ``-inf`` entries are masked (``log 0 = -inf``), and a
    row with every entry masked is all ``-inf``, the log of :func:`softmax_core`'s zero row.
    """
    big = _reduce(np.maximum, getval(x), axis)
    if np.isfinite(big).all():
        return _shifted_log_softmax(x, big, axis)
    shifted = x - np.where(big == -np.inf, 0.0, big)
    total = anp.sum(anp.exp(shifted), axis=axis, keepdims=True)
    return shifted - anp.log(anp.where(total > 0, total, 1.0))


# Rows are processed in tiles of about 2**18 entries, so the max, exp, sum and scale passes over
# a tile run while it is still in cache instead of streaming the whole score array four times.
_TILE_ENTRIES = 1 << 18


def _softmax_rows(x: np.ndarray) -> None:
    """In-place softmax along the last axis of ``x`` (masked entries are -inf).

    Raises ``FloatingPointError`` if a row's largest entry is +inf or NaN (a score that overflowed).
    """
    big = _reduce(np.maximum, x)
    if not np.isfinite(big).all():
        if (big == np.inf).any() or np.isnan(big).any():
            raise FloatingPointError("a row of the softmax input holds +inf or NaN")
        big[~np.isfinite(big)] = 0.0  # a fully masked row: exp(-inf) = 0 below, total 0
    x -= big
    np.exp(x, out=x)
    total = _reduce(np.add, x)
    total[total == 0] = 1.0  # fully masked rows stay all zeros
    np.reciprocal(total, out=total)  # one division per row, then a multiply per entry
    x *= total


def softmax_inplace(x: np.ndarray, axis: int = -1, mask=None) -> np.ndarray:
    """Numpy fast path of :func:`softmax_core`: overwrites and returns ``x`` (a float array the caller owns).

    Same semantics (``-inf`` and ``mask == False`` are masked; rows with nothing left give
    zeros) with five cheap passes over the data instead of ten, which matters for
    ``(…, n, n)`` score arrays. Single-threaded, tiled for the cache. Raises
    ``FloatingPointError`` for a row holding ``+inf`` or NaN (callers validate their inputs, so only an
    overflowed score gets here). Not differentiable by autograd: training code uses :func:`softmax_core`.
    """
    if mask is not None:
        np.copyto(x, -np.inf, where=~mask)
    rows = np.moveaxis(x, axis, -1)
    if rows.size == 0:
        return x
    if not rows.flags.c_contiguous:
        _softmax_rows(rows)  # a strided view (axis != -1): one pass, no tiles
        return x
    flat = rows.reshape(-1, rows.shape[-1])  # a view: rows is C-contiguous
    step = max(1, _TILE_ENTRIES // max(1, flat.shape[-1]))
    for r in range(0, flat.shape[0], step):
        _softmax_rows(flat[r : r + step])
    return x


def _mask_for(name: str, mask, x: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(f"{name} must be a boolean array (True = keep), received dtype {mask.dtype}")
    try:
        np.broadcast_shapes(mask.shape, x.shape)
    except ValueError:
        raise ValueError(f"{name} of shape {mask.shape} does not broadcast to logits of shape {x.shape}") from None
    if np.broadcast_shapes(mask.shape, x.shape) != x.shape:
        raise ValueError(f"{name} of shape {mask.shape} would enlarge logits of shape {x.shape}")
    return mask


def softmax(x, axis: int = -1, mask=None) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    Parameters
    ----------
    x : array (..., n, ...)
        Logits. ``-inf`` is allowed and means "masked"; NaN and ``+inf`` raise.
    axis : int
        Axis along which the probabilities sum to 1.
    mask : bool array broadcastable to ``x``, optional
        ``True`` where an entry may receive probability.

    Returns
    -------
    p : array, same shape as ``x``
        Rows sum to 1, except rows with every entry masked, which are all zeros
        (documented choice: such a query attends to nothing).
    """
    x = as_float_array("x", x, allow_neg_inf=True)
    if mask is not None:
        mask = _mask_for("mask", mask, x)
    return softmax_inplace(x.copy(), axis=axis, mask=mask)


def log_softmax(x, axis: int = -1) -> np.ndarray:
    """``log(softmax(x))`` computed without forming ``softmax`` (no log of 0 for large gaps).

    x : (..., n) logits; ``-inf`` means masked, as in :func:`softmax`, and gives ``-inf``; NaN and
    ``+inf`` raise. Returns the same shape; a row with every entry masked is all ``-inf``.
    """
    return log_softmax_core(as_float_array("x", x, allow_neg_inf=True), axis=axis)


def _probabilities(name: str, p, axis: int = -1) -> np.ndarray:
    """``p`` as probability vectors along ``axis``: non-negative, each summing to 1 within rounding of
    its dtype, or all zeros (the row :func:`softmax` returns when every entry is masked)."""
    p = as_float_array(name, p)
    total = np.sum(p, axis=axis)
    slack = max(1e-6, 8 * p.shape[axis] * float(np.finfo(p.dtype).eps)) if p.size else 0.0
    bad = (np.abs(total - 1) > slack) & (total != 0)
    if (p < 0).any() or bad.any():
        worst = "a negative entry" if (p < 0).any() else f"a row summing to {total[bad].flat[0]:.6g}"
        raise ValueError(
            f"{name} must be probability vectors along axis {axis} (non-negative, each summing to 1 or all zero); "
            f"received {worst} in shape {p.shape}"
        )
    return p


def entropy(p, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats of probability vectors along ``axis``; ``0 log 0 = 0``.

    p : (..., n) probabilities (an all-zero row, softmax's fully masked row, has entropy 0);
    returns (...). Anything that is not a probability vector raises.
    """
    p = _probabilities("p", p, axis)
    logp = np.log(np.where(p > 0, p, 1.0))
    return -np.sum(p * logp, axis=axis)


def softmax_jacobian(p) -> np.ndarray:
    """Jacobian of softmax at output ``p``: ``J = diag(p) - p pᵀ``.

    ``J[..., i, j] = ∂p_i/∂z_j = p_i (δ_ij - p_j)``.

    p : (..., n) probability vectors (non-negative, summing to 1). An all-zero row (softmax's
    output for a fully masked row) is constant in the logits and has ``J = 0``.

    returns : (..., n, n)
    """
    p = _probabilities("p", p)
    return p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]


def jacobian_frobenius_sq(p) -> np.ndarray:
    """Closed form ``‖diag(p) − p pᵀ‖_F² = Σp² − 2Σp³ + (Σp²)²``.

    p : (..., n); returns (...).
    The three terms cancel when p is nearly one-hot (about 1 − max p < 1e-6): the result
    then loses its relative accuracy and can even come out ≤ 0. Near one-hot, build the
    Jacobian from the logits instead (``softmax_jacobian_from_logits`` of chapter 3).
    """
    p = _probabilities("p", p)
    s2 = np.sum(p**2, axis=-1)
    return s2 - 2 * np.sum(p**3, axis=-1) + s2**2


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


__all__ = [
    "log_tail_mass",
    "softmax",
    "softmax_core",
    "log_softmax_core",
    "softmax_inplace",
    "log_softmax",
    "entropy",
    "softmax_jacobian",
    "jacobian_frobenius_sq",
]
