"""Three sequence layers for the toy models and the comparisons: self-attention, a tanh RNN and a
causal 1-D convolution, with the closed-form multiply-add counts of each.

Shapes: ``x (..., n, d_in)`` → ``(..., n, d)``; leading axes are batch axes. Every array product goes
through :func:`attn_utils.book.measuring.counted_matmul`, so ``with count_macs() as c:`` counts what a
layer executed, to be compared with :func:`attention_macs`, :func:`rnn_macs`, :func:`conv_macs`.
The RNN is a Python loop over time because the recurrence *is* sequential (chapter 11).
"""

from __future__ import annotations

import numpy as np

from ..attention import scaled_dot_product_attention
from ..book.measuring import counted_matmul
from ..multihead import merge_heads, multi_head_attention, split_heads
from ..validation import as_float_array, check_axis_size, positive_int, positive_scalar


def attention_macs(
    n: int,
    d: int,
    *,
    h: int = 1,
    h_kv: int | None = None,
    d_k: int | None = None,
    d_v: int | None = None,
    projections: bool = True,
    by_part: bool = False,
):
    """Multiply-adds of one multi-head self-attention layer on ``n`` tokens of width ``d`` (the book's one formula).

    Per head ``i``: the scores ``Q_i K_iᵀ`` cost ``n²·d_k``, the weighted sum ``A_i V_i`` ``n²·d_v``;
    the projections ``W_Q, W_K, W_V, W_O`` cost ``n·d·h·(2·d_k + 2·d_v)``, or with ``h_kv`` key/value
    heads (grouped-query attention: only ``W_K`` and ``W_V`` shrink) ``n·d·(h·d_k + h_kv·d_k + h_kv·d_v + h·d_v)``.
    ``d_k`` and ``d_v`` default to ``d / h``, and then the layer costs ``2·n²·d + 4·n·d²`` whatever ``h`` is
    (with ``h_kv = h``). ``projections=False``
    counts the core (scores and weighted sum) only. One multiply-add is two floating-point operations.

    Returns the total, or with ``by_part`` a dict: ``projections``, ``scores``, ``weighted_sum``,
    ``total`` and ``softmax_entries`` (``h·n²`` exponentials, not multiply-adds: the one part that
    grows with ``h`` at fixed ``d``).
    """
    n, d, h = positive_int("n", n), positive_int("d", d), positive_int("h", h)
    h_kv = h if h_kv is None else positive_int("h_kv", h_kv)
    if (d_k is None or d_v is None) and d % h:
        raise ValueError(f"d={d} must be divisible by h={h} when d_k/d_v are not given")
    d_k = d // h if d_k is None else positive_int("d_k", d_k)
    d_v = d // h if d_v is None else positive_int("d_v", d_v)
    parts = {
        "projections": n * d * (h * d_k + h_kv * d_k + h_kv * d_v + h * d_v) if projections else 0,
        "scores": h * n * n * d_k,
        "weighted_sum": h * n * n * d_v,
    }
    parts["total"] = sum(parts.values())
    parts["softmax_entries"] = h * n * n
    return parts if by_part else parts["total"]


def rnn_macs(n: int, d: int, *, d_in: int | None = None) -> int:
    """Multiply-adds of :func:`rnn_layer`: input product ``n·d_in·d`` plus recurrence ``n·d²``."""
    n, d = positive_int("n", n), positive_int("d", d)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    return n * d_in * d + n * d * d


def conv_macs(n: int, d: int, k: int, *, d_in: int | None = None) -> int:
    """Multiply-adds of :func:`conv1d_layer`: ``n`` outputs × ``k`` taps × ``d_in·d`` (padding included)."""
    n, d, k = positive_int("n", n), positive_int("d", d), positive_int("k", k)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    return n * k * d_in * d


def self_attention_layer(x, params: dict | None = None, h: int | None = None, mask=None, *, projections: bool = True):
    """Self-attention ``concat_i(softmax(Q_i K_iᵀ/√d_k) V_i) W_o`` with ``Q, K, V = x W_q, x W_k, x W_v``.

    x : (..., n, d); params : ``W_q, W_k, W_v (d, h·d_k)``, ``W_o (h·d_v, d)`` from
    :func:`~attn_utils.multihead.init_mha_params`; mask : bool (n, n), ``True`` = may attend.
    h : the head count; taken from the parameters when they are :class:`~attn_utils.multihead.MHAParams`
    (a different ``h`` is refused: it would change ``d_k`` and the scale), required otherwise.
    With projections this is :func:`~attn_utils.multihead.multi_head_attention` on ``(x, x)`` (grouped
    key/value heads included). ``projections=False`` runs the core only (``Q = K = V = x``, no ``W_o``;
    ``params`` ignored).

    Returns ``(output (..., n, d_out), weights (..., h, n, n))``. The core is
    :func:`~attn_utils.attention.scaled_dot_product_attention`, whose two products ``Q Kᵀ`` and
    ``A V`` are counted by :func:`count_macs` like the projections, so a counter sees what was
    executed: ``2·n²·d`` multiply-adds whether or not a mask zeroes some weights, because the dense
    products are computed either way.
    """
    if projections:
        if params is None:
            raise ValueError("params is required when projections=True")
        x = as_float_array("x", x, min_ndim=2)
        if "W_q" in params:  # named here as x, not as the core's x_q
            check_axis_size("x", x, -1, params["W_q"].shape[0], "d, rows of W_q")
        return multi_head_attention(x, x, params, h, mask)  # the core layer: validated, counted
    x = as_float_array("x", x, min_ndim=2)
    if h is None:
        raise TypeError("h is required with projections=False (the heads split x itself)")
    h = positive_int("h", h)
    heads, weights = scaled_dot_product_attention(split_heads(x, h), split_heads(x, h), split_heads(x, h), mask)
    return merge_heads(heads), weights


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))  # sign fix: Haar-distributed orthogonal matrix


