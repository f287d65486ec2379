"""Unit and property tests for attn_utils.experiments.ch11_layers (chapter 11: attention vs RNN vs CNN)."""

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import (
    causal_mask,
    count_macs,
    init_mha_params,
    loglog_slope,
    merge_heads,
    mha_param_count,
    min_seconds,
    multi_head_attention,
    numerical_jacobian,
    scaled_dot_product_attention,
    split_heads,
)
from attn_utils.experiments.ch11_layers import (
    attention_input_jacobians,
    biased_attention_layer,
    distance_bias,
    hop_distances,
    init_lstm_params,
    input_sensitivity,
    layer_graph,
    layers_to_connect,
    lstm_layer,
    lstm_macs,
    perturbation_reach,
    restricted_attention_layer,
    rnn_input_jacobians,
    sequential_depth,
)
from attn_utils.harness.layers import (
    attention_macs,
    conv1d_layer,
    conv_macs,
    init_conv_params,
    init_rnn_params,
    rnn_layer,
    rnn_macs,
    self_attention_layer,
)

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def lower(n):
    return np.arange(n)[None, :] <= np.arange(n)[:, None]


# ---------------------------------------------------------------- counting


@pytest.mark.parametrize("n,d,h", [(1, 4, 1), (7, 6, 2), (16, 8, 4), (33, 12, 3)])
def test_counted_macs_equal_closed_forms(n, d, h):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, d))
    with count_macs() as c:
        self_attention_layer(x, init_mha_params(rng, d, h), h)
    assert (c.macs, c.products) == (attention_macs(n, d), 6)
    with count_macs() as c:
        self_attention_layer(x, projections=False, h=h)
    assert (c.macs, c.products) == (attention_macs(n, d, projections=False), 2)
    with count_macs() as c:
        rnn_layer(x, init_rnn_params(rng, d))
    assert (c.macs, c.products) == (rnn_macs(n, d), n + 1)
    for k in (1, 3):
        with count_macs() as c:
            conv1d_layer(x, init_conv_params(rng, d, k), dilation=2)
        assert (c.macs, c.products) == (conv_macs(n, d, k), 1)


def test_closed_forms_values_and_d_in():
    assert attention_macs(10, 4) == 4 * 10 * 16 + 2 * 100 * 4
    assert attention_macs(10, 4, projections=False) == 800
    assert rnn_macs(5, 3, d_in=7) == 5 * 7 * 3 + 5 * 9
    assert conv_macs(5, 3, 2, d_in=7) == 5 * 2 * 7 * 3
    rng = np.random.default_rng(0)
    with count_macs() as c:
        rnn_layer(rng.normal(size=(5, 7)), init_rnn_params(rng, 3, d_in=7))
    assert c.macs == rnn_macs(5, 3, d_in=7)


def test_table1_exponents_of_the_closed_forms():
    """Table 1's first and third columns as exponents of (eq-ch11-macs) and (eq-ch11-paths); chapter 11 checks that
    the counted costs and measured path lengths equal these closed forms exactly, and only prints the fits."""
    n, d = 2 ** np.arange(4, 11), 2 ** np.arange(4, 10)
    for macs, a_n, a_d in [
        (lambda n, d: attention_macs(n, d, projections=False), 2, 1),
        (rnn_macs, 1, 2),
        (lstm_macs, 1, 2),
        (lambda n, d: conv_macs(n, d, 3), 1, 2),
    ]:
        assert loglog_slope(n, [macs(k, 64) for k in n]) == pytest.approx(a_n, abs=1e-12)
        assert loglog_slope(d, [macs(64, k) for k in d]) == pytest.approx(a_d, abs=1e-12)
    w = np.array([2, 3, 5, 9])
    assert loglog_slope(w, [conv_macs(64, 64, k) for k in w]) == pytest.approx(1, abs=1e-12)
    full = np.array([attention_macs(k, 64) for k in n])  # the full layer: local exponent from 1 towards 2
    local = np.log2(full[1:] / full[:-1])
    assert local[0] < 1.2 and local[-1] > 1.8 and np.all(np.diff(local) > 0)
    paths = 2 ** np.arange(3, 9)
    assert loglog_slope(paths, [layers_to_connect("conv", k, w=3) for k in paths]) == pytest.approx(1, abs=0.02)
    assert [layers_to_connect("conv", k, w=2, dilation_base=2) for k in paths] == list(np.log2(paths).astype(int))


