"""Chapter 14 — where order comes from: the position schemes of attention, each next to its formula.

Positions are integers ``i`` (query) and ``j`` (key), counted from 0. Shapes follow the core:
``x (..., n, d)`` with the sequence axis second to last.

* absolute, added to the input: :func:`sinusoidal_positions` (Vaswani et al. 2017, section 3.5)
  and :func:`learned_position_table`, both used through :func:`add_positions`;
* relative, inside the score: :func:`relative_scores` (Shaw et al. 2018, clipped offsets);
* rotary: :func:`rope` rotates q and k (Su et al., RoFormer); :func:`rope_matrix` is the same
  rotation written as an explicit block-diagonal matrix;
* a bias on the score: :func:`alibi_slopes`, :func:`alibi_bias` (Press et al., ALiBi), used
  through :func:`biased_attention`.
"""

from __future__ import annotations

import numpy as np

from ..attention import default_scale
from ..multihead import multi_head_attention
from ..softmax import softmax
from ..validation import as_float_array, positive_int


def _even(name: str, d) -> int:
    d = positive_int(name, d)
    if d % 2:
        raise ValueError(f"{name} must be even (features come in pairs), received {name}={d}")
    return d


def _positions(positions, n: int) -> np.ndarray:
    """Integer or real positions, shape (n,); ``None`` means 0 … n−1."""
    if positions is None:
        return np.arange(n, dtype=float)
    pos = np.asarray(positions, dtype=float)
    if pos.shape != (n,):
        raise ValueError(f"positions must have shape (n,) = ({n},), received shape {pos.shape}")
    return pos


# ------------------------------------------------------------------ absolute positions, added to x


