"""Chapter 18: cheaper than n² — local windows, fixed sparse patterns, linear attention.

* Windows: :func:`window_reach` (how far back ``L`` layers of window ``w`` can see, derived) and
  :func:`hybrid_stack`, a stack of residual self-attention layers, each either banded
  (chapter 11's :func:`~attn_utils.experiments.ch11_layers.restricted_attention_layer`) or full causal
  (:func:`attn_utils.scaled_dot_product_attention`); chapter 11's ``perturbation_reach`` measures which
  inputs each output depends on. :func:`hybrid_cache_tokens` counts the cached positions of a
  local:global stack from its layer pattern.
* Fixed sparse patterns: :func:`sparse_masks` (strided, after Child et al. 2019; window + global
  + random, after BigBird) and :func:`pattern_graph`, which turns per-layer masks into chapter 11's
  :class:`~attn_utils.experiments.ch11_layers.LayerGraph` so that ``hop_distances`` gives path lengths;
  :func:`pattern_layers_to_connect` counts the layers a cycle of masks needs to connect given pairs.
* Linear attention: :func:`elu_features`, :func:`positive_random_features`;
  :func:`linear_attention_quadratic` (the masked ``n × n`` form) and :func:`linear_attention_recurrent`
  (the ``d_v × d_φ`` state, token by token) and :func:`linear_attention_scan` (the same states as one prefix
  sum); every product of the first two goes through ``counted_matmul``. :func:`elu_weight_limit`: the weights
  ``elu + 1`` features tend to as the query is scaled up.
* Random features: :func:`prf_kernel_estimates` (draws of the estimate of ``exp(q·k)``) and
  :func:`prf_variance` (its variance, derived).
* Memory: :func:`additive_state`, :func:`delta_state` (write ``(k, v)`` pairs into a matrix state, optionally
  gated),
  :func:`recall` (read them back), :func:`least_squares_recall` and :func:`best_linear_residual` (the
  best any matrix state can do).

Shapes: keys and queries ``(..., n, d)``; values ``(..., n, d_v)``; a state ``S`` is ``(..., d_v, d)`` and
reads ``v̂ = S k``. Costs are multiply-adds (MACs) counted by :func:`attn_utils.count_macs`.
"""

from __future__ import annotations

import numpy as np

from ..attention import causal_mask, scaled_dot_product_attention
from ..counting import counted_matmul
from ..validation import as_float_array, check_axis_size, nonneg_int, positive_int
from .ch11_layers import LayerGraph, hop_distances, restricted_attention_layer

# ---------------------------------------------------------------- windows and local:global stacks


def window_reach(n_layers: int, window: int) -> int:
    """How many positions back the top of ``n_layers`` causal window layers can see: ``L·(w − 1)``.

    A query at ``i`` attends to ``i − w + 1 … i`` (itself included), so each layer adds ``w − 1``."""
    return positive_int("n_layers", n_layers) * (positive_int("window", window) - 1)


def _check_pattern(pattern) -> tuple[str, ...]:
    pattern = tuple(pattern)
    if not pattern or any(p not in ("local", "global") for p in pattern):
        raise ValueError(f"pattern must be a non-empty sequence of 'local'/'global', received {pattern!r}")
    return pattern


def hybrid_stack(x, pattern, window: int) -> np.ndarray:
    """Residual self-attention layers ``x ← x + attn(x)`` with ``Q = K = V = x`` (no projections).

    pattern : e.g. ``("local", "local", "global")``; a ``"local"`` layer is causal attention restricted to
    the last ``window`` positions, computed banded (``2·n·w·d`` MACs); a ``"global"`` layer is full causal
    attention (``2·n²·d`` MACs: the dense kernel also multiplies the masked half).
    x : (..., n, d). Returns (..., n, d).
    """
    x = as_float_array("x", x, min_ndim=2)
    pattern, window = _check_pattern(pattern), positive_int("window", window)
    n = x.shape[-2]
    for kind in pattern:
        if kind == "local":
            x = x + restricted_attention_layer(x, window=window, projections=False)
        else:
            x = x + scaled_dot_product_attention(x, x, x, mask=causal_mask(n))[0]
    return x


def hybrid_cache_tokens(pattern, window: int, n_ctx: int) -> int:
    """Positions cached per sequence by all layers of ``pattern`` at context ``n_ctx``: a local layer keeps
    ``min(w, n)`` (a rolling buffer), a global layer keeps ``n``."""
    pattern, window, n_ctx = _check_pattern(pattern), positive_int("window", window), nonneg_int("n_ctx", n_ctx)
    return sum(min(window, n_ctx) if p == "local" else n_ctx for p in pattern)


