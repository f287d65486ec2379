"""Unit and property tests for attn_utils.experiments.ch03_gradients."""

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from attn_utils import attention_query_jacobian, numerical_jacobian, softmax, softmax_core, softmax_jacobian
from attn_utils.experiments.ch03_gradients import ols, softmax_jacobian_from_logits

PROPS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- numerical_jacobian


def test_linear_map_is_recovered():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 5))
    x = rng.normal(size=5)
    np.testing.assert_allclose(numerical_jacobian(lambda v: a @ v, x), a, rtol=0, atol=1e-9)


def test_quadratic_and_shapes():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3))
    # f(X) = sum of squares: gradient 2X, output is a scalar so the Jacobian has shape x.shape
    jac = numerical_jacobian(lambda m: np.sum(m**2), x)
    assert jac.shape == (2, 3)
    np.testing.assert_allclose(jac, 2 * x, rtol=0, atol=1e-8)
    # elementwise square of a matrix: Jacobian (2, 3, 2, 3), diagonal 2x
    jac = numerical_jacobian(lambda m: m**2, x)
    assert jac.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(jac.reshape(6, 6), np.diag(2 * x.ravel()), rtol=0, atol=1e-8)


def test_scalar_input():
    assert numerical_jacobian(np.sin, 0.3) == pytest.approx(math.cos(0.3), abs=1e-9)


def test_matches_autograd_for_softmax():
    x = np.array([0.3, -1.2, 2.0, 0.7])
    np.testing.assert_allclose(numerical_jacobian(softmax, x), autograd.jacobian(softmax_core)(x), rtol=0, atol=1e-9)


def test_step_controls_the_error():
    # truncation error of a central difference for exp at 0 is h²/6
    coarse = numerical_jacobian(np.exp, np.zeros(1), h=1e-2)[0, 0] - 1.0
    assert coarse == pytest.approx(1e-4 / 6, rel=1e-3)


def test_bad_arguments():
    with pytest.raises(TypeError, match="f must be callable, received int"):
        numerical_jacobian(3, np.ones(2))
    with pytest.raises(ValueError, match=r"x contains 1 non-finite value"):
        numerical_jacobian(np.sin, np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=r"h must be finite and > 0, received -0.1"):
        numerical_jacobian(np.sin, np.ones(2), h=-0.1)
    with pytest.raises(TypeError, match=r"x must be a numeric array"):
        numerical_jacobian(np.sin, ["a", "b"])


def test_output_shape_must_not_change():
    def shifty(v):
        return np.ones(2) if v[0] > 0 else np.ones(3)

    with pytest.raises(ValueError, match=r"f must return one fixed shape; received \(2,\), then"):
        numerical_jacobian(shifty, np.array([1e-7, 0.0]), h=1e-6)


# ---------------------------------------------------------------- softmax_jacobian_from_logits


def test_equals_jacobian_from_probabilities_for_moderate_logits():
    rng = np.random.default_rng(2)
    z = rng.normal(scale=3, size=(4, 6, 7))
    J = softmax_jacobian_from_logits(z)
    assert J.shape == (4, 6, 7, 7)
    np.testing.assert_allclose(J, softmax_jacobian(softmax(z)), rtol=0, atol=1e-15)
    np.testing.assert_allclose(J[1, 2], autograd.jacobian(softmax_core)(z[1, 2]), rtol=0, atol=1e-15)


def test_diagonal_survives_where_one_minus_p_rounds_to_zero():
    z = np.array([0.0, -50.0])
    p = softmax(z)
    assert p[0] == 1.0  # 1 − e^{-50} rounds to 1 in float64 …
    assert softmax_jacobian(p)[0, 0] == 0.0  # … so diag(p) − p pᵀ loses the entry,
    t = math.exp(-50.0)
    expected = t / (1 + t) ** 2  # while the true value is e^{-50}/(1+e^{-50})²
    J = softmax_jacobian_from_logits(z)
    np.testing.assert_allclose(J, expected * np.array([[1, -1], [-1, 1]]), rtol=1e-14, atol=0)


def test_five_logit_example_from_chapter_3():
    z = np.array([-3.0, 1.0, 100.0, 5.0, -1.0])
    J = softmax_jacobian_from_logits(z)
    tail = sum(math.exp(v - 100.0) for v in (-3.0, 1.0, 5.0, -1.0))
    assert J[2, 2] == pytest.approx(tail / (1 + tail) ** 2, rel=1e-13)
    assert np.abs(J).max() == J[2, 2]
    assert 5e-42 < np.abs(J).max() < 1e-41


def test_entries_below_the_smallest_subnormal_underflow_to_zero():
    J = softmax_jacobian_from_logits(np.array([0.0, -1000.0, 3.0]))
    assert J[1].tolist() == [0.0, 0.0, 0.0]
    assert J[0, 0] > 0


def test_rejects_non_finite_and_bad_types():
    with pytest.raises(ValueError, match=r"z contains 1 non-finite value"):
        softmax_jacobian_from_logits(np.array([0.0, np.inf]))
    with pytest.raises(ValueError, match=r"z must have at least 1 axes, received shape \(\)"):
        softmax_jacobian_from_logits(1.0)
    with pytest.raises(TypeError, match=r"z must be a numeric array"):
        softmax_jacobian_from_logits(np.array(["x"]))


