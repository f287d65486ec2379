"""Bad input fails loudly, naming the argument and showing expected vs received shape."""

import numpy as np
import pytest

from attn_utils import (
    attention_query_jacobian,
    attention_scores,
    causal_mask,
    default_scale,
    entropy,
    init_mha_params,
    log_softmax,
    merge_heads,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from attn_utils.validation import as_float_array, positive_int, positive_scalar

rng = np.random.default_rng(50)
Q = rng.normal(size=(3, 4))
K = rng.normal(size=(5, 4))
V = rng.normal(size=(5, 2))


# ---------------------------------------------------------------- ranks and sizes


def test_q_with_too_few_axes():
    with pytest.raises(ValueError, match=r"q must have at least 2 axes, received shape \(4,\)"):
        scaled_dot_product_attention(np.ones(4), K, V)


def test_k_and_v_with_too_few_axes():
    with pytest.raises(ValueError, match=r"k must have at least 2 axes, received shape \(4,\)"):
        scaled_dot_product_attention(Q, np.ones(4), V)
    with pytest.raises(ValueError, match=r"v must have at least 2 axes, received shape \(\)"):
        scaled_dot_product_attention(Q, K, 1.0)


def test_mismatched_d_k():
    with pytest.raises(ValueError, match=r"k axis -1 \(d_k.*\) must have size 4, received shape \(5, 3\)"):
        scaled_dot_product_attention(Q, np.ones((5, 3)), V)
    with pytest.raises(ValueError, match=r"k axis -1 .*size 4.*\(5, 6\)"):
        attention_scores(Q, np.ones((5, 6)))


def test_mismatched_n_k_between_k_and_v():
    with pytest.raises(ValueError, match=r"v axis -2 \(n_k.*\) must have size 5, received shape \(6, 2\)"):
        scaled_dot_product_attention(Q, K, np.ones((6, 2)))


def test_different_leading_axes_do_not_broadcast():
    q = np.ones((2, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"leading \(batch/head\) axes must be identical; received q \(2, 3, 4\), "
        r"k \(5, 4\)",
    ):
        scaled_dot_product_attention(q, K, V)
    with pytest.raises(ValueError, match=r"q \(2, 3, 4\), k \(2, 5, 4\), v \(1, 5, 2\)"):
        scaled_dot_product_attention(q, np.ones((2, 5, 4)), np.ones((1, 5, 2)))
    with pytest.raises(ValueError, match="leading"):
        scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((3, 5, 4)), np.ones((3, 5, 2)))
    with pytest.raises(ValueError, match=r"received q \(2, 3, 4\), k \(1, 5, 4\)"):
        attention_scores(q, np.ones((1, 5, 4)))


# ---------------------------------------------------------------- scale


@pytest.mark.parametrize("scale", [0, 0.0, -1.0, float("nan"), float("inf")])
def test_bad_scale_value(scale):
    with pytest.raises(ValueError, match=r"scale must be finite and > 0, received"):
        scaled_dot_product_attention(Q, K, V, scale=scale)


@pytest.mark.parametrize("scale", [True, "0.5", np.array([0.5]), None.__class__])
def test_bad_scale_type(scale):
    with pytest.raises(TypeError, match=r"scale must be a real number, received"):
        attention_scores(Q, K, scale=scale)


def test_scale_accepts_numpy_scalars():
    out1 = attention_scores(Q, K, scale=np.float32(0.5))
    out2 = attention_scores(Q, K, scale=0.5)
    np.testing.assert_array_equal(out1, out2)


# ---------------------------------------------------------------- non-finite input


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_finite_inputs(which, bad):
    args = {"q": Q.copy(), "k": K.copy(), "v": V.copy()}
    args[which][1, 1] = bad
    with pytest.raises(ValueError, match=rf"^{which} contains 1 non-finite value\(s\).*shape"):
        scaled_dot_product_attention(**args)


def test_softmax_rejects_nan_and_pos_inf_but_not_neg_inf():
    for f in (softmax, log_softmax):  # -inf is a masked logit for both; NaN and +inf have no softmax
        with pytest.raises(ValueError, match="x contains 1 non-finite"):
            f([1.0, np.nan])
        with pytest.raises(ValueError, match="x contains 1 non-finite"):
            f([1.0, np.inf])
        f([1.0, -np.inf])


def test_non_numeric_input():
    with pytest.raises(TypeError, match="x must be a numeric array, received dtype"):
        softmax(["a", "b"])
    with pytest.raises(TypeError, match="q must be a numeric array"):
        scaled_dot_product_attention(np.array([[1, None]], dtype=object), K, V)
    with pytest.raises(TypeError, match="x must be real"):
        softmax(np.array([1 + 1j, 2.0]))


def test_entropy_rejects_negative():
    with pytest.raises(ValueError, match="p must be probability vectors.*a negative entry"):
        entropy([0.5, -0.1, 0.6])


# ---------------------------------------------------------------- masks


def test_non_bool_mask():
    with pytest.raises(TypeError, match=r"mask must be boolean .*received dtype int64"):
        scaled_dot_product_attention(Q, K, V, mask=np.ones((3, 5), dtype=np.int64))
    with pytest.raises(TypeError, match=r"mask must be a boolean array .*received dtype float64"):
        softmax(np.ones((3, 5)), mask=np.ones((3, 5)))


def test_wrong_mask_shape():
    with pytest.raises(
        ValueError, match=r"mask of shape \(5, 3\) must broadcast to the scores \(\.\.\., n_q, n_k\) = \(3, 5\)"
    ):
        scaled_dot_product_attention(Q, K, V, mask=np.ones((5, 3), bool))
    with pytest.raises(ValueError, match=r"mask of shape \(4,\) must broadcast"):
        scaled_dot_product_attention(Q, K, V, mask=np.ones(4, bool))
    scaled_dot_product_attention(Q, K, V, mask=np.ones(5, bool))  # (n_k,) broadcasts, as in numpy
    # a mask may not enlarge the batch
    with pytest.raises(
        ValueError, match=r"mask of shape \(2, 3, 5\) must broadcast to the scores .* without enlarging them"
    ):
        scaled_dot_product_attention(Q, K, V, mask=np.ones((2, 3, 5), bool))


def test_softmax_mask_shape():
    with pytest.raises(ValueError, match=r"mask of shape \(4,\) does not broadcast to logits of shape \(3, 5\)"):
        softmax(np.ones((3, 5)), mask=np.ones(4, bool))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 3, 5\) would enlarge logits of shape \(3, 5\)"):
        softmax(np.ones((3, 5)), mask=np.ones((2, 3, 5), bool))