def repeat_pattern(unit, n_layers: int) -> tuple[str, ...]:
    """Layer ``i`` gets ``unit[i mod len(unit)]`` (how Gemma's released configurations cycle their list)."""
    unit, n_layers = _check_pattern(unit), positive_int("n_layers", n_layers)
    return tuple(unit[i % len(unit)] for i in range(n_layers))


# ---------------------------------------------------------------- fixed sparse patterns

SPARSE_KINDS = ("window", "strided", "bigbird")


def sparse_masks(
    kind: str,
    n: int,
    *,
    window: int = 4,
    stride: int = 4,
    n_global: int = 1,
    n_random: int = 2,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, ...]:
    """The boolean masks (``True`` = may attend) of one sparse pattern, one ``(n, n)`` mask per head kind.

    * ``"window"``: causal, ``0 ≤ i − j < window``.
    * ``"strided"`` (Sparse Transformer, Child et al. 2019): two causal masks, the local one
      ``0 ≤ i − j < stride`` and the strided one ``i − j ≡ 0 (mod stride)``; their union has
      ``≈ stride + i/stride`` keys per row, ``≈ 2√n`` at ``stride = √n``.
    * ``"bigbird"`` (Zaheer et al. 2020, encoder, not causal): one mask with a band ``|i − j| < window``,
      ``n_global`` global tokens (the first positions; they see and are seen by every position) and
      ``n_random`` random keys per row drawn from ``rng``.
    """
    if kind not in SPARSE_KINDS:
        raise ValueError(f"kind must be one of {SPARSE_KINDS}, received {kind!r}")
    n = positive_int("n", n)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if kind == "window":
        return ((i - j >= 0) & (i - j < positive_int("window", window)),)
    if kind == "strided":
        stride = positive_int("stride", stride)
        return (i - j >= 0) & (i - j < stride), (i - j >= 0) & ((i - j) % stride == 0)
    window, n_global, n_random = (
        positive_int("window", window),
        nonneg_int("n_global", n_global),
        nonneg_int("n_random", n_random),
    )
    if rng is None:
        raise ValueError("rng is required for kind='bigbird' (its random keys)")
    mask = np.abs(i - j) < window
    mask[:n_global, :] = True
    mask[:, :n_global] = True
    if n_random:
        picks = np.argsort(rng.random((n, n)), axis=1)[:, :n_random]  # n_random distinct keys per row
        mask[np.arange(n)[:, None], picks] = True
    return (mask,)


def pattern_graph(masks_per_layer) -> LayerGraph:
    """Chapter 11's :class:`LayerGraph` for a stack whose layer ``ℓ`` lets query ``i`` read key ``j`` where
    ``masks_per_layer[ℓ][i, j]``; feed it to ``hop_distances`` for path lengths."""
    masks = tuple(np.asarray(m, bool) for m in masks_per_layer)
    if not masks or any(m.ndim != 2 or m.shape != masks[0].shape or m.shape[0] != m.shape[1] for m in masks):
        raise ValueError(
            f"masks_per_layer must be square (n, n) masks of one shape, received {[m.shape for m in masks]}"
        )
    return LayerGraph("attention", masks[0].shape[0], masks, (None,) * len(masks))


def strided_path_layers(n: int, stride: int) -> int:
    """Layers that connect every ``j ≤ i`` when a local layer (``i − j < stride``) is followed by a strided
    one (``i − j ≡ 0 mod stride``): 2 once ``stride ≥ 2`` and ``n > stride``; 1 when ``n ≤ stride``."""
    return 1 if positive_int("n", n) <= positive_int("stride", stride) else 2


def pattern_layers_to_connect(masks_cycle, target=None, max_layers: int | None = None) -> int:
    """Fewest layers, layer ``ℓ`` using ``masks_cycle[ℓ mod len(masks_cycle)]``, after which chapter 11's
    ``hop_distances`` is finite on every pair ``(i, j)`` with ``target[i, j]``.

    target : (n, n) bools, default every pair. Raises ``ValueError`` if ``max_layers`` (default ``n``) layers
    are not enough.
    """
    masks = tuple(np.asarray(m, bool) for m in masks_cycle)
    n = pattern_graph(masks).n
    target = np.ones((n, n), bool) if target is None else np.asarray(target, bool)
    if target.shape != (n, n):
        raise ValueError(f"target must be an (n, n) = {(n, n)} mask, received shape {target.shape}")
    max_layers = n if max_layers is None else positive_int("max_layers", max_layers)
    for n_layers in range(1, max_layers + 1):
        graph = pattern_graph([masks[k % len(masks)] for k in range(n_layers)])
        if np.isfinite(hop_distances(graph)[target]).all():
            return n_layers
    raise ValueError(f"the masks do not connect every target pair within max_layers={max_layers} layers")


