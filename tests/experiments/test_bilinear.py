"""Unit and property tests for attn_utils.experiments.ch08_bilinear (chapter 8: why W_Q and W_K differ)."""

import math

import autograd
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import count_macs, init_mha_params
from attn_utils.experiments.ch08_bilinear import (
    SELF_PENALTY,
    argmax_offset_rate,
    cyclic_previous_token_task,
    diagonal_max_probability,
    dot_score_no_self,
    factorization_rank,
    first_layer_queries,
    neighbour_weights,
    predecessor_chains,
    qk_attention_layer,
    qk_scores,
    self_mask,
)
from attn_utils.harness.layers import self_attention_layer
from attn_utils.harness.tasks import previous_token_task
from attn_utils.harness.training import SCORES, ModelConfig, attention_weights, init_params, register_score

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- scores


@PROPS
@given(n=st.integers(2, 9), d=st.integers(1, 8), dk=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_shared_scores_are_a_gram_matrix(n, d, dk, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.normal(size=(n, d)), rng.normal(size=(d, dk))
    s = qk_scores(x, w)
    a = x @ w
    np.testing.assert_allclose(s, a @ a.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, s.T, rtol=0, atol=1e-12)
    scale = max(1.0, float(np.abs(s).max()))
    assert np.linalg.eigvalsh(s).min() >= -1e-10 * scale
    diag = np.diag(s)
    # Cauchy–Schwarz: s_ij ≤ sqrt(s_ii s_jj) ≤ max(s_ii, s_jj)
    assert (s <= np.sqrt(np.outer(diag, diag)) + 1e-9 * scale).all()
    # the longest row always has its maximum on the diagonal
    i = int(np.argmax(diag))
    assert s[i, i] >= s[i].max() - 1e-9 * scale


def test_separate_scores_and_broadcasting():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7, 6))
    w_q, w_k = rng.normal(size=(5, 6, 3)), rng.normal(size=(5, 6, 3))
    s = qk_scores(x, w_q, w_k)
    assert s.shape == (5, 7, 7)
    np.testing.assert_allclose(s, (x @ w_q) @ np.swapaxes(x @ w_k, -1, -2), rtol=1e-12)
    assert not np.allclose(s, np.swapaxes(s, -1, -2))


def test_qk_scores_counts_one_product_fewer_when_shared():
    rng = np.random.default_rng(1)
    n, d, dk = 9, 8, 4
    x, w_q, w_k = rng.normal(size=(n, d)), rng.normal(size=(d, dk)), rng.normal(size=(d, dk))
    with count_macs() as sep:
        qk_scores(x, w_q, w_k)
    with count_macs() as sh:
        qk_scores(x, w_q)
    assert (sep.macs, sep.products) == (2 * n * d * dk + n * n * dk, 3)
    assert (sh.macs, sh.products) == (n * d * dk + n * n * dk, 2)


def test_qk_scores_validates_shapes():
    x = np.zeros((4, 6))
    with pytest.raises(ValueError, match="w_q"):
        qk_scores(x, np.zeros((5, 2)))
    with pytest.raises(ValueError, match="w_k"):
        qk_scores(x, np.zeros((6, 2)), np.zeros((6, 3)))
    with pytest.raises(ValueError, match="x"):
        qk_scores(np.zeros(6), np.zeros((6, 2)))


# ---------------------------------------------------------------- argmax rates


def test_argmax_offset_rate_on_known_patterns():
    n = 6
    eye = np.eye(n)
    assert argmax_offset_rate(eye, 0) == 1.0
    assert argmax_offset_rate(eye, -1) == 0.0
    shift = np.roll(eye, -1, axis=1)  # row i has its max at i − 1 (mod n)
    assert argmax_offset_rate(shift, -1, cyclic=True) == 1.0
    assert argmax_offset_rate(shift, -1) == 1.0  # rows 1..n−1 only
    # a mask can hide the diagonal
    s = 2 * eye + shift
    assert argmax_offset_rate(s, -1, cyclic=True) == 0.0
    assert argmax_offset_rate(s, -1, cyclic=True, mask=~np.eye(n, dtype=bool)) == 1.0
    batch = np.stack([eye, shift])
    np.testing.assert_array_equal(argmax_offset_rate(batch, 0), [1.0, 0.0])


def test_argmax_offset_rate_validates():
    with pytest.raises(ValueError, match="scores"):
        argmax_offset_rate(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="offset"):
        argmax_offset_rate(np.zeros((3, 3)), 3)
    with pytest.raises(TypeError, match="offset"):
        argmax_offset_rate(np.zeros((3, 3)), 0.5)
    with pytest.raises(TypeError, match="mask"):
        argmax_offset_rate(np.zeros((3, 3)), mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match="no allowed key"):
        argmax_offset_rate(np.zeros((3, 3)), mask=np.zeros((3, 3), bool))


