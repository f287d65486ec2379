"""Unit and property tests for attn_utils.multihead."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_utils import causal_mask, init_mha_params, merge_heads, mha_param_count, multi_head_attention, split_heads

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
