"""Three sequence layers side by side — self-attention, a tanh RNN, a causal 1-D convolution —
with the instruments that reproduce the complexity table of the Transformer paper by measurement.

Shapes: ``x (..., n, d_in)`` → ``(..., n, d)``; leading axes are batch axes.

What is here
------------
* Layers: :func:`self_attention_layer` (projections + :func:`~attn_utils.attention.scaled_dot_product_attention`),
  :func:`rnn_layer` (``h_t = tanh(x_t W + h_{t−1} U + b)``, a Python loop over time, because the
  recurrence *is* sequential) and :func:`conv1d_layer` (causal, kernel width ``k``, optional dilation,
  vectorised over positions as one im2col product). Initialisers :func:`init_rnn_params`,
  :func:`init_conv_params`; attention uses :func:`~attn_utils.multihead.init_mha_params`.
* Counting: inside ``with count_macs() as c:`` every array product the three layers execute adds its
  multiply-adds (from the operand shapes it actually received) to ``c.macs`` and 1 to ``c.products``.
  :func:`attention_macs`, :func:`rnn_macs`, :func:`conv_macs` are the closed forms.
* Dependency structure: :func:`layer_graph` builds the position-level computation graph of a stack of
  layers; :func:`hop_distances` (fewest edges from input ``j`` to output ``i``), :func:`sequential_depth`
  (longest chain of dependent nodes), :func:`layers_to_connect`. :func:`perturbation_reach` measures the
  same structure on the real layers by perturbing one input position at a time.
* Gradients: :func:`rnn_input_jacobians` (exact, by back-propagation through time) and
  :func:`attention_input_jacobians` (the closed form for one head); both are checked against
  :func:`~attn_utils.gradients.numerical_jacobian`.
* :func:`loglog_slope`, :func:`min_seconds` for fitting exponents and timing.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .attention import scaled_dot_product_attention
from .multihead import merge_heads, split_heads
from .validation import as_float_array, check_axis_size, positive_int, positive_scalar

LAYER_KINDS = ("attention", "rnn", "conv")


# ---------------------------------------------------------------- counting multiply-adds


@dataclass
class MacCounter:
    """Running totals: ``macs`` multiply-adds and ``products`` array products executed."""

    macs: int = 0
    products: int = 0


_ACTIVE: list[MacCounter] = []


@contextmanager
def count_macs():
    """Count the multiply-adds of every array product the layers of this module execute.

    ``with count_macs() as c: ...`` then read ``c.macs`` and ``c.products``. A product
    ``(..., m, p) @ (..., p, r)`` counts ``size(result) · p`` multiply-adds. Element-wise work
    (softmax, tanh, bias, masking) is not counted: it is ``O(n·n)`` or ``O(n·d)``, lower order than
    every product. Counters nest: an outer counter also sees what an inner one counts.
    """
    counter = MacCounter()
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)


def record_macs(macs: int, products: int = 1) -> None:
    """Add ``macs`` multiply-adds (in ``products`` matrix products) to every active :class:`MacCounter`."""
    for counter in _ACTIVE:
        counter.macs += int(macs)
        counter.products += products


def counted_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``, its multiply-adds recorded in every active :class:`MacCounter`."""
    out = a @ b
    record_macs(out.size * a.shape[-1])
    return out


def attention_macs(n: int, d: int, *, projections: bool = True) -> int:
    """Multiply-adds of one self-attention layer on ``n`` tokens of width ``d`` (any number of heads).

    Core ``Q Kᵀ`` and ``A V``: ``2·n²·d``. Projections ``W_q, W_k, W_v, W_o``: ``4·n·d²``.
    (One multiply-add is two floating-point operations.)
    """
    n, d = positive_int("n", n), positive_int("d", d)
    return 2 * n * n * d + (4 * n * d * d if projections else 0)


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


# ---------------------------------------------------------------- the three layers


