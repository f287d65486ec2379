"""Multi-head attention as array operations (no Python loop over heads).

Parameter layout: ``W_q : (d_model, h·d_k)``, ``W_k : (d_model, h_kv·d_k)``,
``W_v : (d_model, h_kv·d_v)``, ``W_o : (h·d_v, d_model)``. Head ``i`` owns columns
``i·d_k … (i+1)·d_k − 1``. ``h_kv`` is the number of key/value heads: ``h_kv = h`` is ordinary
multi-head attention, ``h_kv = 1`` multi-query attention (MQA) and ``1 < h_kv < h`` grouped-query
attention (GQA). With ``g = h / h_kv``, query heads ``j·g … (j+1)·g − 1`` share key/value head ``j``
(:func:`grouped_attention`); the result equals multi-head attention with every key/value head
repeated ``g`` times, while the keys and values are computed, stored and read once per group.

The same four matrices split into a different number of heads are a different model with a
different d_k and therefore a different scale 1/√d_k, so the parameters carry their head counts
``h`` and ``h_kv`` (:class:`MHAParams`) and :func:`multi_head_attention` refuses any others.
"""

from __future__ import annotations

import numpy as np

from .attention import check_mask, scaled_dot_product_attention
from .counting import counted_matmul
from .validation import as_float_array, check_axis_size, positive_int


def group_size(h: int, h_kv: int | None) -> int:
    """``g = h / h_kv``, the number of query heads that share one key/value head.

    ``h_kv = None`` means ``h`` (ordinary multi-head attention, ``g = 1``). Raises ``ValueError``
    unless ``h_kv`` divides ``h``.
    """
    h = positive_int("h", h)
    h_kv = h if h_kv is None else positive_int("h_kv", h_kv)
    if h % h_kv:
        raise ValueError(
            f"h={h} must be a multiple of h_kv={h_kv}: each key/value head is shared by h/h_kv query heads"
        )
    return h // h_kv