def test_neighbour_weights_on_a_known_matrix():
    w = np.arange(16.0).reshape(4, 4)
    pred, succ = neighbour_weights(w, cyclic=True)
    np.testing.assert_array_equal(pred, [3, 4, 9, 14])
    np.testing.assert_array_equal(succ, [1, 6, 11, 12])
    pred, succ = neighbour_weights(np.stack([w, w.T]))
    assert pred.shape == succ.shape == (2, 4)
    np.testing.assert_array_equal(pred[0], [np.nan, 4, 9, 14])
    np.testing.assert_array_equal(succ[0], [1, 6, 11, np.nan])
    np.testing.assert_array_equal(pred[1], [np.nan, 1, 6, 11])
    with pytest.raises(ValueError, match="weights"):
        neighbour_weights(np.zeros((3, 4)))


@PROPS
@given(n=st.integers(3, 9), d=st.integers(1, 6), seed=st.integers(0, 10_000), masked=st.booleans())
def test_symmetric_scores_have_a_row_that_does_not_prefer_its_cyclic_predecessor(n, d, seed, masked):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(20, n, d))
    s = a @ np.swapaxes(a, -1, -2)  # symmetric (Gram) scores
    s = s - 1e5 * np.eye(n) if masked else s
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    for m in (s, e / e.sum(axis=-1, keepdims=True)):  # raw scores and softmax weights
        pred, succ = neighbour_weights(m, cyclic=True)
        assert ((succ >= pred).sum(axis=-1) >= 1).all()


def test_a_cyclic_shift_prefers_every_predecessor():
    shift = np.roll(np.eye(6), -1, axis=1)  # row i peaks at i − 1 (mod n)
    pred, succ = neighbour_weights(shift, cyclic=True)
    assert (succ < pred).all()


def test_predecessor_chains_on_the_norm_ladder_and_its_reverse():
    n = 6
    ladder = (np.eye(n) + np.eye(n, k=-1)) * 3.0 ** -np.arange(n)[:, None]  # part 3's example
    s = ladder @ ladder.T
    chained, falling = predecessor_chains(s)
    assert chained and falling
    rising = np.eye(n, k=-1) * np.arange(1, n + 1)[:, None]  # asymmetric: s[i, i−1] = i + 1
    chained, falling = predecessor_chains(rising)
    assert chained and not falling
    masked = s - 1e5 * np.eye(n)  # peaks taken from the masked matrix
    chained, _ = predecessor_chains(s, masked)
    assert chained
    batch = np.stack([s, np.eye(n)])
    chained, falling = predecessor_chains(batch)
    np.testing.assert_array_equal(chained, [True, False])
    with pytest.raises(ValueError, match="weights"):
        predecessor_chains(s, s[:-1, :-1])
    with pytest.raises(ValueError, match="scores"):
        predecessor_chains(np.zeros((3, 4)))


@PROPS
@given(n=st.integers(3, 8), seed=st.integers(0, 10_000), masked=st.booleans())
def test_a_chained_symmetric_score_always_falls(n, seed, masked):
    rng = np.random.default_rng(seed)
    # random symmetric scores with a noisy bias towards a falling chain, so that many sequences are chained
    sub = rng.uniform(0, 4, size=(400, n - 1))[:, ::-1].cumsum(axis=-1)[:, ::-1]  # decreasing along the chain
    band = np.zeros((400, n, n))
    band[:, np.arange(1, n), np.arange(n - 1)] = sub
    s = rng.normal(0, 0.5, size=(400, n, n))
    s = s + np.swapaxes(s, -1, -2) + band + np.swapaxes(band, -1, -2)
    w = s - 1e5 * np.eye(n) if masked else s
    chained, falling = predecessor_chains(s, w)
    assert chained.sum() >= 5
    assert (falling[chained]).all()


def test_separate_rate_is_one_over_n_and_shared_matches_the_formula():
    rng = np.random.default_rng(2)
    T, n, d, dk = 1500, 8, 16, 4
    x = rng.normal(size=(T, n, d))
    w_q, w_k = rng.normal(size=(T, d, dk)), rng.normal(size=(T, d, dk))
    sep = argmax_offset_rate(qk_scores(x, w_q, w_k), 0)
    assert abs(sep.mean() - 1 / n) < 4 * sep.std() / math.sqrt(T)
    w = rng.normal(size=(d, dk))
    shared = argmax_offset_rate(qk_scores(x, w), 0)
    theory = diagonal_max_probability(w, n, rng, 40_000)
    assert abs(shared.mean() - theory) < 4 * shared.std() / math.sqrt(T) + 0.01