def window_layers_to_connect(n: int, window: int) -> int:
    """Causal window layers needed to connect position 0 to position ``n − 1``: ``⌈(n − 1)/(w − 1)⌉``."""
    n, window = positive_int("n", n), positive_int("window", window)
    if window < 2:
        raise ValueError(f"window must be ≥ 2 to connect distinct positions, received {window}")
    return max(1, -(-(n - 1) // (window - 1)))


# ---------------------------------------------------------------- linear attention


def elu_features(x) -> np.ndarray:
    """``φ(x) = elu(x) + 1`` (Katharopoulos et al. 2020): positive, elementwise, same shape as ``x``."""
    x = as_float_array("x", x)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def positive_random_features(x, w) -> np.ndarray:
    """Positive random features (Performer's FAVOR+): ``φ(x) = exp(W x − |x|²/2)/√m``.

    x : (..., n, d); w : (..., m, d) with rows drawn from N(0, I). Returns (..., n, m), and
    ``E[φ(q)·φ(k)] = exp(q·k)`` over the draw of ``w``.
    """
    x, w = as_float_array("x", x, min_ndim=2), as_float_array("w", w, min_ndim=2)
    check_axis_size("w", w, -1, x.shape[-1], "d, the feature size of x")
    m = w.shape[-2]
    proj = x @ np.swapaxes(w, -1, -2)  # (..., n, m)
    return np.exp(proj - 0.5 * (x**2).sum(axis=-1, keepdims=True)) / np.sqrt(m)


def _check_linear(phi_q, phi_k, v):
    phi_q, phi_k = as_float_array("phi_q", phi_q, min_ndim=2), as_float_array("phi_k", phi_k, min_ndim=2)
    v = as_float_array("v", v, min_ndim=2)
    check_axis_size("phi_k", phi_k, -1, phi_q.shape[-1], "d_phi, the feature size of phi_q")
    check_axis_size("v", v, -2, phi_k.shape[-2], "n, the number of keys")
    if (phi_q < 0).any() or (phi_k < 0).any():
        raise ValueError("phi_q and phi_k must be non-negative feature maps (the weights must be ≥ 0)")
    return phi_q, phi_k, v


def linear_attention_quadratic(phi_q, phi_k, v, causal: bool = True) -> np.ndarray:
    """``o_i = Σ_j a_ij v_j / Σ_j a_ij`` with ``a_ij = φ(q_i)·φ(k_j)`` (``j ≤ i`` when causal): the ``n × n`` form.

    phi_q : (..., n, d_phi); phi_k : (..., n, d_phi); v : (..., n, d_v). Returns (..., n, d_v).
    Costs ``n²·(d_phi + d_v)`` MACs (the masked half included, as a dense kernel computes it).
    """
    phi_q, phi_k, v = _check_linear(phi_q, phi_k, v)
    a = counted_matmul(phi_q, np.swapaxes(phi_k, -1, -2))  # (..., n, n)
    if causal:
        a = a * causal_mask(phi_q.shape[-2], phi_k.shape[-2])
    return counted_matmul(a, v) / a.sum(axis=-1, keepdims=True)


def linear_attention_recurrent(phi_q, phi_k, v) -> np.ndarray:
    """Causal linear attention as a recurrence over a ``d_v × d_phi`` state:

    ``S_t = S_{t−1} + v_t φ(k_t)ᵀ``, ``u_t = u_{t−1} + φ(k_t)``, ``o_t = S_t φ(q_t) / (u_tᵀ φ(q_t))``.

    Same shapes as :func:`linear_attention_quadratic`; costs ``n·(2·d_v·d_phi + d_phi)`` MACs in ``3n``
    products, and holds ``d_v·d_phi + d_phi`` numbers whatever ``n`` is.
    """
    phi_q, phi_k, v = _check_linear(phi_q, phi_k, v)
    lead, n, d_phi, d_v = phi_q.shape[:-2], phi_q.shape[-2], phi_q.shape[-1], v.shape[-1]
    S = np.zeros((*lead, d_v, d_phi))
    u = np.zeros((*lead, 1, d_phi))
    out = np.empty((*lead, n, d_v))
    for t in range(n):
        S = S + counted_matmul(v[..., t, :, None], phi_k[..., t, None, :])  # outer product, d_v·d_phi MACs
        u = u + phi_k[..., t, None, :]
        q_t = phi_q[..., t, :, None]  # (..., d_phi, 1)
        num = counted_matmul(S, q_t)[..., 0]  # (..., d_v)
        den = counted_matmul(u, q_t)[..., 0]  # (..., 1)
        out[..., t, :] = num / den
    return out


def linear_attention_scan(phi_q, phi_k, v) -> np.ndarray:
    """Causal linear attention with every state at once: ``S_t = Σ_{j ≤ t} v_j φ(k_j)ᵀ`` is a prefix sum
    (an associative scan), here ``np.cumsum`` over the ``n`` outer products; the same for ``u_t``.

    Same shapes and result as :func:`linear_attention_recurrent`; holds all ``n`` states of ``d_v × d_phi``
    numbers, which is the memory that chunked kernels avoid.
    """
    phi_q, phi_k, v = _check_linear(phi_q, phi_k, v)
    states = np.cumsum(v[..., :, :, None] * phi_k[..., :, None, :], axis=-3)  # (..., n, d_v, d_phi)
    norms = np.cumsum(phi_k, axis=-2)  # (..., n, d_phi)
    num = (states @ phi_q[..., :, :, None])[..., 0]
    return num / (norms * phi_q).sum(axis=-1, keepdims=True)


def elu_weight_limit(q, keys) -> np.ndarray:
    """The linear-attention weights of query ``c·q`` as ``c → ∞`` with ``φ = elu + 1``.

    ``φ(c q)/c → relu(q)`` (a negative component gives ``e^{c q_d}/c → 0``), so the weights tend to
    ``relu(q)·φ(k_j) / Σ_i relu(q)·φ(k_i)``: a fixed vector, not one-hot. q : (d,); keys : (n, d) → (n,).
    """
    q, keys = as_float_array("q", q), as_float_array("keys", keys, min_ndim=2)
    check_axis_size("keys", keys, -1, q.shape[-1], "d, the size of q")
    if q.ndim != 1 or not (q > 0).any():
        raise ValueError(f"q must be a vector (d,) with a positive component, received shape {q.shape}")
    a = elu_features(keys) @ np.maximum(q, 0.0)
    return a / a.sum()


def linear_crossover(d_k: int, d_v: int, d_phi: int) -> float:
    """The length above which the recurrence costs fewer MACs than causal softmax attention computed
    densely: ``n·(d_k + d_v) = 2·d_v·d_phi + d_phi`` per query, so ``n* = (2·d_v·d_phi + d_phi)/(d_k + d_v)``."""
    d_k, d_v, d_phi = positive_int("d_k", d_k), positive_int("d_v", d_v), positive_int("d_phi", d_phi)
    return (2 * d_v * d_phi + d_phi) / (d_k + d_v)


# ---------------------------------------------------------------- random features for exp(q·k)


def prf_kernel_estimates(q, k, rng: np.random.Generator, m: int, draws: int) -> np.ndarray:
    """``draws`` independent estimates of ``exp(q·k)`` by ``m`` positive random features each.

    q, k : (d,). Returns (draws,): ``φ(q)·φ(k)`` for a fresh ``W`` (m, d) per draw.
    """
    q, k = as_float_array("q", q), as_float_array("k", k)
    if q.shape != k.shape or q.ndim != 1:
        raise ValueError(f"q and k must be vectors of one size (d,), received {q.shape} and {k.shape}")
    m, draws = positive_int("m", m), positive_int("draws", draws)
    w = rng.standard_normal((draws, m, q.size))
    return (positive_random_features(q[None], w) * positive_random_features(k[None], w)).sum(axis=-1)[:, 0]


def prf_variance(q, k, m: int = 1) -> float:
    """Variance of the ``m``-feature estimate of ``exp(q·k)``: ``exp(2 q·k)·(exp(|q + k|²) − 1)/m``."""
    q, k = as_float_array("q", q), as_float_array("k", k)
    s = q + k
    return float(np.exp(2 * q @ k) * np.expm1(s @ s) / positive_int("m", m))


# ---------------------------------------------------------------- associative memory in a matrix state


def _check_pairs(keys, values):
    keys, values = as_float_array("keys", keys, min_ndim=2), as_float_array("values", values, min_ndim=2)
    check_axis_size("values", values, -2, keys.shape[-2], "n, the number of keys")
    return keys, values


def additive_state(keys, values, gate: float = 1.0) -> np.ndarray:
    """``S = Σ_i v_i k_iᵀ`` (linear attention's state without normaliser). keys (..., n, d), values (..., n, d_v)
    → (..., d_v, d).

    ``gate = λ < 1`` decays the state before each write, ``S_t = λ S_{t−1} + v_t k_tᵀ``, so that
    ``S_n = Σ_i λ^{n−i} v_i k_iᵀ``.
    """
    keys, values = _check_pairs(keys, values)
    if not 0.0 < gate <= 1.0:
        raise ValueError(f"gate must be in (0, 1], received {gate}")
    n = keys.shape[-2]
    decay = gate ** np.arange(n - 1, -1, -1.0)  # λ^{n−i} for i = 1 … n
    return counted_matmul(np.swapaxes(values * decay[:, None], -1, -2), keys)


def delta_state(keys, values, beta: float = 1.0, passes: int = 1, gate: float = 1.0) -> np.ndarray:
    """The delta rule: ``S ← λ·S + β (v_t − λ·S k_t) k_tᵀ`` for each pair in order (``passes`` times).

    With unit keys and ``β = 1`` each write makes ``S k_t = v_t`` exactly (it replaces what the state
    returned for ``k_t``); ``gate = λ < 1`` first decays the whole state (gated delta rule).
    keys (..., n, d) (unit rows for the exact-overwrite property), values (..., n, d_v) → (..., d_v, d).
    """
    keys, values = _check_pairs(keys, values)
    passes = positive_int("passes", passes)
    if not 0.0 < gate <= 1.0:
        raise ValueError(f"gate must be in (0, 1], received {gate}")
    S = np.zeros((*keys.shape[:-2], values.shape[-1], keys.shape[-1]))
    for _ in range(passes):
        for t in range(keys.shape[-2]):
            k_t, v_t = keys[..., t, :], values[..., t, :]
            S = gate * S
            err = v_t - (S @ k_t[..., None])[..., 0]
            S = S + beta * err[..., :, None] * k_t[..., None, :]
    return S


def recall(S, keys) -> np.ndarray:
    """Read the state at every key: ``v̂_i = S k_i``. S (..., d_v, d), keys (..., n, d) → (..., n, d_v)."""
    S, keys = as_float_array("S", S, min_ndim=2), as_float_array("keys", keys, min_ndim=2)
    check_axis_size("keys", keys, -1, S.shape[-1], "d, the key size of the state")
    return counted_matmul(keys, np.swapaxes(S, -1, -2))


def mean_square_error(estimate, target) -> np.ndarray:
    """Mean of ``(v̂ − v)²`` over the last two axes (pairs and value components), one number per leading index.

    For values with independent unit-variance components this is the error relative to ``E|v|²/d_v = 1``."""
    estimate, target = np.asarray(estimate, float), np.asarray(target, float)
    if estimate.shape != target.shape:
        raise ValueError(f"estimate and target must have one shape, received {estimate.shape} and {target.shape}")
    return ((estimate - target) ** 2).mean(axis=(-2, -1))


def least_squares_recall(keys, values) -> np.ndarray:
    """What the best matrix state returns: ``S* k_i`` for the ``S*`` minimising ``Σ|S k_i − v_i|²``.

    keys (..., n, d), values (..., n, d_v) → (..., n, d_v): the values projected onto the span of the
    keys' columns in ``R^n`` (equal to the values when the keys are linearly independent, ``n ≤ d``).
    """
    keys, values = _check_pairs(keys, values)
    basis, _ = np.linalg.qr(keys)  # (..., n, min(n, d))
    return basis @ (np.swapaxes(basis, -1, -2) @ values)


def best_linear_residual(keys, values) -> np.ndarray:
    """The smallest :func:`mean_square_error` of ``S k_i`` against ``v_i`` over all matrices ``S`` (least squares).

    Zero when the keys are linearly independent (``n ≤ d``); for values with independent N(0, 1) components,
    independent of ``n > d`` generic keys, its mean is ``(n − d)/n``.
    """
    return mean_square_error(least_squares_recall(keys, values), values)


def unit_rows(rng: np.random.Generator, shape) -> np.ndarray:
    """Rows drawn uniformly on the unit sphere (normalised Gaussians), shape (..., n, d)."""
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


__all__ = [
    "window_reach",
    "hybrid_stack",
    "hybrid_cache_tokens",
    "repeat_pattern",
    "SPARSE_KINDS",
    "sparse_masks",
    "pattern_graph",
    "strided_path_layers",
    "pattern_layers_to_connect",
    "window_layers_to_connect",
    "elu_features",
    "positive_random_features",
    "linear_attention_quadratic",
    "linear_attention_recurrent",
    "linear_attention_scan",
    "elu_weight_limit",
    "linear_crossover",
    "prf_kernel_estimates",
    "prf_variance",
    "additive_state",
    "delta_state",
    "recall",
    "mean_square_error",
    "least_squares_recall",
    "best_linear_residual",
    "unit_rows",
]
