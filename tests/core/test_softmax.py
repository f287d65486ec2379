"""Unit and property tests for attn_utils.softmax."""

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from attn_utils import entropy, jacobian_frobenius_sq, log_softmax, softmax, softmax_core, softmax_jacobian
from attn_utils.softmax import _reduce, log_softmax_core, softmax_inplace

PROPS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


def naive_softmax(x):
    """Textbook softmax of a 1-D vector, in exact-ish float arithmetic (small logits only)."""
    e = np.array([math.exp(v) for v in x])
    return e / e.sum()


def finite_logits(max_n=8, bound=30.0):
    return arrays(
        np.float64,
        array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=max_n),
        elements=st.floats(-bound, bound, allow_nan=False, allow_infinity=False),
    )


def prob_vectors(max_n=8):
    """Probability vectors from bounded logits (so some entries can be tiny)."""
    return finite_logits(max_n=max_n, bound=10.0).map(lambda x: softmax(x))


# ---------------------------------------------------------------- softmax values


def test_rows_sum_to_one_and_match_naive():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5, 7))
    p = softmax(x)
    assert p.shape == x.shape
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(p[2, 3], naive_softmax(x[2, 3]), rtol=1e-14, atol=0)


def test_axis_argument():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 6))
    np.testing.assert_allclose(softmax(x, axis=0), softmax(x.T).T, rtol=1e-15, atol=0)
    np.testing.assert_allclose(softmax(x, axis=0).sum(axis=0), 1.0, atol=1e-14)


def test_exact_value_1_1_2():
    p = softmax(np.array([1.0, 1.0, 2.0]))
    assert p.max() == pytest.approx(math.e / (2 + math.e), rel=1e-15, abs=0)
    assert p.max() == pytest.approx(0.5761168847658291, rel=1e-15, abs=0)
    assert p[0] == pytest.approx(1 / (2 + math.e), rel=1e-15, abs=0)


def test_exact_value_1_2_10():
    p = softmax([1.0, 2.0, 10.0])
    expected = 1 / (1 + math.exp(-9) + math.exp(-8))
    assert p[2] == pytest.approx(expected, rel=1e-15, abs=0)
    assert p[2] == pytest.approx(0.999541338035342, rel=1e-14, abs=0)


def test_float64_saturates_exactly_at_a_100():
    # x = (a, a, 2a): the max weight is 1/(1 + 2 e^{-a}); for a = 100 the
    # correction 2e^{-100} ≈ 7e-44 is far below float64 resolution.
    a = 100.0
    p = softmax(np.array([a, a, 2 * a]))
    assert p[2] == 1.0
    # for a = 1 it is not saturated and equals the closed form
    p1 = softmax(np.array([1.0, 1.0, 2.0]))
    assert p1[2] == pytest.approx(1 / (1 + 2 * math.exp(-1)), rel=1e-15, abs=0)


def test_softmax_not_sharpened():
    # the temperature is exactly 1: log p_i - log p_j = x_i - x_j
    x = np.array([0.0, 0.5, 3.0, -2.0])
    p = softmax(x)
    np.testing.assert_allclose(np.log(p) - np.log(p[0]), x - x[0], rtol=0, atol=1e-13)


@pytest.mark.parametrize("big", [1e4, -1e4])
def test_no_overflow_for_huge_logits(big):
    x = np.array([[big, 0.0, big - 1.0], [big, big, big]])
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        p = softmax(x)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, atol=1e-15)
    np.testing.assert_allclose(p[1], 1 / 3, rtol=1e-15)
    if big > 0:
        np.testing.assert_allclose(
            p[0], [1 / (1 + math.exp(-1)), 0.0, math.exp(-1) / (1 + math.exp(-1))], rtol=1e-14, atol=0
        )


