"""Scaled dot-product attention and the masks it uses.

Shapes: batch and head axes lead, sequence and feature axes come last.
``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``.

:func:`scaled_dot_product_attention` is the book's one implementation: three lines after its
argument checks, ``softmax(s·q kᵀ) v``. It is single-threaded numpy apart from BLAS's own
threads in the two matrix products, so it is safe to call from any thread and after ``fork``.
"""

from __future__ import annotations

import numpy as np

from .counting import counted_matmul
from .softmax import softmax_inplace
from .validation import as_float_array, check_axis_size, check_same_leading, positive_int, positive_scalar


def default_scale(d_k: int) -> float:
    """The Transformer's logit scale ``1/sqrt(d_k)``, with ``d_k`` the per-head key size."""
    return 1.0 / np.sqrt(positive_int("d_k", d_k))


def causal_mask(n_q: int, n_k: int | None = None) -> np.ndarray:
    """Boolean ``(n_q, n_k)`` mask, ``True`` where query ``i`` may see key ``j``.

    Queries are aligned with the *last* ``n_q`` keys, so with a KV cache
    (``n_k > n_q``) query ``i`` sits at absolute position ``n_k - n_q + i`` and
    sees keys ``0 … n_k - n_q + i``.
    """
    n_q = positive_int("n_q", n_q)
    n_k = n_q if n_k is None else positive_int("n_k", n_k)
    if n_k < n_q:
        raise ValueError(f"n_k must be >= n_q for a causal mask, received n_q={n_q}, n_k={n_k}")
    return np.arange(n_k)[None, :] <= np.arange(n_k - n_q, n_k)[:, None]


def check_qkv(q, k, v=None):
    """Validate attention inputs: ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``.

    Returns them as float arrays. Raises ``ValueError`` naming the argument for mismatched
    ``d_k`` or ``n_k``, differing leading (batch/head) axes, and NaN or ±inf entries.
    """
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    check_axis_size("k", k, -1, q.shape[-1], "d_k, must match q")
    check_same_leading(("q", "k"), (q, k), 2)
    if v is not None:
        v = as_float_array("v", v, min_ndim=2)
        check_axis_size("v", v, -2, k.shape[-2], "n_k, must match k")
        check_same_leading(("q", "k", "v"), (q, k, v), 2)
    return q, k, v


def check_mask(mask, scores_shape: tuple[int, ...]) -> np.ndarray:
    """Validate a boolean attention mask (``True`` = may attend) against ``(..., n_q, n_k)``.

    Any shape that broadcasts to the scores without enlarging them is accepted, as in numpy,
    PyTorch and JAX: ``(n_q, n_k)``, a key-padding mask ``(B, 1, 1, n_k)``, a per-query mask
    ``(..., n_q, 1)``.
    """
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(f"mask must be boolean (True = may attend), received dtype {mask.dtype}")
    try:
        ok = np.broadcast_shapes(mask.shape, scores_shape) == tuple(scores_shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {mask.shape} must broadcast to the scores (..., n_q, n_k) = "
            f"{tuple(scores_shape)} without enlarging them"
        )
    return mask


def attention_scores(q, k, scale: float | None = None) -> np.ndarray:
    """Scaled logits ``scale · q kᵀ``; ``scale`` defaults to ``1/sqrt(d_k)``.

    q : (..., n_q, d_k), k : (..., n_k, d_k) → (..., n_q, n_k)
    """
    q, k, _ = check_qkv(q, k)
    scores = _scores(q, k, scale)
    if not np.isfinite(scores).all():
        raise ValueError(_overflow_message(scores.dtype))
    return scores


def _overflow_message(dtype) -> str:
    wider = " or pass them as float64" if dtype != np.float64 else ""
    return (
        f"scale·q·kᵀ overflowed {dtype} (largest finite value {np.finfo(dtype).max:.3g}) "
        f"although q and k are finite: scale q or k down{wider}"
    )


def _cannot_overflow(q: np.ndarray, k: np.ndarray, scale: float | None) -> bool:
    """True when neither ``scale · q`` (formed in q's dtype by :func:`_scores`) nor any partial sum of its
    products with k can reach the largest float of its dtype (Cauchy–Schwarz: ``|Σ a_l b_l| ≤ d·max|a|·max|b|``)."""
    if q.size == 0 or k.size == 0:
        return True
    s = float(np.asarray(default_scale(q.shape[-1]) if scale is None else scale, dtype=q.dtype))  # as _scores rounds it
    q_max = s * float(np.abs(q).max())  # Python floats: inf, not a warning
    if q_max > float(np.finfo(q.dtype).max) / 4:
        return False
    bound = q.shape[-1] * q_max * float(np.abs(k).max())
    return bound <= float(np.finfo(np.result_type(q, k)).max) / 4  # 4: room for rounding


def _scores(q: np.ndarray, k: np.ndarray, scale: float | None, matmul=counted_matmul) -> np.ndarray:
    """:func:`attention_scores` for arrays that are already checked."""
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    # Scaling q (n_q·d_k numbers) is cheaper than scaling the (n_q, n_k) product. An overflow
    # is not warned about here: scaled_dot_product_attention reports it as an error.
    with np.errstate(over="ignore"):
        return matmul(q * np.asarray(scale, dtype=q.dtype), np.swapaxes(k, -1, -2))