# ---------------------------------------------------------------- heads, causal mask, ints


def test_split_heads_not_divisible():
    with pytest.raises(ValueError, match=r"x last axis \(10\) must be divisible by h=3; received shape \(4, 10\)"):
        split_heads(np.ones((4, 10)), 3)


def test_split_and_merge_bad_rank_and_h():
    with pytest.raises(ValueError, match=r"x must have at least 2 axes, received shape \(6,\)"):
        split_heads(np.ones(6), 2)
    with pytest.raises(ValueError, match=r"x must have at least 3 axes, received shape \(4, 6\)"):
        merge_heads(np.ones((4, 6)))
    with pytest.raises(ValueError, match="h must be >= 1, received 0"):
        split_heads(np.ones((4, 6)), 0)
    with pytest.raises(TypeError, match="h must be an integer, received float"):
        split_heads(np.ones((4, 6)), 2.0)


def test_causal_mask_n_k_smaller_than_n_q():
    with pytest.raises(ValueError, match=r"n_k must be >= n_q for a causal mask, received n_q=5, n_k=3"):
        causal_mask(5, 3)


def test_causal_mask_and_default_scale_bad_ints():
    with pytest.raises(ValueError, match="n_q must be >= 1, received 0"):
        causal_mask(0)
    with pytest.raises(TypeError, match="n_k must be an integer, received float"):
        causal_mask(2, 3.0)
    with pytest.raises(TypeError, match="d_k must be an integer, received bool"):
        default_scale(True)
    with pytest.raises(ValueError, match="d_k must be >= 1, received -4"):
        default_scale(-4)


def test_mha_d_model_mismatch():
    params = init_mha_params(np.random.default_rng(51), 8, 2)
    with pytest.raises(ValueError, match=r"x_q axis -1 \(d_model.*\) must have size 8, received shape \(3, 6\)"):
        multi_head_attention(np.ones((3, 6)), np.ones((3, 8)), params, 2)
    with pytest.raises(ValueError, match=r"head count the parameters were made for \(2\), received h=3"):
        multi_head_attention(np.ones((3, 8)), np.ones((3, 8)), params, 3)
    with pytest.raises(ValueError, match=r"W_q must be \(d_model=8, 3·d\) for 3 heads, received shape \(8, 8\)"):
        multi_head_attention(np.ones((3, 8)), np.ones((3, 8)), dict(params), 3)


def test_query_jacobian_bad_input():
    with pytest.raises(ValueError, match=r"k axis -1 .*size 4.*received shape \(5, 3\)"):
        attention_query_jacobian(np.ones(4), np.ones((5, 3)), V)
    with pytest.raises(ValueError, match=r"q must have at least 1 axes, received shape \(\)"):
        attention_query_jacobian(1.0, K, V)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        attention_query_jacobian(np.ones(4), K, V, scale=-1.0)


def test_validation_helpers_directly():
    assert as_float_array("a", [1, 2]).dtype == np.float64
    assert as_float_array("a", [True, False]).dtype == np.float64
    assert as_float_array("a", [-np.inf], allow_neg_inf=True)[0] == -np.inf
    with pytest.raises(ValueError, match="a contains 1 non-finite"):
        as_float_array("a", [-np.inf])
    assert positive_scalar("s", np.int64(3)) == 3.0
    assert positive_int("n", np.int32(2)) == 2