def split_heads(x, h: int) -> np.ndarray:
    """(..., n, h·d) → (..., h, n, d)."""
    x = as_float_array("x", x, min_ndim=2)
    h = positive_int("h", h)
    if x.shape[-1] % h:
        raise ValueError(f"x last axis ({x.shape[-1]}) must be divisible by h={h}; received shape {x.shape}")
    return np.swapaxes(x.reshape(*x.shape[:-1], h, x.shape[-1] // h), -3, -2)


def merge_heads(x) -> np.ndarray:
    """(..., h, n, d) → (..., n, h·d); the inverse of :func:`split_heads`."""
    x = as_float_array("x", x, min_ndim=3)
    h, n, d = x.shape[-3:]
    return np.swapaxes(x, -3, -2).reshape(*x.shape[:-3], n, h * d)


class MHAParams(dict):
    """The four projection matrices and the head counts, validated once, on construction; immutable.

    ``weights``: ``W_q (d_model, h·d_k)``, ``W_k (d_model, h_kv·d_k)``, ``W_v (d_model, h_kv·d_v)``,
    ``W_o (h·d_v, d_model)``, finite. ``h`` query heads and ``h_kv`` key/value heads (default ``h``;
    it must divide ``h``). A wrong shape, a head count that does not divide the columns, or a
    non-finite weight raises ``ValueError`` naming the matrix. A dict, so ``params["W_q"]`` and
    ``params.values()`` work; ``params.h``, ``params.h_kv``, ``params.d_k`` and ``params.d_v`` are
    not among the values. Assigning to it raises: a new head count or a new matrix is a new
    :class:`MHAParams`.
    """

    def __init__(self, weights: dict, h: int, h_kv: int | None = None):
        if not isinstance(weights, dict):
            raise TypeError(f"weights must be a dict of the four matrices, received {type(weights).__name__}")
        missing = {"W_q", "W_k", "W_v", "W_o"} - set(weights)
        if missing:
            raise ValueError(f"params is missing {sorted(missing)}")
        h = positive_int("h", h)
        h_kv = h // group_size(h, h_kv)
        w = {name: as_float_array(name, weights[name], min_ndim=2) for name in ("W_q", "W_k", "W_v", "W_o")}
        for name, m in w.items():
            if m.ndim != 2:
                raise ValueError(f"{name} must be a matrix (2 axes), received shape {m.shape}")
        d_model = w["W_q"].shape[0]

        def per_head(name: str, heads: int) -> int:
            cols = w[name].shape[1]
            if w[name].shape[0] != d_model or cols % heads:
                raise ValueError(
                    f"{name} must be (d_model={d_model}, {heads}·d) for {heads} heads, received shape {w[name].shape}"
                )
            return cols // heads

        d_k, d_v = per_head("W_q", h), per_head("W_v", h_kv)
        if w["W_k"].shape != (d_model, h_kv * d_k):
            raise ValueError(
                f"W_k must be (d_model, h_kv·d_k) = {(d_model, h_kv * d_k)}, received shape {w['W_k'].shape}"
            )
        if w["W_o"].shape != (h * d_v, d_model):
            raise ValueError(f"W_o must be (h·d_v, d_model) = {(h * d_v, d_model)}, received shape {w['W_o'].shape}")
        super().__init__(w)
        self.h, self.h_kv, self.d_k, self.d_v = h, h_kv, d_k, d_v

    def check_head_count(self, h) -> int:
        """The head count, after checking that a given ``h`` (``None``: not given) is the one these
        parameters were made for: another split would change ``d_k`` and the scale ``1/√d_k``."""
        if h is not None and positive_int("h", h) != self.h:
            raise ValueError(
                f"h must be the head count the parameters were made for ({self.h}), received "
                f"h={h}: splitting them into {h} heads would change d_k and the scale 1/√d_k"
            )
        return self.h

    def _immutable(self, *args, **kwargs):
        raise TypeError("MHAParams is immutable: build a new one, MHAParams({...}, h, h_kv)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _immutable

    def __repr__(self) -> str:
        kv = "" if self.h_kv == self.h else f", h_kv={self.h_kv}"
        return f"MHAParams(h={self.h}{kv}, {', '.join(f'{k}: {v.shape}' for k, v in self.items())})"


def init_mha_params(
    rng: np.random.Generator,
    d_model: int,
    h: int,
    d_k: int | None = None,
    d_v: int | None = None,
    *,
    h_kv: int | None = None,
) -> MHAParams:
    """Gaussian weights with variance 1/fan_in, so unit-variance inputs give unit-variance q, k, v.

    ``d_k`` and ``d_v`` default to ``d_model // h`` (the Transformer's choice). ``h_kv`` key/value
    heads (default ``h``; 1 for multi-query, a divisor of ``h`` for grouped-query attention) give
    ``W_k : (d_model, h_kv·d_k)`` and ``W_v : (d_model, h_kv·d_v)``. The result remembers ``h``
    and ``h_kv`` (:class:`MHAParams`). With ``h_kv = h`` the draws are those of earlier versions.
    """
    d_model, h = positive_int("d_model", d_model), positive_int("h", h)
    h_kv = h // group_size(h, h_kv)
    if d_k is None or d_v is None:
        if d_model % h:
            raise ValueError(f"d_model={d_model} must be divisible by h={h} when d_k/d_v are not given")
    d_k = d_model // h if d_k is None else positive_int("d_k", d_k)
    d_v = d_model // h if d_v is None else positive_int("d_v", d_v)
    std_in, std_out = d_model**-0.5, (h * d_v) ** -0.5
    return MHAParams(
        {
            "W_q": rng.normal(0, std_in, (d_model, h * d_k)),
            "W_k": rng.normal(0, std_in, (d_model, h_kv * d_k)),
            "W_v": rng.normal(0, std_in, (d_model, h_kv * d_v)),
            "W_o": rng.normal(0, std_out, (h * d_v, d_model)),
        },
        h,
        h_kv,
    )


def mha_param_count(
    d_model: int, h: int, d_k: int | None = None, d_v: int | None = None, *, h_kv: int | None = None
) -> int:
    """Number of weights in the four projections (no biases).

    ``d·h·d_k + d·h_kv·d_k + d·h_kv·d_v + h·d_v·d`` (W_q, W_k, W_v, W_o); with ``h_kv = h`` (the
    default) this is ``2·d·h·d_k + 2·d·h·d_v``.
    """
    d_model, h = positive_int("d_model", d_model), positive_int("h", h)
    h_kv = h // group_size(h, h_kv)
    if (d_k is None or d_v is None) and d_model % h:
        raise ValueError(f"d_model={d_model} must be divisible by h={h} when d_k/d_v are not given")
    d_k = d_model // h if d_k is None else positive_int("d_k", d_k)
    d_v = d_model // h if d_v is None else positive_int("d_v", d_v)
    return d_model * (h + h_kv) * d_k + d_model * (h_kv + h) * d_v


def grouped_attention(q, k, v, mask=None, scale: float | None = None, *, matmul=counted_matmul):
    """Attention of ``h`` query heads over ``h_kv`` shared key/value heads (MQA/GQA), without copying K/V.

    q : (..., h, n_q, d_k); k : (..., h_kv, n_k, d_k); v : (..., h_kv, n_k, d_v), with ``h_kv``
    dividing ``h``. Query head ``i`` uses key/value head ``i // g``, ``g = h / h_kv``: the result
    equals :func:`~attn_utils.attention.scaled_dot_product_attention` of ``q`` with ``k`` and ``v``
    repeated ``g`` times along the head axis (``np.repeat(k, g, axis=-3)``). It is computed by
    stacking the ``g`` query heads of a group along the query axis, ``(..., h_kv, g·n_q, d_k)``, so
    each key/value head enters one matrix product, once.

    mask : bool, broadcastable to (..., h, n_q, n_k), as for multi-head attention.
    matmul : passed to :func:`~attn_utils.attention.scaled_dot_product_attention` (a counting
    matmul measures the multiply-adds of the two products).
    Returns ``(output (..., h, n_q, d_v), weights (..., h, n_q, n_k))``.
    """
    q = as_float_array("q", q, min_ndim=3)
    k = as_float_array("k", k, min_ndim=3)
    v = as_float_array("v", v, min_ndim=3)
    h, n_q, d_k = q.shape[-3:]
    h_kv, n_k = k.shape[-3], k.shape[-2]
    if h_kv == 0 or h % h_kv:
        raise ValueError(
            f"q has h={h} heads (axis -3) and k has h_kv={h_kv}: h must be a multiple of h_kv; "
            f"received q {q.shape}, k {k.shape}"
        )
    if v.shape[-3] != h_kv:
        raise ValueError(f"v must have h_kv={h_kv} heads on axis -3 like k, received shape {v.shape}")
    g = h // h_kv
    lead = q.shape[:-3]
    q_grouped = q.reshape(*lead, h_kv, g * n_q, d_k)  # the g query heads of group j, one after another
    if mask is not None:
        full = (*lead, h, n_q, n_k)
        mask = check_mask(mask, full)
        mask = np.broadcast_to(mask, full).reshape(*lead, h_kv, g * n_q, n_k)
    out, weights = scaled_dot_product_attention(q_grouped, k, v, mask=mask, scale=scale, matmul=matmul)
    return out.reshape(*lead, h, n_q, v.shape[-1]), weights.reshape(*lead, h, n_q, n_k)


def attention_heads(
    x_q,
    x_kv,
    params: dict,
    h: int | None = None,
    mask=None,
    scale: float | None = None,
    *,
    h_kv: int | None = None,
    share_qk: bool = False,
    rotate=None,
):
    """The heads of :func:`multi_head_attention` before ``W_o``: ``head_i = Attn(x_q W_q^i, x_kv W_k^j, x_kv W_v^j)``.

    Arguments as in :func:`multi_head_attention`. Returns ``(heads (..., h, n_q, d_v), weights
    (..., h, n_q, n_k))``; ``merge_heads(heads) @ W_o`` is the layer's output, and head ``i``'s share
    of it is ``heads[..., i, :, :] @ W_o[i·d_v:(i+1)·d_v]`` (chapter 9).
    """
    self_attention = x_kv is x_q
    x_q = as_float_array("x_q", x_q, min_ndim=2)
    x_kv = x_q if self_attention else as_float_array("x_kv", x_kv, min_ndim=2)
    if share_qk and not isinstance(params, MHAParams) and "W_k" not in params:
        params = {**params, "W_k": params["W_q"]} if "W_q" in params else params  # W_k = W_q, validated below
    if isinstance(params, MHAParams):
        params.check_head_count(h)
        if h_kv is not None and positive_int("h_kv", h_kv) != params.h_kv:
            raise ValueError(
                f"h_kv must be the key/value head count the parameters were made for ({params.h_kv}), "
                f"received h_kv={h_kv}"
            )
    elif h is None:
        raise TypeError("h is required when params is a plain dict (init_mha_params records it)")
    else:
        params = MHAParams(params, h, h_kv)  # a plain dict goes through the same validation
    h, h_kv = params.h, params.h_kv
    if share_qk and h_kv != h:
        raise ValueError(f"share_qk needs one key head per query head; the parameters have h={h}, h_kv={h_kv}")
    d_model = params["W_q"].shape[0]
    check_axis_size("x_q", x_q, -1, d_model, "d_model, rows of W_q")
    check_axis_size("x_kv", x_kv, -1, d_model, "d_model, rows of W_q")
    q = split_heads(counted_matmul(x_q, params["W_q"]), h)  # every product counted by an active count_macs()
    if share_qk and self_attention:
        k = q  # one projection instead of two: the n·d_model·h·d_k multiply-adds of W_k are saved
    else:
        k = split_heads(counted_matmul(x_kv, params["W_q" if share_qk else "W_k"]), h_kv)
    v = split_heads(counted_matmul(x_kv, params["W_v"]), h_kv)
    if rotate is not None:  # a position transform of every head's queries and keys (RoPE, chapter 14)
        shared = k is q
        q = rotate(q)
        k = q if shared else rotate(k)
    if h_kv == h:
        return scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    return grouped_attention(q, k, v, mask=mask, scale=scale)


def multi_head_attention(
    x_q,
    x_kv,
    params: dict,
    h: int | None = None,
    mask=None,
    scale: float | None = None,
    *,
    h_kv: int | None = None,
    share_qk: bool = False,
    rotate=None,
):
    """Multi-head attention ``concat_i(head_i) W_o`` with ``head_i = Attn(x_q W_q^i, x_kv W_k^j, x_kv W_v^j)``.

    ``j = i`` for ordinary multi-head attention; with ``h_kv < h`` key/value heads (grouped-query
    attention, multi-query for ``h_kv = 1``) ``j = i // (h / h_kv)`` (:func:`grouped_attention`).

    x_q : (..., n_q, d_model); x_kv : (..., n_k, d_model) (pass ``x_q`` twice for self-attention)
    params : from :func:`init_mha_params` (which records h and h_kv), or a plain dict of the four matrices
    h : number of query heads; optional for :class:`MHAParams`, and if given it must equal ``params.h``
    mask : bool, broadcastable to (..., h, n_q, n_k): (n_q, n_k), or key padding (B, 1, 1, n_k)
    scale : defaults to 1/sqrt(d_k) with the per-head d_k.
    h_kv : number of key/value heads (keyword only); optional for :class:`MHAParams` (then it must
    equal ``params.h_kv``), defaults to ``h`` for a plain dict. ``W_k`` must have ``h_kv·d_k`` columns.
    share_qk : keys from the queries' projection, ``W_k = W_q`` (chapter 8; ``W_k`` is then not used
    and a plain dict may omit it).
    rotate : ``rotate(a)`` applied to every head's queries and keys, ``a`` of shape (..., heads, n, d_k),
    before the scores (a position transform such as RoPE, chapter 14).

    Returns ``(output (..., n_q, d_model), weights (..., h, n_q, n_k))``. Every product runs through
    ``attn_utils.counting.counted_matmul``: ``with count_macs()`` around the call counts them.
    """
    heads, weights = attention_heads(x_q, x_kv, params, h, mask, scale, h_kv=h_kv, share_qk=share_qk, rotate=rotate)
    w_o = params["W_o"]
    return counted_matmul(merge_heads(heads), w_o), weights
