"""Unit and property tests for attn_utils.experiments.ch14_positions (chapter 14)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import causal_mask, init_mha_params, multi_head_attention, softmax
from attn_utils.experiments.ch14_positions import (
    add_positions,
    alibi_bias,
    alibi_slopes,
    biased_attention,
    clipped_offsets,
    learned_position_table,
    mean_distance,
    permutation_error,
    relative_scores,
    rope,
    rope_aligned_mean,
    rope_frequencies,
    rope_matrix,
    rope_multi_head_attention,
    rope_offset_scores,
    same_offset_spread,
    sinusoid_frequencies,
    sinusoidal_positions,
)
from attn_utils.harness.training import sinusoidal_positions as harness_sinusoidal

PROPS = settings(max_examples=30, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- sinusoidal and learned


def test_sinusoidal_matches_the_formula_and_the_harness():
    pe = sinusoidal_positions(50, 16)
    i, c = 7, 3
    omega = 10000 ** (-2 * c / 16)
    assert pe[i, 2 * c] == pytest.approx(np.sin(i * omega))
    assert pe[i, 2 * c + 1] == pytest.approx(np.cos(i * omega))
    np.testing.assert_allclose(pe, harness_sinusoidal(50, 16), atol=1e-15)


def test_sinusoidal_norm_and_offset_only_dot_products():
    pe = sinusoidal_positions(40, 32)
    np.testing.assert_allclose((pe**2).sum(axis=1), 16.0, atol=1e-12)
    gram = pe @ pe.T
    offsets = np.arange(40)[None, :] - np.arange(40)[:, None]
    expected = np.cos(offsets[..., None] * sinusoid_frequencies(32)).sum(-1)
    np.testing.assert_allclose(gram, expected, atol=1e-10)


def test_sinusoidal_shift_is_a_rotation_of_each_pair():
    """Vaswani et al.: PE_{i+k} is a linear function of PE_i (a rotation by k·ω_c in every pair)."""
    pe = sinusoidal_positions(30, 8)
    k = 5
    omega = sinusoid_frequencies(8)
    for c, w in enumerate(omega):
        rot = np.array([[np.cos(k * w), -np.sin(k * w)], [np.sin(k * w), np.cos(k * w)]])
        np.testing.assert_allclose(pe[k:, 2 * c : 2 * c + 2], pe[:-k, 2 * c : 2 * c + 2] @ rot, atol=1e-12)


def test_odd_width_and_short_table_are_rejected():
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positions(4, 7)
    table = learned_position_table(np.random.default_rng(0), 8, 4)
    assert table.shape == (8, 4)
    np.testing.assert_allclose(add_positions(np.zeros((5, 4)), table), table[:5])
    with pytest.raises(ValueError, match="only 8"):
        add_positions(np.zeros((9, 4)), table)
    with pytest.raises(ValueError, match="width"):
        add_positions(np.zeros((3, 5)), table)


# ---------------------------------------------------------------- RoPE


def test_rope_frequencies():
    theta = rope_frequencies(8)
    np.testing.assert_allclose(theta, [1.0, 10000**-0.25, 10000**-0.5, 10000**-0.75])


@PROPS
@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 2**31 - 1))
def test_rope_score_depends_on_offset_only(i, j, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 16))
    s = rope(q[None], [float(i)])[0] @ rope(k[None], [float(j)])[0]
    np.testing.assert_allclose(s, q @ rope_matrix(j - i, 16) @ k, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(rope(q[None], [float(i)])), np.linalg.norm(q), rtol=1e-12)


def test_rope_matches_its_matrix_and_starts_at_identity():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 6, 12))
    pos = np.array([0.0, 1.0, 2.0, 5.0, 17.0, 1e4])
    out = rope(x, pos)
    for t, p in enumerate(pos):
        np.testing.assert_allclose(out[:, t], x[:, t] @ rope_matrix(p, 12).T, atol=1e-12)
    np.testing.assert_allclose(rope(x[:, :1], [0.0]), x[:, :1])
    r = rope_matrix(3.0, 12)
    np.testing.assert_allclose(r.T @ r, np.eye(12), atol=1e-12)


def test_rope_pairings_differ_by_a_fixed_permutation():
    rng = np.random.default_rng(2)
    d = 10
    x = rng.standard_normal((7, d))
    pos = np.arange(7.0) * 3
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # adjacent layout -> half layout
    np.testing.assert_allclose(rope(x[:, perm], pos, pairing="half"), rope(x, pos)[:, perm], atol=1e-12)
    with pytest.raises(ValueError, match="pairing"):
        rope(x, pos, pairing="other")
    with pytest.raises(ValueError, match="positions"):
        rope(x, np.arange(3.0))


def test_rope_aligned_mean_closed_form():
    np.testing.assert_allclose(rope_aligned_mean(0, 64), 64.0)
    assert rope_aligned_mean(1000, 64) < rope_aligned_mean(10, 64) < rope_aligned_mean(0, 64)
    # against the trace of the rotation matrix: E[q·R_Δ k] = tr(R_Δ) when E[k qᵀ] = I
    for delta in (1.0, 37.0, 5000.0):
        np.testing.assert_allclose(rope_aligned_mean(delta, 16), np.trace(rope_matrix(delta, 16)), atol=1e-12)


def test_rope_with_a_sign_error_is_not_offset_only():
    """The Toeplitz check of the chapter can fail: keys rotated the wrong way give scores that depend on i + j."""
    rng = np.random.default_rng(8)
    n, d = 20, 16
    q, k = np.broadcast_to(rng.standard_normal((2, 1, d)), (2, n, d))
    good = rope(q) @ rope(k).T
    bad = rope(q) @ rope(k, -np.arange(n, dtype=float)).T
    assert same_offset_spread(good) < 1e-12
    assert same_offset_spread(bad) > 0.3


@PROPS
@given(st.floats(0.0, 1e4), st.integers(0, 2**31 - 1))
def test_roformer_bound_holds(delta, seed):
    """RoFormer section 3.4.3: |q·R_Δ k| ≤ max_c |h_{c+1} − h_c| · Σ_c |S_c| (summation by parts)."""
    rng = np.random.default_rng(seed)
    d = 32
    q, k = rng.standard_normal((2, d))
    score = q @ rope_matrix(delta, d) @ k
    h = np.append((q[0::2] + 1j * q[1::2]) * np.conj(k[0::2] + 1j * k[1::2]), 0.0)
    bound = np.abs(np.diff(h)).max() * np.abs(np.cumsum(np.exp(1j * delta * rope_frequencies(d)))).sum()
    assert abs(score) <= bound * (1 + 1e-12)


def test_ntk_aware_base_keeps_the_fastest_pair_and_slows_the_slowest_by_s():
    d, s = 64, 8.0
    theta, theta_ntk = rope_frequencies(d), rope_frequencies(d, 10_000.0 * s ** (d / (d - 2)))
    np.testing.assert_allclose(theta_ntk[0], theta[0])
    np.testing.assert_allclose(theta[-1] / theta_ntk[-1], s, rtol=1e-12)
    ratio = theta / theta_ntk
    assert np.all(np.diff(ratio) > 0)  # pairs in between: interpolated by factors between 1 and s


def test_rope_attention_is_shift_invariant_not_permutation_equivariant():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 16))
    params = init_mha_params(rng, 16, 4)
    a, w = rope_multi_head_attention(x, params)
    b, _ = rope_multi_head_attention(x, params, positions=np.arange(9.0) + 777)
    np.testing.assert_allclose(a, b, atol=1e-10)
    np.testing.assert_allclose(w.sum(-1), 1.0)
    perm = rng.permutation(9)
    assert permutation_error(lambda z: rope_multi_head_attention(z, params)[0], x, perm) > 0.05


def test_rope_at_position_zero_is_plain_attention():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16))  # n = 1: the only position is 0
    params = init_mha_params(rng, 16, 2)
    np.testing.assert_allclose(
        rope_multi_head_attention(x, params)[0], multi_head_attention(x, x, params)[0], atol=1e-12
    )


# ---------------------------------------------------------------- relative (Shaw) and ALiBi


def test_clipped_offsets():
    idx = clipped_offsets(3, 5, 2)
    assert idx.tolist() == [[2, 3, 4, 4, 4], [1, 2, 3, 4, 4], [0, 1, 2, 3, 4]]


def test_relative_scores_formula_and_zero_table():
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 6, 4))
    table = rng.standard_normal((5, 4))
    s = relative_scores(q, k, table)
    i, j = 1, 5  # offset 4 clipped to 2 -> row 4
    assert s[i, j] == pytest.approx(q[i] @ (k[j] + table[4]) / 2)
    np.testing.assert_allclose(relative_scores(q, k, np.zeros((5, 4))), q @ k.T / 2)
    with pytest.raises(ValueError, match="2K"):
        relative_scores(q, k, np.zeros((4, 4)))


def test_alibi_slopes():
    np.testing.assert_allclose(alibi_slopes(8), [2.0**-r for r in range(1, 9)])
    np.testing.assert_allclose(alibi_slopes(16)[1::2], alibi_slopes(8))
    with pytest.raises(ValueError, match="power of two"):
        alibi_slopes(6)


def test_alibi_bias_values_and_kv_cache_alignment():
    b = alibi_bias(4, slopes=[0.5])
    assert b.shape == (1, 4, 4)
    assert b[0, 3].tolist() == [-1.5, -1.0, -0.5, -0.0]
    # one new query with 6 cached keys sits at position 5
    np.testing.assert_allclose(alibi_bias(1, 6, [0.25])[0, 0], -0.25 * np.arange(5, -1, -1))


def test_biased_attention_with_zero_bias_is_softmax_attention_and_window_mean():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((3, 5, 8))
    out, w = biased_attention(q, k, v, 0.0, mask=causal_mask(5))
    np.testing.assert_allclose(w, softmax(q @ k.T / np.sqrt(8), mask=causal_mask(5)))
    np.testing.assert_allclose(out, w @ v)
    # equal content scores: truncated geometric weights, mean distance β/(1−β) − (i+1)β^(i+1)/(1−β^(i+1)) at query i
    for n, mu in ((400, 0.1), (6, 0.5), (3, 2.0)):
        _, w = biased_attention(np.zeros((1, 1, 4)), np.zeros((1, n, 4)), np.zeros((1, n, 1)), alibi_bias(1, n, [mu]))
        beta = np.exp(-mu)
        finite = beta / (1 - beta) - n * beta**n / (1 - beta**n)
        np.testing.assert_allclose(mean_distance(w)[0, 0], finite, rtol=1e-10)
        assert mean_distance(w)[0, 0] < 1 / np.expm1(mu)
        # weight at distances ≥ D is at most e^(−μD)
        tail = np.cumsum(w[0, 0])  # keys 0..n−1; distance of key j is n−1−j
        for D in range(1, n):
            assert tail[n - 1 - D] <= np.exp(-mu * D) + 1e-15


# ---------------------------------------------------------------- measuring helpers


def test_same_offset_spread():
    t = np.array([[0.0, 1.0, 2.0], [-1.0, 0.0, 1.0], [-2.0, -1.0, 0.0]])
    assert same_offset_spread(t) == 0.0
    assert same_offset_spread(np.diag([0.0, 1.0, 2.0])) > 0.5
    with pytest.raises(ValueError, match="square"):
        same_offset_spread(np.zeros((2, 3)))


def test_permutation_error_of_plain_attention_is_rounding():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 8, 16))
    params = init_mha_params(rng, 16, 4)
    perm = rng.permutation(8)
    assert permutation_error(lambda z: multi_head_attention(z, z, params)[0], x, perm) < 1e-13
    assert permutation_error(lambda z: multi_head_attention(z, z, params, mask=causal_mask(8))[0], x, perm) > 0.05


@pytest.mark.parametrize("base", [10_000.0, 10_000.0 * 4 ** (64 / 62)])
def test_rope_offset_scores_equal_rotating_the_keys(base):
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 5, 64))
    offsets = np.array([0.0, 1.0, 2.5, 511.0, 2047.0])
    rotated = rope(np.repeat(k[:, None, :], offsets.size, axis=1), offsets, base=base)
    np.testing.assert_allclose(rope_offset_scores(q, k, offsets, base), np.einsum("pd,pod->po", q, rotated), atol=1e-10)
    with pytest.raises(ValueError, match="both be"):
        rope_offset_scores(q, k[:3], offsets)
