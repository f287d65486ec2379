"""Chapter 19: shrinking the KV cache — latent (MLA) caches, absorption, quantised caches, shared prefixes.

* :class:`MLAConfig`, :data:`DEEPSEEK_V2` — the widths of multi-head latent attention (MLA) and what a
  token costs in the cache; :meth:`MLAConfig.as_mha` gives the multi-head model with the same heads
  (chapter 15's :class:`~attn_utils.experiments.ch15_inference.TransformerConfig`).
* :class:`MLAParams`, :func:`init_mla`, :func:`mla_cache` — one MLA layer (row-vector convention,
  ``x @ W``): the latent ``c = x W_dkv`` and the decoupled rotary key ``k_R = RoPE(x W_kr)`` are all it caches.
* :func:`mla_explicit` — attention computed the long way: every head's keys ``c W_uk[i]`` and values
  ``c W_uv[i]`` are up-projected, then ordinary causal attention (the core's
  :func:`~attn_utils.attention.scaled_dot_product_attention`).
* :func:`mla_absorbed` — the same layer with the up-projections absorbed: each head's query is mapped
  into the latent space, ``q W_uk[i]ᵀ``, and attention runs over the cached latents directly, as
  multi-query attention (:func:`~attn_utils.multihead.grouped_attention` with one key/value head).
* :func:`fixed_absorption_residual`, :func:`fit_fixed_absorption` — how much of a rotary score no fixed
  matrix can absorb: in closed form, and measured by a least-squares fit on sampled scores.
* :func:`quantize`, :func:`dequantize`, :func:`quantized_nbytes` — asymmetric (min–max) integer
  quantisation with one scale and one offset per group: per token (groups along the channel axis)
  or per channel (groups along the token axis).
* :func:`synthetic_keys`, :func:`synthetic_values`, :func:`quantized_attention_error` — a synthetic test
  bed (keys with a few outlier channels, values with a spread of per-token sizes) and the error that
  quantising the cache causes in attention outputs.
* :func:`fork_cache` — a copy of chapter 15's :class:`~attn_utils.experiments.ch15_inference.GroupedKVCache`
  that can be extended without touching the original (a shared prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..attention import causal_mask, scaled_dot_product_attention
from ..multihead import grouped_attention
from ..validation import as_float_array, positive_int
from .ch14_positions import rope, rope_matrix
from .ch15_inference import GroupedKVCache, TransformerConfig

# ---------------------------------------------------------------- the cache of a latent-attention model


@dataclass(frozen=True)
class MLAConfig:
    """The attention widths of a multi-head latent attention (MLA) model.

    n_layers l; d_model d; h query heads of width d_h (content part; values also d_h wide); d_c the
    width of the cached latent ``c``; d_c_q the width of the query latent (0: queries not compressed;
    it never touches the cache); d_rope the width of the decoupled rotary query/key per head.
    """

    name: str
    n_layers: int
    d_model: int
    h: int
    d_h: int
    d_c: int
    d_c_q: int = 0
    d_rope: int = 0
    source: str = ""

    def __post_init__(self):
        for name in ("n_layers", "d_model", "h", "d_h", "d_c"):
            positive_int(name, getattr(self, name))
        for name in ("d_c_q", "d_rope"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, received {getattr(self, name)}")

    def kv_numbers_per_token(self) -> int:
        """Numbers cached per token: ``l·(d_c + d_rope)`` (the latent and the shared rotary key)."""
        return self.n_layers * (self.d_c + self.d_rope)

    def kv_bytes(self, n_tokens: int = 1, bytes_per_number: int = 2, batch: int = 1) -> int:
        """Bytes of the cache of ``batch`` sequences of ``n_tokens`` tokens."""
        return self.kv_numbers_per_token() * n_tokens * bytes_per_number * batch

    def gqa_groups(self) -> float:
        """Key/value heads of width d_h that a GQA model caches as much with: ``(d_c + d_rope)/(2 d_h)``."""
        return (self.d_c + self.d_rope) / (2 * self.d_h)

    def decode_attention_intensity(self, h_kv: int | None = None, bytes_per_number: int = 2) -> float:
        """FLOPs per byte of cache that decoding attention does (per cached token and layer, one query).

        ``h_kv = None``: absorbed MLA, each of the h heads scores the (d_c + d_rope)-wide cached key and
        averages the d_c-wide latent, ``2·h·(2 d_c + d_rope)`` FLOPs over ``(d_c + d_rope)·bytes_per_number``
        bytes. ``h_kv`` given: MHA/GQA with h_kv key/value heads of width d_h, ``2·h·2 d_h`` FLOPs over
        ``2·h_kv·d_h·bytes_per_number`` bytes. The projections (weights, shared by the batch) are not counted.
        """
        b = positive_int("bytes_per_number", bytes_per_number)
        if h_kv is None:
            return 2 * self.h * (2 * self.d_c + self.d_rope) / ((self.d_c + self.d_rope) * b)
        return 2 * self.h * 2 * self.d_h / (2 * positive_int("h_kv", h_kv) * self.d_h * b)

    def as_mha(self, h_kv: int | None = None) -> TransformerConfig:
        """The multi-head (``h_kv = h``) or grouped-query model with the same layers and heads of width d_h."""
        h_kv = self.h if h_kv is None else h_kv
        label = "MHA" if h_kv == self.h else ("MQA" if h_kv == 1 else f"GQA, {h_kv} K/V heads")
        return TransformerConfig(f"{self.name} widths, {label}", self.n_layers, self.d_model, self.h, h_kv, self.d_h)


DEEPSEEK_V2_SOURCE = (
    "DeepSeek-AI 2024, arXiv:2405.04434 v5 = deepseek-v2-tech-report.pdf in github.com/deepseek-ai/DeepSeek-V2 at "
    "commit c15bff2, Section 3.1.2 (model hyper-parameters), Section 2.1.4 and the Table 1 caption (2.25 groups)"
)

DEEPSEEK_V2 = MLAConfig("DeepSeek-V2", 60, 5120, 128, 128, 512, d_c_q=1536, d_rope=64, source=DEEPSEEK_V2_SOURCE)
"""DeepSeek-V2: 60 layers, hidden dimension 5120, n_h = 128 heads of d_h = 128, KV compression dimension
d_c = 512, query compression dimension d_c' = 1536, decoupled rotary queries and key of d_h^R = 64 per head
(Section 3.1.2 of the paper). Table 1 gives the cache per token as (d_c + d_h^R)·l ≈ (9/2)·d_h·l elements;
Section 2.1.4 and the Table 1 caption call it "equal to GQA with only 2.25 groups"."""


# ---------------------------------------------------------------- one MLA layer


class MLAParams(NamedTuple):
    """Weights of one MLA layer (queries not compressed: that does not change the cache).

    W_dkv (d_model, d_c) down-projection to the latent; W_uk, W_uv (h, d_c, d_h) per-head up-projections
    of keys and values; W_q (h, d_model, d_h) content queries; W_qr (h, d_model, d_rope) rotary queries;
    W_kr (d_model, d_rope) the rotary key shared by all heads; W_o (h, d_h, d_model) output projection.
    """

    W_dkv: np.ndarray
    W_uk: np.ndarray
    W_uv: np.ndarray
    W_q: np.ndarray
    W_qr: np.ndarray
    W_kr: np.ndarray
    W_o: np.ndarray


def init_mla(rng: np.random.Generator, d_model: int, h: int, d_h: int, d_c: int, d_rope: int = 0) -> MLAParams:
    """Gaussian weights with variance 1/fan_in, so unit-variance inputs give unit-variance latents, keys and queries."""
    d_model, h, d_h, d_c = (positive_int(n, v) for n, v in (("d_model", d_model), ("h", h), ("d_h", d_h), ("d_c", d_c)))
    if d_rope < 0 or d_rope % 2:
        raise ValueError(f"d_rope must be an even number ≥ 0 (rotations act on pairs), received {d_rope}")

    def w(*shape):
        return rng.normal(0, shape[-2] ** -0.5, shape)

    return MLAParams(
        W_dkv=w(d_model, d_c),
        W_uk=w(h, d_c, d_h),
        W_uv=w(h, d_c, d_h),
        W_q=w(h, d_model, d_h),
        W_qr=w(h, d_model, d_rope),
        W_kr=w(d_model, d_rope),
        W_o=rng.normal(0, (h * d_h) ** -0.5, (h, d_h, d_model)),
    )


def _inputs(x, p: MLAParams) -> np.ndarray:
    x = as_float_array("x", x, min_ndim=2)
    if x.ndim != 2 or x.shape[-1] != p.W_dkv.shape[0]:
        raise ValueError(f"x must have shape (n, d_model={p.W_dkv.shape[0]}), received {x.shape}")
    return x


def mla_cache(p: MLAParams, x, positions=None) -> tuple[np.ndarray, np.ndarray]:
    """What an MLA layer caches for tokens ``x`` (n, d_model): the latent ``c = x W_dkv`` (n, d_c) and the
    shared rotary key ``k_R = RoPE(x W_kr)`` (n, d_rope), rotated by its position (default 0 … n−1)."""
    x = _inputs(x, p)
    return x @ p.W_dkv, _rotate(x @ p.W_kr, positions)


def _rotate(x, positions=None) -> np.ndarray:
    """RoPE (chapter 14) on the last axis; a zero-width part (no rotary features) stays as it is."""
    return rope(x, positions) if x.shape[-1] else x


def _output(o_heads: np.ndarray, W_o: np.ndarray) -> np.ndarray:
    """``Σ_i o_i W_o[i]``: (h, n, d_h) head outputs → (n, d_model)."""
    return np.einsum("hnd,hde->ne", o_heads, W_o)


def mla_explicit(p: MLAParams, x, rope_mode: str = "decoupled", positions=None) -> np.ndarray:
    """Causal MLA over tokens ``x`` (n, d_model), computed the long way (keys and values up-projected).

    rope_mode : ``"none"`` — content scores only, scale ``1/√d_h``; ``"decoupled"`` — each head's query
        ``[q_C; q_R]`` against the key ``[k_C; k_R]`` with the shared rotary key, scale ``1/√(d_h + d_rope)``
        (DeepSeek-V2); ``"content"`` — RoPE applied to the content queries and keys themselves, scale
        ``1/√d_h`` (the design that cannot be absorbed).
    positions : (n,) the tokens' positions for the rotations (default 0 … n−1).
    Returns the layer output (n, d_model).
    """
    x = _inputs(x, p)
    n, d_h, d_rope = x.shape[0], p.W_uk.shape[-1], p.W_kr.shape[-1]
    c, k_r = mla_cache(p, x, positions)
    k = c @ p.W_uk  # (h, n, d_h): one key per head and token, up-projected from the latent
    v = c @ p.W_uv  # (h, n, d_h)
    q = x @ p.W_q  # (h, n, d_h)
    if rope_mode == "none":
        scale = d_h**-0.5
    elif rope_mode == "content":
        q, k, scale = rope(q, positions), rope(k, positions), d_h**-0.5
    elif rope_mode == "decoupled":
        q = np.concatenate([q, _rotate(x @ p.W_qr, positions)], axis=-1)
        k = np.concatenate([k, np.broadcast_to(k_r, (k.shape[0], n, d_rope))], axis=-1)
        scale = (d_h + d_rope) ** -0.5
    else:
        raise ValueError(f"rope_mode must be 'none', 'decoupled' or 'content', received {rope_mode!r}")
    o, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(n), scale=scale)
    return _output(o, p.W_o)


def mla_absorbed(
    p: MLAParams, x, rope_mode: str = "decoupled", scale: float | None = None, positions=None, cache=None
) -> np.ndarray:
    """The same layer as :func:`mla_explicit` without ever forming keys or values: attention over the cache.

    Each head's content query is mapped into the latent space, ``q̃_i = q_i W_uk[i]ᵀ`` (d_c wide), and
    (``"decoupled"``) followed by its rotary query; all heads then attend to one shared key per token,
    ``[c; k_R]``, and one shared value, ``c``: multi-query attention over the cache
    (:func:`~attn_utils.multihead.grouped_attention` with ``h_kv = 1``). The latent each head reads,
    ``Σ_j p_ij c_j``, goes through ``W_uv[i] W_o[i]`` (d_c, d_model), the value up-projection absorbed
    into the output projection. ``scale`` defaults to the explicit layer's: ``1/√d_h``, or
    ``1/√(d_h + d_rope)`` with the decoupled key; the latent's width d_c plays no part in it.
    rope_mode ``"none"`` or ``"decoupled"`` (the content-RoPE layer has no absorbed form).
    positions : (n,) the tokens' positions for the rotations (default 0 … n−1). cache : ``(c, k_R)`` to
    attend to instead of :func:`mla_cache` of ``x`` at ``positions`` (same number of tokens), e.g. a cache
    computed elsewhere.
    """
    x = _inputs(x, p)
    n, d_h, d_rope = x.shape[0], p.W_uk.shape[-1], p.W_kr.shape[-1]
    c, k_r = mla_cache(p, x, positions) if cache is None else cache
    if c.shape != (n, p.W_dkv.shape[1]) or k_r.shape != (n, d_rope):
        raise ValueError(
            f"cache must be (c, k_R) of shapes {(n, p.W_dkv.shape[1])} and {(n, d_rope)}, "
            f"received {c.shape} and {k_r.shape}"
        )
    q_latent = (x @ p.W_q) @ np.swapaxes(p.W_uk, -1, -2)  # (h, n, d_c): W_uk absorbed into the query
    if rope_mode == "none":
        q, keys, default = q_latent, c, d_h**-0.5
    elif rope_mode == "decoupled":
        q = np.concatenate([q_latent, _rotate(x @ p.W_qr, positions)], axis=-1)
        keys, default = np.concatenate([c, k_r], axis=-1), (d_h + d_rope) ** -0.5
    else:
        raise ValueError(
            f"rope_mode must be 'none' or 'decoupled' (content RoPE cannot be absorbed), received {rope_mode!r}"
        )
    read, _ = grouped_attention(q, keys[None], c[None], mask=causal_mask(n), scale=default if scale is None else scale)
    W_ov = p.W_uv @ p.W_o  # (h, d_c, d_model): W_uv absorbed into the output projection
    return np.einsum("hnc,hce->ne", read, W_ov)


# ---------------------------------------------------------------- RoPE between the query and the up-projection


def offset_matrices(W_uk_head, offsets, base: float = 10000.0) -> np.ndarray:
    """``M_δ = R_δ W_ukᵀ`` (d_h, d_c) for each offset δ = j − t: the score of a query q at t and a latent c at
    j under content RoPE is ``qᵀ M_δ c`` (``R_tᵀ R_j = R_{j−t}``). W_uk_head : (d_c, d_h)."""
    W = as_float_array("W_uk_head", W_uk_head, min_ndim=2)
    return np.stack([rope_matrix(float(delta), W.shape[1], base) @ W.T for delta in np.asarray(offsets)])


def fixed_absorption_residual(W_uk_head, offsets, base: float = 10000.0) -> float:
    """Share of the score that the best fixed matrix leaves unexplained, in closed form.

    For q and c independent with identity covariance and δ uniform over ``offsets``,
    ``E[(qᵀ(M_δ − A)c)²] = E_δ‖M_δ − A‖²_F``, smallest at ``A = M̄ = mean_δ M_δ``; returned as a share of
    ``E_δ‖M_δ‖²_F``: 0 when the offsets do not matter (no rotation), up to 1.
    """
    M = offset_matrices(W_uk_head, offsets, base)
    return float(((M - M.mean(axis=0)) ** 2).sum() / (M**2).sum())


def fit_fixed_absorption(rng: np.random.Generator, W_uk_head, offsets, n_fit: int, n_test: int, base: float = 10000.0):
    """Fit one fixed matrix A to sampled rotary scores by least squares; measure what it leaves on new samples.

    Each sample draws q ~ N(0, I_{d_h}), c ~ N(0, I_{d_c}) and δ uniformly from ``offsets``, and scores
    ``s = RoPE(q, t)·RoPE(c W_uk, t + δ)`` (rotations of :func:`~attn_utils.experiments.ch14_positions.rope`,
    positions t drawn from 0 … 999). A is fitted on ``n_fit`` samples (``s ≈ qᵀ A c``, linear in the entries
    of A, solved by the normal equations) and tested on ``n_test`` others; the fit's own excess error is
    about a share ``d_h·d_c/n_fit`` of the residual, so ``n_fit`` should be large against ``d_h·d_c``.
    Returns ``(residual share, its standard error)``: the test samples' mean squared residual over their
    mean squared score (SE by the delta method).
    """
    W = as_float_array("W_uk_head", W_uk_head, min_ndim=2)
    d_c, d_h = W.shape
    offsets = np.asarray(offsets)

    def sample(m):
        q, c = rng.standard_normal((m, d_h)), rng.standard_normal((m, d_c))
        t = rng.integers(0, 1000, m).astype(float)
        j = t + rng.choice(offsets, m)
        rq, rk = rope(q, t, base), rope(c @ W, j, base)  # row i rotated by its own position
        features = (q[:, :, None] * c[:, None, :]).reshape(m, -1)  # s = vec(q cᵀ)·vec(A)
        return features, (rq * rk).sum(axis=1)

    f_fit, s_fit = sample(positive_int("n_fit", n_fit))
    A = np.linalg.solve(f_fit.T @ f_fit, f_fit.T @ s_fit)  # normal equations: the features are near-orthogonal
    f_test, s_test = sample(positive_int("n_test", n_test))
    r2, s2 = (s_test - f_test @ A) ** 2, s_test**2
    share = r2.mean() / s2.mean()
    # delta method for a ratio of means: Var(r̄²/s̄²) ≈ Var(r² − share·s²)/(m·s̄²²)
    se = (r2 - share * s2).std(ddof=1) / np.sqrt(len(s2)) / s2.mean()
    return float(share), float(se)


# ---------------------------------------------------------------- quantised caches


def quantize(x, bits: int, axis: int):
    """Asymmetric uniform quantisation of ``x`` with one scale and offset per group, along ``axis``.

    The numbers that share ``axis`` (all others fixed) form a group: for keys (…, n, d), ``axis=-1``
    groups a token's channels (per-token quantisation), ``axis=-2`` a channel's tokens (per-channel).
    Each group stores ``lo = min`` and ``scale = (max − min)/(2^bits − 1)`` in float16 and the codes
    ``round((x − lo)/scale)`` in 0 … 2^bits − 1. Returns ``(codes uint8, scale float16, lo float16)``;
    :func:`dequantize` inverts it up to half a step, ``scale/2`` (slightly more, about 1.0005·scale/2 at
    most, because ``lo`` and ``scale`` are rounded to float16).
    """
    x = as_float_array("x", x, min_ndim=2)
    bits = positive_int("bits", bits)
    if bits > 8:
        raise ValueError(f"bits must be at most 8 (codes are stored as uint8), received {bits}")
    levels = 2**bits - 1
    lo = x.min(axis=axis, keepdims=True).astype(np.float16)
    span = x.max(axis=axis, keepdims=True) - lo.astype(np.float64)
    scale = (span / levels).astype(np.float16)
    scale = np.where(scale > 0, scale, np.float16(1))  # a constant group: any scale reproduces it
    codes = np.clip(np.round((x - lo) / scale.astype(np.float64)), 0, levels).astype(np.uint8)
    return codes, scale, lo


def dequantize(codes, scale, lo) -> np.ndarray:
    """``codes·scale + lo`` in float64."""
    return codes.astype(np.float64) * scale.astype(np.float64) + lo.astype(np.float64)


def quantized_nbytes(codes, scale, lo, bits: int) -> int:
    """Bytes a server stores: the codes packed at ``bits`` per number, plus each group's float16 scale and offset."""
    return -(-codes.size * positive_int("bits", bits) // 8) + scale.nbytes + lo.nbytes


def synthetic_keys(rng: np.random.Generator, draws: int, n: int, d: int, n_outliers: int, offset: float) -> np.ndarray:
    """Keys (draws, n, d): standard normal channels, of which ``n_outliers`` randomly chosen ones (per draw)
    carry a large fixed offset of ±``offset`` (sign per channel) on every token. A stand-in for the few
    large-magnitude key channels KIVI reports in real models, not a measurement of one."""
    k = rng.standard_normal((draws, n, d))
    for s in range(draws):
        channels = rng.choice(d, n_outliers, replace=False)
        k[s, :, channels] += (offset * rng.choice([-1.0, 1.0], n_outliers))[:, None]
    return k


def synthetic_values(rng: np.random.Generator, draws: int, n: int, d: int, token_spread: float) -> np.ndarray:
    """Values (draws, n, d): standard normal, each token's row multiplied by ``exp(token_spread·g)``,
    g ~ N(0, 1): tokens differ in size, channels do not (a stand-in, like :func:`synthetic_keys`)."""
    return rng.standard_normal((draws, n, d)) * np.exp(token_spread * rng.standard_normal((draws, n, 1)))


def quantized_attention_error(q, k, v, bits: int, k_axis: int | None, v_axis: int | None) -> np.ndarray:
    """Error that quantising the cached keys and values causes in attention outputs, one number per draw.

    q : (draws, m, d) queries; k, v : (draws, n, d) the cache. ``k_axis``/``v_axis``: ``-1`` per token,
    ``-2`` per channel, ``None`` kept in full precision. Returns the RMS difference between the
    outputs (scale ``1/√d``, no mask) with and without quantisation, divided by the RMS of the exact output.
    """
    exact, _ = scaled_dot_product_attention(q, k, v)
    k_q = k if k_axis is None else dequantize(*quantize(k, bits, k_axis))
    v_q = v if v_axis is None else dequantize(*quantize(v, bits, v_axis))
    approx, _ = scaled_dot_product_attention(q, k_q, v_q)
    rms = lambda a: np.sqrt((a**2).mean(axis=(-2, -1)))  # noqa: E731
    return rms(approx - exact) / rms(exact)


# ---------------------------------------------------------------- shared prefixes


def fork_cache(cache: GroupedKVCache) -> GroupedKVCache:
    """A copy of ``cache`` that can be extended without changing it (appending makes new arrays, so the
    cached arrays themselves are shared, not copied: the prefix is stored once)."""
    if not isinstance(cache, GroupedKVCache):
        raise TypeError(f"cache must be a GroupedKVCache, received {type(cache).__name__}")
    new = GroupedKVCache(len(cache.keys), cache.window, cache.rolling)
    new.keys, new.values = list(cache.keys), list(cache.values)
    new.position, new.start = cache.position, cache.start
    return new


__all__ = [
    "MLAConfig",
    "DEEPSEEK_V2",
    "DEEPSEEK_V2_SOURCE",
    "MLAParams",
    "init_mla",
    "mla_cache",
    "mla_explicit",
    "mla_absorbed",
    "offset_matrices",
    "fixed_absorption_residual",
    "fit_fixed_absorption",
    "quantize",
    "dequantize",
    "quantized_nbytes",
    "synthetic_keys",
    "synthetic_values",
    "quantized_attention_error",
    "fork_cache",
]
