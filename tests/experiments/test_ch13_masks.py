"""Unit and property tests for attn_utils.experiments.ch13_masks (masks, 16-bit fill values, masked decoding)."""

import numpy as np
import pytest
from autograd import grad
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import causal_mask, scaled_dot_product_attention, softmax
from attn_utils.experiments import ch13_masks as ex
from attn_utils.experiments.ch14_positions import rope

PROPS = settings(max_examples=200, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- bfloat16 emulation


def bf16_reference(x: np.float32) -> float:
    """Round one finite float32 to bfloat16 by comparing the two neighbouring bfloat16 candidates exactly."""
    bits = int(np.array(x, dtype=np.float32).view(np.uint32))
    low = bits & 0xFFFF0000
    high = low + 0x10000
    lo_val = float(np.array(low, dtype=np.uint32).view(np.float32))
    hi_val = float(np.array(high, dtype=np.uint32).view(np.float32))  # may be inf past the largest bfloat16
    xv = float(x)
    hi_dist = hi_val if np.isfinite(hi_val) else np.copysign(2.0**128, xv)  # IEEE: overflow as if the range went on
    d_lo, d_hi = abs(xv - lo_val), abs(hi_dist - xv)  # float64 differences of float32 values are exact
    if bits & 0xFFFF == 0:
        return lo_val
    if d_lo < d_hi:
        return lo_val
    if d_hi < d_lo:
        return hi_val
    return lo_val if (low >> 16) % 2 == 0 else hi_val  # tie: even last kept bit


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1.0),
        (1 + 2.0**-8, 1.0),  # exactly halfway between 1 and 1 + 2^-7: ties to even (1.0)
        (1 + 3 * 2.0**-8, 1 + 2.0**-6),  # halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even)
        (1 + 2.0**-8 + 2.0**-20, 1 + 2.0**-7),  # just above halfway rounds up
        (-1e4, -9984.0),
        (-1e9, -998244352.0),
        ((2 - 2.0**-7) * 2.0**127, (2 - 2.0**-7) * 2.0**127),  # the largest bfloat16
    ],
)
def test_round_to_bfloat16_known_values(value, expected):
    assert float(ex.round_to_bfloat16(value)) == expected


def test_round_to_bfloat16_overflow_nan_and_signed_zero():
    out = ex.round_to_bfloat16(np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, np.inf, np.nan, -0.0]))
    assert out[0] == np.inf and out[1] == -np.inf and out[2] == np.inf
    assert np.isnan(out[3])
    assert out[4] == 0 and np.signbit(out[4])
    # a NaN whose payload sits only in the low 16 bits must stay NaN (not become inf)
    odd_nan = np.array(0x7F800001, dtype=np.uint32).view(np.float32)
    assert np.isnan(ex.round_to_bfloat16(odd_nan))


def test_round_to_bfloat16_ties_at_the_top_of_the_range_and_double_rounding():
    def f32(bits):
        return np.array(bits, dtype=np.uint32).view(np.float32)

    largest = (2 - 2.0**-7) * 2.0**127
    # halfway between the largest bfloat16 (odd last bit) and 2^128: ties to even means overflow to inf
    assert ex.round_to_bfloat16(f32(0x7F7F8000)) == np.inf
    assert ex.round_to_bfloat16(f32(0x7F7F7FFF)) == largest
    assert ex.round_to_bfloat16(-f32(0x7F7F8000)) == -np.inf
    # float64 input is rounded to float32 first (as documented): 1 + 2^-8 + 2^-30 becomes the tie 1 + 2^-8,
    # which rounds to 1.0, although the float64 value lies above the halfway point (direct rounding: 1 + 2^-7)
    assert float(ex.round_to_bfloat16(1 + 2.0**-8 + 2.0**-30)) == 1.0
    assert float(ex.round_to_bfloat16(np.float32(1 + 2.0**-8 + 2.0**-20))) == 1 + 2.0**-7


@PROPS
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_round_to_bfloat16_matches_exact_nearest_even(x):
    x32 = np.float32(x)
    out = ex.round_to_bfloat16(x32)
    assert out.dtype == np.float32
    assert int(np.array(out).view(np.uint32)) & 0xFFFF == 0 or not np.isfinite(out)
    assert float(out) == bf16_reference(x32)