def sinusoid_frequencies(d: int, base: float = 10000.0) -> np.ndarray:
    """``ω_c = base^(−2c/d)`` for ``c = 0 … d/2 − 1``: wavelengths ``2π/ω_c`` from 2π to almost 2π·base."""
    d = _even("d", d)
    return base ** (-2.0 * np.arange(d // 2) / d)


def sinusoidal_positions(n: int, d: int, base: float = 10000.0) -> np.ndarray:
    """``PE[i, 2c] = sin(i ω_c)``, ``PE[i, 2c+1] = cos(i ω_c)``: the Transformer's fixed code, (n, d)."""
    n = positive_int("n", n)
    angle = np.arange(n)[:, None] * sinusoid_frequencies(d, base)[None, :]  # (n, d/2): i·ω_c
    pe = np.empty((n, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe


def learned_position_table(rng: np.random.Generator, n_max: int, d: int, std: float = 1.0) -> np.ndarray:
    """A learned table at initialisation: one free row per position ``0 … n_max − 1``, entries N(0, std²)."""
    return rng.normal(0.0, std, (positive_int("n_max", n_max), positive_int("d", d)))


def add_positions(x, table) -> np.ndarray:
    """``x_i + P_i`` for the first ``n`` rows of a position table ``P`` (n_max, d); x : (..., n, d).

    A table has no row for a position it was not given: ``n > n_max`` raises ``ValueError``.
    """
    x = as_float_array("x", x, min_ndim=2)
    table = as_float_array("table", table, min_ndim=2)
    n = x.shape[-2]
    if n > table.shape[0]:
        raise ValueError(f"x has n={n} positions but the table has rows for only {table.shape[0]}")
    if table.shape[1] != x.shape[-1]:
        raise ValueError(f"table width {table.shape[1]} must equal the feature size of x, {x.shape[-1]}")
    return x + table[:n]


# ------------------------------------------------------------------ rotary positions (RoPE)


def rope_frequencies(d_k: int, base: float = 10000.0) -> np.ndarray:
    """``θ_c = base^(−2c/d_k)``, ``c = 0 … d_k/2 − 1``: the angle per position step of feature pair c."""
    return sinusoid_frequencies(d_k, base)


def rope(x, positions=None, base: float = 10000.0, pairing: str = "adjacent") -> np.ndarray:
    """Rotate each feature pair of ``x_i`` by the angle ``i·θ_c``: ``R_i x_i``.

    x : (..., n, d_k) queries or keys; positions : (n,) (default 0 … n−1).
    pairing : ``"adjacent"`` rotates features (2c, 2c+1), as in the RoFormer paper; ``"half"``
        rotates (c, c + d_k/2). The two differ by a fixed permutation of the features.

    Each pair ``(a, b)`` becomes ``(a cos φ − b sin φ, a sin φ + b cos φ)`` with ``φ = i·θ_c``.
    """
    x = as_float_array("x", x, min_ndim=2)
    d_k = _even("d_k (last axis of x)", x.shape[-1])
    phi = _positions(positions, x.shape[-2])[:, None] * rope_frequencies(d_k, base)[None, :]  # (n, d_k/2)
    cos, sin = np.cos(phi), np.sin(phi)
    if pairing == "adjacent":
        a, b = x[..., 0::2], x[..., 1::2]
    elif pairing == "half":
        a, b = x[..., : d_k // 2], x[..., d_k // 2 :]
    else:
        raise ValueError(f"pairing must be 'adjacent' or 'half', received {pairing!r}")
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if pairing == "adjacent":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : d_k // 2], out[..., d_k // 2 :] = ra, rb
    return out


def rope_offset_scores(q, k, offsets, base: float = 10000.0) -> np.ndarray:
    """Unscaled RoPE scores ``q·R_δ k`` of paired rows of ``q`` and ``k`` at many offsets, without rotating copies.

    q, k : (P, d_k) one query and one key per row; offsets : (O,). Returns (P, O). Reading each feature
    pair (adjacent pairing) as a complex number ``z = a + ib``, a rotation by ``φ`` is ``z e^{iφ}`` and a
    2-D dot product is ``Re(conj(z_q) z_k)``, so ``q·R_δ k = Re Σ_c conj(z_q,c) z_k,c e^{iδθ_c}``: one
    (P, d_k/2) × (d_k/2, O) product. Equal to rotating ``k`` with :func:`rope` (tested).
    """
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    if q.shape != k.shape or q.ndim != 2:
        raise ValueError(f"q and k must both be (P, d_k), received {q.shape} and {k.shape}")
    d_k = _even("d_k (last axis of q)", q.shape[-1])
    offsets = np.asarray(offsets, dtype=float)
    if offsets.ndim != 1:
        raise ValueError(f"offsets must be 1-D, received shape {offsets.shape}")
    pair = np.conj(q[:, 0::2] + 1j * q[:, 1::2]) * (k[:, 0::2] + 1j * k[:, 1::2])  # (P, d_k/2)
    return (pair @ np.exp(1j * rope_frequencies(d_k, base)[:, None] * offsets[None, :])).real


def rope_matrix(position: float, d_k: int, base: float = 10000.0) -> np.ndarray:
    """``R_i``: the (d_k, d_k) block-diagonal matrix of 2×2 rotations by ``i·θ_c`` (adjacent pairs).

    ``rope(x, [i])`` equals ``x @ R_i.T`` row by row; built block by block, it is a second,
    independent way to compute the same rotation.
    """
    d_k = _even("d_k", d_k)
    r = np.zeros((d_k, d_k))
    for c, theta in enumerate(rope_frequencies(d_k, base)):
        phi = position * theta
        r[2 * c : 2 * c + 2, 2 * c : 2 * c + 2] = [[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]]
    return r


def rope_aligned_mean(offsets, d_k: int, base: float = 10000.0) -> np.ndarray:
    """``E[(R_i q)·(R_j k)] = 2 Σ_c cos((j − i) θ_c)`` when ``E[k qᵀ] = I`` (e.g. ``k = q``): one value per offset."""
    offsets = np.asarray(offsets, dtype=float)
    return 2.0 * np.cos(offsets[..., None] * rope_frequencies(d_k, base)).sum(axis=-1)


def rope_multi_head_attention(x, params, positions=None, mask=None, base: float = 10000.0):
    """Multi-head self-attention with RoPE applied to every head's queries and keys (values untouched).

    x : (..., n, d_model); params : :class:`attn_utils.MHAParams`. Returns (output, weights) like
    :func:`attn_utils.multi_head_attention`.
    """
    return multi_head_attention(x, x, params, mask=mask, rotate=lambda a: rope(a, positions, base))


# ------------------------------------------------------------------ relative positions (Shaw et al.)


def clipped_offsets(n_q: int, n_k: int, max_distance: int) -> np.ndarray:
    """``clip(j − i, −K, K) + K``: the row of the relative table that pair (i, j) uses, (n_q, n_k) ints."""
    max_distance = positive_int("max_distance", max_distance)
    offsets = np.arange(positive_int("n_k", n_k))[None, :] - np.arange(positive_int("n_q", n_q))[:, None]
    return np.clip(offsets, -max_distance, max_distance) + max_distance


def relative_scores(q, k, table, scale: float | None = None) -> np.ndarray:
    """Shaw et al.'s scores ``e_ij = q_i · (k_j + a_clip(j−i, K)) · scale``.

    q : (..., n_q, d_k), k : (..., n_k, d_k), table : (2K + 1, d_k) with row ``K + r`` for offset r.
    """
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    table = as_float_array("table", table, min_ndim=2)
    if table.shape[0] % 2 == 0 or table.shape[1] != q.shape[-1]:
        raise ValueError(f"table must have shape (2K+1, d_k) with d_k={q.shape[-1]}, received {table.shape}")
    a = table[clipped_offsets(q.shape[-2], k.shape[-2], table.shape[0] // 2)]  # (n_q, n_k, d_k): a_ij
    scale = default_scale(q.shape[-1]) if scale is None else scale
    content = q @ np.swapaxes(k, -1, -2)  # q_i · k_j
    position = np.einsum("...id,ijd->...ij", q, a)  # q_i · a_ij
    return scale * (content + position)


# ------------------------------------------------------------------ ALiBi: a linear bias on the score


def alibi_slopes(h: int) -> np.ndarray:
    """Head slopes ``μ_r = 2^(−8r/h)``, ``r = 1 … h`` (a geometric sequence; h a power of two)."""
    h = positive_int("h", h)
    if h & (h - 1):
        raise ValueError(f"h must be a power of two for the geometric slopes 2^(-8r/h), received h={h}")
    return 2.0 ** (-8.0 * np.arange(1, h + 1) / h)


def alibi_bias(n_q: int, n_k: int | None = None, slopes=None) -> np.ndarray:
    """``b_rij = −μ_r |i − j|``, shape (h, n_q, n_k); queries aligned with the last n_q keys.

    For the keys a causal query may see (j ≤ i) this is ALiBi's ``−μ_r (i − j)``.
    """
    n_q = positive_int("n_q", n_q)
    n_k = n_q if n_k is None else positive_int("n_k", n_k)
    slopes = as_float_array("slopes", slopes, min_ndim=1)
    i = np.arange(n_k - n_q, n_k)[:, None]  # absolute position of each query
    j = np.arange(n_k)[None, :]
    return -slopes[:, None, None] * np.abs(i - j)[None]


def biased_attention(q, k, v, bias, mask=None, scale: float | None = None):
    """``softmax(scale · q kᵀ + bias) v`` with an optional boolean mask (True = may attend).

    bias broadcastable to (..., n_q, n_k). Returns (output (..., n_q, d_v), weights (..., n_q, n_k)).
    """
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    v = as_float_array("v", v, min_ndim=2)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    weights = softmax(scale * (q @ np.swapaxes(k, -1, -2)) + bias, mask=mask)
    return weights @ v, weights


def mean_distance(weights) -> np.ndarray:
    """``Σ_j w_ij |i − j|`` per query: how far back a query looks on average; weights (..., n_q, n_k)."""
    weights = as_float_array("weights", weights, min_ndim=2)
    n_q, n_k = weights.shape[-2:]
    dist = np.abs(np.arange(n_k - n_q, n_k)[:, None] - np.arange(n_k)[None, :])
    return (weights * dist).sum(axis=-1)


# ------------------------------------------------------------------ measuring structure


def same_offset_spread(scores) -> float:
    """How far a score matrix is from depending on ``j − i`` only (a Toeplitz matrix).

    scores : (..., n, n). For every offset, the standard deviation of the scores on that diagonal;
    the largest of these over offsets and leading axes, divided by the standard deviation of all
    scores. 0 for a Toeplitz matrix; of order 1 when absolute positions matter.
    """
    s = as_float_array("scores", scores, min_ndim=2)
    n = s.shape[-1]
    if s.shape[-2] != n:
        raise ValueError(f"scores must be square (..., n, n), received shape {s.shape}")
    spread = max(float(np.diagonal(s, offset=o, axis1=-2, axis2=-1).std(axis=-1).max()) for o in range(1 - n, n))
    return spread / float(s.std())


def permutation_error(f, x, perm) -> float:
    """``max |f(x[..., perm, :]) − f(x)[..., perm, :]| / max |f(x)|``: 0 when f is permutation equivariant."""
    x = as_float_array("x", x, min_ndim=2)
    perm = np.asarray(perm)
    out = f(x)
    return float(np.abs(f(x[..., perm, :]) - out[..., perm, :]).max() / np.abs(out).max())


__all__ = [
    "add_positions",
    "alibi_bias",
    "alibi_slopes",
    "biased_attention",
    "clipped_offsets",
    "learned_position_table",
    "mean_distance",
    "permutation_error",
    "relative_scores",
    "rope",
    "rope_aligned_mean",
    "rope_frequencies",
    "rope_matrix",
    "rope_multi_head_attention",
    "rope_offset_scores",
    "same_offset_spread",
    "sinusoid_frequencies",
    "sinusoidal_positions",
]