def test_counters_nest_and_stop_outside():
    rng = np.random.default_rng(1)
    x, p = rng.normal(size=(4, 3)), init_conv_params(rng, 3, 2)
    with count_macs() as outer:
        conv1d_layer(x, p)
        with count_macs() as inner:
            conv1d_layer(x, p)
    conv1d_layer(x, p)  # not counted by anyone
    assert inner.macs == conv_macs(4, 3, 2) and outer.macs == 2 * inner.macs
    assert outer.products == 2


def test_batch_axis_counts_every_item():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 6, 4))
    with count_macs() as c:
        self_attention_layer(x, init_mha_params(rng, 4, 2), 2)
    assert c.macs == 5 * attention_macs(6, 4)


# ---------------------------------------------------------------- the layers


@pytest.mark.parametrize("h,causal", [(1, False), (2, True), (4, False)])
def test_self_attention_layer_equals_multi_head_attention(h, causal):
    rng = np.random.default_rng(3)
    x, p = rng.normal(size=(2, 7, 8)), init_mha_params(rng, 8, h)
    mask = causal_mask(7) if causal else None
    out, w = self_attention_layer(x, p, h, mask)
    ref_out, ref_w = multi_head_attention(x, x, p, h, mask=mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=1e-12, atol=1e-12)


def test_attention_core_is_plain_attention_of_x():
    x = np.random.default_rng(4).normal(size=(6, 5))
    out, _ = self_attention_layer(x, projections=False, h=1)
    np.testing.assert_allclose(out, scaled_dot_product_attention(x, x, x)[0], rtol=1e-12)


def naive_rnn(x, p, h0=None):
    h = np.zeros(p["U"].shape[0]) if h0 is None else h0
    out = []
    for t in range(x.shape[0]):
        h = np.tanh(x[t] @ p["W"] + h @ p["U"] + p["b"])
        out.append(h)
    return np.array(out)


def test_rnn_matches_naive_loop_with_batch_and_h0():
    rng = np.random.default_rng(5)
    p = init_rnn_params(rng, 4, d_in=3)
    p["b"] = rng.normal(size=4)
    x, h0 = rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 4))
    out = rnn_layer(x, p, h0)
    for b in range(2):
        np.testing.assert_allclose(out[b], naive_rnn(x[b], p, h0[b]), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rnn_layer(x[0], p), naive_rnn(x[0], p), rtol=1e-12, atol=1e-14)


def naive_lstm(x, p):
    """One sequence, one gate at a time, with the logistic function written out."""
    d = p["U"].shape[0]
    blocks = [
        (p["W"][:, m * d : (m + 1) * d], p["U"][:, m * d : (m + 1) * d], p["b"][m * d : (m + 1) * d]) for m in range(4)
    ]
    y, c, out = np.zeros(d), np.zeros(d), []
    for t in range(x.shape[0]):
        i, f, o, g = (x[t] @ W + y @ U + b for W, U, b in blocks)
        c = c / (1 + np.exp(-f)) + np.tanh(g) / (1 + np.exp(-i))
        y = np.tanh(c) / (1 + np.exp(-o))
        out.append(y)
    return np.array(out)


def test_lstm_matches_naive_loop_counts_and_parameters():
    rng = np.random.default_rng(13)
    p = init_lstm_params(rng, 5, d_in=3)
    p["b"] = rng.normal(size=20)
    x = 2 * rng.normal(size=(2, 9, 3))
    with count_macs() as c:
        out = lstm_layer(x, p)
    assert (c.macs, c.products) == (2 * lstm_macs(9, 5, d_in=3), 9 + 1)
    assert lstm_macs(9, 5, d_in=3) == 4 * 9 * 5 * (3 + 5)
    for b in range(2):
        np.testing.assert_allclose(out[b], naive_lstm(x[b], p), rtol=1e-12, atol=1e-14)
    square = init_lstm_params(rng, 16)
    assert sum(a.size for a in square.values()) == 8 * 16**2 + 4 * 16
    with count_macs() as c:
        lstm_layer(rng.normal(size=(7, 16)), square)
    assert c.macs == lstm_macs(7, 16) == 8 * 7 * 16**2
    with pytest.raises(ValueError, match="x axis -1"):
        lstm_layer(np.ones((3, 4)), p)
    causal = perturbation_reach(lambda z: lstm_layer(z, square), rng.normal(size=(6, 16)))
    np.testing.assert_array_equal(causal, lower(6))


