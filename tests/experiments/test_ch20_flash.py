"""Unit and property tests for attn_utils.experiments.ch20_flash (causal tiles, split-KV merge, ring, backward)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import causal_mask, scaled_dot_product_attention
from attn_utils.experiments import ch20_flash as ex
from attn_utils.experiments.ch12_blocked import blocked_attention

PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- causal tiles


def brute_force_tiles(n, b_q, b_k):
    """Classify every tile by looking at every entry of the causal mask."""
    mask = causal_mask(n)
    skipped = masked = full = entries = 0
    for q0 in range(0, n, b_q):
        for k0 in range(0, n, b_k):
            tile = mask[q0 : q0 + b_q, k0 : k0 + b_k]
            if not tile.any():
                skipped += 1
            else:
                entries += tile.size
                if tile.all():
                    full += 1
                else:
                    masked += 1
    return skipped, masked, full, entries


@PROPS
@given(st.integers(1, 80), st.integers(1, 20), st.integers(1, 20))
def test_causal_tile_counts_match_brute_force(n, b_q, b_k):
    t = ex.causal_tile_counts(n, b_q, b_k)
    assert (t.skipped, t.masked, t.full, t.computed_entries) == brute_force_tiles(n, b_q, b_k)


@PROPS
@given(st.integers(1, 60), st.integers(1, 16), st.integers(1, 16))
def test_causal_tile_counts_match_chapter_12_loop(n, b_q, b_k):
    rng = np.random.default_rng(n)
    q, k, v = rng.standard_normal((3, n, 2))
    _, stats = blocked_attention(q, k, v, b_k, causal=True, query_block_size=b_q, return_stats=True)
    t = ex.causal_tile_counts(n, b_q, b_k)
    assert (stats.n_tiles_skipped, stats.n_tiles_masked, stats.n_tiles - stats.n_tiles_masked) == (
        t.skipped,
        t.masked,
        t.full,
    )


@pytest.mark.parametrize("n_blocks", [1, 2, 5, 16])
def test_square_tiles_closed_form(n_blocks):
    b = 8
    t = ex.causal_tile_counts(n_blocks * b, b, b)
    half = n_blocks * (n_blocks - 1) // 2
    assert (t.skipped, t.masked, t.full) == (half, n_blocks, half)
    assert t.computed_entries * 2 * n_blocks == (n_blocks + 1) * (n_blocks * b) ** 2


@PROPS
@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 40))
def test_rectangular_tiles_do_at_least_the_work_of_square_tiles_of_the_larger_side(n, b_q, b_k):
    """Equal when the smaller side divides the larger; never less (the chapter's sentence on rectangular tiles)."""
    big = max(b_q, b_k)
    rect = ex.causal_tile_counts(n, b_q, b_k).computed_entries
    square = ex.causal_tile_counts(n, big, big).computed_entries
    assert rect >= square
    if big % min(b_q, b_k) == 0:
        assert rect == square


def test_rectangular_tiles_can_do_more_than_square_tiles_of_the_larger_side():
    assert ex.causal_tile_counts(1000, 96, 64).computed_entries > ex.causal_tile_counts(1000, 96, 96).computed_entries


def test_one_by_one_tiles_have_no_masked_tile():
    """With b = 1 each diagonal tile is one visible entry: the count of masked tiles n_B needs b >= 2."""
    t = ex.causal_tile_counts(6, 1, 1)
    assert (t.skipped, t.masked, t.full, t.computed_entries) == (15, 0, 21, 21)


def test_causal_tile_counts_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_q"):
        ex.causal_tile_counts(10, 0, 4)


# ---------------------------------------------------------------- merge


def parts_of(q, k, v, cuts):
    return [ex.partial_attention(q, k[a:b], v[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def test_partial_of_no_keys_is_the_identity():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 5, 4))
    empty = ex.partial_attention(q, k[:0], v[:0])
    assert np.all(empty.lse == -np.inf) and np.all(empty.out == 0)
    full = ex.partial_attention(q, k, v)
    for merged in (ex.merge(empty, full), ex.merge(full, empty)):
        np.testing.assert_allclose(merged.out, full.out, rtol=0, atol=1e-15)
        np.testing.assert_allclose(merged.lse, full.lse, rtol=0, atol=1e-15)
    both_empty = ex.merge(empty, empty)
    assert np.all(both_empty.out == 0) and np.all(both_empty.lse == -np.inf)


def test_merge_is_associative_and_commutative_on_every_order():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 12, 8))
    a, b, c = parts_of(q, k, v, [0, 3, 7, 12])
    results = [ex.merge(ex.merge(x, y), z) for x, y, z in itertools.permutations((a, b, c))]
    results += [ex.merge(x, ex.merge(y, z)) for x, y, z in itertools.permutations((a, b, c))]
    exact = scaled_dot_product_attention(q, k, v)[0]
    for r in results:
        np.testing.assert_allclose(r.out, exact, rtol=0, atol=1e-13)


def test_partial_lse_is_the_log_sum_exp():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 6, 4))
    part = ex.partial_attention(q, k, v)
    z = q @ k.T / 2.0
    np.testing.assert_allclose(part.lse, np.log(np.exp(z).sum(axis=1)), rtol=1e-13)