def test_shift_invariance_large_shift():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 9))
    np.testing.assert_allclose(softmax(x + 1e3), softmax(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(softmax(x - 7.5), softmax(x), rtol=1e-13, atol=1e-16)


# ---------------------------------------------------------------- masks


def test_mask_true_keeps():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    mask = np.array([True, False, True, False])
    p = softmax(x, mask=mask)
    np.testing.assert_array_equal(p[~mask], 0.0)
    np.testing.assert_allclose(p[mask], naive_softmax(x[mask]), rtol=1e-15)


def test_neg_inf_counts_as_masked():
    x = np.array([1.0, -np.inf, 3.0, 0.5])
    p = softmax(x)
    assert p[1] == 0.0
    np.testing.assert_allclose(p, softmax(np.array([1.0, 0.0, 3.0, 0.5]), mask=np.isfinite(x)), rtol=1e-15)
    np.testing.assert_allclose(p.sum(), 1.0, atol=1e-15)


def test_mask_and_neg_inf_combine():
    x = np.array([[-np.inf, 1.0, 2.0], [0.0, 1.0, 2.0]])
    mask = np.array([True, True, False])  # broadcasts over rows
    p = softmax(x, mask=mask)
    np.testing.assert_allclose(p[0], [0.0, 1.0, 0.0], atol=0)
    np.testing.assert_allclose(p[1, :2], naive_softmax([0.0, 1.0]), rtol=1e-15)
    assert p[1, 2] == 0.0


def test_fully_masked_rows_are_zeros():
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [-np.inf, -np.inf, -np.inf]])
    mask = np.array([[True, True, True], [False, False, False], [True, True, True]])
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        p = softmax(x, mask=mask)
    assert np.all(np.isfinite(p))
    np.testing.assert_array_equal(p[1], 0.0)
    np.testing.assert_array_equal(p[2], 0.0)
    np.testing.assert_allclose(p[0].sum(), 1.0, atol=1e-15)


def test_masked_entries_do_not_influence_kept_ones():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 6))
    mask = rng.random((3, 6)) < 0.6
    mask[:, 0] = True
    y = np.where(mask, x, rng.normal(scale=100, size=x.shape))
    np.testing.assert_allclose(softmax(x, mask=mask), softmax(y, mask=mask), rtol=1e-14, atol=0)


# ---------------------------------------------------------------- log-softmax, entropy