def test_attention_core_counts_its_products_as_they_run():
    """The core's Q Kᵀ and A V go through the instrumented product: a counter sees 2 products whose
    multiply-adds follow the shapes actually received (a mask changes nothing: the products are dense)."""
    rng = np.random.default_rng(14)
    for n, d, h in [(5, 4, 1), (9, 8, 4)]:
        x = rng.normal(size=(3, n, d))
        with count_macs() as c:
            self_attention_layer(x, projections=False, h=h, mask=causal_mask(n))
        assert (c.macs, c.products) == (3 * 2 * n * n * d, 2)
    out, w = self_attention_layer(x, projections=False, h=4)
    heads = split_heads(x, 4)
    ref, ref_w = scaled_dot_product_attention(heads, heads, heads)
    np.testing.assert_array_equal(w, ref_w)  # the same computation, bit for bit
    np.testing.assert_array_equal(out, merge_heads(ref))


def naive_conv(x, p, r):
    W, b = p["W"], p["b"]
    k, n = W.shape[0], x.shape[0]
    y = np.tile(b, (n, 1)).astype(float)
    for i in range(n):
        for m in range(k):
            src = i - (k - 1 - m) * r
            if src >= 0:
                y[i] += x[src] @ W[m]
    return y


@pytest.mark.parametrize("k,r", [(1, 1), (2, 1), (3, 1), (3, 2), (2, 5)])
def test_conv_matches_naive_loop(k, r):
    rng = np.random.default_rng(6)
    p = init_conv_params(rng, 4, k, d_in=3)
    p["b"] = rng.normal(size=4)
    x = rng.normal(size=(11, 3))
    np.testing.assert_allclose(conv1d_layer(x, p, dilation=r), naive_conv(x, p, r), rtol=1e-12, atol=1e-13)
    batched = conv1d_layer(np.stack([x, 2 * x]), p, dilation=r)
    np.testing.assert_allclose(batched[1], naive_conv(2 * x, p, r), rtol=1e-12, atol=1e-13)


def test_initialisers_and_parameter_counts():
    rng = np.random.default_rng(7)
    p = init_rnn_params(rng, 16, radius=0.7)
    np.testing.assert_allclose(np.linalg.svd(p["U"], compute_uv=False), 0.7, rtol=1e-12)
    assert sum(a.size for a in p.values()) == 2 * 16**2 + 16
    c = init_conv_params(rng, 16, 5)
    assert c["W"].shape == (5, 16, 16) and sum(a.size for a in c.values()) == 5 * 16**2 + 16
    assert sum(a.size for a in init_mha_params(rng, 16, 4).values()) == 4 * 16**2


@pytest.mark.parametrize("n,d,h,r", [(10, 8, 2, 4), (7, 6, 3, 1), (5, 4, 1, 9), (33, 12, 4, 16)])
def test_restricted_attention_equals_band_masked_dense_and_counts_r_n_d(n, d, h, r):
    """The banded layer computes what the dense layer with the band mask computes, but its core
    executes 2·n·r·d multiply-adds (padding included), not 2·n²·d."""
    rng = np.random.default_rng(16 + n)
    x, p = rng.normal(size=(2, n, d)), init_mha_params(rng, d, h)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    with count_macs() as c:
        got = restricted_attention_layer(x, p, h, window=r)
    np.testing.assert_allclose(got, self_attention_layer(x, p, h, (j <= i) & (i - j < r))[0], rtol=1e-12, atol=1e-13)
    assert (c.macs, c.products) == (2 * (4 * n * d * d + 2 * n * r * d), 6)
    with count_macs() as c:
        core = restricted_attention_layer(x, h=h, window=r, projections=False)
    assert (c.macs, c.products) == (2 * 2 * n * r * d, 2)
    dense_core = self_attention_layer(x, projections=False, h=h, mask=(j <= i) & (i - j < r))[0]
    np.testing.assert_allclose(core, dense_core, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="params is required"):
        restricted_attention_layer(x, window=r)
    reach = perturbation_reach(lambda z: restricted_attention_layer(z, p, h, window=r), x[0])
    np.testing.assert_array_equal(reach, (j <= i) & (i - j < r))


