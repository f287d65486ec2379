"""Scaled dot-product attention and the masks it uses.

Shapes: batch and head axes lead, sequence and feature axes come last.
``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``.
"""
from __future__ import annotations

import numpy as np

from .softmax import softmax_inplace, softmax_jacobian
from .threads import n_workers, single_thread_blas, worker_pool
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


def _check_qkv(q, k, v):
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    check_axis_size("k", k, -1, q.shape[-1], "d_k, must match q")
    check_same_leading(("q", "k"), (q, k), 2)
    if v is not None:
        v = as_float_array("v", v, min_ndim=2)
        check_axis_size("v", v, -2, k.shape[-2], "n_k, must match k")
        check_same_leading(("q", "k", "v"), (q, k, v), 2)
    return q, k, v


def attention_scores(q, k, scale: float | None = None) -> np.ndarray:
    """Scaled logits ``scale · q kᵀ``; ``scale`` defaults to ``1/sqrt(d_k)``.

    q : (..., n_q, d_k), k : (..., n_k, d_k) → (..., n_q, n_k)
    """
    q, k, _ = _check_qkv(q, k, None)
    return _scores(q, k, scale)


def _scores(q: np.ndarray, k: np.ndarray, scale: float | None) -> np.ndarray:
    """:func:`attention_scores` for arrays that are already checked."""
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    # Scaling q (n_q·d_k numbers) is cheaper than scaling the (n_q, n_k) product.
    return (q * np.asarray(scale, dtype=q.dtype)) @ np.swapaxes(k, -1, -2)


def _check_mask(mask, scores_shape):
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(f"mask must be boolean (True = may attend), received dtype {mask.dtype}")
    if mask.ndim < 2 or mask.shape[-2:] != scores_shape[-2:]:
        raise ValueError(f"mask must end in (n_q, n_k) = {scores_shape[-2:]}, received shape {mask.shape}")
    try:
        if np.broadcast_shapes(mask.shape, scores_shape) != scores_shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"mask of shape {mask.shape} does not broadcast to scores of shape {scores_shape}") from None
    return mask


def scaled_dot_product_attention(q, k, v, mask=None, scale: float | None = None):
    """``softmax(scale · q kᵀ) v`` with optional boolean mask.

    Parameters
    ----------
    q : (..., n_q, d_k)
    k : (..., n_k, d_k)
    v : (..., n_k, d_v)
        Leading axes must be identical for q, k and v.
    mask : bool (..., n_q, n_k), optional
        ``True`` where attention is allowed; broadcast over leading axes.
        A query with every key masked gets zero weights and a zero output.
    scale : float > 0, optional
        Defaults to ``1/sqrt(d_k)`` (per-head key size, not d_model).

    Returns
    -------
    output : (..., n_q, d_v)
    weights : (..., n_q, n_k)
    """
    q, k, v = _check_qkv(q, k, v)
    shape = (*q.shape[:-1], k.shape[-2])
    if mask is not None:
        mask = _check_mask(mask, shape)
    if np.prod(shape) >= _FUSED_MIN_SIZE and n_workers() > 1:
        return _fused_attention(q, k, v, mask, scale)
    scores = _scores(q, k, scale)
    weights = softmax_inplace(scores, axis=-1, mask=mask)  # scores is ours to overwrite
    return weights @ v, weights


# Above this many scores, attention is computed tile by tile on all cores: each worker takes a
# block of query rows of one (batch, head), multiplies, normalises and applies the values while the
# tile is still in cache. Same arithmetic as the plain path (equal to rounding, tested), but the
# elementwise softmax passes no longer stream the whole (…, n_q, n_k) array through memory.
_FUSED_MIN_SIZE = 1 << 21
_TILE_ENTRIES = 1 << 20  # measured best on 2 cores between 2**18 and 2**21 (benchmarks/run.py)


def _fused_attention(q, k, v, mask, scale):
    """Tiled, multi-threaded :func:`scaled_dot_product_attention` for checked, large inputs."""
    dtype = np.result_type(q, k, v)
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    lead = q.shape[:-2]
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    qf = (q * np.asarray(scale, dtype=q.dtype)).astype(dtype, copy=False).reshape(-1, n_q, q.shape[-1])
    kt = np.swapaxes(k.astype(dtype, copy=False).reshape(-1, n_k, k.shape[-1]), -1, -2)
    vf = v.astype(dtype, copy=False).reshape(-1, n_k, d_v)
    keep = None if mask is None else np.broadcast_to(mask, (*lead, n_q, n_k)).reshape(-1, n_q, n_k)
    weights = np.empty((qf.shape[0], n_q, n_k), dtype=dtype)
    out = np.empty((qf.shape[0], n_q, d_v), dtype=dtype)
    rows = max(1, _TILE_ENTRIES // n_k)

    def tile(job):
        i, r = job
        w = weights[i, r:r + rows]
        np.matmul(qf[i, r:r + rows], kt[i], out=w)
        softmax_inplace(w, mask=None if keep is None else keep[i, r:r + rows])
        np.matmul(w, vf[i], out=out[i, r:r + rows])

    jobs = [(i, r) for i in range(qf.shape[0]) for r in range(0, n_q, rows)]
    with single_thread_blas():  # the workers are the parallelism; BLAS threads would compete
        list(worker_pool().map(tile, jobs))
    return out.reshape(*lead, n_q, d_v), weights.reshape(*lead, n_q, n_k)


def attention_query_jacobian(q, k, v, scale: float | None = None) -> np.ndarray:
    """Jacobian ``∂o/∂q`` of one attention output with respect to its query.

    With ``p = softmax(s K q)`` and ``o = Vᵀ p`` the chain rule gives
    ``∂o/∂q = s · Vᵀ (diag(p) − p pᵀ) K``. For ``V = K`` this is ``s`` times the
    covariance matrix of the keys under ``p``.

    q : (..., d_k), k : (..., n_k, d_k), v : (..., n_k, d_v) → (..., d_v, d_k)
    """
    q = as_float_array("q", q, min_ndim=1)
    out, p = scaled_dot_product_attention(q[..., None, :], k, v, scale=scale)
    s = default_scale(q.shape[-1]) if scale is None else float(scale)
    jac = softmax_jacobian(p[..., 0, :])
    return s * np.swapaxes(v, -1, -2) @ jac @ k
