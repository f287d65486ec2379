"""Chapter 12 — attention computed block by block with an online softmax, never forming the n×n matrix.

The keys are visited in blocks of ``block_size``. For every query the function keeps three
running quantities (the *online softmax* state):

* ``m``   — the largest logit seen so far,
* ``ℓ``   — ``Σ_j exp(z_j − m)`` over the keys seen so far,
* ``acc`` — ``Σ_j exp(z_j − m) v_j`` over the keys seen so far (an unnormalised output).

When a block raises the maximum from ``m_old`` to ``m_new``, the old ``ℓ`` and ``acc`` are
multiplied by ``exp(m_old − m_new)`` so that they refer to the new maximum; the block's own
terms are then added. At the end ``acc / ℓ`` is exactly ``softmax(z) V``. The largest temporary
array is one ``(n_q_block, block_size)`` tile of logits, instead of ``(n_q, n_k)``.

Shapes follow :mod:`attn_utils.attention`: ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``,
``v (..., n_k, d_v)`` with identical leading (batch/head) axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attention import check_mask, check_qkv, default_scale
from ..validation import positive_int, positive_scalar


@dataclass(frozen=True)
class BlockedAttentionStats:
    """What :func:`blocked_attention` did, counted from the shapes it actually processed.

    Attributes
    ----------
    lse : (..., n_q) array
        Log-sum-exp of each query's (scaled, masked) logits, ``m + log ℓ``; ``-inf`` for a
        query that sees no key. Enough to merge partial results or to recompute weights.
    n_tiles : int
        Number of (query block, key block) tiles computed.
    n_tiles_skipped : int
        Tiles skipped because every entry of the tile was masked.
    matmul_flops : int
        Floating-point operations in the two products per tile, ``2·b_q·b_k·d_k`` for the
        logits and ``2·b_q·b_k·d_v`` for the weighted values, summed over tiles and leading axes.
    exp_evaluations : int
        Calls of ``exp`` on individual numbers: ``b_q·b_k`` per tile plus ``b_q`` for the
        rescaling factor.
    rescale_flops : int
        Extra multiplications that exact one-pass softmax does not need: ``b_q·(d_v + 1)`` per
        tile, the rescaling of ``acc`` and ``ℓ`` by ``exp(m_old − m_new)``.
    n_max_increases : int
        Number of (query, tile) pairs in which an already finite running maximum increased,
        i.e. in which the rescaling factor differs from exactly 1 (summed over leading axes).
    """

    lse: np.ndarray
    n_tiles: int
    n_tiles_skipped: int
    matmul_flops: int
    exp_evaluations: int
    rescale_flops: int
    n_max_increases: int


def blocked_attention(
    q,
    k,
    v,
    block_size,
    mask=None,
    scale: float | None = None,
    *,
    causal: bool = False,
    query_block_size: int | None = None,
    return_stats: bool = False,
):
    """Exact ``softmax(scale · q kᵀ) v`` computed one key block at a time (online softmax).

    Parameters
    ----------
    q : (..., n_q, d_k)
    k : (..., n_k, d_k)
    v : (..., n_k, d_v)
        Leading axes must be identical for q, k and v. Computation runs in the input's
        floating dtype (float32 inputs give float32 accumulators).
    block_size : int ≥ 1
        Number of keys per block; need not divide ``n_k`` (the last block is shorter).
    mask : bool (..., n_q, n_k), optional
        ``True`` where attention is allowed, broadcast over leading axes, exactly as in
        :func:`attn_utils.scaled_dot_product_attention`.
    scale : float > 0, optional
        Defaults to ``1/sqrt(d_k)``.
    causal : bool
        Apply the causal mask of :func:`attn_utils.causal_mask` (queries aligned with the last
        ``n_q`` keys) without building it: each tile makes its own ``(b_q, b_k)`` piece.
        Combined with ``mask`` by logical and. Requires ``n_k ≥ n_q``.
    query_block_size : int ≥ 1, optional
        Also split the queries into blocks of this size (default: all queries at once). Only
        with query blocks can whole tiles be skipped under a causal mask.
    return_stats : bool
        Also return a :class:`BlockedAttentionStats`.

    Returns
    -------
    output : (..., n_q, d_v)
        Equal to ``scaled_dot_product_attention(q, k, v, mask, scale)[0]`` up to rounding. A
        query with every key masked gets a zero output, as there.
    stats : BlockedAttentionStats
        Only when ``return_stats``.
    """
    q, k, v = check_qkv(q, k, v)
    block_size = positive_int("block_size", block_size)
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, received {type(causal).__name__}")
    lead, (n_q, d_k), n_k, d_v = q.shape[:-2], q.shape[-2:], k.shape[-2], v.shape[-1]
    q_block = max(n_q, 1) if query_block_size is None else positive_int("query_block_size", query_block_size)
    if mask is not None:
        mask = np.broadcast_to(check_mask(mask, lead + (n_q, n_k)), lead + (n_q, n_k))  # a view; tiles slice it
    if causal and n_k < n_q:
        raise ValueError(f"causal attention needs n_k >= n_q, received n_q={n_q}, n_k={n_k}")
    offset = n_k - n_q  # query i sits at absolute position offset + i
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)

    out = np.empty(lead + (n_q, d_v), dtype=dtype)
    lse = np.empty(lead + (n_q,), dtype=dtype)
    n_lead = int(np.prod(lead, dtype=np.int64))
    n_tiles = n_skipped = matmul_flops = n_exp = rescale_flops = n_increases = 0

    for q0 in range(0, n_q, q_block):
        q1 = min(q0 + q_block, n_q)
        qi = q[..., q0:q1, :]
        bq = q1 - q0
        m = np.full(lead + (bq, 1), -np.inf, dtype=dtype)  # running maximum
        ell = np.zeros(lead + (bq, 1), dtype=dtype)  # running Σ exp(z − m)
        acc = out[..., q0:q1, :]  # running Σ exp(z − m) v, kept in the output
        acc[...] = 0.0
        for k0 in range(0, n_k, block_size):
            k1 = min(k0 + block_size, n_k)
            keep = None if mask is None else mask[..., q0:q1, k0:k1]
            if causal:
                if k0 > offset + q1 - 1:  # no query of this block sees any key of this block
                    n_skipped += 1
                    continue
                tri = np.arange(k0, k1)[None, :] <= np.arange(offset + q0, offset + q1)[:, None]
                keep = tri if keep is None else keep & tri
            if keep is not None and not keep.any():
                n_skipped += 1
                continue
            bk = k1 - k0
            s = qi @ np.swapaxes(k[..., k0:k1, :], -1, -2)  # (..., bq, bk): the only tile in memory
            s *= scale
            if keep is not None:
                np.copyto(s, -np.inf, where=~keep)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            n_increases += int(np.count_nonzero((m_new > m) & np.isfinite(m)))
            m_ref = np.where(np.isfinite(m_new), m_new, 0.0)  # rows that have seen nothing stay at 0
            alpha = np.exp(m - m_ref)  # exp(m_old − m_new); 0 when m_old = −inf
            s -= m_ref
            p = np.exp(s, out=s)  # masked logits give exactly 0
            ell *= alpha
            ell += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ v[..., k0:k1, :]
            del s, p  # free the tile before the next one exists
            m = m_new
            n_tiles += 1
            matmul_flops += n_lead * 2 * bq * bk * (d_k + d_v)
            n_exp += n_lead * (bq * bk + bq)
            rescale_flops += n_lead * bq * (d_v + 1)
        seen = ell > 0
        acc /= np.where(seen, ell, 1.0)  # rows with no visible key stay 0
        lse[..., q0:q1] = np.where(seen, m + np.log(np.where(seen, ell, 1.0)), -np.inf)[..., 0]

    if not return_stats:
        return out
    return out, BlockedAttentionStats(lse, n_tiles, n_skipped, matmul_flops, n_exp, rescale_flops, n_increases)


__all__ = ["blocked_attention", "BlockedAttentionStats"]