# ---------------------------------------------------------------- dependency graphs


@PROPS
@given(n=st.integers(1, 40), L=st.integers(1, 4), w=st.integers(2, 4))
def test_hop_distances_closed_forms(n, L, w):
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    att = hop_distances(layer_graph("attention", n, L))
    assert np.all(att[lower(n)] == L) and np.all(np.isinf(att[~lower(n)]))
    assert np.all(hop_distances(layer_graph("attention", n, 1, causal=False)) == 1)
    rnn = hop_distances(layer_graph("rnn", n))
    np.testing.assert_array_equal(rnn, np.where(j <= i, i - j + 1.0, np.inf))
    conv = hop_distances(layer_graph("conv", n, L, w=w))
    np.testing.assert_array_equal(np.isfinite(conv), (i - j >= 0) & (i - j <= L * (w - 1)))
    assert np.all(conv[np.isfinite(conv)] == L)
    dil = hop_distances(layer_graph("conv", n, L, w=w, dilation_base=w))
    np.testing.assert_array_equal(np.isfinite(dil), (i - j >= 0) & (i - j < w**L))


@PROPS
@given(n=st.integers(2, 80), w=st.integers(2, 5))
def test_layers_to_connect_formulas(n, w):
    assert layers_to_connect("attention", n) == 1
    assert layers_to_connect("attention", n, causal=False) == 1
    assert layers_to_connect("rnn", n) == 1
    assert layers_to_connect("conv", n, w=w) == math.ceil((n - 1) / (w - 1))
    assert layers_to_connect("conv", n, w=w, dilation_base=w) == next(L for L in range(n + 1) if w**L >= n)
    assert layers_to_connect("attention", n, window=w) == math.ceil((n - 1) / (w - 1))


@pytest.mark.parametrize("n,L", [(1, 1), (5, 1), (9, 3), (30, 4)])
def test_sequential_depth(n, L):
    assert sequential_depth(layer_graph("rnn", n, L)) == n + L - 1
    assert sequential_depth(layer_graph("attention", n, L)) == L
    assert sequential_depth(layer_graph("conv", n, L, w=3, dilation_base=2)) == L


def test_layers_to_connect_raises_when_too_shallow():
    with pytest.raises(ValueError, match="max_layers=3"):
        layers_to_connect("conv", 20, w=2, max_layers=3)


def test_perturbation_reach_matches_graphs_of_real_layers():
    rng = np.random.default_rng(8)
    n, d = 13, 4
    x = rng.normal(size=(n, d))
    att = init_mha_params(rng, d, 2)
    got = perturbation_reach(lambda z: self_attention_layer(z, att, 2, causal_mask(n))[0], x)
    np.testing.assert_array_equal(got, lower(n))
    got = perturbation_reach(lambda z: self_attention_layer(z, att, 2)[0], x)
    assert got.all()
    rnn = init_rnn_params(rng, d, radius=0.9)
    np.testing.assert_array_equal(perturbation_reach(lambda z: rnn_layer(z, rnn), x), lower(n))
    ws = [init_conv_params(rng, d, 2) for _ in range(3)]

    def stack(z):
        for layer, w in enumerate(ws):
            z = conv1d_layer(z, w, dilation=2**layer)
        return z

    graph = np.isfinite(hop_distances(layer_graph("conv", n, 3, w=2, dilation_base=2)))
    np.testing.assert_array_equal(perturbation_reach(stack, x), graph)


# ---------------------------------------------------------------- gradients


def autograd_rnn_last(x, p):
    h = anp.zeros(p["U"].shape[0])
    for t in range(x.shape[0]):
        h = anp.tanh(anp.dot(x[t], p["W"]) + anp.dot(h, p["U"]) + p["b"])
    return h


