"""Tests for the two-level memory model of chapter 12 (attn_utils.experiments.ch12_blocked.attention_io)."""

import math

import numpy as np
import pytest

from attn_utils import scaled_dot_product_attention
from attn_utils.experiments.ch12_blocked import (
    IO_ALGORITHMS,
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


@pytest.mark.parametrize("algorithm", IO_ALGORITHMS)
@pytest.mark.parametrize("n,d,fast_size", [(1, 4, 64), (37, 4, 64), (50, 8, 200), (129, 16, 1024), (64, 2, 40)])
def test_loops_compute_attention_and_counts_match_the_proposition(algorithm, n, d, fast_size):
    rng = np.random.default_rng(n * 1000 + d)
    q, k, v = rng.normal(size=(3, n, d))
    run = attention_io(q, k, v, fast_size, algorithm)
    np.testing.assert_allclose(run.output, scaled_dot_product_attention(q, k, v)[0], rtol=0, atol=1e-12)
    assert run.total == predicted(algorithm, n, d, fast_size)
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
    a = mem.slow((4, 3))
    mem.load(a, (slice(0, 3),))  # 9 numbers
    with pytest.raises(MemoryError, match="more than fast_size = 10"):
        mem.scratch((2,))
    assert mem.reads == 9 and mem.writes == 0


def test_store_writes_through_and_counts():
    mem = TwoLevelMemory(8)
    a = mem.slow((2, 2))
    block = mem.scratch((1, 2), 5.0)
    mem.store(a, (slice(1, 2),), block)
    mem.free(block)
    np.testing.assert_array_equal(a, [[0, 0], [5, 5]])
    assert (mem.writes, mem.held, mem.peak) == (2, 0, 2)


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
