"""Tests for the two-level memory model of chapter 12 (attn_utils.experiments.ch12_blocked.attention_io)."""

import math

import numpy as np
import pytest

from attn_utils import scaled_dot_product_attention
from attn_utils.experiments.ch12_blocked import (
    IO_ALGORITHMS,
    FastMemoryOverflow,
    SlowArray,
    TwoLevelMemory,
    attention_io,
    count_attention_io,
    fast_words,
    io_block_sizes,
)


def predicted(algorithm, n, d, fast_size):
    """Proposition prop-ch12-io, written out independently of the loops."""
    b = io_block_sizes(algorithm, fast_size, d)[0]
    t = math.ceil(n / b)
    if algorithm == "standard":
        return (4 if n + 2 <= fast_size else 5) * n * n + 2 * n * d + 2 * t * n * d
    if algorithm == "flash1":
        return 3 * n * d + 2 * n + t * (3 * n * d + 4 * n)
    return 2 * n * d + n + 2 * t * n * d


def predicted_per_word(algorithm, n, d, fast_size):
    """(reads, writes) of every word of each slow array, from the proof of prop-ch12-io."""
    t = math.ceil(n / io_block_sizes(algorithm, fast_size, d)[0])
    if algorithm == "standard":
        s_reads = 1 if n + 2 <= fast_size else 2
        return {"Q": (1, 0), "K": (t, 0), "S": (s_reads, 1), "P": (1, 1), "V": (t, 0), "O": (0, 1)}
    if algorithm == "flash1":
        return {"K": (1, 0), "V": (1, 0), "Q": (t, 0), "O": (t, t + 1), "l": (t, t + 1), "m": (t, t + 1)}
    return {"Q": (1, 0), "K": (t, 0), "V": (t, 0), "O": (0, 1), "lse": (0, 1)}


@pytest.mark.parametrize("algorithm", IO_ALGORITHMS)
@pytest.mark.parametrize("n,d,fast_size", [(1, 4, 64), (37, 4, 64), (50, 8, 200), (129, 16, 1024), (64, 2, 40)])
def test_loops_compute_attention_and_counts_match_the_proposition(algorithm, n, d, fast_size):
    rng = np.random.default_rng(n * 1000 + d)
    q, k, v = rng.normal(size=(3, n, d))
    run = attention_io(q, k, v, fast_size, algorithm)
    np.testing.assert_allclose(run.output, scaled_dot_product_attention(q, k, v)[0], rtol=0, atol=1e-12)
    assert run.total == predicted(algorithm, n, d, fast_size)
    expected = predicted_per_word(algorithm, n, d, fast_size)
    assert set(run.per_word) == set(expected)
    for name, (reads, writes) in run.per_word.items():
        assert np.all(reads == expected[name][0]), name
        assert np.all(writes == expected[name][1]), name
    assert sum(int(r.sum()) for r, _ in run.per_word.values()) == run.reads
    assert sum(int(w.sum()) for _, w in run.per_word.values()) == run.writes
    assert run.peak_fast <= fast_size
    if algorithm != "standard" and n >= run.outer_block:  # full blocks occur: the budget is reached exactly
        assert run.peak_fast == fast_words(algorithm, run.outer_block, run.inner_block, d)
    shapes = count_attention_io(n, d, fast_size, algorithm)
    assert (shapes.reads, shapes.writes, shapes.peak_fast) == (run.reads, run.writes, run.peak_fast)
    assert shapes.output is None


def test_block_sizes_are_the_largest_that_fit():
    for algorithm in IO_ALGORITHMS:
        for fast_size, d in [(64, 4), (1000, 8), (16384, 32), (5000, 64)]:
            outer, inner = io_block_sizes(algorithm, fast_size, d)
            assert inner == min(outer, d)
            assert fast_words(algorithm, outer, inner, d) <= fast_size
            assert fast_words(algorithm, outer + 1, min(outer + 1, d), d) > fast_size