@pytest.mark.parametrize("radius", [0.5, 1.3])
def test_rnn_input_jacobians_against_autograd(radius):
    rng = np.random.default_rng(9)
    p = init_rnn_params(rng, 5, d_in=3, radius=radius)
    x = rng.normal(size=(8, 3))
    ref = autograd.jacobian(lambda z: autograd_rnn_last(z, p))(x)  # (d, n, d_in)
    np.testing.assert_allclose(rnn_input_jacobians(x, p), np.moveaxis(ref, 0, 1), rtol=1e-10, atol=1e-13)
    mid = rnn_input_jacobians(x, p, i=3)
    assert np.all(mid[4:] == 0)
    ref_mid = autograd.jacobian(lambda z: autograd_rnn_last(z, p))(x[:4])
    np.testing.assert_allclose(mid[:4], np.moveaxis(ref_mid, 0, 1), rtol=1e-10, atol=1e-13)


def test_rnn_jacobian_bound_holds():
    rng = np.random.default_rng(10)
    p = init_rnn_params(rng, 6, radius=0.8)
    jac = rnn_input_jacobians(rng.normal(size=(20, 6)), p)
    norms = np.linalg.norm(jac, 2, axis=(1, 2))
    assert np.all(norms <= 0.8 ** np.arange(19, -1, -1) * np.linalg.norm(p["W"], 2) * (1 + 1e-12))


@pytest.mark.parametrize("causal,i", [(False, 0), (False, 4), (True, 6), (True, 2)])
def test_attention_input_jacobians_against_finite_differences(causal, i):
    rng = np.random.default_rng(11)
    n, d = 7, 5
    x, p = rng.normal(size=(n, d)), init_mha_params(rng, d, 1)
    mask = causal_mask(n) if causal else None
    ref = numerical_jacobian(lambda z: self_attention_layer(z, p, 1, mask)[0][i], x)  # (d_out, n, d)
    got = attention_input_jacobians(x, p, mask, i)
    np.testing.assert_allclose(got, np.moveaxis(ref, 0, 1), atol=1e-8)
    if causal:
        assert np.all(got[i + 1 :] == 0)


@pytest.mark.parametrize("causal,i,slope", [(False, 3, 0.5), (True, 6, 0.25), (True, 2, 2.0)])
def test_biased_attention_jacobians_against_finite_differences(causal, i, slope):
    rng = np.random.default_rng(15)
    n, d = 7, 5
    x, p = rng.normal(size=(n, d)), init_mha_params(rng, d, 1)
    mask = causal_mask(n) if causal else None
    bias = distance_bias(n, slope)
    ref = numerical_jacobian(lambda z: biased_attention_layer(z, p, bias, mask)[i], x)
    np.testing.assert_allclose(attention_input_jacobians(x, p, mask, i, bias=bias), np.moveaxis(ref, 0, 1), atol=1e-8)
    zero = np.zeros((n, n))
    unbiased = self_attention_layer(x, p, 1, mask)[0]
    np.testing.assert_allclose(biased_attention_layer(x, p, zero, mask), unbiased, atol=1e-12)
    np.testing.assert_allclose(
        attention_input_jacobians(x, p, mask, i, bias=zero), attention_input_jacobians(x, p, mask, i), atol=1e-12
    )


def test_input_sensitivity_is_the_directional_derivative():
    """Finite differences on the layer agree with the closed-form Jacobians applied to the same
    directions (the directions are the first draw of the generator after the seed)."""
    n, d = 9, 4
    rng = np.random.default_rng(17)
    x, p, rnn = rng.normal(size=(n, d)), init_mha_params(rng, d, 1), init_rnn_params(rng, d, radius=0.8)
    mask, bias = causal_mask(n), distance_bias(n, 0.5)
    u = np.random.default_rng(5).standard_normal((n, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    cases = [
        (lambda z: self_attention_layer(z, p, 1, mask)[0], attention_input_jacobians(x, p, mask)),
        (lambda z: biased_attention_layer(z, p, bias, mask), attention_input_jacobians(x, p, mask, bias=bias)),
        (lambda z: rnn_layer(z, rnn), rnn_input_jacobians(x, rnn)),
    ]
    for fn, jac in cases:
        got = input_sensitivity(fn, x, np.random.default_rng(5))
        np.testing.assert_allclose(got, np.linalg.norm(np.einsum("jab,jb->ja", jac, u), axis=1), rtol=1e-6, atol=1e-9)
    mid = input_sensitivity(lambda z: rnn_layer(z, rnn), x, np.random.default_rng(5), i=3)
    assert np.all(mid[4:] == 0) and np.all(mid[:4] > 0)
    with pytest.raises(ValueError, match="i must be in"):
        input_sensitivity(lambda z: z, x, rng, i=n)


def test_distance_bias_values_and_validation():
    np.testing.assert_array_equal(distance_bias(3, 0.5), -0.5 * np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]]))
    with pytest.raises(ValueError, match="slope"):
        distance_bias(3, 0.0)
    p = init_mha_params(np.random.default_rng(0), 4, 1)
    with pytest.raises(ValueError, match=r"bias must have shape \(n, n\)"):
        attention_input_jacobians(np.ones((3, 4)), p, bias=np.zeros((2, 2)))


