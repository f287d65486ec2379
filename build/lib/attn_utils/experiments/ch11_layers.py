"""Chapter 11 — the instruments that reproduce the complexity table of the Transformer paper by
measurement, on the three layers of :mod:`attn_utils.harness.layers` (self-attention, a tanh RNN,
a causal 1-D convolution), and an LSTM, the recurrent cell the Transformer paper's baselines used.

Shapes: ``x (..., n, d_in)`` → ``(..., n, d)``; leading axes are batch axes.

* The LSTM: :func:`init_lstm_params`, :func:`lstm_layer` (every product counted by
  :func:`attn_utils.count_macs`) and its closed-form count :func:`lstm_macs`.
* Restricted self-attention (Table 1's last row): :func:`restricted_attention_layer`, banded, so that a
  counter sees its ``O(r·n·d)`` core.
* Dependency structure: :func:`layer_graph` builds the position-level computation graph of a stack of
  layers; :func:`hop_distances` (fewest edges from input ``j`` to output ``i``), :func:`sequential_depth`
  (longest chain of dependent nodes), :func:`layers_to_connect`. :func:`perturbation_reach` measures the
  same structure on the real layers by perturbing one input position at a time.
* Gradients: :func:`rnn_input_jacobians` (exact, by back-propagation through time) and
  :func:`attention_input_jacobians` (the closed form for one head, optionally with a positional logit
  bias such as :func:`distance_bias`, run by :func:`biased_attention_layer`); both are checked against
  :func:`attn_utils.numerical_jacobian`; :func:`input_sensitivity` measures the same distance dependence
  on the layer itself by finite differences, without either formula.
* Costs are counted with :func:`attn_utils.count_macs` and timed with :func:`attn_utils.min_seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attention import attention_scores, scaled_dot_product_attention
from ..book.measuring import counted_matmul
from ..harness.layers import rnn_layer
from ..multihead import merge_heads, split_heads
from ..softmax import softmax
from ..validation import as_float_array, check_axis_size, positive_int, positive_scalar

LAYER_KINDS = ("attention", "rnn", "conv")


# ---------------------------------------------------------------- the LSTM, the recurrent cell of the 2017 baselines


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # = 1/(1 + e^(−z)), without overflow for large |z|


def init_lstm_params(rng: np.random.Generator, d: int, *, d_in: int | None = None) -> dict[str, np.ndarray]:
    """LSTM weights for :func:`lstm_layer`: ``W (d_in, 4d)`` Gaussian with variance ``1/d_in``,
    ``U (d, 4d)`` Gaussian with variance ``1/d``, ``b (4d,)`` zero. The four column blocks are the
    input, forget and output gates and the candidate cell, in that order."""
    d = positive_int("d", d)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    return {
        "W": rng.normal(0.0, d_in**-0.5, (d_in, 4 * d)),
        "U": rng.normal(0.0, d**-0.5, (d, 4 * d)),
        "b": np.zeros(4 * d),
    }


def lstm_layer(x, params: dict) -> np.ndarray:
    """LSTM (Hochreiter & Schmidhuber 1997, with a forget gate): ``x (..., n, d_in)`` → every output ``(..., n, d)``.

    ``[ι_t, f_t, o_t, c̃_t] = x_t W + y_{t−1} U + b`` (four blocks of width ``d``; ι is the input gate),
    ``c_t = σ(f_t) ⊙ c_{t−1} + σ(ι_t) ⊙ tanh(c̃_t)``, ``y_t = σ(o_t) ⊙ tanh(c_t)``, ``y_{−1} = c_{−1} = 0``.
    Like :func:`attn_utils.harness.rnn_layer`, the input products for all ``t`` are one product and the
    recurrence is a loop of ``n`` dependent products, every one through ``counted_matmul``:
    ``4·n·d·(d_in + d)`` multiply-adds in ``n + 1`` products.
    """
    x = as_float_array("x", x, min_ndim=2)
    W, U, b = (as_float_array(name, params[name], min_ndim=1) for name in ("W", "U", "b"))
    d = U.shape[0]
    check_axis_size("U", U, -1, 4 * d, "4d, four gates of the d rows of U")
    check_axis_size("W", W, -1, 4 * d, "4d, columns of U")
    check_axis_size("x", x, -1, W.shape[0], "d_in, rows of W")
    check_axis_size("b", b, -1, 4 * d, "4d")
    pre = counted_matmul(x, W) + b
    y = np.zeros(x.shape[:-2] + (d,))
    c = np.zeros_like(y)
    out = np.empty(x.shape[:-1] + (d,))
    for t in range(x.shape[-2]):
        z = pre[..., t, :] + counted_matmul(y, U)
        iota, f, o, c_tilde = (z[..., m * d : (m + 1) * d] for m in range(4))  # input, forget, output gates; candidate
        c = _sigmoid(f) * c + _sigmoid(iota) * np.tanh(c_tilde)
        y = _sigmoid(o) * np.tanh(c)
        out[..., t, :] = y
    return out


def lstm_macs(n: int, d: int, *, d_in: int | None = None) -> int:
    """Multiply-adds of :func:`lstm_layer`: four gates, each an input product ``n·d_in·d`` and a
    recurrent product ``n·d²`` (``8·n·d²`` when ``d_in = d``)."""
    n, d = positive_int("n", n), positive_int("d", d)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    return 4 * n * d * (d_in + d)


# ---------------------------------------------------------------- restricted (banded) self-attention


def restricted_attention_layer(
    x, params: dict | None = None, h: int = 1, window: int = 4, *, projections: bool = True
) -> np.ndarray:
    """Causal self-attention restricted to the ``window = r`` most recent positions, computed banded.

    Query ``i`` attends to keys ``i − r + 1, …, i`` only, and only those ``r`` scores are computed: the keys
    and values are gathered into ``(n, r)`` windows (zero-padded before position 0, padding masked), so
    ``Q Kᵀ`` and ``A V`` are ``n`` products of ``r`` keys each, ``2·n·r·d`` multiply-adds in all heads instead
    of the dense ``2·n²·d`` (the projections still cost ``4·n·d²``). Same output as
    :func:`attn_utils.harness.self_attention_layer` with the band mask ``0 ≤ i − j < r``.

    x : (..., n, d); params from :func:`attn_utils.init_mha_params`. ``projections=False`` runs the core only
    (``Q = K = V = x``, no ``W_o``; ``params`` ignored), as in ``self_attention_layer``. Returns (..., n, d_out).
    """
    x = as_float_array("x", x, min_ndim=2)
    h, r = positive_int("h", h), positive_int("window", window)
    if projections:
        if params is None:
            raise ValueError("params is required when projections=True")
        check_axis_size("x", x, -1, params["W_q"].shape[0], "d, rows of W_q")
        q, k, v = (split_heads(counted_matmul(x, params[name]), h) for name in ("W_q", "W_k", "W_v"))
    else:
        q = k = v = split_heads(x, h)  # (..., h, n, d_k)
    n, d_k = q.shape[-2], q.shape[-1]
    pad = np.zeros(k.shape[:-2] + (r - 1, d_k))
    kp, vp = np.concatenate([pad, k], axis=-2), np.concatenate([pad, v], axis=-2)
    keys = np.stack([kp[..., m : m + n, :] for m in range(r)], axis=-2)  # (..., h, n, r, d_k): keys i−r+1 … i
    values = np.stack([vp[..., m : m + n, :] for m in range(r)], axis=-2)
    scores = counted_matmul(q[..., None, :] / np.sqrt(d_k), np.swapaxes(keys, -1, -2))[..., 0, :]  # (..., h, n, r)
    valid = (np.arange(n)[:, None] + np.arange(r)[None, :]) >= r - 1  # key position i − (r−1) + m ≥ 0
    weights = softmax(scores, mask=valid)
    out = counted_matmul(weights[..., None, :], values)[..., 0, :]  # (..., h, n, d_k)
    return counted_matmul(merge_heads(out), params["W_o"]) if projections else merge_heads(out)


# ---------------------------------------------------------------- dependency structure


@dataclass(frozen=True)
class LayerGraph:
    """Position-level computation graph of a stack of layers.

    Node ``(ℓ, i)`` is position ``i`` after layer ``ℓ`` (``ℓ = 0`` are the inputs).
    ``across[ℓ][i, j]``: node ``(ℓ+1, i)`` reads ``(ℓ, j)`` directly;
    ``within[ℓ][i, j]``: node ``(ℓ+1, i)`` reads ``(ℓ+1, j)`` directly (``j < i``; recurrences only).
    """

    kind: str
    n: int
    across: tuple[np.ndarray, ...]
    within: tuple[np.ndarray | None, ...]

    @property
    def n_layers(self) -> int:
        return len(self.across)


def _layer_edges(
    kind: str, n: int, layer: int, w: int, dilation_base: int, causal: bool, window: int | None
) -> tuple[np.ndarray, np.ndarray | None]:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if kind == "attention":
        a = (j <= i) if causal else np.ones((n, n), bool)
        if window is not None:
            a = a & (i - j < window) & (j - i < window)
        return np.asarray(a, bool), None
    if kind == "rnn":
        return i == j, j == i - 1
    lag, step = i - j, min(dilation_base**layer, n)  # dilation ν = dilation_base**layer; ν ≥ n leaves only lag 0
    return (lag >= 0) & (lag % step == 0) & (lag // step < w), None


def _check_kind(kind: str, n, w, dilation_base, window):
    if kind not in LAYER_KINDS:
        raise ValueError(f"kind must be one of {LAYER_KINDS}, received {kind!r}")
    window = None if window is None else positive_int("window", window)
    return positive_int("n", n), positive_int("w", w), positive_int("dilation_base", dilation_base), window


def layer_graph(
    kind: str,
    n: int,
    n_layers: int = 1,
    *,
    w: int = 3,
    dilation_base: int = 1,
    causal: bool = True,
    window: int | None = None,
) -> LayerGraph:
    """Which positions feed which, for ``n_layers`` stacked layers of one kind.

    * ``"attention"``: every ``j`` (``j ≤ i`` when ``causal``); ``window=r`` keeps ``i − r < j``
      (and ``j < i + r`` when not causal) — restricted self-attention.
    * ``"rnn"``: ``(ℓ, i)`` and ``(ℓ+1, i−1)`` — one input edge and the recurrent edge.
    * ``"conv"``: causal, kernel width ``w`` (the argument ``k`` of :func:`attn_utils.harness.init_conv_params`);
      layer ``ℓ = 0, 1, …`` has dilation ``ν = dilation_base**ℓ`` (``1`` = contiguous kernels;
      ``w`` = receptive field ``w**L`` after ``L`` layers).
    """
    n, w, dilation_base, window = _check_kind(kind, n, w, dilation_base, window)
    n_layers = positive_int("n_layers", n_layers)
    edges = [_layer_edges(kind, n, layer, w, dilation_base, causal, window) for layer in range(n_layers)]
    return LayerGraph(kind, n, tuple(a for a, _ in edges), tuple(rec for _, rec in edges))


def _min_over_parents(parents: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``out[i] = min_{m: parents[i, m]} values[m]`` (inf if none); values (n, c). Gathers the
    parents by index (cheap for sparse rows), chunked over rows to bound memory."""
    n, c = values.shape
    counts = parents.sum(axis=1)
    width = max(1, int(counts.max()))
    idx = np.full((n, width), n)  # index n points at an extra row of +inf
    rows, cols = np.nonzero(parents)
    idx[rows, np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)] = cols
    padded = np.vstack([values, np.full((1, c), np.inf)])
    out = np.empty((n, c))
    chunk = max(1, 2**22 // (width * c))
    for start in range(0, n, chunk):
        out[start : start + chunk] = padded[idx[start : start + chunk]].min(axis=1)
    return out


def _advance(dist: np.ndarray, a: np.ndarray, rec: np.ndarray | None, sign: float = 1.0) -> np.ndarray:
    """One layer of shortest (sign=+1) or longest (sign=−1, on negated values) path lengths."""
    new = _min_over_parents(a, dist) + sign
    if rec is not None:  # recurrent edges: row i needs row i−1 of this layer first — sequential
        for i in range(new.shape[0]):
            if rec[i].any():
                new[i] = np.minimum(new[i], new[rec[i]].min(axis=0) + sign)
    return new


def hop_distances(graph: LayerGraph) -> np.ndarray:
    """``D[i, j]``: fewest edges on a path from input ``j`` to top-layer output ``i`` (``inf``: none).

    This is the paper's "path length" between positions: how many weight applications a signal
    (forward) or a gradient (backward) must traverse. Returns a float array (n, n).
    """
    dist = np.where(np.eye(graph.n, dtype=bool), 0.0, np.inf)
    for a, rec in zip(graph.across, graph.within):
        dist = _advance(dist, a, rec)
    return dist


def sequential_depth(graph: LayerGraph) -> int:
    """Longest chain of edges from an input to any node: the number of rounds needed when each
    round computes, in parallel, every node whose inputs are ready."""
    neg_depth = np.zeros((graph.n, 1))
    for a, rec in zip(graph.across, graph.within):
        neg_depth = _advance(neg_depth, a, rec, sign=-1.0)
    return int(-neg_depth.min())


def layers_to_connect(
    kind: str,
    n: int,
    *,
    w: int = 3,
    dilation_base: int = 1,
    causal: bool = True,
    window: int | None = None,
    max_layers: int | None = None,
) -> int:
    """Fewest stacked layers after which every input reaches every output it may reach
    (all ``j ≤ i`` when causal — conv and RNN always are — all pairs otherwise).
    Raises ``ValueError`` if ``max_layers`` (default ``n``) layers are not enough."""
    n, w, dilation_base, window = _check_kind(kind, n, w, dilation_base, window)
    max_layers = n if max_layers is None else positive_int("max_layers", max_layers)
    lower = np.arange(n)[None, :] <= np.arange(n)[:, None]
    target = lower if (causal or kind != "attention") else np.ones((n, n), bool)
    dist = np.where(np.eye(n, dtype=bool), 0.0, np.inf)
    for layer in range(max_layers):
        dist = _advance(dist, *_layer_edges(kind, n, layer, w, dilation_base, causal, window))
        if np.isfinite(dist[target]).all():
            return layer + 1
    raise ValueError(f"{kind} with n={n} is not connected after max_layers={max_layers} layers")


def perturbation_reach(fn, x, *, eps: float = 1.0, tol: float = 1e-9) -> np.ndarray:
    """Measured dependency structure: ``R[i, j]`` is True when changing input position ``j`` changes output ``i``.

    fn : callable mapping (B, n, d_in) → (B, n, d_out) (all layers here accept a batch axis);
    x : (n, d_in). Input ``j`` is moved by ``eps`` along the all-ones direction (all ``n`` perturbed copies
    and the unperturbed one go through ``fn`` in one batched call); an output counts as changed when some
    component moves by more than ``tol``.
    """
    x = as_float_array("x", x, min_ndim=2)
    if x.ndim != 2:
        raise ValueError(f"x must have shape (n, d_in), received shape {x.shape}")
    eps, tol = positive_scalar("eps", eps), positive_scalar("tol", tol)
    n = x.shape[0]
    batch = np.repeat(x[None], n + 1, axis=0)
    batch[1 + np.arange(n), np.arange(n), :] += eps
    y = np.asarray(fn(batch))
    if y.shape[:2] != (n + 1, n):
        raise ValueError(f"fn must return shape (B, n, d_out) = ({n + 1}, {n}, …), received {y.shape}")
    changed = np.abs(y[1:] - y[:1]).max(axis=-1) > tol  # (perturbed input j, output i)
    return changed.T


# ---------------------------------------------------------------- gradients


def input_sensitivity(fn, x, rng: np.random.Generator, i: int | None = None, *, eps: float = 1e-6) -> np.ndarray:
    """Measured ``‖(∂y_i/∂x_j) u_j‖`` for every input position ``j``, by central differences on ``fn`` itself.

    Uses no derivative formula: each ``x_j`` is moved by ``±eps·u_j`` along its own random unit direction
    ``u_j`` (drawn from ``rng``), all ``2n`` perturbed copies go through ``fn`` in one batched call, and the
    change of output ``i`` (default the last) is divided by ``2·eps``. For exchangeable inputs and
    directions the mean of its log has the same distance dependence as ``log ‖∂y_i/∂x_j‖``.

    fn : callable mapping (B, n, d_in) → (B, n, d_out); x : (n, d_in). Returns (n,), entry ``j``.
    Differences below the rounding of ``fn`` (about ``1e-16/eps``) read as 0.
    """
    x = as_float_array("x", x, min_ndim=2)
    if x.ndim != 2:
        raise ValueError(f"x must have shape (n, d_in), received shape {x.shape}")
    eps = positive_scalar("eps", eps)
    n = x.shape[0]
    i = n - 1 if i is None else int(i)
    if not 0 <= i < n:
        raise ValueError(f"i must be in [0, {n}), received {i}")
    u = rng.standard_normal(x.shape)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    batch = np.repeat(x[None], 2 * n, axis=0)
    batch[np.arange(n), np.arange(n)] += eps * u
    batch[n + np.arange(n), np.arange(n)] -= eps * u
    y = np.asarray(fn(batch))
    if y.shape[:2] != (2 * n, n):
        raise ValueError(f"fn must return shape (B, n, d_out) = ({2 * n}, {n}, …), received {y.shape}")
    return np.linalg.norm(y[:n, i] - y[n:, i], axis=-1) / (2 * eps)


def _sequence_and_output_index(x, i, shape: str):
    """Validate one unbatched sequence ``x`` and the output position ``i`` (default: the last)."""
    x = as_float_array("x", x, min_ndim=2)
    if x.ndim != 2:
        raise ValueError(f"x must have shape {shape}, received shape {x.shape}")
    n = x.shape[0]
    i = n - 1 if i is None else int(i)
    if not 0 <= i < n:
        raise ValueError(f"i must be in [0, {n}), received {i}")
    return x, n, i


def rnn_input_jacobians(x, params: dict, i: int | None = None) -> np.ndarray:
    """Exact ``∂y_i/∂x_j`` of :func:`rnn_layer` (state ``y_t``) for every ``j`` (0 for ``j > i``), by back-propagation.

    x : (n, d_in); i defaults to ``n − 1``. Returns (n, d, d_in), entry ``j`` the Jacobian matrix
    ``[Π_{t=i}^{j+1} diag(1−y_t²) Uᵀ] diag(1−y_j²) Wᵀ``.
    """
    x, n, i = _sequence_and_output_index(x, i, "(n, d_in)")
    y = rnn_layer(x, params)
    W, U = np.asarray(params["W"], float), np.asarray(params["U"], float)
    d = U.shape[0]
    jac = np.zeros((n, d, x.shape[1]))
    g = np.eye(d)  # ∂y_i/∂y_t, starting at t = i
    for t in range(i, -1, -1):
        ga = g * (1.0 - y[t] ** 2)[None, :]  # ∂y_i/∂a_t
        jac[t] = ga @ W.T
        g = ga @ U.T
    return jac


def distance_bias(n: int, slope: float) -> np.ndarray:
    """ALiBi's logit bias for one head: ``B[i, j] = −μ·|i − j|``, ``μ = slope`` (Press et al. 2022), shape (n, n)."""
    n, slope = positive_int("n", n), positive_scalar("slope", slope)
    pos = np.arange(n)
    return -slope * np.abs(pos[:, None] - pos[None, :]).astype(float)


def _one_head_weights(x, params: dict, mask, bias):
    Wq, Wk, Wv, Wo = (np.asarray(params[name], float) for name in ("W_q", "W_k", "W_v", "W_o"))
    check_axis_size("x", x, -1, Wq.shape[0], "d, rows of W_q")
    q, k, v = x @ Wq, x @ Wk, x @ Wv
    if bias is None:
        return (Wq, Wk, Wv, Wo), (q, k, v), scaled_dot_product_attention(q, k, v, mask=mask)[1]
    bias = as_float_array("bias", bias, min_ndim=2)
    if bias.shape[-2:] != (x.shape[-2], x.shape[-2]):
        raise ValueError(f"bias must have shape (n, n) = {(x.shape[-2],) * 2}, received {bias.shape}")
    return (Wq, Wk, Wv, Wo), (q, k, v), softmax(attention_scores(q, k) + bias, mask=mask)


def biased_attention_layer(x, params: dict, bias, mask=None) -> np.ndarray:
    """One head of self-attention with an additive logit bias: ``softmax(q kᵀ/√d_k + B) v W_o``.

    x : (..., n, d); bias : (n, n), e.g. :func:`distance_bias`; mask : bool (n, n) or None.
    Returns (..., n, d_out).
    """
    x = as_float_array("x", x, min_ndim=2)
    (_, _, _, Wo), (_, _, v), p = _one_head_weights(x, params, mask, bias)
    return (p @ v) @ Wo


def attention_input_jacobians(x, params: dict, mask=None, i: int | None = None, *, bias=None) -> np.ndarray:
    """Exact ``∂y_i/∂x_j`` of a one-head :func:`self_attention_layer` for every ``j``, in closed form.

    With ``q = xW_q, k = xW_k, v = xW_v``, weights ``p_i·`` of query ``i`` and ``v̄_i = Σ_m p_im v_m``:
    ``∂y_i/∂x_j = [p_ij (W_v + W_k q_iᵀ (v_j − v̄_i)/√d_k) + [j = i] W_q Σ_l p_il k_lᵀ (v_l − v̄_i)/√d_k] W_o``
    as the matrix that multiplies a row perturbation ``δx_j`` from the right. A logit ``bias`` (n, n)
    that does not depend on ``x`` (:func:`biased_attention_layer`) changes only the weights ``p``.

    x : (n, d); params : ``W_q, W_k (d, d_k)``, ``W_v (d, d_v)``, ``W_o (d_v, d_out)``, read as ONE head;
    mask : bool (n, n) or None; i defaults to ``n − 1``. Returns (n, d_out, d), entry ``j`` = ``∂y_i/∂x_j``
    (rows: output components, columns: input components).
    """
    x, n, i = _sequence_and_output_index(x, i, "(n, d)")
    (Wq, Wk, Wv, Wo), (q, k, v), p = _one_head_weights(x, params, mask, bias)
    p_i, s = p[i], 1.0 / np.sqrt(q.shape[-1])
    v_bar = p_i @ v
    key_value = p_i[:, None, None] * (
        Wv[None] + s * (Wk @ q[i])[None, :, None] * (v - v_bar)[:, None, :]
    )  # (n, d, d_v)
    key_value[i] += s * Wq @ ((p_i[:, None] * k).T @ (v - v_bar))  # the query path, j = i only
    return np.swapaxes(key_value @ Wo, -1, -2)


__all__ = [
    "init_lstm_params",
    "lstm_layer",
    "lstm_macs",
    "restricted_attention_layer",
    "LAYER_KINDS",
    "LayerGraph",
    "layer_graph",
    "hop_distances",
    "sequential_depth",
    "layers_to_connect",
    "perturbation_reach",
    "input_sensitivity",
    "rnn_input_jacobians",
    "distance_bias",
    "biased_attention_layer",
    "attention_input_jacobians",
]
