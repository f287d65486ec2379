"""Unit and property tests for attn_utils.experiments.ch19_kv_cache (MLA cache and absorption, quantisation, forks)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.experiments import ch15_inference as inf
from attn_utils.experiments import ch19_kv_cache as ex

PROPS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- configurations


def test_deepseek_v2_cache_counts():
    ds = ex.DEEPSEEK_V2
    assert ds.kv_numbers_per_token() == 60 * (512 + 64)
    assert ds.kv_bytes(1, 2) == 69_120
    assert ds.gqa_groups() == 2.25
    assert ds.as_mha().kv_numbers_per_token() == 2 * 60 * 128 * 128
    assert ds.as_mha(8).h_kv == 8 and ds.as_mha(1).name.endswith("MQA")


def test_decode_attention_intensity():
    ds = ex.DEEPSEEK_V2
    assert ds.decode_attention_intensity() == pytest.approx(2 * 128 * (2 * 512 + 64) / (576 * 2))  # ≈ 242
    assert ds.decode_attention_intensity(h_kv=128) == pytest.approx(1.0)  # MHA in 16 bits: 1 FLOP per byte
    assert ds.decode_attention_intensity(h_kv=8) == pytest.approx(16.0)
    with pytest.raises(ValueError, match="bytes_per_number"):
        ds.decode_attention_intensity(bytes_per_number=0)


def test_mla_config_refuses_bad_widths():
    with pytest.raises(ValueError, match="d_c"):
        ex.MLAConfig("x", 2, 64, 4, 16, 0)
    with pytest.raises(ValueError, match="d_rope"):
        ex.MLAConfig("x", 2, 64, 4, 16, 8, d_rope=-2)


def test_init_mla_shapes_and_bad_input():
    p = ex.init_mla(np.random.default_rng(0), 32, 4, 8, 16, 4)
    assert p.W_dkv.shape == (32, 16) and p.W_uk.shape == (4, 16, 8) and p.W_uv.shape == (4, 16, 8)
    assert p.W_q.shape == (4, 32, 8) and p.W_qr.shape == (4, 32, 4) and p.W_kr.shape == (32, 4)
    assert p.W_o.shape == (4, 8, 32)
    with pytest.raises(ValueError, match="d_rope"):
        ex.init_mla(np.random.default_rng(0), 32, 4, 8, 16, 3)
    with pytest.raises(ValueError, match="x must have shape"):
        ex.mla_cache(p, np.zeros((5, 31)))


# ---------------------------------------------------------------- absorption


@PROPS
@given(seed=st.integers(0, 2**16), h=st.sampled_from([1, 2, 4]), d_rope=st.sampled_from([0, 2, 6]), n=st.integers(1, 9))
def test_absorbed_equals_explicit(seed, h, d_rope, n):
    rng = np.random.default_rng(seed)
    p = ex.init_mla(rng, 12, h, 4, 6, d_rope)
    x = rng.standard_normal((n, 12))
    for mode in ("none", "decoupled"):
        np.testing.assert_allclose(ex.mla_absorbed(p, x, mode), ex.mla_explicit(p, x, mode), atol=1e-10, rtol=1e-10)


def test_decoupled_rope_depends_on_relative_positions_only():
    """Shifting every position leaves the output unchanged; a cache rotated at other positions changes it."""
    rng = np.random.default_rng(4)
    p = ex.init_mla(rng, 12, 2, 4, 6, 4)
    x = rng.standard_normal((7, 12))
    shifted = np.arange(7) + 500
    for mode in ("decoupled", "content"):
        np.testing.assert_allclose(ex.mla_explicit(p, x, mode, shifted), ex.mla_explicit(p, x, mode), atol=1e-10)
    np.testing.assert_allclose(ex.mla_absorbed(p, x, positions=shifted), ex.mla_explicit(p, x), atol=1e-10)
    stale = ex.mla_absorbed(p, x, cache=ex.mla_cache(p, x, shifted))
    assert np.abs(stale - ex.mla_explicit(p, x)).max() > 1e-3
    with pytest.raises(ValueError, match="cache must be"):
        ex.mla_absorbed(p, x, cache=ex.mla_cache(p, x[:3]))


def test_absorbed_refuses_content_rope_and_unknown_modes():
    p = ex.init_mla(np.random.default_rng(1), 12, 2, 4, 6, 2)
    x = np.zeros((3, 12))
    with pytest.raises(ValueError, match="content RoPE"):
        ex.mla_absorbed(p, x, "content")
    with pytest.raises(ValueError, match="rope_mode"):
        ex.mla_explicit(p, x, "rotary")


def test_mla_is_causal():
    """Changing the last token leaves the outputs at earlier positions unchanged."""
    rng = np.random.default_rng(2)
    p = ex.init_mla(rng, 12, 2, 4, 6, 2)
    x = rng.standard_normal((6, 12))
    y = x.copy()
    y[-1] += 1.0
    np.testing.assert_allclose(ex.mla_explicit(p, x)[:-1], ex.mla_explicit(p, y)[:-1], atol=1e-12)


def test_offset_matrices_give_rotary_scores():
    """qᵀ M_δ c equals the score of the rotated query (position t) and rotated key (position t + δ)."""
    from attn_utils.experiments.ch14_positions import rope

    rng = np.random.default_rng(3)
    W = rng.standard_normal((6, 4))
    q, c = rng.standard_normal(4), rng.standard_normal(6)
    for t, delta in ((0, 0), (5, -3), (11, 7)):
        M = ex.offset_matrices(W, [delta])[0]
        direct = rope(q[None], [t])[0] @ rope((c @ W)[None], [t + delta])[0]
        assert np.isclose(q @ M @ c, direct)


def test_fixed_absorption_residual_limits():
    W = np.random.default_rng(4).standard_normal((6, 4))
    assert ex.fixed_absorption_residual(W, [0]) == 0.0
    assert ex.fixed_absorption_residual(W, [0, 0, 0]) < 1e-30
    assert 0.0 < ex.fixed_absorption_residual(W, -np.arange(32)) < 1.0


# ---------------------------------------------------------------- quantisation


@PROPS
@given(seed=st.integers(0, 2**16), bits=st.sampled_from([2, 4, 8]), axis=st.sampled_from([-1, -2]))
def test_quantize_error_is_at_most_half_a_step(seed, bits, axis):
    x = np.random.default_rng(seed).standard_normal((2, 7, 5)) * 3
    codes, scale, lo = ex.quantize(x, bits, axis)
    assert codes.dtype == np.uint8 and codes.max() <= 2**bits - 1
    assert scale.dtype == np.float16 and scale.shape[axis] == 1
    err = np.abs(ex.dequantize(codes, scale, lo) - x)
    # half a step, plus the float16 rounding of the offset (half a float16 unit of lo)
    slack = scale.astype(float) / 2 + np.abs(lo.astype(float)) * 2.0**-11 + 1e-12
    assert np.all(err <= slack * 1.0001)


def test_quantize_constant_group_and_bad_bits():
    codes, scale, lo = ex.quantize(np.full((3, 4), 2.5), 4, -1)
    np.testing.assert_array_equal(ex.dequantize(codes, scale, lo), 2.5)
    with pytest.raises(ValueError, match="bits"):
        ex.quantize(np.zeros((3, 4)), 9, -1)


def test_quantized_nbytes_counts_codes_and_scales():
    x = np.random.default_rng(5).standard_normal((256, 64))
    assert ex.quantized_nbytes(*ex.quantize(x, 4, -2), 4) == 256 * 64 // 2 + 2 * 64 * 2
    assert ex.quantized_nbytes(*ex.quantize(x, 4, -1), 4) == 256 * 64 // 2 + 2 * 256 * 2
    assert ex.quantized_nbytes(*ex.quantize(x[:3, :3], 3, -1), 3) == 4 + 2 * 3 * 2  # 27 bits round up to 4 bytes


def test_unquantized_cache_has_no_error_and_synthetic_shapes():
    rng = np.random.default_rng(6)
    k = ex.synthetic_keys(rng, 3, 16, 8, n_outliers=2, offset=5.0)
    v = ex.synthetic_values(rng, 3, 16, 8, token_spread=1.0)
    assert k.shape == v.shape == (3, 16, 8)
    assert (np.abs(k.mean(axis=1)) > 3).sum(axis=1).tolist() == [2, 2, 2]  # two offset channels per draw
    q = rng.standard_normal((3, 4, 8))
    assert np.all(ex.quantized_attention_error(q, k, v, 4, None, None) == 0)
    assert np.all(ex.quantized_attention_error(q, k, v, 4, -2, -1) > 0)


# ---------------------------------------------------------------- forked caches


def test_fork_cache_leaves_the_original_unchanged():
    rng = np.random.default_rng(7)
    cfg = inf.TransformerConfig("t", 2, 16, 4, 2, 4)
    model = inf.init_stand_in(rng, cfg, dtype=np.float32)
    cache = inf.GroupedKVCache(2)
    inf.run_positions(model, rng.standard_normal((1, 5, 16)).astype(np.float32), cache)
    before = [k.copy() for k in cache.keys]
    fork = ex.fork_cache(cache)
    inf.run_positions(model, rng.standard_normal((1, 3, 16)).astype(np.float32), fork)
    assert cache.length == 5 and cache.position == 5 and fork.length == 8 and fork.position == 8
    for a, b in zip(before, cache.keys):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="GroupedKVCache"):
        ex.fork_cache({"keys": []})