def test_log_softmax_equals_log_of_softmax():
    rng = np.random.default_rng(4)
    x = rng.normal(scale=3, size=(6, 8))
    np.testing.assert_allclose(log_softmax(x), np.log(softmax(x)), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(log_softmax(x, axis=0), np.log(softmax(x, axis=0)), rtol=1e-13, atol=1e-13)


def test_log_softmax_finite_for_large_gaps():
    x = np.array([0.0, 2000.0])
    ls = log_softmax(x)
    np.testing.assert_allclose(ls, [-2000.0, 0.0], rtol=1e-15, atol=0)
    with np.errstate(divide="ignore", under="ignore"):
        assert np.log(softmax(x))[0] == -np.inf  # the naive route loses it


@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_entropy_uniform_is_log_n(n):
    assert entropy(np.full(n, 1.0 / n)) == pytest.approx(math.log(n), rel=1e-14, abs=1e-15)


def test_entropy_one_hot_is_zero_and_batched():
    p = np.eye(4)
    np.testing.assert_array_equal(entropy(p), np.zeros(4))
    q = np.array([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    np.testing.assert_allclose(entropy(q), [math.log(2), 1.5 * math.log(2)], rtol=1e-15)


# ---------------------------------------------------------------- Jacobian


def central_fd_jacobian(f, x, h=1e-6):
    n = x.size
    cols = []
    for j in range(n):
        e = np.zeros(n)
        e[j] = h
        cols.append((f(x + e) - f(x - e)) / (2 * h))
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jacobian_matches_autograd_and_finite_differences(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=2, size=7)
    p = softmax(x)
    J = softmax_jacobian(p)
    J_auto = autograd.jacobian(softmax_core)(x)
    np.testing.assert_allclose(J, J_auto, rtol=0, atol=1e-14)
    J_fd = central_fd_jacobian(softmax, x)
    np.testing.assert_allclose(J, J_fd, rtol=0, atol=1e-9)
    # the closed form, entry by entry: J_ij = p_i (δ_ij − p_j)
    i, j = 2, 5
    assert J[i, j] == pytest.approx(-p[i] * p[j], rel=1e-14)
    assert J[i, i] == pytest.approx(p[i] * (1 - p[i]), rel=1e-14)


@pytest.mark.parametrize("axis", [-1, 0])
def test_gradients_of_the_core_with_a_mask_match_finite_differences(axis):
    """The hand-written vector-Jacobian products of softmax_core and log_softmax_core, batched, masked and
    along a leading axis, against central differences of a weighted sum (rules out a VJP that forgets the
    ⟨g, p⟩ term, or reduces along the wrong axis)."""
    rng = np.random.default_rng(7)
    x = rng.normal(scale=2, size=(5, 6, 5))
    keep = rng.random(x.shape) < 0.8
    keep[:, 0, :] = keep[0, :, :] = keep[..., 0] = True  # every row along either axis keeps an entry
    w = rng.normal(size=x.shape)

    def masked_softmax(z):
        return anp.sum(w * softmax_core(z, axis=axis, mask=keep))

    def log_softmax_sum(z):
        return anp.sum(w * log_softmax_core(z, axis=axis))

    for f in (masked_softmax, log_softmax_sum):
        g = autograd.grad(f)(x)
        fd = np.array([(f(x + h) - f(x - h)) / 2e-6 for h in 1e-6 * np.eye(x.size).reshape((x.size,) + x.shape)])
        np.testing.assert_allclose(g.ravel(), fd, rtol=0, atol=1e-7)


@pytest.mark.parametrize("width", [1, 5, 16, 17, 40])
def test_the_short_row_reduction_equals_numpy(width):
    rng = np.random.default_rng(width)
    x = rng.normal(size=(3, width, 4)).astype(np.float32)
    for axis in (-1, 1, 0):
        for ufunc in (np.add, np.maximum):
            got = _reduce(ufunc, x, axis)
            want = ufunc.reduce(x, axis=axis, keepdims=True)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_jacobian_structure():
    rng = np.random.default_rng(5)
    p = softmax(rng.normal(scale=2, size=(10, 6)))
    J = softmax_jacobian(p)
    np.testing.assert_allclose(J, np.swapaxes(J, -1, -2), rtol=0, atol=1e-16)
    np.testing.assert_allclose(J.sum(axis=-1), 0.0, atol=1e-15)
    eig = np.linalg.eigvalsh(J)
    assert eig.min() >= -1e-14
    assert eig.max() <= 0.5 + 1e-14
    # two equal halves achieve the 1/2 bound
    assert np.linalg.eigvalsh(softmax_jacobian([0.5, 0.5])).max() == pytest.approx(0.5, rel=1e-14)


def test_jacobian_batched_shapes():
    rng = np.random.default_rng(6)
    p = softmax(rng.normal(size=(2, 3, 5)))
    J = softmax_jacobian(p)
    assert J.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(J[1, 2], softmax_jacobian(p[1, 2]), rtol=0, atol=0)
    np.testing.assert_allclose(J[1, 2], autograd.jacobian(softmax_core)(np.log(p[1, 2])), rtol=0, atol=1e-14)


def test_jacobian_rejects_non_probabilities():
    with pytest.raises(ValueError, match="probability"):
        softmax_jacobian([0.5, 0.6])
    with pytest.raises(ValueError, match="probability"):
        softmax_jacobian([1.5, -0.5])


def test_frobenius_closed_form_matches_norm():
    rng = np.random.default_rng(7)
    p = softmax(rng.normal(scale=1.5, size=(20, 9)))
    expected = np.linalg.norm(softmax_jacobian(p), axis=(-2, -1)) ** 2
    np.testing.assert_allclose(jacobian_frobenius_sq(p), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 100])
def test_frobenius_uniform(n):
    p = np.full(n, 1.0 / n)
    assert math.sqrt(jacobian_frobenius_sq(p)) == pytest.approx(math.sqrt(1 / n - 1 / n**2), rel=1e-12, abs=1e-15)
    assert np.linalg.norm(softmax_jacobian(p)) == pytest.approx(math.sqrt(1 / n - 1 / n**2), rel=1e-12, abs=1e-15)


# ---------------------------------------------------------------- properties


@PROPS
@given(finite_logits())
def test_prop_rows_sum_to_one(x):
    p = softmax(x)
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


@PROPS
@given(finite_logits(), st.floats(-1e3, 1e3, allow_nan=False))
def test_prop_shift_invariance(x, c):
    np.testing.assert_allclose(softmax(x + c), softmax(x), rtol=0, atol=1e-12)


@PROPS
@given(finite_logits(bound=10.0))
def test_prop_log_ratio_is_logit_difference(x):
    # temperature exactly 1: log p_i − log p_0 = x_i − x_0 (bounded logits so no p underflows)
    lp = log_softmax(x)
    np.testing.assert_allclose(lp - lp[..., :1], x - x[..., :1], rtol=0, atol=1e-11)
    np.testing.assert_allclose(np.log(softmax(x)), lp, rtol=0, atol=1e-11)


@PROPS
@given(prob_vectors())
def test_prop_jacobian_symmetric_psd_zero_row_sums(p):
    J = softmax_jacobian(p)
    assert J.shape == p.shape + p.shape[-1:]
    np.testing.assert_allclose(J, np.swapaxes(J, -1, -2), rtol=0, atol=1e-15)
    np.testing.assert_allclose(J.sum(axis=-1), 0.0, rtol=0, atol=1e-14)
    eig = np.linalg.eigvalsh(J)
    assert eig.min() >= -1e-13
    assert eig.max() <= 0.5 + 1e-13
    np.testing.assert_allclose(jacobian_frobenius_sq(p), np.sum(J**2, axis=(-2, -1)), rtol=1e-10, atol=1e-15)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(arrays(np.float64, st.integers(1, 6), elements=st.floats(-10, 10, allow_nan=False)))
def test_prop_jacobian_equals_autograd(x):
    np.testing.assert_allclose(softmax_jacobian(softmax(x)), autograd.jacobian(softmax_core)(x), rtol=0, atol=1e-13)


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 7))
def test_prop_fast_path_equals_autograd_path(seed, rows, n):
    """softmax_inplace (numpy fast path) and softmax_core (autograd path) agree, masks included."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 30, (rows, n))
    x[rng.random((rows, n)) < 0.2] = -np.inf
    mask = rng.random((rows, n)) < 0.7
    np.testing.assert_allclose(
        softmax_inplace(x.copy(), mask=mask), softmax_core(x, mask=mask), rtol=1e-12, atol=1e-300
    )
    np.testing.assert_allclose(softmax_inplace(x.copy()), softmax_core(x), rtol=1e-12, atol=1e-300)


# --- input that has no softmax, and the rows softmax returns for fully masked input ---


def test_core_gives_a_nan_row_not_a_mixture_for_nan_or_overflowed_input():
    x = np.array([[1.0, np.nan, 0.0], [1.0, np.inf, 0.0], [0.0, 1.0, 2.0]])
    p = softmax_core(x)
    assert np.isnan(p[:2]).all()  # a NaN row, never [2.7, nan, 1.0] that looks half like a distribution
    np.testing.assert_allclose(p[2], softmax(x[2]), rtol=1e-15)
    with pytest.raises(FloatingPointError, match=r"\+inf"):
        softmax_inplace(x[1:2].copy())  # the fast path raises instead; public callers validate first


def test_core_nan_row_has_nan_gradient_not_an_exception():
    # a diverged training run must show up as a NaN loss that the training code can report
    x = np.array([1.0, np.nan])
    assert np.isnan(softmax_core(x)).all()
    assert np.isnan(autograd.grad(lambda x: softmax_core(x)[0])(x)).any()


def test_log_softmax_treats_neg_inf_as_masked_like_softmax():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    out = log_softmax(x)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(out, np.log(softmax(x)), rtol=1e-14)  # -inf where softmax is 0, all -inf if all are
    np.testing.assert_allclose(out[0, [0, 2]], log_softmax(x[0, [0, 2]]), rtol=1e-15)


def test_jacobian_of_a_fully_masked_row_is_zero():
    # softmax returns a zero row when every logit is masked; it is constant in the logits, so J = 0
    p = softmax(np.array([[-np.inf, -np.inf], [0.0, 0.0]]))
    J = softmax_jacobian(p)
    np.testing.assert_array_equal(J[0], np.zeros((2, 2)))
    np.testing.assert_allclose(J[1], [[0.25, -0.25], [-0.25, 0.25]], rtol=1e-15)
    assert entropy(p)[0] == 0 and jacobian_frobenius_sq(p)[0] == 0


@pytest.mark.parametrize("f", [entropy, jacobian_frobenius_sq, softmax_jacobian])
@pytest.mark.parametrize(
    "bad, what",
    [([2.0, 3.0], "a row summing to 5"), ([0.5, 0.6], "a row summing to 1.1"), ([1.5, -0.5], "a negative entry")],
)
def test_functions_of_probabilities_refuse_other_vectors(f, bad, what):
    with pytest.raises(ValueError, match=rf"p must be probability vectors.*{what}"):
        f(np.array(bad))


def test_probability_check_allows_float32_rounding():
    p = softmax(np.random.default_rng(0).normal(size=(4, 4096)).astype(np.float32))
    assert np.isfinite(entropy(p)).all() and np.isfinite(jacobian_frobenius_sq(p)).all()


def test_log_tail_mass_exact_small_case():
    # x = (1, 0): 1 − p_max = 1/(1 + e), so the log is −log(1 + e); r/m alone would give −1
    from attn_utils.softmax import log_tail_mass

    np.testing.assert_allclose(log_tail_mass(np.array([1.0, 0.0])), -np.log1p(np.e), rtol=1e-14)
    np.testing.assert_allclose(log_tail_mass(np.array([2.0, 2.0, 0.0])), -np.log1p(2 * np.e**2), rtol=1e-14)
    assert log_tail_mass(np.array([3.0, 3.0])) == -np.inf


def test_the_core_takes_what_numpy_reductions_take():
    # the short-row chain must not narrow the inputs: axis None or a tuple, a bad axis as numpy's AxisError
    # (a ValueError), a 0-d logit, a list
    x = np.random.default_rng(5).normal(size=(3, 4))
    np.testing.assert_allclose(log_softmax(x, axis=None), x - np.log(np.exp(x).sum()), rtol=1e-12)
    np.testing.assert_allclose(log_softmax(x, axis=(0, 1)), log_softmax(x, axis=None), rtol=1e-12)
    with pytest.raises(ValueError, match="axis 2 is out of bounds"):
        log_softmax(x, axis=2)
    assert softmax_core(np.float64(1.0)) == 1.0
    np.testing.assert_allclose(softmax_core([1.0, 2.0, 3.0]), softmax(np.array([1.0, 2.0, 3.0])), rtol=1e-12)


def test_float16_rows_sum_to_one_within_rounding():
    # a float16 sum chained column by column rounds at every step (2.1e-3 off on 16 columns); numpy's reduction does not
    x = np.random.default_rng(6).normal(size=(20000, 16)).astype(np.float16)
    assert np.abs(softmax_core(x).astype(np.float64).sum(axis=-1) - 1).max() <= 1.5 * np.finfo(np.float16).eps
