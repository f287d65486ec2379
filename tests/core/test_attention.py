"""Unit and property tests for attn_utils.attention."""

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_utils import (
    attention_query_jacobian,
    attention_scores,
    causal_mask,
    default_scale,
    mc_moments,
    scaled_dot_product_attention,
)

PROPS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


def naive_attention(q, k, v, mask=None, scale=None):
    """Reference: one query at a time, explicit exp/sum, for 2-D q (n_q, d_k), k (n_k, d_k), v (n_k, d_v)."""
    n_q, d_k = q.shape
    s = 1.0 / math.sqrt(d_k) if scale is None else scale
    out = np.zeros((n_q, v.shape[1]))
    weights = np.zeros((n_q, k.shape[0]))
    for i in range(n_q):
        logits = np.array([s * float(np.dot(q[i], k[j])) for j in range(k.shape[0])])
        keep = np.ones(k.shape[0], bool) if mask is None else mask[i]
        if not keep.any():
            continue
        m = logits[keep].max()
        e = np.where(keep, np.exp(logits - m), 0.0)
        w = e / e.sum()
        weights[i] = w
        out[i] = sum(w[j] * v[j] for j in range(k.shape[0]))
    return out, weights


def qkv(rng, n_q=4, n_k=6, d_k=5, d_v=3, lead=()):
    return (rng.normal(size=lead + (n_q, d_k)), rng.normal(size=lead + (n_k, d_k)), rng.normal(size=lead + (n_k, d_v)))


# ---------------------------------------------------------------- against the naive reference


@pytest.mark.parametrize("scale", [None, 0.3, 2.0])
def test_matches_naive_loop(scale):
    rng = np.random.default_rng(10)
    q, k, v = qkv(rng, n_q=4, n_k=7, d_k=8, d_v=3)
    out, w = scaled_dot_product_attention(q, k, v, scale=scale)
    ref_out, ref_w = naive_attention(q, k, v, scale=scale)
    assert out.shape == (4, 3) and w.shape == (4, 7)
    np.testing.assert_allclose(w, ref_w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-14)