def test_flash_traffic_falls_like_one_over_m_and_standard_does_not():
    d, n = 16, 2048  # a row of S fits at both M (n + 2 ≤ M)
    ms = d * d * np.array([16, 64])
    traffic = {a: [count_attention_io(n, d, int(m), a).total for m in ms] for a in IO_ALGORITHMS}
    for a in ("flash1", "flash2"):
        assert 3.0 < traffic[a][0] / traffic[a][1] < 4.5  # M × 4 → traffic / ≈ 4
    assert 1.0 < traffic["standard"][0] / traffic["standard"][1] < 1.1
    assert min(traffic["standard"]) >= 4 * n * n


def test_fast_memory_refuses_to_overflow():
    mem = TwoLevelMemory(10)
    a = mem.slow("A", (4, 3))
    mem.load(a, (slice(0, 3),))  # 9 numbers
    with pytest.raises(FastMemoryOverflow, match="more than fast_size = 10") as caught:
        mem.scratch((2,))
    assert caught.value.held == 11 and isinstance(caught.value, MemoryError)
    assert mem.reads == 9 and mem.writes == 0
    np.testing.assert_array_equal(a.reads, [[1] * 3] * 3 + [[0] * 3])


def test_store_writes_through_and_counts():
    mem = TwoLevelMemory(8)
    a = mem.slow("A", (2, 2))
    block = mem.scratch((1, 2), 5.0)
    mem.store(a, (slice(1, 2),), block)
    mem.free(block)
    np.testing.assert_array_equal(a.data, [[0, 0], [5, 5]])
    np.testing.assert_array_equal(a.writes, [[0, 0], [1, 1]])
    assert (mem.writes, mem.held, mem.peak) == (2, 0, 2)


def test_slow_arrays_are_reached_only_through_load_and_store():
    mem = TwoLevelMemory(8)
    a = mem.slow("A", (2, 2), data=np.ones((2, 2)))
    assert isinstance(a, SlowArray)
    with pytest.raises(TypeError, match="only be reached through load and store"):
        np.matmul(a, np.ones((2, 2)))
    with pytest.raises(ValueError, match="exists already"):
        mem.slow("A", (1,))


@pytest.mark.parametrize("algorithm", IO_ALGORITHMS)
def test_a_block_one_row_too_large_is_refused(algorithm):
    rng = np.random.default_rng(7)
    n, d, fast_size = 60, 8, 600
    q, k, v = rng.normal(size=(3, n, d))
    outer, inner = io_block_sizes(algorithm, fast_size, d)
    assert attention_io(q, q, q, fast_size, algorithm, blocks=(outer, inner)).peak_fast <= fast_size
    with pytest.raises(FastMemoryOverflow) as caught:
        attention_io(q, k, v, fast_size, algorithm, blocks=(outer + 1, min(outer + 1, d)))
    assert caught.value.held > fast_size


def test_bad_arguments():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(5, 4))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        attention_io(q, q, q, 100, "flash3")
    with pytest.raises(ValueError, match="too small"):
        io_block_sizes("flash2", 5, 4)
    with pytest.raises(ValueError, match="must all be"):
        attention_io(q, q, q[:, :3], 100, "flash2")
    with pytest.raises(ValueError, match="fast_size must be >= 1"):
        TwoLevelMemory(0)


def test_orders_of_the_counts_printed_in_chapter_12():
    """The exponents chapter 12 prints (d = 32): M⁰ for standard, M⁻¹ for both tiled orders, n² for all,
    each within a tenth; and at the A100 configuration standard moves at least twice FlashAttention-2's words."""
    d, n_fix, M_fix = 32, 8192, 16384
    M_sweep = d**2 * np.array([16, 32, 64, 128])
    n_sweep = np.array([2048, 4096, 8192])
    slope = lambda x, y: np.polyfit(np.log(x), np.log(y), 1)[0]  # noqa: E731
    for algorithm, law in (("standard", 0.0), ("flash1", -1.0), ("flash2", -1.0)):
        io_M = [count_attention_io(n_fix, d, int(M), algorithm).total for M in M_sweep]
        io_n = [count_attention_io(int(n), d, M_fix, algorithm).total for n in n_sweep]
        assert abs(slope(M_sweep, io_M) - law) <= 0.1
        assert abs(slope(n_sweep, io_n) - 2.0) <= 0.1
    std, fa2 = (count_attention_io(1024, 64, 164 * 1024 // 2, a).total for a in ("standard", "flash2"))
    assert std >= 2 * fa2