def finite_logits(max_n=8, bound=200.0):
    return arrays(
        np.float64,
        array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=max_n),
        elements=st.floats(-bound, bound, allow_nan=False, allow_infinity=False),
    )


@PROPS
@given(finite_logits())
def test_prop_symmetric_psd_zero_row_sums_bounded(z):
    J = softmax_jacobian_from_logits(z)
    np.testing.assert_allclose(J, np.swapaxes(J, -1, -2), rtol=0, atol=0)
    np.testing.assert_allclose(J.sum(axis=-1), 0.0, rtol=0, atol=1e-15)
    eig = np.linalg.eigvalsh(J)
    assert eig.min() >= -1e-15
    assert eig.max() <= 0.5 + 1e-15
    # the diagonal is never less accurate than the p-only formula
    diag = np.diagonal(J, axis1=-2, axis2=-1)
    p = softmax(z)
    assert np.all(diag >= 0)
    np.testing.assert_allclose(diag, p * (1 - p), rtol=0, atol=1e-15)


def softmax_traced(z):
    """Softmax in autograd.numpy with the shift by the largest logit inside the traced computation
    (chapter 3's ``softmax_traced``)."""
    e = anp.exp(z - anp.max(z))
    return e / anp.sum(e)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(arrays(np.float64, st.integers(1, 6), elements=st.floats(-30, 30, allow_nan=False)))
def test_prop_equals_autograd(z):
    # entry by entry to 1e-12 relative: no tolerance that would hide a diagonal rounded to 0
    np.testing.assert_allclose(
        softmax_jacobian_from_logits(z), autograd.jacobian(softmax_traced)(z), rtol=1e-12, atol=0
    )


def test_autograd_keeps_the_saturated_entry_only_when_the_shift_is_traced():
    """Chapter 3's claim: with the max shift inside autograd's graph, J_33 at z = (−3, 1, 100, 5, −1)
    comes out as t/(1+t)²; the core's softmax_core takes the shift outside the graph, and there
    autograd forms p_3 − p_3² = 0."""
    z = np.array([-3.0, 1.0, 100.0, 5.0, -1.0])
    t = sum(math.exp(v - 100.0) for v in (-3.0, 1.0, 5.0, -1.0))
    traced = autograd.jacobian(softmax_traced)(z)
    assert traced[2, 2] == pytest.approx(t / (1 + t) ** 2, rel=1e-12)
    np.testing.assert_allclose(traced, softmax_jacobian_from_logits(z), rtol=1e-12, atol=0)
    assert autograd.jacobian(softmax_core)(z)[2, 2] == 0.0


# ---------------------------------------------------------------- the query Jacobian near one-hot


def test_query_jacobian_keeps_its_relative_accuracy_near_one_hot():
    """au.attention_query_jacobian (covariance centred on the most-attended key) agrees with
    s Vᵀ J K for J from the logits to 1e-12 of its largest entry, from moderate logits to
    saturation, where J formed from the rounded p is wrong."""
    rng = np.random.default_rng(4)
    q, keys, values = rng.standard_normal(8), rng.standard_normal((6, 8)), rng.standard_normal((6, 3))
    s = 1 / np.sqrt(8)
    for t in (1.0, 8.0, 32.0, 64.0, 128.0):
        logits = s * keys @ (t * q)
        reference = s * values.T @ softmax_jacobian_from_logits(logits) @ keys
        got = attention_query_jacobian(t * q, keys, values)
        assert np.abs(reference).max() > 0
        np.testing.assert_allclose(got, reference, rtol=0, atol=1e-12 * np.abs(reference).max())
    from_p = s * values.T @ softmax_jacobian(softmax(logits)) @ keys
    assert np.abs(from_p - reference).max() > 0.1 * np.abs(reference).max()


def test_query_jacobian_centre_does_not_matter():
    """The covariance may be centred anywhere (eq-ch3-centred): the centred evaluation equals
    s(Σ p_j v_j k_jᵀ − o k̄ᵀ) at moderate logits, batched."""
    rng = np.random.default_rng(5)
    q, keys, values = rng.standard_normal((3, 4)), rng.standard_normal((3, 7, 4)), rng.standard_normal((3, 7, 2))
    p = softmax(0.5 * np.einsum("bjd,bd->bj", keys, q))
    o, k_bar = np.einsum("bj,bje->be", p, values), np.einsum("bj,bjd->bd", p, keys)
    plain = np.einsum("bj,bje,bjd->bed", p, values, keys) - o[:, :, None] * k_bar[:, None, :]
    np.testing.assert_allclose(attention_query_jacobian(q, keys, values), 0.5 * plain, rtol=0, atol=1e-14)


def test_ols_recovers_coefficients_and_standard_errors():
    rng = np.random.default_rng(2)
    X = np.stack([np.ones(400), rng.standard_normal(400), rng.uniform(-5, 5, 400)], axis=1)
    beta, se = ols(X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.standard_normal(400))
    np.testing.assert_allclose(beta, [1.0, -2.0, 0.5], atol=5 * se.max())
    expected_se = 0.1 * np.sqrt(np.diag(np.linalg.inv(X.T @ X)))
    np.testing.assert_allclose(se, expected_se, rtol=0.2)
    with pytest.raises(ValueError, match="N > k"):
        ols(X[:2], np.zeros(2))