def test_one_dimensional_head_has_at_most_two_diagonal_winners():
    rng = np.random.default_rng(6)
    x, w = rng.normal(size=(400, 8, 5)), rng.normal(size=(5, 1))
    a = (x @ w)[..., 0]
    wins = argmax_offset_rate(qk_scores(x, w), 0) * 8
    np.testing.assert_array_equal(wins, (a.max(axis=-1) > 0).astype(int) + (a.min(axis=-1) < 0))


def test_diagonal_max_probability_special_cases():
    rng = np.random.default_rng(3)
    # d_k = 1: row i peaks on the diagonal iff a_i is the largest and positive or the smallest and negative
    assert abs(diagonal_max_probability(np.ones((5, 1)), 8, rng, 50_000) - (2 - 2.0**-7) / 8) < 0.01
    assert diagonal_max_probability(np.eye(64)[:, :64], 2, rng, 2000) > 0.999
    with pytest.raises(ValueError, match="n"):
        diagonal_max_probability(np.eye(3), 1, rng)
    with pytest.raises(ValueError, match="w"):
        diagonal_max_probability(np.ones((2, 2, 3, 4)), 4, rng)


def test_diagonal_max_probability_of_a_stack_is_each_matrix_own():
    # one estimate per matrix of a stack, each the same law as the single-matrix call
    rng = np.random.default_rng(4)
    ws = np.stack([np.ones((5, 3)), np.eye(5)[:, :3]])  # the first has rank 1: the d_k = 1 law
    p = diagonal_max_probability(ws, 8, rng, 40_000)
    assert p.shape == (2,)
    assert abs(p[0] - (2 - 2.0**-7) / 8) < 0.01
    assert abs(p[1] - diagonal_max_probability(ws[1], 8, rng, 40_000)) < 0.01
    assert abs(p[0] - p[1]) > 0.1


# ---------------------------------------------------------------- self-mask and the layer


def test_self_mask_follows_the_reformer_rule():
    m = self_mask(5)
    assert not np.diag(m).any() and m.sum() == 20
    c = self_mask(5, causal=True)
    assert c[0, 0] and not np.diag(c)[1:].any()
    np.testing.assert_array_equal(c[1:], np.tril(np.ones((5, 5), bool), -1)[1:])
    assert self_mask(1)[0, 0]  # a single token has nothing else to attend to


def test_qk_attention_layer_matches_the_library_and_counts_the_saving():
    rng = np.random.default_rng(4)
    n, d, h = 10, 12, 3
    x, params = rng.normal(size=(2, n, d)), init_mha_params(rng, d, h)
    ref, w_ref = self_attention_layer(x, params, h)
    out, w = qk_attention_layer(x, params, h)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)
    with count_macs() as sep:
        qk_attention_layer(x[0], params, h)
    with count_macs() as sh:
        out_sh, w_sh = qk_attention_layer(x[0], {k: v for k, v in params.items() if k != "W_k"}, h, share_qk=True)
    assert sep.macs - sh.macs == n * d * d and sep.products - sh.products == 1
    # every product runs through counted_matmul, the core's Q Kᵀ and A V included (none is recorded by formula)
    assert sep.products == 6 and sep.macs == 4 * n * d * d + 2 * n * n * d
    same = dict(params, W_k=params["W_q"])
    np.testing.assert_allclose(out_sh, qk_attention_layer(x[0], same, h)[0], rtol=1e-12)
    _, w_masked = qk_attention_layer(x[0], same, h, share_qk=True, mask=self_mask(n))
    assert np.all(np.diagonal(w_masked, axis1=-2, axis2=-1) == 0)
    with pytest.raises(ValueError, match="W_k"):
        qk_attention_layer(x, {k: v for k, v in params.items() if k != "W_k"}, h)


# ---------------------------------------------------------------- factorisation


@pytest.mark.parametrize("d,dk", [(5, 1), (6, 2), (7, 3), (6, 6)])
def test_factorization_rank_equals_the_manifold_dimension(d, dk):
    rng = np.random.default_rng(d * 10 + dk)
    w_q, w_k = rng.normal(size=(d, dk)), rng.normal(size=(d, dk))
    assert factorization_rank(w_q, w_k) == dk * (2 * d - dk)
    assert factorization_rank(w_q) == d * dk - dk * (dk - 1) // 2