def test_round_to_and_dtype_min():
    x = np.array([1.0 + 2.0**-12, -1e9, 70000.0])
    np.testing.assert_array_equal(ex.round_to(x, "float32"), x.astype(np.float32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ex.round_to(x, "float16"), x.astype(np.float16).astype(np.float32))
    assert ex.round_to(-1e9, "float16") == -np.inf
    assert ex.dtype_min("float16") == -65504.0
    assert ex.dtype_min("float32") == float(np.finfo(np.float32).min)
    assert ex.dtype_min("bfloat16") == -(2 - 2.0**-7) * 2.0**127
    assert ex.round_to(ex.dtype_min("bfloat16"), "bfloat16") == ex.dtype_min("bfloat16")
    with pytest.raises(ValueError, match="dtype"):
        ex.round_to(1.0, "int8")
    with pytest.raises(ValueError, match="dtype"):
        ex.dtype_min("float64")


# ---------------------------------------------------------------- padding masks


def test_padding_keep_right_and_left():
    np.testing.assert_array_equal(ex.padding_keep([3, 1, 0], 4, "right"), [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(ex.padding_keep([3, 1, 4], 4, "left"), [[0, 1, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="lengths"):
        ex.padding_keep([5], 4)
    with pytest.raises(ValueError, match="side"):
        ex.padding_keep([2], 4, "middle")


# ---------------------------------------------------------------- framework softmax


def test_framework_softmax_neg_inf_matches_masked_softmax_and_gives_nan_for_empty_rows():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 7))
    keep = rng.random((5, 7)) < 0.6
    keep[0] = True
    keep[1, 0] = True
    keep[4] = False
    p = ex.framework_softmax(z, keep, -np.inf, "float32")
    np.testing.assert_allclose(p[:4], softmax(z[:4], mask=keep[:4]), atol=1e-6)
    assert np.isnan(p[4]).all()


@pytest.mark.parametrize("dtype", ex.DTYPES)
def test_framework_softmax_fill_min_is_uniform_and_two_min_biases_overflow(dtype):
    z = np.linspace(-5, 5, 6)
    keep = np.zeros(6, bool)
    lo = ex.dtype_min(dtype)
    np.testing.assert_array_equal(
        ex.framework_softmax(z, keep, lo, dtype), np.full(6, float(ex.round_to(1 / 6, dtype)))
    )
    assert np.isnan(ex.framework_softmax(z, keep, lo, dtype, additive=True, n_masks=2)).all()


def test_framework_softmax_float16_minus_1e9_is_nan_bfloat16_is_not():
    z, keep = np.arange(4.0), np.zeros(4, bool)
    assert np.isnan(ex.framework_softmax(z, keep, -1e9, "float16")).all()
    assert np.isfinite(ex.framework_softmax(z, keep, -1e9, "bfloat16")).all()


def test_framework_softmax_additive_float32_bias_keeps_the_scores_of_an_empty_row():
    z, keep = np.array([0.0, 1.0, 2.0, 3.0]), np.zeros(4, bool)
    np.testing.assert_allclose(ex.framework_softmax(z, keep, -1e4, "float32", additive=True), softmax(z), rtol=1e-3)


# ---------------------------------------------------------------- attention under both policies


def test_masked_attention_policies():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 2, 5, 4))
    keep = causal_mask(5) & np.array([False, True, True, True, True])  # row 0 keeps nothing
    zero = ex.masked_attention(q, k, v, keep, "zero")
    naive = ex.masked_attention(q, k, v, keep, "naive")
    np.testing.assert_array_equal(zero, scaled_dot_product_attention(q, k, v, mask=keep)[0])
    np.testing.assert_allclose(naive[:, 1:], zero[:, 1:], atol=1e-13)
    assert (zero[:, 0] == 0).all() and np.isnan(naive[:, 0]).all()
    v_nan = v.copy()
    v_nan[:, 0] = np.nan  # a masked slot holding NaN poisons every query under the naive policy
    with np.errstate(invalid="ignore"):
        assert np.isnan(ex.masked_attention(q, k, v_nan, keep, "naive")).all()
    with pytest.raises(ValueError, match="policy"):
        ex.masked_attention(q, k, v, keep, "other")


# ---------------------------------------------------------------- loss over a padded batch


def _loss_setup(side="right"):
    rng = np.random.default_rng(2)
    lengths = np.array([4, 2, 3])
    keep = ex.padding_keep(lengths, 4, side)
    x = rng.normal(size=(3, 4, 5))
    w = {name: rng.normal(size=(5, 5)) / np.sqrt(5) for name in ("W_q", "W_k", "W_v")}
    w["W_out"] = rng.normal(size=(5, 3))
    y = rng.integers(0, 3, (3, 4))
    return lengths, keep, x, w, y


@pytest.mark.parametrize("causal", [False, True])
def test_token_loss_with_both_masks_equals_unpadded_loss_and_ignores_padding(causal):
    lengths, keep, x, w, y = _loss_setup()
    ref = (
        sum(
            L * ex.token_loss(x[b : b + 1, :L], w, y[b : b + 1, :L], np.ones((1, L), bool), causal=causal)
            for b, L in enumerate(lengths)
        )
        / lengths.sum()
    )
    f = lambda x_: ex.token_loss(x_, w, y, keep, causal=causal)  # noqa: E731
    np.testing.assert_allclose(f(x), ref, atol=1e-12)
    assert (grad(f)(x)[~keep] == 0).all()
    x_junk = np.where(keep[..., None], x, 1e3)
    np.testing.assert_allclose(f(x_junk), f(x), atol=1e-12)


def test_losses_against_real_keys_decompose_the_key_mask_only_loss():
    rng = np.random.default_rng(13)
    lengths, n, d, classes = np.array([5, 3, 2]), 5, 6, 4
    keep = ex.padding_keep(lengths, n, "right")
    x = rng.normal(size=(3, n, d))
    w = {name: rng.normal(size=(d, d)) / np.sqrt(d) for name in ("W_q", "W_k", "W_v")}
    w["W_out"] = rng.normal(size=(d, classes))
    y = rng.integers(0, classes, (3, n))
    per_position = ex.losses_against_real_keys(x, w, y, keep)
    assert per_position.shape == (3, n) and (per_position > 0).all()
    key_only = ex.token_loss(x, w, y, keep, key_mask=True, query_mask=None)
    np.testing.assert_allclose(key_only, per_position.mean(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ex.token_loss(x, w, y, keep), per_position[keep].mean(), rtol=0, atol=1e-12)
    for b, length in enumerate(lengths):  # real positions: the sequence alone, no padding at all
        alone = ex.losses_against_real_keys(x[b : b + 1, :length], w, y[b : b + 1, :length], np.ones((1, length), bool))
        np.testing.assert_allclose(alone[0], per_position[b, :length], rtol=0, atol=1e-12)


def test_token_loss_where_vs_multiply_and_errors():
    lengths, keep, x, w, y = _loss_setup("left")
    a = ex.token_loss(x, w, y, keep, causal=True, query_mask="multiply")
    b = ex.token_loss(x, w, y, keep, causal=True, query_mask="where")
    np.testing.assert_allclose(a, b, atol=1e-14)
    with np.errstate(invalid="ignore"):
        assert np.isnan(ex.token_loss(x, w, y, keep, causal=True, policy="naive"))
    with pytest.raises(ValueError, match="policy"):
        ex.token_loss(x, w, y, keep, policy="x")
    with pytest.raises(ValueError, match="query_mask"):
        ex.token_loss(x, w, y, keep, query_mask="x")


# ---------------------------------------------------------------- decoding with a KV cache


def _decoder(rng, d=8, h=2, n_layers=2):
    return [
        {name: rng.normal(size=(d, d)) / np.sqrt(d) for name in ("W_q", "W_k", "W_v", "W_o")} for _ in range(n_layers)
    ]


@pytest.mark.parametrize("side", ["left", "right"])
def test_cached_decode_and_parallel_pass_equal_each_sequence_alone(side):
    rng = np.random.default_rng(3)
    layers, lengths, P, T = _decoder(rng), np.array([5, 2, 4]), 5, 3
    keep = ex.padding_keep(lengths, P, side)
    prompt, new = rng.normal(size=(3, P, 8)), rng.normal(size=(3, T, 8))
    parallel = ex.stack_forward(
        np.concatenate([prompt, new], 1), layers, 2, np.concatenate([keep, np.ones((3, T), bool)], 1)
    )
    decoded = ex.cached_decode(prompt, new, layers, 2, keep)
    for b, L in enumerate(lengths):
        seq = np.concatenate([prompt[b][keep[b]], new[b]])[None]
        alone = ex.stack_forward(seq, layers, 2, np.ones((1, L + T), bool))
        np.testing.assert_allclose(decoded[b], alone[0, L:], atol=1e-12)
        if side == "left":  # with right padding the new tokens sit after the padding, at other columns
            np.testing.assert_allclose(parallel[b, P:], alone[0, L:], atol=1e-12)
    unmasked = ex.cached_decode(prompt, new, layers, 2, keep, use_key_mask=False)
    assert np.abs(unmasked[1] - decoded[1]).max() > 1e-3


def test_stack_forward_naive_policy_spreads_nan_from_empty_rows():
    rng = np.random.default_rng(4)
    layers = _decoder(rng)
    keep = ex.padding_keep([4, 2], 4, "left")
    x = rng.normal(size=(2, 4, 8))
    with np.errstate(invalid="ignore"):
        one = ex.stack_forward(x, layers[:1], 2, keep, policy="naive")
        two = ex.stack_forward(x, layers, 2, keep, policy="naive")
    assert np.isfinite(one[keep]).all() and np.isnan(one[~keep]).all()
    assert np.isnan(two[1]).all() and np.isfinite(two[0]).all()
    np.testing.assert_allclose(ex.stack_forward(x, layers, 2, keep)[0], two[0], atol=1e-13)


# ---------------------------------------------------------------- leak bound


@pytest.mark.parametrize("m", [1, 3, 100])
def test_masked_weight_bound_is_attained_and_monotone(m):
    gaps = np.linspace(0.0, 30.0, 7)
    C = 50.0
    z = np.concatenate([np.zeros((7, 1)), np.repeat((C - gaps)[:, None], m, axis=1) - C], axis=1)
    np.testing.assert_allclose(softmax(z)[:, 1:].sum(axis=1), ex.masked_weight_bound(gaps, m), rtol=1e-12)
    assert (np.diff(ex.masked_weight_bound(gaps, m)) < 0).all()


# ---------------------------------------------------------------- packing, prefix LM, draft trees


def _layers(rng, d=8, count=2):
    return [{n: rng.standard_normal((d, d)) / np.sqrt(d) for n in ("W_q", "W_k", "W_v", "W_o")} for _ in range(count)]


def test_packing_helpers_known_values():
    assert ex.document_ids([2, 3]).tolist() == [0, 0, 1, 1, 1]
    assert ex.packed_positions([2, 3, 1]).tolist() == [0, 1, 0, 1, 2, 0]
    assert ex.packed_targets(np.array([4, 5, 6, 7, 8]), [2, 3]).tolist() == [5, -1, 7, 8, -1]
    expected = np.array(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=bool
    )
    np.testing.assert_array_equal(ex.document_mask([2, 3]), expected)
    np.testing.assert_array_equal(ex.document_mask([4]), causal_mask(4))  # one document: the causal mask


def test_prefix_lm_mask_known_values_and_limits():
    m = ex.prefix_lm_mask(4, 2)
    np.testing.assert_array_equal(m, np.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool))
    np.testing.assert_array_equal(ex.prefix_lm_mask(5, 0), causal_mask(5))
    np.testing.assert_array_equal(ex.prefix_lm_mask(5, 1), causal_mask(5))  # a prefix of one token adds nothing
    assert ex.prefix_lm_mask(5, 5).all()


def test_tree_mask_and_depths_known_values():
    parents = [-1, -1, 0, 2]
    assert ex.tree_depths(parents).tolist() == [0, 0, 1, 2]
    m = ex.tree_mask(parents, 2)
    assert m.shape == (4, 6) and m[:, :2].all()
    np.testing.assert_array_equal(
        m[:, 2:], np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=bool)
    )
    # a chain is the bottom-right causal block
    np.testing.assert_array_equal(ex.tree_mask([-1, 0, 1], 3), causal_mask(3, 6))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ex.document_mask([2, 0]), "lengths"),
        (lambda: ex.packed_positions([[2, 3]]), "lengths"),
        (lambda: ex.packed_targets(np.arange(4), [2, 3]), "tokens"),
        (lambda: ex.prefix_lm_mask(3, 4), "prefix"),
        (lambda: ex.tree_mask([0], 2), "parents"),
        (lambda: ex.tree_depths([-1, 2, 0]), "parents"),
        (lambda: ex.tree_depths([-1.0]), "parents"),
    ],
)
def test_new_helpers_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_attend_with_cache_rejects_a_mask_of_the_wrong_shape():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 8))
    with pytest.raises(ValueError, match="keep"):
        ex.attend_with_cache(x, _layers(rng), 2, causal_mask(4))


