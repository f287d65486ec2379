"""Chapter 20 — FlashAttention in practice: causal tiles, split-KV decoding, the backward pass.

Everything here sits on chapter 12's loop (:func:`~attn_utils.experiments.ch12_blocked.blocked_attention`):

* :func:`causal_tile_counts` — which tiles a causal mask skips, masks elementwise or leaves full,
  predicted from the block sizes alone (the chapter compares it with what the loop counted);
* :class:`Partial`, :func:`partial_attention`, :func:`merge` — attention over a subset of the keys
  as ``(output, log-sum-exp)`` and the exact rule that merges two subsets (split-KV, Flash-Decoding);
* :func:`ring_attention` — the same merge over ``P`` simulated devices that pass key/value blocks
  around a ring, with the words each device sends counted;
* :func:`flash_backward` — the gradient of attention from ``Q, K, V, O, dO`` and the row log-sum-exp
  ``L`` only, recomputing each tile of the weights (FlashAttention's backward pass).

Shapes follow :mod:`attn_utils.attention`: ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..attention import check_qkv, default_scale
from ..book.measuring import count_macs, counted_matmul
from ..validation import positive_int, positive_scalar
from .ch12_blocked import blocked_attention

# ---------------------------------------------------------------- causal tiles


@dataclass(frozen=True)
class CausalTiles:
    """Tiles of an ``n × n`` causal attention cut into ``block_q × block_k`` tiles."""

    skipped: int  # every entry masked: never computed
    masked: int  # the diagonal crosses it: computed, then masked elementwise
    full: int  # no entry masked
    computed_entries: int  # logits computed (entries of the computed tiles)

    @property
    def total(self) -> int:
        return self.skipped + self.masked + self.full


def causal_tile_counts(n: int, block_q: int, block_k: int) -> CausalTiles:
    """Predict the tile counts of causal self-attention from the block sizes alone (no loop over tiles).

    Query block ``i`` holds rows ``[i·b_q, min((i+1)·b_q, n))``; its last row sees keys ``0 … r_i - 1`` with
    ``r_i = min((i+1)·b_q, n)``, so it computes the first ``⌈r_i / b_k⌉`` key blocks; a key block is
    full when its last key is at most the block's first row ``i·b_q``.
    """
    n, block_q, block_k = positive_int("n", n), positive_int("block_q", block_q), positive_int("block_k", block_k)
    starts = np.arange(0, n, block_q)
    stops = np.minimum(starts + block_q, n)
    key_ends = np.minimum(np.arange(block_k, n + block_k, block_k), n)  # last key + 1 of each key block
    computed = -(-stops // block_k)  # ⌈r_i / b_k⌉ key blocks per query block
    full = (key_ends[None, :] <= starts[:, None] + 1).sum(axis=1)
    n_key_blocks = len(key_ends)
    entries = int(((stops - starts) * np.minimum(computed * block_k, n)).sum())
    return CausalTiles(
        skipped=int((n_key_blocks - computed).sum()),
        masked=int((computed - full).sum()),
        full=int(full.sum()),
        computed_entries=entries,
    )


# ---------------------------------------------------------------- split-KV: partial results and their merge


class Partial(NamedTuple):
    """Attention of some queries over a subset of the keys.

    out : (..., n_q, d_v) the normalised output over that subset (0 where the query sees none of it)
    lse : (..., n_q) ``L = m + log ℓ``, the log-sum-exp of the query's logits over the subset
        (``-inf`` where it sees none). ``(m, ℓ)`` enter the merge only through ``L``.
    """

    out: np.ndarray
    lse: np.ndarray


def partial_attention(q, k, v, scale: float | None = None, *, mask=None, block_size: int | None = None) -> Partial:
    """Attention over the given keys only, as a :class:`Partial` (chapter 12's loop, one pass)."""
    q, k, v = check_qkv(q, k, v)
    if scale is None:
        scale = default_scale(q.shape[-1])
    n_k = k.shape[-2]
    if n_k == 0:
        lead_q = q.shape[:-1]
        return Partial(np.zeros(lead_q + (v.shape[-1],), dtype=q.dtype), np.full(lead_q, -np.inf))
    out, stats = blocked_attention(q, k, v, block_size or n_k, mask=mask, scale=scale, return_stats=True)
    return Partial(out, stats.lse)


def merge(a: Partial, b: Partial) -> Partial:
    """Merge the partial results of two disjoint key sets into the result over their union.

    ``L = M + log(e^{L_a - M} + e^{L_b - M})`` with ``M = max(L_a, L_b)`` (``np.logaddexp``),
    ``out = e^{L_a - L} out_a + e^{L_b - L} out_b``. Exponents are never positive, so large logits cannot
    overflow; a part with ``L = -inf`` (no visible key) gets weight 0.
    """
    if not isinstance(a, Partial) or not isinstance(b, Partial):
        raise TypeError(f"merge needs two Partial results, received {type(a).__name__} and {type(b).__name__}")
    if a.out.shape != b.out.shape:
        raise ValueError(f"partial outputs must have one shape, received {a.out.shape} and {b.out.shape}")
    lse = np.logaddexp(a.lse, b.lse)
    seen = np.isfinite(lse)
    ref = np.where(seen, lse, 0.0)
    w_a = np.where(seen, np.exp(a.lse - ref), 0.0)[..., None]
    w_b = np.where(seen, np.exp(b.lse - ref), 0.0)[..., None]
    return Partial(w_a * a.out + w_b * b.out, lse)


def merge_in_random_tree(parts, rng: np.random.Generator) -> Partial:
    """Merge a list of partial results in a random order with a random bracketing.

    Repeatedly picks two of the remaining results at random (in a random order) and replaces them by
    their merge: every binary tree over every ordering can occur.
    """
    pool = list(parts)
    if not pool:
        raise ValueError("merge_in_random_tree needs at least one partial result, received none")
    while len(pool) > 1:
        i, j = rng.choice(len(pool), size=2, replace=False)
        merged = merge(pool[i], pool[j])
        pool = [p for t, p in enumerate(pool) if t not in (i, j)] + [merged]
    return pool[0]


def random_split(n: int, n_parts: int, rng: np.random.Generator) -> np.ndarray:
    """Cut points ``0 = c_0 ≤ c_1 ≤ … ≤ c_P = n`` drawn at random (empty parts allowed)."""
    n, n_parts = positive_int("n", n), positive_int("n_parts", n_parts)
    inner = np.sort(rng.integers(0, n + 1, size=n_parts - 1))
    return np.concatenate([[0], inner, [n]])


def split_kv_attention(q, k, v, cuts, rng: np.random.Generator, scale: float | None = None) -> Partial:
    """Split-KV attention: one partial result per key range ``[cuts[t], cuts[t+1])``, merged in a random tree."""
    parts = [partial_attention(q, k[..., a:b, :], v[..., a:b, :], scale) for a, b in zip(cuts[:-1], cuts[1:])]
    return merge_in_random_tree(parts, rng)


def decode_work_units(batch: int, heads: int, n_q: int, block_q: int, splits: int = 1) -> int:
    """Independent thread blocks of a forward kernel that parallelises over batch, heads, query blocks and
    (split-KV) key splits: ``batch · heads · ⌈n_q / block_q⌉ · splits``."""
    batch, heads, n_q = positive_int("batch", batch), positive_int("heads", heads), positive_int("n_q", n_q)
    block_q, splits = positive_int("block_q", block_q), positive_int("splits", splits)
    return batch * heads * -(-n_q // block_q) * splits


# ---------------------------------------------------------------- Ring Attention, simulated


@dataclass(frozen=True)
class RingStats:
    """What each simulated device did in :func:`ring_attention` (arrays of length ``P``)."""

    words_sent: np.ndarray  # key/value numbers sent to the next device
    peak_kv_words: np.ndarray  # most key/value numbers held at once (own block in use + the one arriving)
    blocks_computed: np.ndarray  # (query block, key block) pairs computed, skipped ones not counted
    macs: np.ndarray  # multiply-adds of the products, counted as they ran


def ring_attention(q, k, v, n_devices: int, *, causal: bool = False, scale: float | None = None):
    """Self-attention over ``P`` simulated devices on a ring (Ring Attention, Liu et al., arXiv:2310.01889).

    Device ``p`` holds the ``p``-th of ``P`` equal row blocks of ``Q``, ``K`` and ``V``. At step
    ``s = 0 … P-1`` it computes the partial result of its queries against the key/value block it holds
    (originally device ``(p - s) mod P``'s), merges it into its running :class:`Partial`, and sends the block
    to device ``p + 1`` (no send after the last step). With ``causal``, a block entirely in a query block's
    future is skipped and the diagonal block is masked elementwise.

    q, k, v : (n, d_k), (n, d_k), (n, d_v) with ``P`` dividing ``n``.
    Returns ``(output (n, d_v), RingStats)``.
    """
    q, k, v = check_qkv(q, k, v)
    n_devices = positive_int("n_devices", n_devices)
    if q.ndim != 2 or q.shape[0] != k.shape[0]:
        raise ValueError(f"ring_attention needs self-attention inputs (n, d), received {q.shape} and {k.shape}")
    n = q.shape[0]
    if n % n_devices:
        raise ValueError(f"n_devices must divide n, received n = {n}, n_devices = {n_devices}")
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    b = n // n_devices
    rows = [slice(p * b, (p + 1) * b) for p in range(n_devices)]
    queries = [q[r] for r in rows]
    held = [(p, k[r], v[r]) for p, r in enumerate(rows)]  # (origin, key block, value block) on device p
    state = [Partial(np.zeros((b, v.shape[1])), np.full(b, -np.inf)) for _ in range(n_devices)]
    sent, blocks, macs = (np.zeros(n_devices, dtype=np.int64) for _ in range(3))
    peak = np.zeros(n_devices, dtype=np.int64)
    for step in range(n_devices):
        for p in range(n_devices):
            origin, k_blk, v_blk = held[p]
            incoming = k_blk.size + v_blk.size if step < n_devices - 1 else 0  # the block arriving meanwhile
            peak[p] = max(peak[p], k_blk.size + v_blk.size + incoming)
            if causal and origin > p:
                continue  # every key of this block comes after every query of device p
            mask = np.tril(np.ones((b, b), dtype=bool)) if causal and origin == p else None
            with count_macs() as counter:
                part = partial_attention(queries[p], k_blk, v_blk, scale, mask=mask)
            macs[p] += counter.macs
            blocks[p] += 1
            state[p] = merge(state[p], part)
        if step < n_devices - 1:  # every device sends what it holds to the next one
            for p in range(n_devices):
                sent[p] += held[p][1].size + held[p][2].size
            held = [held[(p - 1) % n_devices] for p in range(n_devices)]
    out = np.concatenate([s.out for s in state])
    return out, RingStats(sent, peak, blocks, macs)


# ---------------------------------------------------------------- the backward pass


@dataclass(frozen=True)
class BackwardStats:
    """What :func:`flash_backward` computed: tiles visited and the largest temporary it held."""

    n_tiles: int
    n_tiles_skipped: int
    largest_tile: int  # entries of the largest (b_q, b_k) tile of recomputed weights


def flash_backward(q, k, v, out, lse, d_out, block_size: int, *, causal: bool = False, scale: float | None = None):
    """Gradients ``dQ, dK, dV`` of attention from ``Q, K, V, O, dO`` and the row log-sum-exp ``L`` only.

    Per tile, with ``s`` the scale: ``P_ij = exp(s Q_i K_jᵀ − L_i)`` (recomputed, masked entries 0),
    ``dV_j += P_ijᵀ dO_i``, ``dP_ij = dO_i V_jᵀ``, ``dS_ij = P_ij ∘ (dP_ij − D_i)`` with
    ``D = rowsum(dO ∘ O)``, ``dQ_i += s dS_ij K_j``, ``dK_j += s dS_ijᵀ Q_i``. Key blocks are the outer
    loop (each ``dK_j, dV_j`` is finished in one pass, as in FlashAttention-2's backward); query blocks
    the inner. No array of ``n_q × n_k`` entries is formed.

    q, k, v : (..., n, d_k), (..., n_k, d_k), (..., n_k, d_v); out, d_out : (..., n, d_v); lse : (..., n)
    block_size : tile side ``b_q = b_k``. causal : queries aligned with the last keys, as chapter 12.
    Returns ``(dq, dk, dv, BackwardStats)``.
    """
    q, k, v = check_qkv(q, k, v)
    block = positive_int("block_size", block_size)
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    out, d_out, lse = (np.asarray(x, dtype=float) for x in (out, d_out, lse))
    n_q, n_k = q.shape[-2], k.shape[-2]
    for name, x, shape in (
        ("out", out, q.shape[:-1] + (v.shape[-1],)),
        ("d_out", d_out, q.shape[:-1] + (v.shape[-1],)),
        ("lse", lse, q.shape[:-1]),
    ):
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, received {x.shape}")
    if causal and n_k < n_q:
        raise ValueError(f"causal attention needs n_k >= n_q, received n_q={n_q}, n_k={n_k}")
    offset = n_k - n_q
    D = (d_out * out).sum(axis=-1, keepdims=True)  # (..., n_q, 1): the row term
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    n_tiles = n_skipped = largest = 0
    for k0 in range(0, n_k, block):
        cols = slice(k0, min(k0 + block, n_k))
        k_j, v_j = k[..., cols, :], v[..., cols, :]
        for q0 in range(0, n_q, block):
            rows = slice(q0, min(q0 + block, n_q))
            if causal and k0 > offset + rows.stop - 1:
                n_skipped += 1
                continue
            s_ij = counted_matmul(q[..., rows, :], np.swapaxes(k_j, -1, -2)) * scale
            p_ij = np.exp(s_ij - np.where(np.isfinite(lse[..., rows]), lse[..., rows], 0.0)[..., None])
            if causal:
                key_pos = np.arange(cols.start, cols.stop)[None, :]
                tri = key_pos <= np.arange(offset + rows.start, offset + rows.stop)[:, None]
                p_ij = np.where(tri, p_ij, 0.0)
            dv[..., cols, :] += counted_matmul(np.swapaxes(p_ij, -1, -2), d_out[..., rows, :])
            dp_ij = counted_matmul(d_out[..., rows, :], np.swapaxes(v_j, -1, -2))
            ds_ij = p_ij * (dp_ij - D[..., rows, :])
            dq[..., rows, :] += scale * counted_matmul(ds_ij, k_j)
            dk[..., cols, :] += scale * counted_matmul(np.swapaxes(ds_ij, -1, -2), q[..., rows, :])
            n_tiles += 1
            largest = max(largest, p_ij.shape[-1] * p_ij.shape[-2])
            del s_ij, p_ij, dp_ij, ds_ij
    return dq, dk, dv, BackwardStats(n_tiles, n_skipped, largest)


def saved_for_backward(n: int, d: int, *, heads: int = 1, flash: bool = True) -> int:
    """Numbers a forward pass keeps for its backward pass beyond ``Q, K, V`` (one sequence, ``heads`` heads):
    ``O`` and ``L`` (``n·d + n`` per head) for FlashAttention, ``O`` and ``P`` (``n·d + n²``) for standard attention."""
    n, d, heads = positive_int("n", n), positive_int("d", d), positive_int("heads", heads)
    return heads * (n * d + (n if flash else n * n))


__all__ = [
    "CausalTiles",
    "causal_tile_counts",
    "Partial",
    "partial_attention",
    "merge",
    "merge_in_random_tree",
    "random_split",
    "split_kv_attention",
    "decode_work_units",
    "RingStats",
    "ring_attention",
    "BackwardStats",
    "flash_backward",
    "saved_for_backward",
]