def init_rnn_params(
    rng: np.random.Generator, d: int, *, d_in: int | None = None, radius: float = 0.9
) -> dict[str, np.ndarray]:
    """``W (d_in, d)`` Gaussian with variance ``1/d_in``; ``U = radius · Q`` with ``Q`` orthogonal; ``b = 0``.

    Every singular value of ``U`` equals ``radius``, so ``radius`` is both its spectral norm and its
    spectral radius: ``radius < 1`` makes the recurrence contractive.
    """
    d = positive_int("d", d)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    radius = positive_scalar("radius", radius)
    return {"W": rng.normal(0.0, d_in**-0.5, (d_in, d)), "U": radius * _orthogonal(rng, d), "b": np.zeros(d)}


def rnn_layer(x, params: dict, h0=None) -> np.ndarray:
    """Elman RNN ``y_t = tanh(x_t W + y_{t−1} U + b)``, ``y_{−1} = h0`` (default 0).

    x : (..., n, d_in); params : ``W (d_in, d)``, ``U (d, d)``, ``b (d,)``; h0 : (..., d).
    Returns every state, (..., n, d). The input products for all ``t`` are one parallel product; the
    recurrence is a Python loop of ``n`` dependent products — that dependence is the point.
    """
    x = as_float_array("x", x, min_ndim=2)
    W, U, b = (as_float_array(name, params[name], min_ndim=1) for name in ("W", "U", "b"))
    d = U.shape[-1]
    check_axis_size("x", x, -1, W.shape[0], "d_in, rows of W")
    check_axis_size("W", W, -1, d, "d, columns of U")
    check_axis_size("U", U, 0, d, "d, U must be square")
    check_axis_size("b", b, -1, d, "d")
    pre = counted_matmul(x, W) + b
    y = np.zeros(x.shape[:-2] + (d,)) if h0 is None else as_float_array("h0", h0, min_ndim=1)
    check_axis_size("h0", y, -1, d, "d")
    states = np.empty(pre.shape)
    for t in range(x.shape[-2]):
        y = np.tanh(pre[..., t, :] + counted_matmul(y, U))
        states[..., t, :] = y
    return states


def init_conv_params(rng: np.random.Generator, d: int, k: int, *, d_in: int | None = None) -> dict[str, np.ndarray]:
    """``W (k, d_in, d)`` Gaussian with variance ``1/(k·d_in)`` (unit-variance outputs), ``b = 0``."""
    d, k = positive_int("d", d), positive_int("k", k)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    return {"W": rng.normal(0.0, (k * d_in) ** -0.5, (k, d_in, d)), "b": np.zeros(d)}


def conv1d_layer(x, params: dict, *, dilation: int = 1) -> np.ndarray:
    """Causal 1-D convolution ``y_i = b + Σ_{m=0}^{w−1} x_{i−(w−1−m)ν} W_m`` (zero before position 0).

    x : (..., n, d_in); params : ``W (w, d_in, d)`` (kernel width ``w``), ``b (d,)``; dilation ``ν ≥ 1``.
    Output i sees inputs ``i−(w−1)ν, …, i−ν, i``. Computed as one product of the ``(n, w·d_in)``
    window matrix with ``W`` reshaped to ``(w·d_in, d)``: ``n·w·d_in·d`` multiply-adds.
    """
    x = as_float_array("x", x, min_ndim=2)
    W, b = as_float_array("W", params["W"], min_ndim=3), as_float_array("b", params["b"], min_ndim=1)
    if W.ndim != 3:
        raise ValueError(f"W must have shape (k, d_in, d), received shape {W.shape}")
    k, d_in, d = W.shape
    check_axis_size("x", x, -1, d_in, "d_in, axis 1 of W")
    check_axis_size("b", b, -1, d, "d")
    r = positive_int("dilation", dilation)
    n = x.shape[-2]
    pad = np.zeros(x.shape[:-2] + ((k - 1) * r, d_in))
    xp = np.concatenate([pad, x], axis=-2)
    windows = np.stack([xp[..., m * r : m * r + n, :] for m in range(k)], axis=-2)  # (..., n, k, d_in)
    return counted_matmul(windows.reshape(x.shape[:-2] + (n, k * d_in)), W.reshape(k * d_in, d)) + b


__all__ = [
    "attention_macs",
    "rnn_macs",
    "conv_macs",
    "self_attention_layer",
    "init_rnn_params",
    "rnn_layer",
    "init_conv_params",
    "conv1d_layer",
]