def self_attention_layer(x, params: dict | None = None, h: int = 1, mask=None, *, projections: bool = True):
    """Self-attention ``concat_i(softmax(Q_i K_iᵀ/√d_k) V_i) W_o`` with ``Q, K, V = x W_q, x W_k, x W_v``.

    x : (..., n, d); params : ``W_q, W_k, W_v (d, h·d_k)``, ``W_o (h·d_v, d)`` from
    :func:`~attn_utils.multihead.init_mha_params`; mask : bool (n, n), ``True`` = may attend.
    ``projections=False`` runs the core only (``Q = K = V = x``, no ``W_o``; ``params`` ignored).

    Returns ``(output (..., n, d_out), weights (..., h, n, n))``. The core counts ``2·n²·d`` multiply-adds
    whether or not a mask zeroes some weights: the dense products are computed either way.
    """
    x = as_float_array("x", x, min_ndim=2)
    h = positive_int("h", h)
    if projections:
        if params is None:
            raise ValueError("params is required when projections=True")
        missing = {"W_q", "W_k", "W_v", "W_o"} - set(params)
        if missing:
            raise ValueError(f"params is missing {sorted(missing)}")
        check_axis_size("x", x, -1, params["W_q"].shape[0], "d, rows of W_q")
        q, k, v = (counted_matmul(x, params[name]) for name in ("W_q", "W_k", "W_v"))
    else:
        q = k = v = x
    qh, kh, vh = split_heads(q, h), split_heads(k, h), split_heads(v, h)
    heads, weights = scaled_dot_product_attention(qh, kh, vh, mask=mask)
    record_macs(weights.size * qh.shape[-1] + heads.size * kh.shape[-2], products=2)  # Q Kᵀ, then A V
    out = merge_heads(heads)
    return (counted_matmul(out, params["W_o"]) if projections else out), weights


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
    """Elman RNN ``h_t = tanh(x_t W + h_{t−1} U + b)``, ``h_{−1} = h0`` (default 0).

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
    h = np.zeros(x.shape[:-2] + (d,)) if h0 is None else as_float_array("h0", h0, min_ndim=1)
    check_axis_size("h0", h, -1, d, "d")
    states = np.empty(pre.shape)
    for t in range(x.shape[-2]):
        h = np.tanh(pre[..., t, :] + counted_matmul(h, U))
        states[..., t, :] = h
    return states


def init_conv_params(rng: np.random.Generator, d: int, k: int, *, d_in: int | None = None) -> dict[str, np.ndarray]:
    """``W (k, d_in, d)`` Gaussian with variance ``1/(k·d_in)`` (unit-variance outputs), ``b = 0``."""
    d, k = positive_int("d", d), positive_int("k", k)
    d_in = d if d_in is None else positive_int("d_in", d_in)
    return {"W": rng.normal(0.0, (k * d_in) ** -0.5, (k, d_in, d)), "b": np.zeros(d)}


def conv1d_layer(x, params: dict, *, dilation: int = 1) -> np.ndarray:
    """Causal 1-D convolution ``y_i = b + Σ_{m=0}^{k−1} x_{i−(k−1−m)·r} W_m`` (zero before position 0).

    x : (..., n, d_in); params : ``W (k, d_in, d)``, ``b (d,)``; dilation ``r ≥ 1``.
    Output i sees inputs ``i−(k−1)r, …, i−r, i``. Computed as one product of the ``(n, k·d_in)``
    window matrix with ``W`` reshaped to ``(k·d_in, d)``: ``n·k·d_in·d`` multiply-adds.
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
    kind: str, n: int, layer: int, k: int, dilation_base: int, causal: bool, window: int | None
) -> tuple[np.ndarray, np.ndarray | None]:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if kind == "attention":
        a = (j <= i) if causal else np.ones((n, n), bool)
        if window is not None:
            a = a & (i - j < window) & (j - i < window)
        return np.asarray(a, bool), None
    if kind == "rnn":
        return i == j, j == i - 1
    lag, r = i - j, min(dilation_base**layer, n)  # a dilation ≥ n leaves only lag 0, as n does
    return (lag >= 0) & (lag % r == 0) & (lag // r < k), None


def _check_kind(kind: str, n, k, dilation_base, window):
    if kind not in LAYER_KINDS:
        raise ValueError(f"kind must be one of {LAYER_KINDS}, received {kind!r}")
    window = None if window is None else positive_int("window", window)
    return positive_int("n", n), positive_int("k", k), positive_int("dilation_base", dilation_base), window


def layer_graph(
    kind: str,
    n: int,
    n_layers: int = 1,
    *,
    k: int = 3,
    dilation_base: int = 1,
    causal: bool = True,
    window: int | None = None,
) -> LayerGraph:
    """Which positions feed which, for ``n_layers`` stacked layers of one kind.

    * ``"attention"``: every ``j`` (``j ≤ i`` when ``causal``); ``window=r`` keeps ``i − r < j``
      (and ``j < i + r`` when not causal) — restricted self-attention.
    * ``"rnn"``: ``(ℓ, i)`` and ``(ℓ+1, i−1)`` — one input edge and the recurrent edge.
    * ``"conv"``: causal, kernel width ``k``; layer ``ℓ = 0, 1, …`` has dilation ``dilation_base**ℓ``
      (``1`` = contiguous kernels; ``k`` = receptive field ``k**L`` after ``L`` layers).
    """
    n, k, dilation_base, window = _check_kind(kind, n, k, dilation_base, window)
    n_layers = positive_int("n_layers", n_layers)
    edges = [_layer_edges(kind, n, layer, k, dilation_base, causal, window) for layer in range(n_layers)]
    return LayerGraph(kind, n, tuple(a for a, _ in edges), tuple(w for _, w in edges))


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


def _advance(dist: np.ndarray, a: np.ndarray, w: np.ndarray | None, sign: float = 1.0) -> np.ndarray:
    """One layer of shortest (sign=+1) or longest (sign=−1, on negated values) path lengths."""
    new = _min_over_parents(a, dist) + sign
    if w is not None:  # recurrent edges: row i needs row i−1 of this layer first — sequential
        for i in range(new.shape[0]):
            if w[i].any():
                new[i] = np.minimum(new[i], new[w[i]].min(axis=0) + sign)
    return new


def hop_distances(graph: LayerGraph) -> np.ndarray:
    """``D[i, j]``: fewest edges on a path from input ``j`` to top-layer output ``i`` (``inf``: none).

    This is the paper's "path length" between positions: how many weight applications a signal
    (forward) or a gradient (backward) must traverse. Returns a float array (n, n).
    """
    dist = np.where(np.eye(graph.n, dtype=bool), 0.0, np.inf)
    for a, w in zip(graph.across, graph.within):
        dist = _advance(dist, a, w)
    return dist


def sequential_depth(graph: LayerGraph) -> int:
    """Longest chain of edges from an input to any node: the number of rounds needed when each
    round computes, in parallel, every node whose inputs are ready."""
    neg_depth = np.zeros((graph.n, 1))
    for a, w in zip(graph.across, graph.within):
        neg_depth = _advance(neg_depth, a, w, sign=-1.0)
    return int(-neg_depth.min())


def layers_to_connect(
    kind: str,
    n: int,
    *,
    k: int = 3,
    dilation_base: int = 1,
    causal: bool = True,
    window: int | None = None,
    max_layers: int | None = None,
) -> int:
    """Fewest stacked layers after which every input reaches every output it may reach
    (all ``j ≤ i`` when causal — conv and RNN always are — all pairs otherwise).
    Raises ``ValueError`` if ``max_layers`` (default ``n``) layers are not enough."""
    n, k, dilation_base, window = _check_kind(kind, n, k, dilation_base, window)
    max_layers = n if max_layers is None else positive_int("max_layers", max_layers)
    lower = np.arange(n)[None, :] <= np.arange(n)[:, None]
    target = lower if (causal or kind != "attention") else np.ones((n, n), bool)
    dist = np.where(np.eye(n, dtype=bool), 0.0, np.inf)
    for layer in range(max_layers):
        dist = _advance(dist, *_layer_edges(kind, n, layer, k, dilation_base, causal, window))
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
    """Exact ``∂h_i/∂x_j`` of :func:`rnn_layer` for every ``j`` (zero for ``j > i``), by back-propagation.

    x : (n, d_in); i defaults to ``n − 1``. Returns (n, d, d_in), entry ``j`` the Jacobian matrix
    ``[Π_{t=i}^{j+1} diag(1−h_t²) Uᵀ] diag(1−h_j²) Wᵀ``.
    """
    x, n, i = _sequence_and_output_index(x, i, "(n, d_in)")
    h = rnn_layer(x, params)
    W, U = np.asarray(params["W"], float), np.asarray(params["U"], float)
    d = U.shape[0]
    jac = np.zeros((n, d, x.shape[1]))
    g = np.eye(d)  # ∂h_i/∂h_t, starting at t = i
    for t in range(i, -1, -1):
        ga = g * (1.0 - h[t] ** 2)[None, :]  # ∂h_i/∂a_t
        jac[t] = ga @ W.T
        g = ga @ U.T
    return jac


def attention_input_jacobians(x, params: dict, mask=None, i: int | None = None) -> np.ndarray:
    """Exact ``∂y_i/∂x_j`` of a one-head :func:`self_attention_layer` for every ``j``, in closed form.

    With ``q = xW_q, k = xW_k, v = xW_v``, weights ``p_i·`` of query ``i`` and ``v̄_i = Σ_m p_im v_m``:
    ``∂y_i/∂x_j = [p_ij (W_v + W_k q_iᵀ (v_j − v̄_i)/√d_k) + 𝟙[j=i] W_q Σ_l p_il k_lᵀ (v_l − v̄_i)/√d_k] W_o``
    as the matrix that multiplies a row perturbation ``δx_j`` from the right.

    x : (n, d); params : ``W_q, W_k (d, d_k)``, ``W_v (d, d_v)``, ``W_o (d_v, d_out)``, read as ONE head;
    mask : bool (n, n) or None; i defaults to ``n − 1``. Returns (n, d_out, d), entry ``j`` = ``∂y_i/∂x_j``
    (rows: output components, columns: input components).
    """
    x, n, i = _sequence_and_output_index(x, i, "(n, d)")
    Wq, Wk, Wv, Wo = (np.asarray(params[name], float) for name in ("W_q", "W_k", "W_v", "W_o"))
    check_axis_size("x", x, -1, Wq.shape[0], "d, rows of W_q")
    q, k, v = x @ Wq, x @ Wk, x @ Wv
    _, p = scaled_dot_product_attention(q, k, v, mask=mask)
    p_i, s = p[i], 1.0 / np.sqrt(q.shape[-1])
    v_bar = p_i @ v
    key_value = p_i[:, None, None] * (
        Wv[None] + s * (Wk @ q[i])[None, :, None] * (v - v_bar)[:, None, :]
    )  # (n, d, d_v)
    key_value[i] += s * Wq @ ((p_i[:, None] * k).T @ (v - v_bar))  # the query path, j = i only
    return np.swapaxes(key_value @ Wo, -1, -2)


# ---------------------------------------------------------------- fitting and timing


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``: the exponent ``a`` in ``y ∝ x^a``."""
    x = as_float_array("x", x, min_ndim=1)
    y = as_float_array("y", y, min_ndim=1)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"x and y must be 1-D of equal length ≥ 2, received {x.shape} and {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("x and y must be positive for a log-log fit")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def min_seconds(fn, *args, repeat: int = 5, **kwargs) -> float:
    """Fastest wall-clock seconds of ``fn(*args, **kwargs)`` over ``repeat`` calls, after one warm-up.

    The minimum (not the mean) is the least disturbed by other processes sharing the machine.
    """
    repeat = positive_int("repeat", repeat)
    fn(*args, **kwargs)
    best = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return float(best)


__all__ = [
    "LAYER_KINDS",
    "MacCounter",
    "count_macs",
    "attention_macs",
    "rnn_macs",
    "conv_macs",
    "self_attention_layer",
    "init_rnn_params",
    "rnn_layer",
    "init_conv_params",
    "conv1d_layer",
    "LayerGraph",
    "layer_graph",
    "hop_distances",
    "sequential_depth",
    "layers_to_connect",
    "perturbation_reach",
    "rnn_input_jacobians",
    "attention_input_jacobians",
    "loglog_slope",
    "min_seconds",
]