def scaled_dot_product_attention(q, k, v, mask=None, scale: float | None = None, *, matmul=counted_matmul):
    """``softmax(scale · q kᵀ) v``, with an optional boolean mask.

    Parameters
    ----------
    q : (..., n_q, d_k)
    k : (..., n_k, d_k)
    v : (..., n_k, d_v)
        Leading axes must be identical for q, k and v. Entries must be finite.
    mask : bool, broadcastable to (..., n_q, n_k), optional
        ``True`` where attention is allowed (e.g. :func:`causal_mask`, or a key-padding mask
        of shape (B, 1, 1, n_k)). A query with every key masked gets zero weights and a zero
        output (documented policy: it attends to nothing); so does every query when ``n_k = 0``.
    scale : float > 0, optional
        Defaults to ``1/sqrt(d_k)`` (per-head key size, not d_model).
    matmul : callable, optional
        What multiplies ``q kᵀ`` and ``weights v``: by default ``a @ b`` recorded by any active
        ``au.count_macs()`` (``with au.count_macs() as c:`` around this call
        counts its ``n_q·n_k·(d_k + d_v)`` multiply-adds per batch and head).

    Returns
    -------
    output : (..., n_q, d_v)
    weights : (..., n_q, n_k)

    Computed in the inputs' common float dtype (float16, float32 or float64). If finite
    inputs give a score that overflows that dtype, ``ValueError`` says so instead of
    returning NaN weights.
    """
    q, k, v = check_qkv(q, k, v)
    if mask is not None:
        mask = check_mask(mask, (*q.shape[:-1], k.shape[-2]))
    scores = _scores(q, k, scale, matmul)  # (..., n_q, n_k)
    # With finite q and k, -inf (or NaN, from +inf and -inf partial sums) can only come from an overflow, and
    # softmax would read -inf as "masked": refused, as attention_scores refuses it. Every partial sum of
    # scale·q·k is at most scale·d_k·max|q|·max|k| in size; when that is far below the largest float, no
    # score can overflow and the scan of the (n_q, n_k) scores (a tenth of the forward pass) is skipped.
    if scores.size and not _cannot_overflow(q, k, scale) and not np.isfinite(scores.min()):
        raise ValueError(_overflow_message(scores.dtype))
    try:
        weights = softmax_inplace(scores, mask=mask)  # scores is ours to overwrite
    except FloatingPointError:
        raise ValueError(_overflow_message(scores.dtype)) from None
    return matmul(weights, v), weights


def attention_query_jacobian(q, k, v, scale: float | None = None) -> np.ndarray:
    """Jacobian ``∂o/∂q`` of one attention output with respect to its query.

    With ``p = softmax(s K q)`` and ``o = Vᵀ p`` the chain rule gives
    ``∂o/∂q = s · Vᵀ (diag(p) − p pᵀ) K = s · Cov_p(v, k)``, the covariance under ``p`` of a
    key's value and the key. For ``V = K`` this is ``s`` times the covariance matrix of the keys.

    It is evaluated as a covariance centred on the most-attended key ``w``:
    ``Σ_j p_j (v_j − v_w)(k_j − k_w)ᵀ − (o − v_w)(k̄ − k_w)ᵀ``. Every term carries a weight
    ``p_j`` of a key ``j ≠ w`` (the ``j = w`` term is exactly zero), so the result keeps its
    relative accuracy when ``p`` is within rounding of one-hot. (``diag(p) − p pᵀ`` formed
    from ``p`` would lose the entry ``p_w (1 − p_w)`` there: ``1 − p_w`` rounds to 0.)
    Centring is exact because ``Σ_j p_j (v_j − a)(k_j − b)ᵀ − (o − a)(k̄ − b)ᵀ = Σ_j p_j v_j k_jᵀ − o k̄ᵀ``
    for any fixed ``a, b`` when ``Σ_j p_j = 1`` (chapter 3, eq-ch3-centred). Near uniform ``p`` over
    many keys the two centred terms partly cancel: the relative error grows like ``n·ε``.

    q : (..., d_k), k : (..., n_k, d_k), v : (..., n_k, d_v) → (..., d_v, d_k)
    """
    q = as_float_array("q", q, min_ndim=1)
    _, p = scaled_dot_product_attention(q[..., None, :], k, v, scale=scale)
    s = default_scale(q.shape[-1]) if scale is None else float(scale)
    p = p[..., 0, :]  # (..., n_k)
    k, v = np.asarray(k, dtype=p.dtype), np.asarray(v, dtype=p.dtype)
    top = np.argmax(p, axis=-1)[..., None, None]  # the most-attended key w
    dk = k - np.take_along_axis(k, top, axis=-2)  # k_j − k_w; row w is exactly 0
    dv = v - np.take_along_axis(v, top, axis=-2)  # v_j − v_w
    mean_dk = np.einsum("...j,...jd->...d", p, dk)  # k̄ − k_w
    mean_dv = np.einsum("...j,...je->...e", p, dv)  # o − v_w
    cov = np.swapaxes(dv * p[..., None], -1, -2) @ dk - mean_dv[..., :, None] * mean_dk[..., None, :]
    return s * cov
