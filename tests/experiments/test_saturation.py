"""Unit and property tests for attn_utils.experiments.ch02_saturation."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from attn_utils import log_tail_mass, softmax
from attn_utils.experiments.ch02_saturation import first_exact_one, median_se, top_two_gap_cdf, top_two_gap_quantile

PROPS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


def logits(max_n=8, bound=30.0):
    return arrays(
        np.float64,
        array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=max_n),
        elements=st.floats(-bound, bound, allow_nan=False, allow_infinity=False),
    )


# ---------------------------------------------------------------- log_tail_mass


def test_tail_mass_matches_direct_computation_for_moderate_gaps():
    x = np.array([0.3, -1.2, 2.0, 0.9])
    p = softmax(x)
    assert log_tail_mass(x) == pytest.approx(math.log(1 - p.max()), rel=1e-12)


def test_tail_mass_of_seed_vector_beyond_float64_resolution():
    # x = a·(1, 1, 2): 1 − p_max = 2e^{-a}/(1 + 2e^{-a}); at a = 100 p_max rounds to 1.0
    a = 100.0
    x = np.array([a, a, 2 * a])
    assert softmax(x).max() == 1.0
    assert log_tail_mass(x) == pytest.approx(math.log(2) - a - math.log1p(2 * math.exp(-a)), rel=1e-14)


def test_tail_mass_for_gaps_where_exp_underflows():
    # gap 2000: exp(-2000) underflows to 0, the log-domain value does not
    x = np.array([0.0, -2000.0, -2001.0])
    expected = -2000.0 + math.log1p(math.exp(-1.0))
    assert log_tail_mass(x) == pytest.approx(expected, rel=1e-14)


def test_tail_mass_with_ties_counts_mass_outside_the_tied_set():
    x = np.array([1.0, 3.0, 3.0, 0.0])
    p = softmax(x)
    assert log_tail_mass(x) == pytest.approx(math.log(p[0] + p[3]), rel=1e-12)


def test_tail_mass_all_equal_is_minus_inf_and_batched_shape():
    x = np.array([[2.0, 2.0, 2.0], [0.0, 1.0, 5.0]])
    out = log_tail_mass(x)
    assert out.shape == (2,)
    assert out[0] == -np.inf
    assert np.isfinite(out[1])


@PROPS
@given(logits(), st.floats(-1e3, 1e3))
def test_tail_mass_is_shift_invariant_and_nonpositive(x, c):
    out = log_tail_mass(x)
    assert np.all(out <= 0)
    shifted = log_tail_mass(x + c)
    finite = np.isfinite(out)
    # a shift can create or break ties by rounding; compare only rows where neither changed
    same_ties = np.sum(x == x.max(-1, keepdims=True), -1) == np.sum((x + c) == (x + c).max(-1, keepdims=True), -1)
    keep = finite & same_ties & np.isfinite(shifted)
    np.testing.assert_allclose(shifted[keep], out[keep], rtol=1e-6, atol=1e-6)


def test_tail_mass_rejects_bad_input():
    with pytest.raises(ValueError, match="x"):
        log_tail_mass(np.array([1.0, np.nan]))
    with pytest.raises(TypeError, match="x"):
        log_tail_mass(np.array(["a", "b"]))


# ---------------------------------------------------------------- first_exact_one


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_exact_one_matches_rounding_threshold(dtype):
    # largest probability 1/(1 + 2e^{-a}) rounds to 1 once 2e^{-a} <= eps/2, i.e. a >= ln(4/eps)
    scales = np.arange(1.0, 60.0, 1e-3)
    threshold = math.log(4 / np.finfo(dtype).eps)
    found = first_exact_one([1.0, 1.0, 2.0], scales, dtype)
    assert abs(found - threshold) < 2e-3


def test_first_exact_one_is_nan_when_never_reached():
    assert math.isnan(first_exact_one([1.0, 1.0, 2.0], np.linspace(0.1, 20.0, 50)))


def test_first_exact_one_returns_first_scale_when_always_one():
    assert first_exact_one([0.0, 100.0], [1.0, 2.0]) == 1.0


def test_first_exact_one_rejects_bad_input():
    with pytest.raises(ValueError, match="unique maximum"):
        first_exact_one([1.0, 2.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="shape"):
        first_exact_one([[1.0, 2.0]], [1.0, 2.0])
    with pytest.raises(ValueError, match="increasing"):
        first_exact_one([1.0, 2.0], [2.0, 1.0])
    with pytest.raises(ValueError, match="increasing"):
        first_exact_one([1.0, 2.0], [-1.0, 1.0])
    with pytest.raises(TypeError, match="dtype"):
        first_exact_one([1.0, 2.0], [1.0, 2.0], dtype=np.int64)
    with pytest.raises(ValueError, match="overflows float16"):
        first_exact_one([1.0, 2.0], [1.0, 1e5], dtype=np.float16)


# ---------------------------------------------------------------- top-two gap and median errors


def test_top_two_gap_of_two_normals_is_half_normal():
    # n = 2: Δ = |x1 − x2| with x1 − x2 ~ N(0, 2), so P(Δ ≤ t) = erf(t/2)
    t = np.array([0.0, 0.3, 1.0, 2.5])
    np.testing.assert_allclose(top_two_gap_cdf(t, 2), [math.erf(v / 2) for v in t], atol=1e-7)


def test_top_two_gap_matches_monte_carlo():
    x = np.sort(np.random.default_rng(11).standard_normal((100_000, 32)), axis=1)
    gap = x[:, -1] - x[:, -2]
    for t in (0.1, 0.3, 1.0):
        p = np.mean(gap <= t)
        assert abs(top_two_gap_cdf(t, 32) - p) < 5 * math.sqrt(p * (1 - p) / gap.size)
    assert abs(top_two_gap_quantile(0.5, 32) - np.median(gap)) < 0.01


def test_top_two_gap_cdf_is_a_distribution_function():
    t = np.linspace(0.0, 8.0, 50)
    cdf = top_two_gap_cdf(t, 16)
    assert cdf[0] == 0.0 and abs(cdf[-1] - 1.0) < 1e-6 and np.all(np.diff(cdf) >= 0)
    assert top_two_gap_cdf(top_two_gap_quantile(0.3, 16), 16) == pytest.approx(0.3, abs=1e-9)


def test_top_two_gap_rejects_bad_input():
    with pytest.raises(ValueError, match="n must"):
        top_two_gap_cdf(0.5, 1)
    with pytest.raises(ValueError, match="t must"):
        top_two_gap_cdf(-0.5, 4)
    with pytest.raises(ValueError, match="prob"):
        top_two_gap_quantile(1.0, 4)


def test_median_se_matches_the_spread_of_medians():
    rng = np.random.default_rng(5)
    medians = np.median(rng.standard_normal((2000, 401)), axis=1)
    estimates = [median_se(rng.standard_normal(401)) for _ in range(200)]
    assert np.mean(estimates) == pytest.approx(np.std(medians), rel=0.15)
    with pytest.raises(ValueError, match="at least 16"):
        median_se(np.arange(10.0))