def test_attend_with_cache_needs_rotate_and_positions_together():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 8))
    with pytest.raises(ValueError, match="rotate and positions"):
        ex.attend_with_cache(x, _layers(rng), 2, causal_mask(3), positions=np.arange(3))
    with pytest.raises(ValueError, match="rotate and positions"):
        ex.attend_with_cache(x, _layers(rng), 2, causal_mask(3), rotate=rope)


def test_attend_with_cache_in_pieces_equals_one_causal_pass():
    rng = np.random.default_rng(1)
    layers, x = _layers(rng), rng.standard_normal((2, 7, 8))
    full, _ = ex.attend_with_cache(x, layers, 2, causal_mask(7), positions=np.arange(7), rotate=rope)
    first, caches = ex.attend_with_cache(x[:, :3], layers, 2, causal_mask(3), positions=np.arange(3), rotate=rope)
    rest, caches = ex.attend_with_cache(
        x[:, 3:], layers, 2, causal_mask(4, 7), caches=caches, positions=3 + np.arange(4), rotate=rope
    )
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), full, atol=1e-12, rtol=0)
    assert caches[0][0].shape == (2, 2, 7, 4)


def test_stack_forward_equals_attend_with_cache_without_positions():
    rng = np.random.default_rng(2)
    layers, x = _layers(rng), rng.standard_normal((2, 5, 8))
    keep = ex.padding_keep([5, 3], 5, "left")
    ref, _ = ex.attend_with_cache(x, layers, 2, keep[:, None, None, :] & causal_mask(5))
    np.testing.assert_array_equal(ex.stack_forward(x, layers, 2, keep), ref)