def test_batched_matches_per_batch_naive():
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, n_q=3, n_k=5, d_k=4, d_v=2, lead=(2, 3))
    mask = rng.random((3, 5)) < 0.7
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.shape == (2, 3, 3, 2) and w.shape == (2, 3, 3, 5)
    for b in range(2):
        for h in range(3):
            ro, rw = naive_attention(q[b, h], k[b, h], v[b, h], mask=mask)
            np.testing.assert_allclose(out[b, h], ro, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(w[b, h], rw, rtol=1e-12, atol=1e-15)


def test_scores_are_scaled_dot_products():
    rng = np.random.default_rng(12)
    q, k, _ = qkv(rng, d_k=9)
    np.testing.assert_allclose(attention_scores(q, k), q @ k.T / 3.0, rtol=1e-14)
    np.testing.assert_allclose(attention_scores(q, k, scale=0.5), 0.5 * q @ k.T, rtol=1e-14)


# ---------------------------------------------------------------- the default scale


@pytest.mark.parametrize("d_k", [1, 4, 64, 256, 512])
def test_default_scale_is_inverse_sqrt(d_k):
    assert default_scale(d_k) == 1.0 / math.sqrt(d_k)


def test_default_scale_uses_last_axis_of_q():
    rng = np.random.default_rng(13)
    q, k, v = qkv(rng, n_q=5, n_k=5, d_k=16, d_v=3)  # n and d_v differ from d_k
    out, w = scaled_dot_product_attention(q, k, v)
    out2, w2 = scaled_dot_product_attention(q, k, v, scale=0.25)
    np.testing.assert_array_equal(w, w2)
    np.testing.assert_array_equal(out, out2)
    _, w_wrong = scaled_dot_product_attention(q, k, v, scale=1 / 16)
    assert np.max(np.abs(w - w_wrong)) > 1e-3


def test_default_scale_gives_unit_score_variance():
    # q·k/sqrt(d_k) for independent unit normals has variance exactly 1.
    rng = np.random.default_rng(14)
    n, d_k = 20_000, 256
    q = rng.standard_normal((n, 1, d_k))
    k = rng.standard_normal((n, 1, d_k))
    scores = attention_scores(q, k)[:, 0, 0]
    m = mc_moments(scores, z=4.0)
    assert abs(float(m.var) - 1.0) <= float(m.var_halfwidth), (m.var, m.var_halfwidth)
    assert abs(float(m.mean)) <= float(m.mean_halfwidth)
    # scale 1/d_k (the common mistake) shrinks the variance to 1/d_k: outside the CI
    wrong = attention_scores(q, k, scale=1.0 / d_k)[:, 0, 0]
    mw = mc_moments(wrong, z=4.0)
    assert abs(float(mw.var) - 1.0) > float(mw.var_halfwidth)
    assert abs(float(mw.var) - 1.0 / d_k) <= float(mw.var_halfwidth)


# ---------------------------------------------------------------- permutation equivariance


def test_permuting_keys_and_values_leaves_output_unchanged():
    rng = np.random.default_rng(15)
    q, k, v = qkv(rng, n_q=4, n_k=9)
    perm = rng.permutation(9)
    out, w = scaled_dot_product_attention(q, k, v)
    out_p, w_p = scaled_dot_product_attention(q, k[perm], v[perm])
    np.testing.assert_allclose(out_p, out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(w_p, w[:, perm], rtol=1e-12, atol=1e-15)
    # permuting only the values does change the output
    out_v, _ = scaled_dot_product_attention(q, k, v[perm])
    assert np.max(np.abs(out_v - out)) > 1e-3


def test_permuting_queries_permutes_outputs():
    rng = np.random.default_rng(16)
    q, k, v = qkv(rng, n_q=7, n_k=5)
    perm = rng.permutation(7)
    out, w = scaled_dot_product_attention(q, k, v)
    out_p, w_p = scaled_dot_product_attention(q[perm], k, v)
    np.testing.assert_allclose(out_p, out[perm], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(w_p, w[perm], rtol=1e-13, atol=1e-16)


# ---------------------------------------------------------------- masks


def test_causal_mask_square():
    m = causal_mask(4)
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(m, expected)
    assert m.dtype == bool


def test_causal_mask_kv_cache_alignment():
    # 2 new queries after 3 cached keys: they sit at absolute positions 3 and 4
    m = causal_mask(2, 5)
    np.testing.assert_array_equal(m, np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool))
    np.testing.assert_array_equal(causal_mask(1, 6), np.ones((1, 6), bool))
    np.testing.assert_array_equal(causal_mask(3, 3), causal_mask(3))


def test_masked_keys_get_zero_weight_and_no_influence():
    rng = np.random.default_rng(17)
    q, k, v = qkv(rng, n_q=4, n_k=4)
    mask = causal_mask(4)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(w[~mask], 0.0)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-15)
    v2 = v.copy()
    v2[3] += 100.0  # only the last query may see key 3
    out2, _ = scaled_dot_product_attention(q, k, v2, mask=mask)
    np.testing.assert_array_equal(out2[:3], out[:3])
    assert np.all(np.abs(out2[3] - out[3]) > 0)


def test_fully_masked_query_gives_zero_output():
    rng = np.random.default_rng(18)
    q, k, v = qkv(rng, n_q=3, n_k=4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(w[1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    assert np.all(np.isfinite(out))


def step_by_step(q, k, v, scale=None):
    """Decode one query at a time: query i (absolute position n_k − n_q + i) sees keys[: n_k − n_q + i + 1]."""
    n_q, n_k = q.shape[0], k.shape[0]
    rows = []
    for i in range(n_q):
        end = n_k - n_q + i + 1
        o, _ = scaled_dot_product_attention(q[i : i + 1], k[:end], v[:end], scale=scale)
        rows.append(o[0])
    return np.array(rows)


@pytest.mark.parametrize("n_q,n_k", [(6, 6), (3, 7), (1, 5)])
def test_causal_parallel_equals_step_by_step(n_q, n_k):
    rng = np.random.default_rng(19)
    q, k, v = qkv(rng, n_q=n_q, n_k=n_k, d_k=4, d_v=3)
    out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(n_q, n_k))
    np.testing.assert_allclose(out, step_by_step(q, k, v), rtol=0, atol=1e-12)
    # and the reference is not trivially satisfied: without the mask it differs
    if n_q > 1:
        unmasked, _ = scaled_dot_product_attention(q, k, v)
        assert np.max(np.abs(unmasked - out)) > 1e-3


# ---------------------------------------------------------------- query Jacobian


def _output_of_query(k, v, scale):
    def f(qv):
        logits = scale * anp.dot(k, qv)
        e = anp.exp(logits - anp.max(logits))
        return anp.dot(e / anp.sum(e), v)

    return f


@pytest.mark.parametrize("scale", [None, 0.7])
def test_query_jacobian_matches_autograd_and_fd(scale):
    rng = np.random.default_rng(20)
    n_k, d_k, d_v = 6, 4, 3
    q = rng.normal(size=d_k)
    k = rng.normal(size=(n_k, d_k))
    v = rng.normal(size=(n_k, d_v))
    J = attention_query_jacobian(q, k, v, scale=scale)
    assert J.shape == (d_v, d_k)
    s = 1 / math.sqrt(d_k) if scale is None else scale
    f = _output_of_query(k, v, s)
    np.testing.assert_allclose(J, autograd.jacobian(f)(q), rtol=0, atol=1e-13)

    def out(qv):
        return scaled_dot_product_attention(qv[None, :], k, v, scale=scale)[0][0]

    h = 1e-6
    J_fd = np.stack([(out(q + h * e) - out(q - h * e)) / (2 * h) for e in np.eye(d_k)], axis=-1)
    np.testing.assert_allclose(J, J_fd, rtol=0, atol=1e-8)


def test_query_jacobian_batched():
    rng = np.random.default_rng(21)
    q = rng.normal(size=(2, 4))
    k = rng.normal(size=(2, 5, 4))
    v = rng.normal(size=(2, 5, 3))
    J = attention_query_jacobian(q, k, v)
    assert J.shape == (2, 3, 4)
    for b in range(2):
        np.testing.assert_allclose(J[b], attention_query_jacobian(q[b], k[b], v[b]), rtol=1e-13, atol=1e-15)


def test_query_jacobian_with_v_equal_k_is_scaled_key_covariance():
    rng = np.random.default_rng(22)
    n_k, d_k = 8, 5
    q = rng.normal(size=d_k)
    k = rng.normal(size=(n_k, d_k))
    s = 1 / math.sqrt(d_k)
    logits = s * k @ q
    p = np.exp(logits - logits.max())
    p /= p.sum()
    mean = p @ k
    cov = sum(p[j] * np.outer(k[j] - mean, k[j] - mean) for j in range(n_k))
    J = attention_query_jacobian(q, k, k)
    np.testing.assert_allclose(J, s * cov, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(J, J.T, atol=1e-15)
    assert np.linalg.eigvalsh(J).min() >= -1e-14


@pytest.mark.parametrize("gap", [5.0, 40.0, 95.0, 600.0])
def test_query_jacobian_keeps_relative_accuracy_near_one_hot(gap):
    """Two keys whose logits differ by ``gap``: ∂o/∂q = s p₁p₂ (v₁ − v₂)(k₁ − k₂)ᵀ exactly, with
    p₁p₂ = t/(1 + t)², t = e^{−gap}. For gap ≥ 40, 1 − p₁ rounds to 0 in float64, so a Jacobian
    built from p as diag(p) − ppᵀ is wrong there by 100% (its entry p₁(1 − p₁) is 0)."""
    rng = np.random.default_rng(23)
    d_k, d_v, s = 4, 3, 0.5
    k = rng.normal(size=(2, d_k))
    v = rng.normal(size=(2, d_v))
    dk = k[0] - k[1]
    q = dk * gap / (s * dk @ dk)  # s q·(k₁ − k₂) = gap
    gap_exact = s * q @ dk
    t = math.exp(-gap_exact)
    exact = s * t / (1 + t) ** 2 * np.outer(v[0] - v[1], dk)
    np.testing.assert_allclose(attention_query_jacobian(q, k, v, scale=s), exact, rtol=1e-12, atol=0)


# ---------------------------------------------------------------- properties

small = st.floats(-3, 3, allow_nan=False, allow_infinity=False)


@st.composite
def attention_inputs(draw, square=False):
    n_q = draw(st.integers(1, 5))
    n_k = n_q + (0 if square else draw(st.integers(0, 4)))
    d_k = draw(st.integers(1, 4))
    d_v = draw(st.integers(1, 3))
    q = draw(arrays(np.float64, (n_q, d_k), elements=small))
    k = draw(arrays(np.float64, (n_k, d_k), elements=small))
    v = draw(arrays(np.float64, (n_k, d_v), elements=small))
    return q, k, v


@PROPS
@given(attention_inputs(), st.randoms(use_true_random=False))
def test_prop_permutation_equivariance(inputs, rnd):
    q, k, v = inputs
    pk = np.array(rnd.sample(range(k.shape[0]), k.shape[0]))
    pq = np.array(rnd.sample(range(q.shape[0]), q.shape[0]))
    out, w = scaled_dot_product_attention(q, k, v)
    out_k, _ = scaled_dot_product_attention(q, k[pk], v[pk])
    np.testing.assert_allclose(out_k, out, rtol=1e-10, atol=1e-12)
    out_q, w_q = scaled_dot_product_attention(q[pq], k, v)
    np.testing.assert_allclose(out_q, out[pq], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(w_q, w[pq], rtol=1e-12, atol=1e-14)


@PROPS
@given(attention_inputs())
def test_prop_matches_naive(inputs):
    q, k, v = inputs
    out, w = scaled_dot_product_attention(q, k, v)
    ro, rw = naive_attention(q, k, v)
    np.testing.assert_allclose(w, rw, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(out, ro, rtol=1e-10, atol=1e-12)


@PROPS
@given(attention_inputs())
def test_prop_causal_parallel_equals_step_by_step(inputs):
    q, k, v = inputs
    out, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[0], k.shape[0]))
    np.testing.assert_allclose(out, step_by_step(q, k, v), rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-14)


def test_scores_overflowing_to_minus_inf_raise_not_read_as_masked():
    # every score of the row overflows to -inf: treating that as "masked" would return a zero row
    q, k, v = np.array([[1e200, 0.0]]), np.array([[-1e200, 0.0], [-2e200, 0.0]]), np.eye(2)
    for f in (lambda: attention_scores(q, k), lambda: scaled_dot_product_attention(q, k, v)):
        with pytest.raises(ValueError, match="overflowed float64"):
            f()


def test_scores_overflowing_through_cancellation_raise():
    # partial sums of +inf and -inf: -inf or NaN by the order of operations, an overflow either way (true score 0)
    q, k, v = np.array([[1e308, 1e308]]), np.array([[1e308, -1e308], [0.0, 1.0]]), np.eye(2)
    with pytest.raises(ValueError, match="overflowed float64"):
        scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize(
    "q, k, scale",
    [
        (
            np.array([[100.0]], np.float16),
            np.array([[-1e-3], [-2e-3]], np.float16),
            1000.0,
        ),  # scale·q overflows float16
        (np.array([[1e30]], np.float32), np.array([[-1e-30], [-2e-30]], np.float32), 1e10),  # scale·q overflows float32
        (np.array([[100.0]], np.float16), np.array([[-1e-3], [-2e-3]], np.float32), 1000.0),  # mixed dtypes
        (
            np.full((1, 64), 100.0, np.float16),
            np.full((2, 64), -100.0, np.float16),
            None,
        ),  # only the sum over d_k overflows
    ],
)
def test_the_shortcut_past_the_overflow_scan_never_hides_an_overflow(q, k, scale):
    # the scan is skipped only when a bound rules overflow out; each case overflows to -inf in a way the bound
    # must see (the scaled query itself, or the sum of d_k products), and -inf would read as "masked": zero weights
    with pytest.raises(ValueError, match="overflowed"):
        scaled_dot_product_attention(q, k, np.ones((2, 1), q.dtype), scale=scale)
