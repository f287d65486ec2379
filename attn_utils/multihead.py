"""Multi-head attention as array operations (no Python loop over heads).

Parameter layout: ``W_q, W_k : (d_model, h·d_k)``, ``W_v : (d_model, h·d_v)``,
``W_o : (h·d_v, d_model)``. Head ``i`` owns columns ``i·d_k … (i+1)·d_k − 1``.

The same four matrices split into a different number of heads are a different model with a
different d_k and therefore a different scale 1/√d_k, so the parameters carry their head count
(:class:`MHAParams`) and :func:`multi_head_attention` refuses any other ``h``.
"""

from __future__ import annotations

import numpy as np

from .attention import scaled_dot_product_attention
from .validation import as_float_array, check_axis_size, positive_int


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
    """The four projection matrices (a dict ``W_q, W_k, W_v, W_o`` of arrays) and the head count ``h``.

    A dict, so ``params.values()`` are the weight arrays; ``params.h`` is not one of them.
    """

    def __init__(self, weights: dict, h: int):
        super().__init__(weights)
        self.h = positive_int("h", h)

    def __repr__(self) -> str:
        return f"MHAParams(h={self.h}, {', '.join(f'{k}: {v.shape}' for k, v in self.items())})"


def init_mha_params(
    rng: np.random.Generator, d_model: int, h: int, d_k: int | None = None, d_v: int | None = None
) -> MHAParams:
    """Gaussian weights with variance 1/fan_in, so unit-variance inputs give unit-variance q, k, v.

    ``d_k`` and ``d_v`` default to ``d_model // h`` (the Transformer's choice). The result
    remembers ``h`` (:class:`MHAParams`).
    """
    d_model, h = positive_int("d_model", d_model), positive_int("h", h)
    if d_k is None or d_v is None:
        if d_model % h:
            raise ValueError(f"d_model={d_model} must be divisible by h={h} when d_k/d_v are not given")
    d_k = d_model // h if d_k is None else positive_int("d_k", d_k)
    d_v = d_model // h if d_v is None else positive_int("d_v", d_v)
    std_in, std_out = d_model**-0.5, (h * d_v) ** -0.5
    return MHAParams(
        {
            "W_q": rng.normal(0, std_in, (d_model, h * d_k)),
            "W_k": rng.normal(0, std_in, (d_model, h * d_k)),
            "W_v": rng.normal(0, std_in, (d_model, h * d_v)),
            "W_o": rng.normal(0, std_out, (h * d_v, d_model)),
        },
        h,
    )


def mha_param_count(d_model: int, h: int, d_k: int | None = None, d_v: int | None = None) -> int:
    """Number of weights in the four projections (no biases): ``2·d·h·d_k + 2·d·h·d_v``."""
    d_model, h = positive_int("d_model", d_model), positive_int("h", h)
    if (d_k is None or d_v is None) and d_model % h:
        raise ValueError(f"d_model={d_model} must be divisible by h={h} when d_k/d_v are not given")
    d_k = d_model // h if d_k is None else positive_int("d_k", d_k)
    d_v = d_model // h if d_v is None else positive_int("d_v", d_v)
    return 2 * d_model * h * d_k + 2 * d_model * h * d_v


def multi_head_attention(x_q, x_kv, params: dict, h: int | None = None, mask=None, scale: float | None = None):
    """Multi-head attention ``concat_i(head_i) W_o`` with ``head_i = Attn(x_q W_q^i, x_kv W_k^i, x_kv W_v^i)``.

    x_q : (..., n_q, d_model); x_kv : (..., n_k, d_model) (pass ``x_q`` twice for self-attention)
    params : from :func:`init_mha_params` (which records h), or a plain dict of the four matrices
    h : number of heads; optional for :class:`MHAParams`, and if given it must equal ``params.h``
    mask : bool, broadcastable to (..., h, n_q, n_k): (n_q, n_k), or key padding (B, 1, 1, n_k)
    scale : defaults to 1/sqrt(d_k) with the per-head d_k.

    Returns ``(output (..., n_q, d_model), weights (..., h, n_q, n_k))``.
    """
    x_q = as_float_array("x_q", x_q, min_ndim=2)
    x_kv = as_float_array("x_kv", x_kv, min_ndim=2)
    missing = {"W_q", "W_k", "W_v", "W_o"} - set(params)
    if missing:
        raise ValueError(f"params is missing {sorted(missing)}")
    if isinstance(params, MHAParams):
        if h is not None and positive_int("h", h) != params.h:
            raise ValueError(
                f"h must be the head count the parameters were made for ({params.h}), received "
                f"h={h}: splitting them into {h} heads would change d_k and the scale 1/√d_k"
            )
        h = params.h
    elif h is None:
        raise TypeError("h is required when params is a plain dict (init_mha_params records it)")
    d_model = params["W_q"].shape[0]
    check_axis_size("x_q", x_q, -1, d_model, "d_model, rows of W_q")
    check_axis_size("x_kv", x_kv, -1, d_model, "d_model, rows of W_q")
    q = split_heads(x_q @ params["W_q"], h)
    k = split_heads(x_kv @ params["W_k"], h)
    v = split_heads(x_kv @ params["W_v"], h)
    heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    return merge_heads(heads) @ params["W_o"], weights