def test_cached_decode_rotary_ignores_left_padding():
    """Rotary scores depend on offsets only, so a left-padded prompt decodes as the prompt alone."""
    rng = np.random.default_rng(3)
    layers = _layers(rng)
    prompt, new = rng.standard_normal((1, 6, 8)), rng.standard_normal((1, 3, 8))
    keep = ex.padding_keep([4], 6, "left")
    padded = ex.cached_decode(prompt, new, layers, 2, keep, rotate=rope)
    alone = ex.cached_decode(prompt[:, 2:], new, layers, 2, np.ones((1, 4), bool), rotate=rope)
    np.testing.assert_allclose(padded, alone, atol=1e-12, rtol=0)


def test_cached_decode_rotary_rejects_right_padding():
    """Right padding puts the new tokens P − L columns after a prompt of length L: refused, not silently wrong."""
    rng = np.random.default_rng(3)
    layers = _layers(rng)
    prompt, new = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 3, 8))
    keep = ex.padding_keep([6, 4], 6, "right")
    with pytest.raises(ValueError, match=r"left-padded.*rows \[1\]"):
        ex.cached_decode(prompt, new, layers, 2, keep, rotate=rope)
    with pytest.raises(ValueError, match="keep_prompt must have shape"):
        ex.cached_decode(prompt, new, layers, 2, keep[:, :5])
    ex.cached_decode(prompt, new, layers, 2, keep)  # without positions right padding is fine (tested above)