@PROPS
@given(st.integers(0, 10**6), st.integers(1, 9))
def test_split_kv_equals_attention_for_any_split(seed, n_parts):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 3, 4))
    k, v = rng.standard_normal((2, 2, 40, 4))
    cuts = ex.random_split(40, n_parts, rng)
    assert cuts[0] == 0 and cuts[-1] == 40 and np.all(np.diff(cuts) >= 0) and len(cuts) == n_parts + 1
    out = ex.split_kv_attention(q, k, v, cuts, rng).out
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v)[0], rtol=0, atol=1e-12)


def test_split_kv_with_empty_splits():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 4))
    k, v = rng.standard_normal((2, 2, 40, 4))
    out = ex.split_kv_attention(q, k, v, np.array([0, 0, 10, 10, 40, 40]), rng).out
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v)[0], rtol=0, atol=1e-12)


def test_merge_rejects_bad_input():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 4, 2))
    p = ex.partial_attention(q, k, v)
    with pytest.raises(TypeError, match="Partial"):
        ex.merge(p, (p.out, p.lse))
    with pytest.raises(ValueError, match="one shape"):
        ex.merge(p, ex.partial_attention(q[:2], k, v))
    with pytest.raises(ValueError, match="at least one"):
        ex.merge_in_random_tree([], rng)


def test_decode_work_units():
    assert ex.decode_work_units(1, 16, 1, 128) == 16
    assert ex.decode_work_units(2, 16, 300, 128, splits=4) == 2 * 16 * 3 * 4
    with pytest.raises(ValueError, match="splits"):
        ex.decode_work_units(1, 1, 1, 1, splits=0)


# ---------------------------------------------------------------- ring


@pytest.mark.parametrize(("n", "p"), [(12, 1), (12, 3), (16, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_matches_and_counts(n, p, causal):
    rng = np.random.default_rng(n * p)
    q, k = rng.standard_normal((2, n, 4))
    v = rng.standard_normal((n, 3))
    out, stats = ex.ring_attention(q, k, v, p, causal=causal)
    mask = causal_mask(n) if causal else None
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v, mask=mask)[0], rtol=0, atol=1e-12)
    b = n // p
    assert np.all(stats.words_sent == (p - 1) * b * (4 + 3))
    assert np.all(stats.peak_kv_words == (2 if p > 1 else 1) * b * (4 + 3))
    expected_blocks = np.arange(1, p + 1) if causal else np.full(p, p)
    np.testing.assert_array_equal(stats.blocks_computed, expected_blocks)
    np.testing.assert_array_equal(stats.macs, expected_blocks * b * b * (4 + 3))


def test_ring_attention_rejects_bad_input():
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match="divide"):
        ex.ring_attention(x, x, x, 3)
    with pytest.raises(ValueError, match="self-attention"):
        ex.ring_attention(np.zeros((2, 10, 2)), np.zeros((2, 10, 2)), np.zeros((2, 10, 2)), 2)


# ---------------------------------------------------------------- backward


def numerical_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 3, 7])
def test_flash_backward_matches_finite_differences(causal, block):
    rng = np.random.default_rng(block)
    n, d = 7, 3
    q, k, v, d_out = rng.standard_normal((4, n, d))
    mask = causal_mask(n) if causal else None

    def loss(q_, k_, v_):
        return float((d_out * scaled_dot_product_attention(q_, k_, v_, mask=mask)[0]).sum())

    out, stats = blocked_attention(q, k, v, block, causal=causal, query_block_size=block, return_stats=True)
    dq, dk, dv, bstats = ex.flash_backward(q, k, v, out, stats.lse, d_out, block, causal=causal)
    np.testing.assert_allclose(dq, numerical_grad(lambda x: loss(x, k, v), q), atol=1e-7)
    np.testing.assert_allclose(dk, numerical_grad(lambda x: loss(q, x, v), k), atol=1e-7)
    np.testing.assert_allclose(dv, numerical_grad(lambda x: loss(q, k, x), v), atol=1e-7)
    assert bstats.largest_tile <= block * block
    assert bstats.n_tiles + bstats.n_tiles_skipped == (-(-n // block)) ** 2


def test_flash_backward_with_a_cache_and_rejects_bad_shapes():
    rng = np.random.default_rng(5)
    q, d_out = rng.standard_normal((2, 3, 4))
    k, v = rng.standard_normal((2, 9, 4))
    out, stats = blocked_attention(q, k, v, 4, causal=True, query_block_size=2, return_stats=True)
    dq, dk, dv, _ = ex.flash_backward(q, k, v, out, stats.lse, d_out, 2, causal=True)
    mask = causal_mask(3, 9)

    def loss(q_, k_, v_):
        return float((d_out * scaled_dot_product_attention(q_, k_, v_, mask=mask)[0]).sum())

    np.testing.assert_allclose(dk, numerical_grad(lambda x: loss(q, x, v), k), atol=1e-7)
    with pytest.raises(ValueError, match="lse"):
        ex.flash_backward(q, k, v, out, stats.lse[:2], d_out, 2)
    with pytest.raises(ValueError, match="d_out"):
        ex.flash_backward(q, k, v, out, stats.lse, d_out[:2], 2)


def test_saved_for_backward():
    assert ex.saved_for_backward(8, 4) == 8 * 4 + 8
    assert ex.saved_for_backward(8, 4, heads=2, flash=False) == 2 * (8 * 4 + 64)
