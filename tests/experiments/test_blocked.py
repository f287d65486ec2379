"""Unit and property tests for attn_utils.experiments.ch12_blocked (online-softmax attention)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_utils import attention_scores, causal_mask, count_macs, log_softmax, scaled_dot_product_attention
from attn_utils.book.measuring import traced_peak_memory
from attn_utils.experiments.ch12_blocked import BlockedAttentionStats, blocked_attention

PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


def qkv(rng, n_q=6, n_k=11, d_k=5, d_v=3, lead=()):
    return (rng.normal(size=lead + (n_q, d_k)), rng.normal(size=lead + (n_k, d_k)), rng.normal(size=lead + (n_k, d_v)))


def exact(q, k, v, mask=None, scale=None):
    return scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)[0]


# ---------------------------------------------------------------- equality with exact attention


@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 7, 11, 12, 100])
@pytest.mark.parametrize("query_block_size", [None, 1, 4, 6, 50])
def test_matches_exact_attention_for_any_block_sizes(block_size, query_block_size):
    rng = np.random.default_rng(100)
    q, k, v = qkv(rng, lead=(2, 3))
    out = blocked_attention(q, k, v, block_size, query_block_size=query_block_size)
    assert out.shape == (2, 3, 6, 3)
    np.testing.assert_allclose(out, exact(q, k, v), rtol=0, atol=1e-13)


@pytest.mark.parametrize("scale", [None, 0.1, 3.0])
def test_scale_argument_matches_exact(scale):
    rng = np.random.default_rng(101)
    q, k, v = qkv(rng, d_k=16)
    np.testing.assert_allclose(
        blocked_attention(q, k, v, 4, scale=scale), exact(q, k, v, scale=scale), rtol=0, atol=1e-13
    )
    if scale is not None:  # the scale really is used: the default gives something else
        assert np.max(np.abs(blocked_attention(q, k, v, 4) - exact(q, k, v, scale=scale))) > 1e-3


def test_without_rescaling_the_answer_would_be_wrong():
    """Keys in increasing-logit order force a rescale in every block; the result is still exact."""
    rng = np.random.default_rng(102)
    q = np.ones((1, 1))
    k = np.linspace(-5.0, 5.0, 20)[:, None]
    v = rng.normal(size=(20, 2))
    out, stats = blocked_attention(q, k, v, 3, scale=1.0, return_stats=True)
    np.testing.assert_allclose(out, exact(q, k, v, scale=1.0), rtol=0, atol=1e-14)
    assert stats.n_max_increases == math.ceil(20 / 3) - 1
    _, flat = blocked_attention(q, np.zeros((20, 1)), v, 3, scale=1.0, return_stats=True)
    assert flat.n_max_increases == 0


def test_float32_inputs_stay_float32_and_are_accurate():
    rng = np.random.default_rng(103)
    q, k, v = (x.astype(np.float32) for x in qkv(rng, n_q=8, n_k=200, d_k=16, d_v=4))
    out = blocked_attention(q, k, v, 16)
    assert out.dtype == np.float32
    ref = exact(*(x.astype(np.float64) for x in (q, k, v)))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- masks


@pytest.mark.parametrize("n_q,n_k", [(9, 9), (4, 9), (1, 6)])
@pytest.mark.parametrize("block_size,query_block_size", [(1, None), (2, 3), (4, 1), (5, 4), (20, None)])
def test_causal_flag_equals_explicit_causal_mask(n_q, n_k, block_size, query_block_size):
    rng = np.random.default_rng(104)
    q, k, v = qkv(rng, n_q=n_q, n_k=n_k, lead=(2,))
    ref = exact(q, k, v, mask=causal_mask(n_q, n_k))
    by_flag = blocked_attention(q, k, v, block_size, causal=True, query_block_size=query_block_size)
    by_mask = blocked_attention(q, k, v, block_size, mask=causal_mask(n_q, n_k), query_block_size=query_block_size)
    np.testing.assert_allclose(by_flag, ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(by_mask, ref, rtol=0, atol=1e-13)
    if n_q > 1:  # the mask matters
        assert np.max(np.abs(blocked_attention(q, k, v, block_size) - ref)) > 1e-3


def test_causal_with_query_blocks_skips_the_upper_triangle_of_tiles():
    rng = np.random.default_rng(105)
    n, b = 32, 4
    q, k, v = qkv(rng, n_q=n, n_k=n)
    _, stats = blocked_attention(q, k, v, b, causal=True, query_block_size=b, return_stats=True)
    t = n // b
    assert stats.n_tiles == t * (t + 1) // 2
    assert stats.n_tiles_skipped == t * (t - 1) // 2
    _, full = blocked_attention(q, k, v, b, query_block_size=b, return_stats=True)
    assert full.n_tiles == t * t and full.n_tiles_skipped == 0
    # without query blocks the last query sees every key, so nothing can be skipped
    _, rows = blocked_attention(q, k, v, b, causal=True, return_stats=True)
    assert rows.n_tiles == t and rows.n_tiles_skipped == 0


def test_causal_combined_with_padding_mask():
    rng = np.random.default_rng(106)
    q, k, v = qkv(rng, n_q=7, n_k=7, lead=(2,))
    pad = np.ones((2, 1, 7), bool)
    pad[1, :, 5:] = False  # second sequence: last two keys are padding
    mask = pad & causal_mask(7)
    out = blocked_attention(q, k, v, 3, mask=np.broadcast_to(pad, (2, 7, 7)), causal=True)
    np.testing.assert_allclose(out, exact(q, k, v, mask=mask), rtol=0, atol=1e-13)


def test_mask_broadcasts_over_leading_axes():
    rng = np.random.default_rng(107)
    q, k, v = qkv(rng, lead=(2, 3))
    mask = rng.random((6, 11)) < 0.6
    mask[:, 0] = True
    np.testing.assert_allclose(blocked_attention(q, k, v, 4, mask=mask), exact(q, k, v, mask=mask), rtol=0, atol=1e-13)


@pytest.mark.parametrize("query_block_size", [None, 2])
def test_fully_masked_rows_give_zeros_like_exact_attention(query_block_size):
    rng = np.random.default_rng(108)
    q, k, v = qkv(rng, n_q=5, n_k=9)
    mask = rng.random((5, 9)) < 0.5
    mask[1] = False
    mask[3] = False
    mask[4, 8] = True  # only visible key in the last block
    out, stats = blocked_attention(q, k, v, 4, mask=mask, query_block_size=query_block_size, return_stats=True)
    ref = exact(q, k, v, mask=mask)
    np.testing.assert_array_equal(out[[1, 3]], 0.0)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)
    assert np.all(np.isfinite(out))
    assert np.all(stats.lse[[1, 3]] == -np.inf) and np.all(np.isfinite(stats.lse[[0, 2, 4]]))


def test_all_masked_tile_is_skipped():
    rng = np.random.default_rng(109)
    q, k, v = qkv(rng, n_q=3, n_k=8)
    mask = np.ones((3, 8), bool)
    mask[:, 4:] = False
    out, stats = blocked_attention(q, k, v, 4, mask=mask, return_stats=True)
    assert (stats.n_tiles, stats.n_tiles_skipped) == (1, 1)
    np.testing.assert_allclose(out, exact(q, k[:4], v[:4]), rtol=0, atol=1e-14)


# ---------------------------------------------------------------- stability and statistics


@pytest.mark.parametrize("size", [1e2, 1e4, 1e6])
def test_huge_logits_are_stable(size):
    rng = np.random.default_rng(110)
    q, k, v = qkv(rng, n_q=4, n_k=30, d_k=4)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True) * size
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is harmless
        out, stats = blocked_attention(q, k, v, 7, scale=1.0, return_stats=True)
    np.testing.assert_allclose(out, exact(q, k, v, scale=1.0), rtol=0, atol=1e-12)
    assert np.all(np.isfinite(stats.lse))


@pytest.mark.parametrize("block_size", [1, 5, 40])
def test_lse_is_the_log_normaliser(block_size):
    rng = np.random.default_rng(111)
    q, k, v = qkv(rng, n_q=4, n_k=23, lead=(3,))
    _, stats = blocked_attention(q, k, v, block_size, return_stats=True)
    s = attention_scores(q, k)
    np.testing.assert_allclose(stats.lse, (s - log_softmax(s))[..., 0], rtol=0, atol=1e-12)


def test_mac_counts_match_the_formulas():
    rng = np.random.default_rng(112)
    lead, n_q, n_k, d_k, d_v = (2, 3), 10, 13, 5, 4
    q, k, v = qkv(rng, n_q=n_q, n_k=n_k, d_k=d_k, d_v=d_v, lead=lead)
    flops = set()
    for b in (1, 4, 13, 50):
        _, st_ = blocked_attention(q, k, v, b, return_stats=True)
        t = math.ceil(n_k / b)
        assert isinstance(st_, BlockedAttentionStats)
        assert st_.n_tiles == t and st_.n_tiles_skipped == 0
        assert st_.exp_evaluations == 6 * (n_q * n_k + n_q * t)
        assert st_.rescale_mults == 6 * n_q * (d_v + 1) * t
        with count_macs() as counter:
            blocked_attention(q, k, v, b)
        assert counter.macs == st_.matmul_macs and counter.products == 2 * t
        flops.add(st_.matmul_macs)
    assert flops == {6 * n_q * n_k * (d_k + d_v)}  # blocking never changes the matmul work


def test_stats_only_when_asked():
    rng = np.random.default_rng(113)
    q, k, v = qkv(rng)
    assert isinstance(blocked_attention(q, k, v, 3), np.ndarray)
    out, stats = blocked_attention(q, k, v, 3, return_stats=True)
    assert stats.lse.shape == (6,)


def test_empty_axes():
    rng = np.random.default_rng(118)
    q, k, v = qkv(rng, n_q=3, n_k=4)
    assert blocked_attention(q[:0], k, v, 2).shape == (0, 3)
    out, stats = blocked_attention(q, k[:0], v[:0], 2, return_stats=True)  # no keys: like a fully masked row
    np.testing.assert_array_equal(out, 0.0)
    assert np.all(stats.lse == -np.inf) and stats.n_tiles == 0


# ---------------------------------------------------------------- argument validation


def test_rejects_bad_block_sizes():
    rng = np.random.default_rng(114)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        blocked_attention(q, k, v, 0)
    with pytest.raises(TypeError, match="block_size must be an integer"):
        blocked_attention(q, k, v, 2.0)
    with pytest.raises(ValueError, match="query_block_size must be >= 1"):
        blocked_attention(q, k, v, 2, query_block_size=0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        blocked_attention(q, k, v, 2, causal="yes")
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        blocked_attention(q, k, v, 2, scale=-1.0)


def test_rejects_bad_shapes_naming_the_argument():
    rng = np.random.default_rng(115)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"k axis -1 \(d_k, must match q\) must have size 5"):
        blocked_attention(q, k[:, :4], v, 2)
    with pytest.raises(ValueError, match=r"v axis -2 \(n_k, must match k\) must have size 11"):
        blocked_attention(q, k, v[:10], 2)
    with pytest.raises(ValueError, match="leading"):
        blocked_attention(q[None], k, v, 2)
    with pytest.raises(ValueError, match="q must have at least 2 axes"):
        blocked_attention(q[0], k, v, 2)


def test_rejects_bad_masks():
    rng = np.random.default_rng(116)
    q, k, v = qkv(rng, n_q=6, n_k=4)
    with pytest.raises(TypeError, match="mask must be boolean"):
        blocked_attention(q, k, v, 2, mask=np.ones((6, 4)))
    with pytest.raises(ValueError, match=r"mask of shape .* must broadcast to the scores"):
        blocked_attention(q, k, v, 2, mask=np.ones((4, 6), bool))
    with pytest.raises(ValueError, match="causal attention needs n_k >= n_q"):
        blocked_attention(q, k, v, 2, causal=True)


# ---------------------------------------------------------------- properties

small = st.floats(-4, 4, allow_nan=False, allow_infinity=False)


@st.composite
def blocked_inputs(draw):
    n_q = draw(st.integers(1, 6))
    n_k = n_q + draw(st.integers(0, 9))
    d_k, d_v = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    q = draw(arrays(np.float64, (2, n_q, d_k), elements=small))
    k = draw(arrays(np.float64, (2, n_k, d_k), elements=small))
    v = draw(arrays(np.float64, (2, n_k, d_v), elements=small))
    block = draw(st.integers(1, n_k + 2))
    q_block = draw(st.one_of(st.none(), st.integers(1, n_q + 1)))
    mask = draw(arrays(np.bool_, (n_q, n_k)))
    return q, k, v, block, q_block, mask


@PROPS
@given(blocked_inputs())
def test_prop_equals_exact_attention(inputs):
    q, k, v, block, q_block, mask = inputs
    for m in (None, mask):
        np.testing.assert_allclose(
            blocked_attention(q, k, v, block, mask=m, query_block_size=q_block),
            exact(q, k, v, mask=m),
            rtol=0,
            atol=1e-12,
        )
    np.testing.assert_allclose(
        blocked_attention(q, k, v, block, causal=True, query_block_size=q_block),
        exact(q, k, v, mask=causal_mask(q.shape[-2], k.shape[-2])),
        rtol=0,
        atol=1e-12,
    )


@PROPS
@given(blocked_inputs(), st.randoms(use_true_random=False))
def test_prop_key_order_does_not_matter(inputs, rnd):
    q, k, v, block, _, _ = inputs
    perm = np.array(rnd.sample(range(k.shape[-2]), k.shape[-2]))
    np.testing.assert_allclose(
        blocked_attention(q, k[:, perm], v[:, perm], block), blocked_attention(q, k, v, block), rtol=0, atol=1e-12
    )


# ---------------------------------------------------------------- memory measurement


def test_traced_peak_memory_sees_numpy_arrays():
    peak, seconds = traced_peak_memory(np.ones, (1000, 1000))
    assert 8_000_000 <= peak < 9_000_000 and seconds >= 0
    small, _ = traced_peak_memory(np.ones, (10, 10))
    assert small < 100_000


def test_traced_peak_memory_grows_quadratically_for_exact_and_linearly_for_blocked():
    rng = np.random.default_rng(117)
    peaks = {}
    for n in (256, 1024):
        q, k, v = rng.normal(size=(3, n, 16))
        peaks[n] = (
            traced_peak_memory(scaled_dot_product_attention, q, k, v)[0],
            traced_peak_memory(blocked_attention, q, k, v, 32)[0],
        )
    exact_ratio, blocked_ratio = peaks[1024][0] / peaks[256][0], peaks[1024][1] / peaks[256][1]
    assert 12 < exact_ratio < 20  # n² law: 16
    assert 3 < blocked_ratio < 5.5  # n law: 4


def test_traced_peak_memory_refuses_to_nest():
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(RuntimeError, match="already tracing"):
            traced_peak_memory(np.ones, 3)
    finally:
        tracemalloc.stop()
