"""Unit and property tests for attn_utils.multihead."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_utils import (
    causal_mask,
    count_macs,
    init_mha_params,
    merge_heads,
    mha_param_count,
    multi_head_attention,
    scaled_dot_product_attention,
    split_heads,
)
from attn_utils.multihead import MHAParams, attention_heads, group_size, grouped_attention

PROPS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


def loop_over_heads(x_q, x_kv, params, h, mask=None, scale=None):
    """Reference: explicit Python loop over heads, 2-D inputs, textbook softmax per query."""
    d_k = params["W_q"].shape[1] // h
    d_v = params["W_v"].shape[1] // h
    s = 1.0 / math.sqrt(d_k) if scale is None else scale
    heads, all_w = [], []
    for i in range(h):
        qi = x_q @ params["W_q"][:, i * d_k : (i + 1) * d_k]
        ki = x_kv @ params["W_k"][:, i * d_k : (i + 1) * d_k]
        vi = x_kv @ params["W_v"][:, i * d_v : (i + 1) * d_v]
        logits = s * qi @ ki.T
        if mask is not None:
            logits = np.where(mask, logits, -np.inf)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        w = e / e.sum(axis=1, keepdims=True)
        heads.append(w @ vi)
        all_w.append(w)
    return np.concatenate(heads, axis=1) @ params["W_o"], np.stack(all_w)


# ---------------------------------------------------------------- split / merge


def test_split_heads_layout():
    x = np.arange(2 * 3 * 6, dtype=float).reshape(2, 3, 6)
    s = split_heads(x, 3)
    assert s.shape == (2, 3, 3, 2)
    # head i owns columns i*d … (i+1)*d − 1
    for i in range(3):
        np.testing.assert_array_equal(s[:, i], x[..., 2 * i : 2 * i + 2])


@pytest.mark.parametrize("shape,h", [((5, 8), 1), ((5, 8), 2), ((5, 8), 8), ((2, 4, 12), 3), ((2, 2, 3, 6), 6)])
def test_split_merge_round_trip(shape, h):
    rng = np.random.default_rng(30)
    x = rng.normal(size=shape)
    s = split_heads(x, h)
    assert s.shape == shape[:-2] + (h, shape[-2], shape[-1] // h)
    np.testing.assert_array_equal(merge_heads(s), x)
    np.testing.assert_array_equal(split_heads(merge_heads(s), h), s)


# ---------------------------------------------------------------- multi-head attention


@pytest.mark.parametrize("d_model,h", [(8, 1), (8, 2), (12, 4), (6, 6)])
def test_mha_equals_loop_over_heads(d_model, h):
    rng = np.random.default_rng(31)
    params = init_mha_params(rng, d_model, h)
    x = rng.normal(size=(5, d_model))
    out, w = multi_head_attention(x, x, params, h)
    ref_out, ref_w = loop_over_heads(x, x, params, h)
    assert out.shape == (5, d_model) and w.shape == (h, 5, 5)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-12)


def test_mha_cross_attention_with_mask_and_custom_dims():
    rng = np.random.default_rng(32)
    d_model, h, d_k, d_v = 6, 3, 4, 5
    params = init_mha_params(rng, d_model, h, d_k=d_k, d_v=d_v)
    x_q = rng.normal(size=(3, d_model))
    x_kv = rng.normal(size=(7, d_model))
    mask = causal_mask(3, 7)
    out, w = multi_head_attention(x_q, x_kv, params, h, mask=mask)
    ref_out, ref_w = loop_over_heads(x_q, x_kv, params, h, mask=mask)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-12)


def test_mha_batched_and_explicit_scale():
    rng = np.random.default_rng(33)
    d_model, h = 8, 4
    params = init_mha_params(rng, d_model, h)
    x = rng.normal(size=(2, 4, d_model))
    out, w = multi_head_attention(x, x, params, h, scale=0.9)
    assert out.shape == (2, 4, d_model) and w.shape == (2, h, 4, 4)
    for b in range(2):
        ro, rw = loop_over_heads(x[b], x[b], params, h, scale=0.9)
        np.testing.assert_allclose(out[b], ro, rtol=0, atol=1e-12)
        np.testing.assert_allclose(w[b], rw, rtol=0, atol=1e-12)


def test_mha_default_scale_is_per_head_dk():
    # with d_model = 16, h = 4 the per-head d_k is 4 → scale 1/2, not 1/4
    rng = np.random.default_rng(34)
    params = init_mha_params(rng, 16, 4)
    x = rng.normal(size=(5, 16))
    out, _ = multi_head_attention(x, x, params, 4)
    np.testing.assert_array_equal(out, multi_head_attention(x, x, params, 4, scale=0.5)[0])
    assert np.max(np.abs(out - multi_head_attention(x, x, params, 4, scale=0.25)[0])) > 1e-4


def test_mha_missing_params_and_wrong_d_model():
    rng = np.random.default_rng(35)
    params = init_mha_params(rng, 8, 2)
    x = rng.normal(size=(3, 8))
    with pytest.raises(ValueError, match=r"missing \['W_o'\]"):
        multi_head_attention(x, x, {k: v for k, v in params.items() if k != "W_o"}, 2)
    with pytest.raises(ValueError, match=r"x_kv.*size 8.*\(3, 7\)"):
        multi_head_attention(x, rng.normal(size=(3, 7)), params, 2)


# ---------------------------------------------------------------- parameters


def test_init_shapes_and_variance():
    rng = np.random.default_rng(36)
    p = init_mha_params(rng, 64, 8)
    assert p["W_q"].shape == (64, 64) and p["W_k"].shape == (64, 64)
    assert p["W_v"].shape == (64, 64) and p["W_o"].shape == (64, 64)
    # variance 1/fan_in (4096 draws: relative SE of the variance ≈ 2.2 %)
    assert p["W_q"].var() * 64 == pytest.approx(1.0, abs=0.1)
    assert p["W_o"].var() * 64 == pytest.approx(1.0, abs=0.1)
    p2 = init_mha_params(rng, 6, 3, d_k=4, d_v=5)
    assert p2["W_q"].shape == (6, 12) and p2["W_v"].shape == (6, 15) and p2["W_o"].shape == (15, 6)
    with pytest.raises(ValueError, match="divisible"):
        init_mha_params(rng, 10, 3)


@pytest.mark.parametrize("d_model,h,d_k,d_v", [(64, 8, None, None), (12, 3, None, None), (6, 3, 4, 5), (10, 1, 7, 2)])
def test_param_count_equals_sum_of_sizes(d_model, h, d_k, d_v):
    params = init_mha_params(np.random.default_rng(37), d_model, h, d_k=d_k, d_v=d_v)
    assert mha_param_count(d_model, h, d_k=d_k, d_v=d_v) == sum(w.size for w in params.values())


@pytest.mark.parametrize("d_model,h", [(512, 8), (64, 4), (12, 12)])
def test_heads_cost_the_same_as_one_wide_head(d_model, h):
    assert mha_param_count(d_model, h) == mha_param_count(d_model, 1) == 4 * d_model**2
    assert mha_param_count(d_model, h, d_k=d_model // h, d_v=d_model // h) == mha_param_count(
        d_model, 1, d_model, d_model
    )


# ---------------------------------------------------------------- properties


@PROPS
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)),
        elements=st.floats(-5, 5, allow_nan=False),
    ),
    st.integers(1, 4),
)
def test_prop_split_merge_round_trip(x0, h):
    x = np.tile(x0, h)  # last axis a multiple of h
    np.testing.assert_array_equal(merge_heads(split_heads(x, h)), x)


@st.composite
def mha_inputs(draw):
    h = draw(st.integers(1, 4))
    d_head = draw(st.integers(1, 3))
    d_model = h * d_head
    n = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    x = draw(arrays(np.float64, (n, d_model), elements=st.floats(-2, 2, allow_nan=False)))
    causal = draw(st.booleans())
    return x, init_mha_params(np.random.default_rng(seed), d_model, h), h, causal


@PROPS
@given(mha_inputs())
def test_prop_mha_equals_loop_over_heads(inputs):
    x, params, h, causal = inputs
    mask = causal_mask(x.shape[0]) if causal else None
    out, w = multi_head_attention(x, x, params, h, mask=mask)
    ref_out, ref_w = loop_over_heads(x, x, params, h, mask=mask)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-12)


def test_param_count_validates_like_init():
    # regression: mha_param_count(10, 3) used to count d_k = 3 silently, and h = 0 raised ZeroDivisionError
    with pytest.raises(ValueError, match="d_model=10 must be divisible by h=3"):
        mha_param_count(10, 3)
    assert mha_param_count(10, 3, d_k=4, d_v=4) == 2 * 10 * 3 * 4 * 2
    with pytest.raises(ValueError, match="h must be >= 1, received 0"):
        mha_param_count(8, 0)
    with pytest.raises(TypeError, match="h must be an integer, received float"):
        mha_param_count(8, 2.0)
    assert type(mha_param_count(8, 2)) is int


# ---------------------------------------------------------------- grouped K/V heads (MQA / GQA)


def repeat_kv_params(params, h, h_kv):
    """Ordinary multi-head parameters whose key/value heads are the grouped ones repeated g times."""
    g = h // h_kv
    d_k = params["W_q"].shape[1] // h
    d_v = params["W_v"].shape[1] // h_kv

    def repeat(w, d):  # (d_model, h_kv·d) → (d_model, h·d), head j copied to heads j·g … j·g + g − 1
        return np.repeat(w.reshape(w.shape[0], h_kv, d), g, axis=1).reshape(w.shape[0], h * d)

    return {
        "W_q": params["W_q"],
        "W_k": repeat(params["W_k"], d_k),
        "W_v": repeat(params["W_v"], d_v),
        "W_o": params["W_o"],
    }


@pytest.mark.parametrize("h,h_kv", [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (4, 1)])
def test_grouped_mha_equals_mha_with_repeated_kv(h, h_kv):
    rng = np.random.default_rng(40)
    d_model = 24
    params = init_mha_params(rng, d_model, h, h_kv=h_kv)
    assert params["W_k"].shape == (d_model, h_kv * (d_model // h)) and params.h_kv == h_kv
    x_q, x_kv = rng.normal(size=(2, 5, d_model)), rng.normal(size=(2, 7, d_model))
    mask = causal_mask(5, 7)
    out, w = multi_head_attention(x_q, x_kv, params, mask=mask)
    ref_out, ref_w = multi_head_attention(x_q, x_kv, repeat_kv_params(params, h, h_kv), h, mask=mask)
    assert out.shape == (2, 5, d_model) and w.shape == (2, h, 5, 7)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-12)
    # and against the explicit loop over heads on the repeated parameters (textbook softmax)
    for b in range(2):
        lo, lw = loop_over_heads(x_q[b], x_kv[b], repeat_kv_params(params, h, h_kv), h, mask=mask)
        np.testing.assert_allclose(out[b], lo, rtol=0, atol=1e-12)
        np.testing.assert_allclose(w[b], lw, rtol=0, atol=1e-12)


def test_grouped_attention_equals_repeating_k_and_v():
    rng = np.random.default_rng(41)
    h, h_kv, n_q, n_k, d_k, d_v = 6, 2, 3, 5, 4, 3
    q = rng.normal(size=(2, h, n_q, d_k))
    k, v = rng.normal(size=(2, h_kv, n_k, d_k)), rng.normal(size=(2, h_kv, n_k, d_v))
    pad = np.ones((2, 1, 1, n_k), bool)
    pad[1, ..., -2:] = False  # key padding of the second sequence
    for mask in (None, causal_mask(n_q, n_k), pad, rng.random((h, n_q, n_k)) < 0.7):
        out, w = grouped_attention(q, k, v, mask=mask, scale=0.7)
        ref = scaled_dot_product_attention(q, np.repeat(k, 3, axis=-3), np.repeat(v, 3, axis=-3), mask=mask, scale=0.7)
        np.testing.assert_allclose(out, ref[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(w, ref[1], rtol=0, atol=1e-12)
    # query head i uses key/value head i // g
    out, _ = grouped_attention(q, k, v)
    for i in range(h):
        np.testing.assert_allclose(
            out[:, i], scaled_dot_product_attention(q[:, i], k[:, i // 3], v[:, i // 3])[0], rtol=0, atol=1e-12
        )


@PROPS
@given(
    st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(0, 2**32 - 1), st.booleans()
)
def test_prop_grouped_equals_repeated(h_kv, g, d_head, n, seed, causal):
    h = h_kv * g
    rng = np.random.default_rng(seed)
    params = init_mha_params(rng, h * d_head, h, h_kv=h_kv)
    x = rng.normal(size=(n, h * d_head))
    mask = causal_mask(n) if causal else None
    out, w = multi_head_attention(x, x, params, mask=mask)
    ref_out, ref_w = loop_over_heads(x, x, repeat_kv_params(params, h, h_kv), h, mask=mask)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-12)


def test_grouped_param_count_and_errors():
    rng = np.random.default_rng(42)
    for h_kv in (8, 4, 1):
        p = init_mha_params(rng, 32, 8, h_kv=h_kv)
        assert mha_param_count(32, 8, h_kv=h_kv) == sum(w.size for w in p.values())
    assert mha_param_count(32, 8, h_kv=1) == 2 * 32 * 32 + 2 * 32 * 4
    assert "h_kv=2" in repr(init_mha_params(rng, 8, 4, h_kv=2)) and "h_kv" not in repr(init_mha_params(rng, 8, 4))
    with pytest.raises(ValueError, match="h=8 must be a multiple of h_kv=3"):
        init_mha_params(rng, 32, 8, h_kv=3)
    with pytest.raises(ValueError, match="h=8 must be a multiple of h_kv=3"):
        mha_param_count(32, 8, h_kv=3)
    with pytest.raises(ValueError, match="h=6 must be a multiple of h_kv=4"):
        group_size(6, 4)
    assert group_size(6, None) == 1 and group_size(6, 2) == 3
    p = init_mha_params(rng, 16, 4, h_kv=2)
    x = rng.normal(size=(3, 16))
    with pytest.raises(ValueError, match="h_kv must be the key/value head count the parameters were made for"):
        multi_head_attention(x, x, p, h_kv=4)
    plain = dict(p)
    with pytest.raises(ValueError, match=r"W_k must be \(d_model, h_kv·d_k\) = \(16, 16\), received shape \(16, 8\)"):
        multi_head_attention(x, x, plain, 4)  # h_kv defaults to h for a plain dict
    np.testing.assert_array_equal(multi_head_attention(x, x, plain, 4, h_kv=2)[0], multi_head_attention(x, x, p)[0])
    with pytest.raises(ValueError, match="h=4 must be a multiple of h_kv=3"):
        multi_head_attention(x, x, plain, 4, h_kv=3)
    q = rng.normal(size=(4, 2, 3))
    with pytest.raises(ValueError, match="h must be a multiple of h_kv"):
        grouped_attention(q, rng.normal(size=(3, 2, 3)), rng.normal(size=(3, 2, 3)))
    with pytest.raises(ValueError, match="v must have h_kv=2 heads"):
        grouped_attention(q, rng.normal(size=(2, 2, 3)), rng.normal(size=(1, 2, 3)))


def test_h_kv_equal_h_keeps_the_old_draws():
    # h_kv = h (the default) must reproduce the weights and outputs of the ungrouped API exactly
    a = init_mha_params(np.random.default_rng(43), 12, 4)
    b = init_mha_params(np.random.default_rng(43), 12, 4, h_kv=4)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    x = np.random.default_rng(44).normal(size=(5, 12))
    np.testing.assert_array_equal(multi_head_attention(x, x, a)[0], multi_head_attention(x, x, b, 4, h_kv=4)[0])


def test_count_macs_sees_the_core():
    # around the core itself (it used to count 0): the two attention products, then the four projections
    import attn_utils as au

    rng = np.random.default_rng(21)
    b, h, n_q, n_k, d_k, d_v = 2, 3, 5, 7, 4, 6
    q, k, v = rng.normal(size=(b, h, n_q, d_k)), rng.normal(size=(b, h, n_k, d_k)), rng.normal(size=(b, h, n_k, d_v))
    with au.count_macs() as c:
        au.scaled_dot_product_attention(q, k, v)
    assert (c.macs, c.products) == (b * h * n_q * n_k * (d_k + d_v), 2)
    d, n = 12, 9
    x, p = rng.normal(size=(n, d)), au.init_mha_params(rng, d, 4)
    with au.count_macs() as c:
        au.multi_head_attention(x, x, p)
    assert c.macs == 4 * n * d * d + 2 * n * n * d and c.products == 6


def test_mha_params_are_validated_once_and_immutable():
    # shapes, divisibility and finiteness are checked on construction, naming the matrix
    rng = np.random.default_rng(22)
    p = init_mha_params(rng, 12, 4, d_v=5)
    assert (p.h, p.h_kv, p.d_k, p.d_v) == (4, 4, 3, 5)
    bad = {**p, "W_o": p["W_o"][:-1]}
    with pytest.raises(ValueError, match=r"W_o must be \(h·d_v, d_model\) = \(20, 12\)"):
        MHAParams(bad, 4)
    with pytest.raises(ValueError, match="W_q must be .* for 5 heads"):
        MHAParams(dict(p), 5)
    with pytest.raises(ValueError, match="W_v contains 12 non-finite"):
        MHAParams({**p, "W_v": np.where(np.arange(20) == 3, np.nan, p["W_v"])}, 4)
    with pytest.raises(ValueError, match="W_k must be a matrix"):
        MHAParams({**p, "W_k": p["W_k"][None]}, 4)
    with pytest.raises(ValueError, match=r"params is missing \['W_o'\]"):
        MHAParams({k: v for k, v in p.items() if k != "W_o"}, 4)
    with pytest.raises(TypeError, match="immutable"):
        p["W_q"] = p["W_q"] * 2
    with pytest.raises(TypeError, match="immutable"):
        p.update(W_q=p["W_q"])
    # a plain dict with a wrong head count fails the same validation inside multi_head_attention
    x = rng.normal(size=(3, 12))
    with pytest.raises(ValueError, match="for 5 heads"):
        multi_head_attention(x, x, dict(p), 5)


def test_init_variances_are_one_over_fan_in():
    # W_q, W_k, W_v: variance 1/d_model; W_o: 1/(h·d_v), its own fan-in (d_model when d_v = d_model/h)
    rng = np.random.default_rng(23)
    p = init_mha_params(rng, 64, 4, d_v=32)  # W_o is (128, 64): fan-in 128, not 64
    for name, fan_in in (("W_q", 64), ("W_k", 64), ("W_v", 64), ("W_o", 128)):
        assert abs(p[name].std() * np.sqrt(fan_in) - 1) < 0.05, name  # SE of the std about 1%


# ---------------------------------------------------------------- the hooks the chapters use


def test_heads_before_w_o_merge_into_the_layer_output():
    rng = np.random.default_rng(21)
    x, p = rng.normal(size=(2, 5, 8)), init_mha_params(rng, 8, 4)
    heads, w = attention_heads(x, x, p)
    out, w_ref = multi_head_attention(x, x, p)
    assert heads.shape == (2, 4, 5, 2)
    np.testing.assert_allclose(merge_heads(heads) @ p["W_o"], out, rtol=1e-12)
    np.testing.assert_array_equal(w, w_ref)


def test_shared_projection_is_w_k_equal_to_w_q_and_saves_its_products():
    rng = np.random.default_rng(22)
    n, d, h = 6, 8, 2
    x, p = rng.normal(size=(n, d)), init_mha_params(rng, d, h)
    with count_macs() as shared:
        out, _ = multi_head_attention(x, x, p, share_qk=True)
    with count_macs() as separate:
        ref, _ = multi_head_attention(x, x, {**p, "W_k": p["W_q"]}, h)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    assert separate.macs - shared.macs == n * d * d  # the key projection, n·d_model·h·d_k
    no_w_k = {k: v for k, v in p.items() if k != "W_k"}
    np.testing.assert_allclose(multi_head_attention(x, x, no_w_k, h, share_qk=True)[0], out, rtol=1e-12)
    with pytest.raises(ValueError, match="share_qk needs one key head per query head"):
        multi_head_attention(x, x, init_mha_params(rng, d, 4, h_kv=2), share_qk=True)


def test_rotate_transforms_queries_and_keys_before_the_scores():
    rng = np.random.default_rng(23)
    x, p = rng.normal(size=(5, 8)), init_mha_params(rng, 8, 2)
    doubled = multi_head_attention(x, x, p, rotate=lambda a: 2 * a)[1]  # q·k four times larger
    np.testing.assert_allclose(doubled, multi_head_attention(x, x, p, scale=4 / np.sqrt(4))[1], rtol=1e-12)
    seen = []
    multi_head_attention(x, x, p, rotate=lambda a: seen.append(a.shape) or a)
    assert seen == [(2, 5, 4), (2, 5, 4)]  # every head's queries, then its keys


def test_shared_projection_in_cross_attention_projects_the_other_sequence_with_w_q():
    # only self-attention may reuse the queries as keys; W_k is never read when shared
    rng = np.random.default_rng(24)
    x_q, x_kv, p = rng.normal(size=(4, 8)), rng.normal(size=(6, 8)), init_mha_params(rng, 8, 2)
    out, _ = multi_head_attention(x_q, x_kv, p, share_qk=True)
    np.testing.assert_allclose(out, multi_head_attention(x_q, x_kv, {**p, "W_k": p["W_q"]}, 2)[0], rtol=1e-12)
