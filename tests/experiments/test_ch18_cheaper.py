"""Unit and property tests for attn_utils.experiments.ch18_cheaper (windows, sparse patterns, linear attention,
random features, matrix-state memories)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_utils as au
from attn_utils.experiments import ch11_layers as c11
from attn_utils.experiments import ch18_cheaper as ex
from attn_utils.experiments.ch15_inference import GroupedKVCache

PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- windows


@PROPS
@given(st.integers(1, 4), st.integers(2, 6))
def test_window_reach_is_the_farthest_finite_hop_in_chapter_11s_graph(n_layers, window):
    n = 40
    dist = c11.hop_distances(c11.layer_graph("attention", n, n_layers, window=window))
    i, j = np.nonzero(np.isfinite(dist))
    assert (i - j).max() == min(ex.window_reach(n_layers, window), n - 1)
    assert (j <= i).all()


def test_a_local_layer_is_banded_attention_and_a_global_one_is_causal_attention():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 12, 4))
    n, w = 12, 3
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    band = (i - j >= 0) & (i - j < w)
    want_local = x + au.scaled_dot_product_attention(x, x, x, mask=band)[0]
    np.testing.assert_allclose(ex.hybrid_stack(x, ("local",), w), want_local, rtol=1e-12, atol=1e-12)
    want_global = x + au.scaled_dot_product_attention(x, x, x, mask=au.causal_mask(n))[0]
    np.testing.assert_allclose(ex.hybrid_stack(x, ("global",), w), want_global, rtol=1e-12, atol=1e-12)


def test_cached_positions_match_a_rolling_buffer():
    # chapter 15's cache: a rolling buffer of window w keeps min(w, n) positions per layer
    w, n = 5, 9
    cache = GroupedKVCache(1, window=w, rolling=True)
    for _ in range(n):
        cache.append(0, np.zeros((1, 1, 1, 2)), np.zeros((1, 1, 1, 2)))
        cache.finish_step(1)
    assert cache.length == min(w, n) == ex.hybrid_cache_tokens(("local",), w, n)
    assert ex.hybrid_cache_tokens(("local", "global", "local"), 4, 10) == 4 + 10 + 4
    assert ex.hybrid_cache_tokens(("local",), 4, 2) == 2


def test_gemma_patterns_cycle_their_unit():
    gemma3 = ex.repeat_pattern(("local",) * 5 + ("global",), 62)
    assert gemma3.count("global") == 10 and gemma3[5] == "global" and gemma3[0] == "local"
    assert ex.repeat_pattern(("local", "global"), 46).count("global") == 23


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: ex.hybrid_stack(np.zeros((4, 2)), ("local", "dense"), 2), "pattern"),
        (lambda: ex.hybrid_stack(np.zeros((4, 2)), (), 2), "pattern"),
        (lambda: ex.window_reach(0, 4), "n_layers"),
        (lambda: ex.hybrid_cache_tokens(("local",), 0, 4), "window"),
        (lambda: ex.window_layers_to_connect(8, 1), "window"),
    ],
)
def test_bad_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ---------------------------------------------------------------- sparse patterns


def test_strided_masks_are_causal_and_their_union_has_stride_plus_i_over_stride_keys():
    n, stride = 30, 5
    local, strided = ex.sparse_masks("strided", n, stride=stride)
    assert not np.triu(local | strided, 1).any()
    i = np.arange(n)
    want = np.minimum(i + 1, stride) + i // stride  # local keys + strided keys, the query itself counted once
    np.testing.assert_array_equal((local | strided).sum(axis=1), want)


@PROPS
@given(st.integers(2, 48), st.integers(2, 9))
def test_local_then_strided_connects_every_causal_pair_in_the_stated_layers(n, stride):
    local, strided = ex.sparse_masks("strided", n, stride=stride)
    layers = ex.strided_path_layers(n, stride)
    dist = c11.hop_distances(ex.pattern_graph([local, strided][:layers]))
    assert np.isfinite(dist[np.tril_indices(n)]).all()


def test_bigbird_mask_has_its_band_globals_and_distinct_random_keys():
    n = 20
    (mask,) = ex.sparse_masks("bigbird", n, window=2, n_global=2, n_random=3, rng=np.random.default_rng(1))
    assert mask[:2].all() and mask[:, :2].all()
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    assert mask[np.abs(i - j) < 2].all()
    assert (mask.sum(axis=1) >= 3).all()
    with pytest.raises(ValueError, match="rng"):
        ex.sparse_masks("bigbird", n)
    with pytest.raises(ValueError, match="kind"):
        ex.sparse_masks("dilated", n)


def test_pattern_layers_to_connect_counts_layers_of_a_mask_cycle():
    n = 64
    local, strided = ex.sparse_masks("strided", n, stride=8)
    lower = np.tril(np.ones((n, n), bool))
    assert ex.pattern_layers_to_connect([local, strided], lower) == ex.strided_path_layers(n, 8)
    assert ex.pattern_layers_to_connect([local], lower) == ex.window_layers_to_connect(n, 8)
    # a global token (sees and is seen by every position) connects every pair in two layers, whatever the
    # random keys: j -> 0 -> i
    for seed in range(4):
        (bigbird,) = ex.sparse_masks("bigbird", n, window=3, n_global=1, n_random=2, rng=np.random.default_rng(seed))
        assert ex.pattern_layers_to_connect([bigbird]) == 2
    with pytest.raises(ValueError, match="max_layers"):
        ex.pattern_layers_to_connect([local], lower, max_layers=2)
    with pytest.raises(ValueError, match="target"):
        ex.pattern_layers_to_connect([local], lower[:3])


def test_window_layers_to_connect_agrees_with_chapter_11():
    for n, w in ((64, 8), (33, 5), (10, 10), (2, 2)):
        assert ex.window_layers_to_connect(n, w) == c11.layers_to_connect("attention", n, window=w)


def test_pattern_graph_refuses_masks_of_different_shapes():
    with pytest.raises(ValueError, match="masks_per_layer"):
        ex.pattern_graph([np.ones((3, 3), bool), np.ones((4, 4), bool)])


# ---------------------------------------------------------------- linear attention


def test_non_causal_linear_attention_is_phi_q_times_phi_k_transpose_v_by_associativity():
    rng = np.random.default_rng(2)
    pq, pk = np.abs(rng.standard_normal((2, 7, 5))), np.abs(rng.standard_normal((2, 7, 5)))
    v = rng.standard_normal((2, 7, 3))
    kv = np.swapaxes(pk, -1, -2) @ v  # (d_phi, d_v): built once, n·d_phi·d_v
    want = (pq @ kv) / (pq @ pk.sum(axis=-2)[..., None])
    np.testing.assert_allclose(ex.linear_attention_quadratic(pq, pk, v, causal=False), want, rtol=1e-12)


@PROPS
@given(st.integers(1, 20), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_recurrence_equals_the_masked_quadratic_form(n, d_phi, d_v, seed):
    rng = np.random.default_rng(seed)
    pq, pk = ex.elu_features(rng.standard_normal((n, d_phi))), ex.elu_features(rng.standard_normal((n, d_phi)))
    v = rng.standard_normal((n, d_v))
    np.testing.assert_allclose(
        ex.linear_attention_recurrent(pq, pk, v), ex.linear_attention_quadratic(pq, pk, v), rtol=1e-10, atol=1e-12
    )


@PROPS
@given(st.integers(1, 20), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_the_prefix_sum_gives_the_recurrences_output(n, d_phi, d_v, seed):
    rng = np.random.default_rng(seed)
    pq, pk = ex.elu_features(rng.standard_normal((2, n, d_phi))), ex.elu_features(rng.standard_normal((2, n, d_phi)))
    v = rng.standard_normal((2, n, d_v))
    np.testing.assert_allclose(
        ex.linear_attention_scan(pq, pk, v), ex.linear_attention_recurrent(pq, pk, v), rtol=1e-10, atol=1e-12
    )


def test_elu_weights_tend_to_their_limit_as_the_query_grows():
    rng = np.random.default_rng(9)
    q, keys = rng.standard_normal(6), rng.standard_normal((10, 6))
    limit = ex.elu_weight_limit(q, keys)
    gaps = []
    for c in (10.0, 100.0, 1000.0):
        a = ex.elu_features(keys) @ ex.elu_features(c * q)
        gaps.append(np.abs(a / a.sum() - limit).max())
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3
    assert limit.max() < 0.5
    with pytest.raises(ValueError, match="positive component"):
        ex.elu_weight_limit(-np.ones(6), keys)


def test_counted_costs_of_both_forms():
    n, d_phi, d_v = 11, 6, 4
    rng = np.random.default_rng(3)
    pq, pk, v = (
        np.abs(rng.standard_normal((n, d_phi))),
        np.abs(rng.standard_normal((n, d_phi))),
        rng.standard_normal((n, d_v)),
    )
    with au.count_macs() as quad:
        ex.linear_attention_quadratic(pq, pk, v)
    with au.count_macs() as rec:
        ex.linear_attention_recurrent(pq, pk, v)
    assert quad.macs == n * n * (d_phi + d_v)
    assert rec.macs == n * (2 * d_v * d_phi + d_phi) and rec.products == 3 * n
    assert ex.linear_crossover(16, 16, 16) == pytest.approx(16.5)


def test_elu_features_are_positive_and_continuous():
    x = np.array([-30.0, -1.0, 0.0, 1e-12, 2.0])
    phi = ex.elu_features(x)
    assert (phi > 0).all()
    np.testing.assert_allclose(phi, [np.exp(-30.0), np.exp(-1.0), 1.0, 1.0 + 1e-12, 3.0])


def test_negative_features_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        ex.linear_attention_quadratic(-np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 1)))


# ---------------------------------------------------------------- random features


def test_positive_random_features_estimate_the_exponential_kernel():
    rng = np.random.default_rng(4)
    q, k = np.array([0.3, -0.2, 0.1]), np.array([0.1, 0.4, -0.3])
    est = ex.prf_kernel_estimates(q, k, rng, 8, 200_000)
    assert abs(est.mean() - np.exp(q @ k)) < 5 * est.std() / np.sqrt(est.size)
    assert est.var() == pytest.approx(ex.prf_variance(q, k, 8), rel=0.05)
    assert (est > 0).all()


def test_prf_kernel_estimates_need_vectors_of_one_size():
    with pytest.raises(ValueError, match="q and k"):
        ex.prf_kernel_estimates(np.ones(3), np.ones(4), np.random.default_rng(0), 2, 2)


# ---------------------------------------------------------------- matrix-state memories


def test_additive_state_recalls_orthonormal_keys_exactly_and_delta_replaces():
    rng = np.random.default_rng(5)
    keys = np.linalg.qr(rng.standard_normal((8, 8)))[0].T
    values = rng.standard_normal((8, 3))
    np.testing.assert_allclose(ex.recall(ex.additive_state(keys, values), keys), values, atol=1e-12)
    np.testing.assert_allclose(ex.recall(ex.delta_state(keys, values), keys), values, atol=1e-12)
    again = rng.standard_normal((1, 3))
    S = ex.delta_state(np.vstack([keys, keys[:1]]), np.vstack([values, again]))
    np.testing.assert_allclose(ex.recall(S, keys[:1]), again, atol=1e-12)


def test_gated_additive_state_is_the_decayed_recurrence():
    rng = np.random.default_rng(10)
    keys, values, lam = ex.unit_rows(rng, (2, 9, 5)), rng.standard_normal((2, 9, 3)), 0.8
    S = np.zeros((2, 3, 5))
    for t in range(9):
        S = lam * S + values[:, t, :, None] * keys[:, t, None, :]
    np.testing.assert_allclose(ex.additive_state(keys, values, gate=lam), S, atol=1e-12)
    np.testing.assert_allclose(ex.additive_state(keys, values), ex.additive_state(keys, values, gate=1.0))
    with pytest.raises(ValueError, match="gate"):
        ex.additive_state(keys, values, gate=0.0)


def test_delta_rule_makes_the_latest_unit_key_exact():
    rng = np.random.default_rng(6)
    keys = ex.unit_rows(rng, (10, 4))  # more keys than dimensions
    values = rng.standard_normal((10, 2))
    S = ex.delta_state(keys, values)
    np.testing.assert_allclose(S @ keys[-1], values[-1], atol=1e-12)
    gated = ex.delta_state(keys, values, gate=0.5)
    np.testing.assert_allclose(gated @ keys[-1], values[-1], atol=1e-12)
    with pytest.raises(ValueError, match="gate"):
        ex.delta_state(keys, values, gate=1.5)


def test_least_squares_recall_is_the_lstsq_state():
    rng = np.random.default_rng(7)
    keys, values = rng.standard_normal((12, 5)), rng.standard_normal((12, 3))
    S_t, *_ = np.linalg.lstsq(keys, values, rcond=None)  # keys @ S_t ≈ values
    np.testing.assert_allclose(ex.least_squares_recall(keys, values), keys @ S_t, atol=1e-12)
    few = keys[:4]
    np.testing.assert_allclose(ex.least_squares_recall(few, values[:4]), values[:4], atol=1e-12)
    assert ex.best_linear_residual(few, values[:4]) < 1e-20


def test_unit_rows_have_unit_length_and_shapes_are_checked():
    rows = ex.unit_rows(np.random.default_rng(8), (3, 5, 4))
    np.testing.assert_allclose(np.linalg.norm(rows, axis=-1), 1.0)
    with pytest.raises(ValueError, match="values"):
        ex.additive_state(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="estimate and target"):
        ex.mean_square_error(np.ones((2, 2)), np.ones((3, 2)))