def test_attend_with_cache_key_positions_default_and_mismatch():
    """key_positions defaults to positions; keys rotated elsewhere than the queries change the outputs."""
    rng = np.random.default_rng(6)
    layers, x = _layers(rng), rng.standard_normal((1, 5, 8))
    pos = np.arange(5)
    ref, _ = ex.attend_with_cache(x, layers, 2, causal_mask(5), positions=pos, rotate=rope)
    same, _ = ex.attend_with_cache(x, layers, 2, causal_mask(5), positions=pos, rotate=rope, key_positions=pos)
    np.testing.assert_array_equal(same, ref)
    mixed, _ = ex.attend_with_cache(x, layers, 2, causal_mask(5), positions=pos + 3, rotate=rope, key_positions=pos)
    assert np.abs(mixed - ref).max() > 1e-3
    with pytest.raises(ValueError, match="key_positions needs rotate"):
        ex.attend_with_cache(x, layers, 2, causal_mask(5), key_positions=pos)


def test_token_losses_mark_missing_targets_nan():
    rng = np.random.default_rng(4)
    out, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    losses = ex.token_losses(out, w, np.array([1, -1, 4]))
    assert np.isnan(losses[1]) and np.isfinite(losses[[0, 2]]).all()
    logits = out @ w
    np.testing.assert_allclose(losses[0], -np.log(softmax(logits[0]))[1], rtol=1e-12)