def test_a_rank_dk_form_factors_through_its_svd_and_its_symmetric_part_is_nearest():
    """Chapter 8, prop-ch8-rank: any rank-d_k form is W_q W_kᵀ (thin SVD), of rank d_k; the nearest
    symmetric matrix is ½(M + Mᵀ), at Frobenius distance ½‖M − Mᵀ‖ (moved from the chapter: identities)."""
    rng = np.random.default_rng(11)
    d, dk = 12, 4
    w_q, w_k = rng.normal(size=(d, dk)), rng.normal(size=(d, dk))
    assert np.linalg.matrix_rank(w_q @ w_k.T) == dk
    m = rng.normal(size=(d, dk)) @ rng.normal(size=(dk, d))
    u, sv, vt = np.linalg.svd(m)
    np.testing.assert_allclose((u[:, :dk] * np.sqrt(sv[:dk])) @ (vt[:dk].T * np.sqrt(sv[:dk])).T, m, atol=1e-10)
    sym = 0.5 * (m + m.T)
    assert np.linalg.norm(m - sym) == pytest.approx(0.5 * np.linalg.norm(m - m.T), rel=1e-12)
    for _ in range(20):  # no other symmetric matrix (a shared projection's W Wᵀ included) comes closer
        w = rng.normal(size=(d, dk))
        assert np.linalg.norm(m - w @ w.T) >= np.linalg.norm(m - sym)


def test_an_indefinite_symmetric_form_breaks_cauchy_schwarz_with_x_and_minus_x():
    """Chapter 8, prop-ch8-psd: symmetry alone gives no self-preference; x, −x with xMxᵀ < 0 peak off the diagonal."""
    rng = np.random.default_rng(12)
    w = rng.normal(size=(6, 4))
    m = w @ np.diag([1.0, 1.0, -1.0, -1.0]) @ w.T
    x = np.linalg.eigh(m)[1][:, 0]  # eigenvector of the most negative eigenvalue: xMxᵀ < 0
    z = np.stack([x, -x]) @ m @ np.stack([x, -x]).T
    assert z[0, 0] < 0 and z[0, 1] > max(z[0, 0], z[1, 1])
    assert argmax_offset_rate(z, 0) == 0.0
    z_psd = np.stack([x, -x]) @ (w @ w.T) @ np.stack([x, -x]).T  # the shared (PSD) form on the same tokens
    assert argmax_offset_rate(z_psd, 0) == 1.0


def test_factorization_rank_validates():
    with pytest.raises(ValueError, match="w_k"):
        factorization_rank(np.ones((4, 2)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="w_q"):
        factorization_rank(np.ones((2, 4, 2)))


# ---------------------------------------------------------------- harness pieces


def test_dot_score_no_self_removes_the_diagonal_and_is_differentiable():
    rng = np.random.default_rng(5)
    q = rng.normal(size=(2, 3, 1, 4, 5))
    s = dot_score_no_self(q, q, {})
    np.testing.assert_allclose(np.diagonal(s, axis1=-2, axis2=-1), np.einsum("...nd,...nd->...n", q, q) - SELF_PENALTY)
    g = autograd.grad(lambda z: dot_score_no_self(z, z, {}).sum())(q)
    np.testing.assert_allclose(g, 2 * q.sum(axis=-2, keepdims=True) * np.ones_like(q), rtol=1e-12)
    with pytest.raises(ValueError, match="n_q"):
        dot_score_no_self(q, q[..., :3, :], {})


def test_registered_no_self_score_gives_zero_self_weight_except_when_alone():
    register_score("test_no_self", dot_score_no_self, overwrite=True)
    try:
        task = previous_token_task(n=5, vocab=4)
        x = task.sample(0, 3).x
        for causal in (False, True):
            cfg = ModelConfig(d_model=8, share_qk=True, score="test_no_self", causal=causal)
            w = attention_weights(init_params(cfg, task, [0, 1]), cfg, task, x)[0]
            diag = np.diagonal(w, axis1=-2, axis2=-1)
            assert np.all(diag[..., 1:] == 0)
            assert np.all(diag[..., 0] == (1.0 if causal else 0.0))
            np.testing.assert_allclose(w.sum(axis=-1), 1.0)
    finally:
        SCORES.pop("test_no_self", None)


def test_cyclic_previous_token_task():
    task = cyclic_previous_token_task(n=5, vocab=3)
    b = task.sample(7, 4)
    assert b.x.shape == b.y.shape == (4, 5) and task.per_position
    np.testing.assert_array_equal(b.y[:, 0], b.x[:, -1])
    np.testing.assert_array_equal(b.y[:, 1:], b.x[:, :-1])
    np.testing.assert_array_equal(task.sample(7, 4).x, b.x)
    with pytest.raises(ValueError, match="n"):
        cyclic_previous_token_task(n=2)


def test_first_layer_queries_reproduce_the_shared_scores():
    task = previous_token_task(n=6, vocab=5)
    cfg = ModelConfig(d_model=8, n_heads=2, share_qk=True, scale="none")
    params = init_params(cfg, task, [0, 3])
    x = task.sample(1, 4).x
    q = first_layer_queries(params, cfg, task, x)
    assert q.shape == (2, 4, 2, 6, 4)
    s = q @ np.swapaxes(q, -1, -2)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(
        e / e.sum(axis=-1, keepdims=True), attention_weights(params, cfg, task, x)[0], rtol=1e-10, atol=1e-12
    )