# ---------------------------------------------------------------- fitting, timing, validation


def test_loglog_slope_recovers_exponent():
    x = np.array([2.0, 4.0, 8.0, 16.0])
    assert loglog_slope(x, 3 * x**2.5) == pytest.approx(2.5, abs=1e-12)
    with pytest.raises(ValueError, match="positive"):
        loglog_slope(x, -x)
    with pytest.raises(ValueError, match="equal length"):
        loglog_slope(x, x[:3])


def test_min_seconds_is_a_positive_float():
    t = min_seconds(np.ones, 10, repeat=2)
    assert isinstance(t, float) and t >= 0


def test_bad_arguments_name_the_argument():
    rng = np.random.default_rng(12)
    with pytest.raises(ValueError, match="x axis -1"):
        rnn_layer(np.ones((3, 5)), init_rnn_params(rng, 4, d_in=3))
    with pytest.raises(ValueError, match="x axis -1"):
        self_attention_layer(np.ones((3, 5)), init_mha_params(rng, 4, 1))
    with pytest.raises(ValueError, match="overflowed"):
        self_attention_layer(np.full((3, 4), 1e200), projections=False, h=1)
    with pytest.raises(ValueError, match="params is required"):
        self_attention_layer(np.ones((3, 4)), h=1)


def test_self_attention_layer_takes_the_head_count_from_its_parameters():
    # it used to default to h = 1 and split 4-head parameters into one head: output off, no error
    rng = np.random.default_rng(13)
    x, p = rng.normal(size=(5, 8)), init_mha_params(rng, 8, 4)
    np.testing.assert_allclose(self_attention_layer(x, p)[0], multi_head_attention(x, x, p)[0], rtol=1e-12)
    with pytest.raises(ValueError, match=r"head count the parameters were made for \(4\)"):
        self_attention_layer(x, p, 1)
    with pytest.raises(TypeError, match="h is required"):
        self_attention_layer(x, dict(p))  # a plain dict does not know its head count
    gqa = init_mha_params(rng, 8, 4, h_kv=2)  # grouped key/value heads: the core layer's own
    np.testing.assert_allclose(self_attention_layer(x, gqa)[0], multi_head_attention(x, x, gqa)[0], rtol=1e-12)
    with pytest.raises(ValueError, match=r"W must have shape \(k, d_in, d\)"):
        conv1d_layer(np.ones((3, 4)), {"W": np.ones((2, 4, 4, 1)), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="dilation must be >= 1"):
        conv1d_layer(np.ones((3, 4)), init_conv_params(rng, 4, 2), dilation=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        layer_graph("lstm", 5)
    with pytest.raises(ValueError, match=r"x must have shape \(n, d_in\)"):
        perturbation_reach(lambda z: z, np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="radius must be finite and > 0"):
        init_rnn_params(rng, 4, radius=-1.0)
    with pytest.raises(ValueError, match="i must be in"):
        rnn_input_jacobians(np.ones((3, 4)), init_rnn_params(rng, 4), i=3)


@pytest.mark.parametrize("d", [16, 64, 512])
def test_parameter_ratios_printed_in_chapter_11(d):
    """Array sizes of the initialisers: heads do not change attention's count; the ratios are 4d/(2d+1), d/(2d+1)."""
    rng = np.random.default_rng(d)
    size = lambda p: sum(a.size for a in p.values())  # noqa: E731
    attn = size(init_mha_params(rng, d, 8))
    assert attn == size(init_mha_params(rng, d, 1)) == 4 * d**2
    assert attn * (2 * d + 1) == 4 * d * size(init_rnn_params(rng, d))
    assert attn * (2 * d + 1) == d * size(init_lstm_params(rng, d))
    assert size(init_conv_params(rng, d, 3)) < attn < size(init_conv_params(rng, d, 4))


@pytest.mark.parametrize("d", [16, 32, 64])
def test_crossovers_of_the_counted_closed_forms(d):
    """Signs of core − RNN at n = d∓1, d and of attention − LSTM, core − projections at 2d∓1, 2d (chapter 11)."""
    for n, s in ((d - 1, -1), (d, 0), (d + 1, 1)):
        assert np.sign(attention_macs(n, d, projections=False) - rnn_macs(n, d)) == s
    for n, s in ((2 * d - 1, -1), (2 * d, 0), (2 * d + 1, 1)):
        assert np.sign(attention_macs(n, d) - lstm_macs(n, d)) == s
        assert np.sign(2 * attention_macs(n, d, projections=False) - attention_macs(n, d)) == s
    assert attention_macs(1, d) * d == rnn_macs(1, d) * (2 * d + 1)
    assert 3 * (attention_macs(d, d) - attention_macs(d, d, projections=False)) == 2 * attention_macs(d, d)


@pytest.mark.parametrize("n_proc", [16_384, 1_048_576])
def test_work_depth_crossover_closed_form(n_proc):
    """First n where C_SA/P exceeds C_RNN/P + n·τ equals ⌊(τP − 2d²)/(2d)⌋ + 1 (chapter 11, d_model = 64)."""
    d = 64
    tau = int(np.ceil(np.log2(2 * d))) + 1
    ns = np.arange(1, 10**6)
    n_star = ns[(2 * ns**2 * d + 4 * ns * d**2) / n_proc > 2 * ns * d**2 / n_proc + tau * ns][0]
    assert n_star == (tau * n_proc - 2 * d * d) // (2 * d) + 1


# ------------------------------------------------------------------ multi-head cost (chapter 9)
@pytest.mark.parametrize("h", [1, 2, 4, 8, 16])
def test_attention_macs_independent_of_heads_when_dk_is_d_over_h(h):
    n, d = 10, 64
    parts = attention_macs(n, d, h=h, by_part=True)
    assert parts["projections"] == 4 * n * d * d
    assert parts["scores"] == parts["weighted_sum"] == n * n * d
    assert parts["total"] == 4 * n * d * d + 2 * n * n * d
    assert parts["softmax_entries"] == h * n * n


@pytest.mark.parametrize("h", [1, 4, 8])
def test_attention_macs_matches_counted_layer(h):
    rng = np.random.default_rng(0)
    n, d = 7, 32
    params = init_mha_params(rng, d, h)
    with count_macs() as c:
        self_attention_layer(rng.standard_normal((n, d)), params, h=h)
    assert c.macs == attention_macs(n, d, h=h)


def test_attention_macs_fixed_dk_grows_linearly_and_matches_param_count():
    a, b = (attention_macs(5, 16, h=h, d_k=8, d_v=8, by_part=True) for h in (2, 8))
    assert b["total"] == 4 * a["total"]
    assert a["projections"] == 5 * mha_param_count(16, 2, d_k=8, d_v=8)


def test_attention_macs_validation():
    with pytest.raises(ValueError, match="divisible"):
        attention_macs(4, 10, h=3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        attention_macs(0, 8, h=2)
    with pytest.raises(TypeError, match="d_k must be an integer"):
        attention_macs(4, 8, h=2, d_k=2.5)


@pytest.mark.parametrize("h_kv", [1, 2, 4])
def test_attention_macs_counts_grouped_key_value_heads(h_kv):
    rng = np.random.default_rng(31)
    n, d, h = 7, 12, 4
    params = init_mha_params(rng, d, h, h_kv=h_kv)
    with count_macs() as c:
        self_attention_layer(rng.standard_normal((n, d)), params)
    assert c.macs == attention_macs(n, d, h=h, h_kv=h_kv)