def test_tree_cache_gathered_along_the_accepted_path_continues_exactly():
    """After a tree pass, the accepted nodes' cache rows (keys rotated at cache length + depth) are the
    cache of decoding that path alone: the next token decoded against them matches."""
    rng = np.random.default_rng(5)
    layers, P = _layers(rng), 4
    prompt = rng.standard_normal((1, P, 8))
    parents = np.array([-1, -1, 0, 1, 3])
    nodes, nxt = rng.standard_normal((1, parents.size, 8)), rng.standard_normal((1, 1, 8))
    _, cache = ex.attend_with_cache(prompt, layers, 2, causal_mask(P), positions=np.arange(P), rotate=rope)
    _, tree_cache = ex.attend_with_cache(
        nodes, layers, 2, ex.tree_mask(parents, P), caches=cache, positions=P + ex.tree_depths(parents), rotate=rope
    )
    path = np.array([1, 3, 4])
    keep_rows = np.concatenate([np.arange(P), P + path])
    gathered = [(k[..., keep_rows, :], v[..., keep_rows, :]) for k, v in tree_cache]
    out, _ = ex.attend_with_cache(nxt, layers, 2, None, caches=gathered, positions=[P + path.size], rotate=rope)
    alone = ex.cached_decode(
        prompt, np.concatenate([nodes[:, path], nxt], axis=1), layers, 2, np.ones((1, P), bool), rotate=rope
    )
    np.testing.assert_allclose(out[:, 0], alone[:, -1], atol=1e-12, rtol=0)


@PROPS
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.integers(0, 2**31 - 1))
def test_packed_row_equals_documents_alone_rotary_restarted_or_not(lengths, seed):
    rng = np.random.default_rng(seed)
    layers = _layers(rng, count=1)
    n = sum(lengths)
    x = rng.standard_normal((1, n, 8))
    keep = ex.document_mask(lengths)
    starts = np.cumsum(lengths) - np.array(lengths)
    alone = np.concatenate(
        [
            ex.attend_with_cache(x[:, s : s + L], layers, 2, causal_mask(L), positions=np.arange(L), rotate=rope)[0][0]
            for s, L in zip(starts, lengths)
        ]
    )
    for positions in (ex.packed_positions(lengths), np.arange(n)):
        packed = ex.attend_with_cache(x, layers, 2, keep, positions=positions, rotate=rope)[0][0]
        np.testing.assert_allclose(packed, alone, atol=1e-11, rtol=0)
