"""Unit and property tests for attn_utils.experiments.ch06_bottleneck (chapter 6)."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import harness as hz
from attn_utils.experiments.ch06_bottleneck import (
    bag_accuracy_bound,
    copy_tokens,
    exact_positions,
    fano_bits,
    ids_to_words,
    keyword_attention_mass,
    keyword_vocabulary,
    linear_code_init,
    linear_code_logits,
    linear_code_loss_and_grad,
    pack_tokens,
    pick_learning_rate,
    position_accuracy,
    relative_loss_drop,
    superposition_copy_accuracy,
    tokens_per_coordinate,
    train_linear_code,
    unpack_tokens,
    with_uniform_attention,
    words_to_ids,
)

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- bit budget


def test_tokens_per_coordinate_matches_significand_bits():
    assert tokens_per_coordinate(8, "float32") == 8  # 24 bits / 3
    assert tokens_per_coordinate(8, "float64") == 17  # floor(53 / 3)
    assert tokens_per_coordinate(2, "float64") == 53
    assert tokens_per_coordinate(10, "float32") == 7  # 10**7 ≤ 2**24 < 10**8
    assert tokens_per_coordinate(2**25, "float32") == 0


@PROPS
@given(
    st.integers(2, 16),
    st.integers(1, 40),
    st.integers(1, 4),
    st.sampled_from(["float32", "float64"]),
    st.integers(0, 2**31),
)
def test_pack_round_trip_is_exact_on_the_stored_prefix(vocab, m, d, dtype, seed):
    s = np.random.default_rng(seed).integers(0, vocab, size=(5, m))
    z = pack_tokens(s, vocab, d, dtype)
    assert z.shape == (5, d) and z.dtype == np.dtype(dtype)
    out = unpack_tokens(z, vocab, m, guess=1 % vocab)
    keep = min(m, d * tokens_per_coordinate(vocab, dtype))
    np.testing.assert_array_equal(out[:, :keep], s[:, :keep])
    assert (out[:, keep:] == 1 % vocab).all()


def test_pack_uses_the_largest_exact_integers():
    s = np.full((1, 8), 7)  # 8**8 − 1 = 2**24 − 1, the largest stored value
    z = pack_tokens(s, 8, 1, "float32")
    assert float(z[0, 0]) == 2.0**24 - 1


def test_pack_validates():
    with pytest.raises(ValueError, match="tokens must lie in"):
        pack_tokens(np.array([[0, 8]]), 8, 1)
    with pytest.raises(ValueError, match=r"shape \(batch, m\)"):
        pack_tokens(np.array([0, 1]), 8, 1)
    with pytest.raises(TypeError, match="integer tokens"):
        pack_tokens(np.array([[0.5]]), 8, 1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        pack_tokens(np.array([[0]]), 8, 1, "int32")
    with pytest.raises(ValueError, match="guess"):
        unpack_tokens(np.zeros((1, 1), np.float32), 8, 3, guess=8)


def test_fano_bits_endpoints_and_monotone():
    assert fano_bits(1.0, 8) == pytest.approx(3.0)
    assert fano_bits(1 / 8, 8) == 0.0
    assert fano_bits(0.0, 8) == 0.0
    p = np.linspace(1 / 8, 1, 50)
    assert np.all(np.diff(fano_bits(p, 8)) > 0)
    # binary case: I ≥ 1 − h(p)
    assert fano_bits(0.9, 2) == pytest.approx(1 + 0.9 * math.log2(0.9) + 0.1 * math.log2(0.1))


@PROPS
@given(st.integers(2, 8), st.integers(0, 2**31))
def test_fano_bits_below_the_true_information_of_a_symmetric_channel(vocab, seed):
    # symmetric channel: correct with prob p, else uniform over the other V−1 symbols: Fano is tight
    p = np.random.default_rng(seed).uniform(1 / vocab, 1)
    e = 1 - p
    info = math.log2(vocab) + p * math.log2(p) + (e * math.log2(e / (vocab - 1)) if e > 0 else 0)
    assert fano_bits(p, vocab) == pytest.approx(info, abs=1e-12)


def test_fano_bits_validates():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fano_bits(1.5, 8)
    with pytest.raises(ValueError, match="vocab must be >= 2"):
        fano_bits(0.5, 1)


# ---------------------------------------------------------------- order blindness and the linear code


def test_bag_bound_small_cases():
    assert bag_accuracy_bound(np.array([[0, 0, 0, 0]]), 4) == 1.0
    assert bag_accuracy_bound(np.array([[0, 1, 2, 3]]), 4) == 0.25
    assert bag_accuracy_bound(np.array([[0, 0, 1, 2], [3, 3, 3, 1]]), 4) == pytest.approx((0.5 + 0.75) / 2)


def test_bag_bound_is_attained_by_most_frequent_token_guess():
    # enumerate every ordering of one multiset: guessing the mode everywhere scores exactly max count / m
    from itertools import permutations

    base = (0, 0, 1, 2)
    perms = np.array(sorted(set(permutations(base))))
    guess_acc = (perms == 0).mean()
    assert guess_acc == pytest.approx(bag_accuracy_bound(perms, 3))


def test_superposition_accuracy_depends_on_d_over_m():
    a = superposition_copy_accuracy(0, 4, 32, 8, batch=4000)
    b = superposition_copy_accuracy(1, 16, 128, 8, batch=4000)
    assert abs(a - b) < 0.04
    assert superposition_copy_accuracy(2, 16, 32, 8) < a - 0.2
    assert superposition_copy_accuracy(3, 2, 256, 8) == 1.0


# ---------------------------------------------------------------- keyword toy

TASK = hz.keyword_task(n=6)


def test_vocabulary_and_round_trip():
    vocab = keyword_vocabulary(TASK)
    assert len(vocab) == TASK.vocab_size and vocab[-1] == "[CLS]" and vocab[16] == "love" and vocab[20] == "hate"
    ids = words_to_ids(["I", "hate", "this", "movie", "."], TASK)
    assert ids.tolist()[-1] == TASK.vocab_size - 1
    assert ids_to_words(ids, TASK) == ["I", "hate", "this", "movie", ".", "[CLS]"]


def test_words_to_ids_validates():
    with pytest.raises(ValueError, match="n − 1 = 5"):
        words_to_ids(["I", "hate"], TASK)
    with pytest.raises(ValueError, match="exactly one keyword"):
        words_to_ids(["I", "hate", "this", "great", "."], TASK)
    with pytest.raises(ValueError, match="unknown words"):
        words_to_ids(["I", "loathe", "this", "movie", "."], TASK)
    with pytest.raises(TypeError, match="keyword_task"):
        keyword_vocabulary(hz.copy_task(3))


def test_keyword_mass_picks_last_row_and_averages_heads():
    w = np.zeros((2, 3, 2, 4, 4))
    w[..., -1, 1] = 1.0  # every head of every example puts all last-row mass on position 1
    w[:, :, 1, -1, :] = 0.25  # ... except head 1, which is uniform
    mass = keyword_attention_mass(w, np.array([1, 1, 2]))
    np.testing.assert_allclose(mass, [[0.625, 0.625, 0.125]] * 2)
    with pytest.raises(ValueError, match=r"shape \(S, batch, H, n, n\)"):
        keyword_attention_mass(w[0], np.array([1, 1, 2]))
    with pytest.raises(ValueError, match="keyword_pos must have shape"):
        keyword_attention_mass(w, np.array([1, 1]))


def test_uniform_attention_gives_uniform_rows_and_keeps_other_params():
    cfg = hz.ModelConfig(d_model=8)
    params = hz.init_params(cfg, TASK, seeds=[0, 1])
    flat = with_uniform_attention(params, cfg)
    x = TASK.sample(0, 5).x
    w = hz.attention_weights(flat, cfg, TASK, x)[0]
    np.testing.assert_allclose(w, 1 / TASK.seq_len)
    assert not np.allclose(hz.attention_weights(params, cfg, TASK, x)[0], 1 / TASK.seq_len)
    assert all(np.array_equal(flat[k], params[k]) for k in params if not k.endswith("W_q"))
    with pytest.raises(ValueError, match="encoder must be 'attention'"):
        with_uniform_attention(params, hz.ModelConfig(d_model=8, encoder="mean_pool"))


# ---------------------------------------------------------------- convergence


def test_relative_loss_drop_flat_halving_and_rising():
    steps = np.arange(100)
    flat = np.full(100, 0.7)
    halving = np.where(steps < 50, 1.0, 0.5)  # second half at half the level of the first
    rising = np.where(steps < 50, 1.0, 1.25)
    out = relative_loss_drop(np.stack([flat, halving, rising], axis=1), window=10)
    np.testing.assert_allclose(out, [0.0, 0.5, -0.25])


def test_relative_loss_drop_uses_the_ends_of_each_half():
    loss = np.ones((40, 1))
    loss[:10] = 100.0  # an early transient outside both windows is ignored
    loss[-5:] = 0.5
    assert relative_loss_drop(loss, window=5)[0] == pytest.approx(0.5)


def test_relative_loss_drop_validates():
    with pytest.raises(ValueError, match=r"shape \(steps, S\)"):
        relative_loss_drop(np.ones(10), 2)
    with pytest.raises(ValueError, match="window must be <= steps // 2 = 5"):
        relative_loss_drop(np.ones((10, 2)), 6)
    with pytest.raises(ValueError, match="finite"):
        relative_loss_drop(np.array([[1.0], [np.nan], [1.0], [1.0]]), 1)


# ---------------------------------------------------------------- the learned linear code


def test_copy_tokens_are_the_harness_copy_task_tokens():
    task = hz.copy_task(5, 8)
    xs, _ = hz.step_batches(task, (3, 9), 7, 4)  # (steps, S, B, n)
    ours = copy_tokens((3, 9), 1, 28, 5, 8).reshape(2, 7, 4, 5).swapaxes(0, 1)
    np.testing.assert_array_equal(xs[..., :5], ours)
    held = hz.seed_batches(task, (3, 9), 2, 50)
    np.testing.assert_array_equal(held.x[..., :5], copy_tokens((3, 9), 2, 50, 5, 8))


def test_linear_code_init_is_a_random_code_read_by_matched_filter():
    p = linear_code_init([4, 11], m=3, vocab=5, d=64)
    assert p["C"].shape == (2, 15, 64) and p["D"].shape == (2, 64, 15) and p["b"].shape == (2, 1, 15)
    np.testing.assert_array_equal(p["D"], p["C"].transpose(0, 2, 1))
    assert not p["b"].any()
    assert np.mean(np.sum(p["C"] ** 2, axis=-1)) == pytest.approx(1.0, abs=0.1)  # N(0, 1/d) entries: unit norm
    np.testing.assert_array_equal(linear_code_init([11], 3, 5, 64)["C"][0], p["C"][1])  # per seed, not per call


def test_linear_code_logits_sum_one_vector_per_position_and_token():
    rng = np.random.default_rng(0)
    p = linear_code_init([0], m=3, vocab=4, d=5)
    p = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in p.items()}
    s = rng.integers(0, 4, size=(1, 6, 3))
    logits = linear_code_logits(p, s, 4)
    for b in range(6):
        z = sum(p["C"][0, j * 4 + s[0, b, j]] for j in range(3))
        expected = (z @ p["D"][0] + p["b"][0, 0]).reshape(3, 4)
        np.testing.assert_allclose(logits[0, b], expected, rtol=1e-12, atol=1e-12)


def test_linear_code_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    p = linear_code_init([1, 2], m=3, vocab=4, d=5)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    s = rng.integers(0, 4, size=(2, 6, 3))
    loss, grads = linear_code_loss_and_grad(p, s, 4)
    logits = linear_code_logits(p, s, 4)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(loss, -np.take_along_axis(logp, s[..., None], -1).mean(axis=(1, 2, 3)), rtol=1e-12)
    for k in p:
        num = np.zeros_like(p[k])
        for idx in np.ndindex(p[k].shape):
            for sign in (1, -1):
                q = {kk: v.copy() for kk, v in p.items()}
                q[k][idx] += sign * 1e-6
                num[idx] += sign * linear_code_loss_and_grad(q, s, 4)[0].sum() / 2e-6
        np.testing.assert_allclose(grads[k], num, atol=1e-8, rtol=1e-6)


def test_train_linear_code_first_step_is_adam_and_rates_do_not_interact():
    two = train_linear_code(
        3, 4, 5, seeds=[0, 1], lrs=[0.05, 0.001], steps=3, batch_size=8, eval_size=16, n_checkpoints=3
    )
    assert two.loss.shape == (3, 2, 2) and two.accuracy.shape == (2, 2) and two.curve.shape == (3, 2, 2)
    np.testing.assert_array_equal(two.checkpoints, [1, 2, 3])
    for i, lr in enumerate((0.05, 0.001)):
        one = train_linear_code(3, 4, 5, seeds=[0, 1], lrs=lr, steps=3, batch_size=8, eval_size=16, n_checkpoints=3)
        np.testing.assert_allclose(two.loss[:, i], one.loss[:, 0], rtol=1e-12)
        for k in one.params:
            np.testing.assert_allclose(two.params[k][i], one.params[k][0], rtol=1e-12, atol=1e-15)
    # Adam's first step moves every parameter with a non-zero gradient by lr·g/(|g| + 1e-8) ≈ ±lr
    first = train_linear_code(3, 4, 5, seeds=[0], lrs=0.01, steps=1, batch_size=8, eval_size=16, n_checkpoints=1)
    start = linear_code_init([0], 3, 4, 5)
    s = copy_tokens([0], 1, 8, 3, 4)
    _, g = linear_code_loss_and_grad(start, s, 4)
    for k in start:
        expected = start[k] - 0.01 * g[k] / (np.abs(g[k]) + 1e-8)
        np.testing.assert_allclose(first.params[k][0], expected, rtol=1e-10, atol=1e-12)


def test_train_linear_code_learns_a_short_copy_and_beats_the_random_start():
    run = train_linear_code(2, 8, 8, seeds=[0, 1], lrs=0.1, steps=200, batch_size=32, eval_size=256, n_checkpoints=4)
    assert run.accuracy.min() == 1.0
    assert np.all(np.diff(run.curve[:, 0].mean(axis=1)) >= -0.01)


def test_train_linear_code_in_float32_stays_float32_and_follows_the_float64_run():
    kwargs = dict(seeds=[0, 1], lrs=[0.03, 0.1], steps=50, batch_size=16, eval_size=64, n_checkpoints=2)
    run32 = train_linear_code(4, 8, 4, dtype="float32", **kwargs)
    run64 = train_linear_code(4, 8, 4, **kwargs)
    for k in run32.params:  # a float64 learning rate or one-hot would silently promote the whole run
        assert run32.params[k].dtype == np.float32 and run64.params[k].dtype == np.float64
        # 50 Adam steps of rounding at float32's 6e-8: far below the parameters' O(0.1) movement
        np.testing.assert_allclose(run32.params[k], run64.params[k], atol=2e-4)
    np.testing.assert_allclose(run32.loss, run64.loss, rtol=1e-4)


def test_train_linear_code_validates():
    with pytest.raises(ValueError, match="n_checkpoints"):
        train_linear_code(2, 4, 4, [0], 0.1, steps=3, n_checkpoints=4)
    with pytest.raises(ValueError, match="lrs"):
        train_linear_code(2, 4, 4, [0], [0.1, -1.0], steps=3, n_checkpoints=1)
    with pytest.raises(ValueError, match="seeds"):
        train_linear_code(2, 4, 4, [0, 0], 0.1, steps=3, n_checkpoints=1)
    with pytest.raises(ValueError, match="dtype"):
        train_linear_code(2, 4, 4, [0], 0.1, steps=3, n_checkpoints=1, dtype="float16")


def test_pick_learning_rate_best_accuracy_then_lower_loss():
    lrs = (0.01, 0.03, 0.1)
    acc = np.array([[0.9, 0.9], [1.0, 1.0], [1.0, 1.0]])
    loss = np.array([[0.5, 0.5], [0.2, 0.2], [0.1, np.nan]])  # a diverged seed counts as infinite loss
    assert pick_learning_rate(lrs, acc, loss) == 1
    assert pick_learning_rate(lrs, acc, np.array([[0.5, 0.5], [0.2, 0.2], [0.1, 0.1]])) == 2
    assert pick_learning_rate(lrs, np.array([[0.5, 0.7], [0.6, 0.5], [0.2, 0.2]]), np.ones((3, 2))) == 0
    with pytest.raises(ValueError, match="shape"):
        pick_learning_rate(lrs, acc[:2], loss[:2])


def test_position_accuracy_averages_to_the_run_accuracy():
    run = train_linear_code(4, 8, 2, seeds=[0, 1], lrs=[0.03, 0.1], steps=150, eval_size=128, n_checkpoints=2)
    for rate in (0, 1):
        per = position_accuracy(run, rate)
        assert per.shape == (2, 4)
        np.testing.assert_allclose(per.mean(axis=1), run.accuracy[rate], rtol=1e-12)
    with pytest.raises(ValueError, match="rate"):
        position_accuracy(run, 2)
    with pytest.raises(TypeError, match="CodeRun"):
        position_accuracy(object())


# ---------------------------------------------------------------- exact copying (proposition prop-ch6-linear)


def _exact_by_enumeration(params, vocab):
    """Positions decoded correctly, as the unique largest logit, on every one of the vocab**m inputs."""
    m = params["C"].shape[1] // vocab
    every = np.array(list(itertools.product(range(vocab), repeat=m)))
    logits = linear_code_logits(params, np.broadcast_to(every, (params["C"].shape[0],) + every.shape), vocab)
    target = np.take_along_axis(logits, every[None, :, :, None], axis=-1)[..., 0]
    rivals = np.where(np.arange(vocab) == every[None, :, :, None], -np.inf, logits).max(axis=-1)
    return (target > rivals).all(axis=1)


def _code_copying_first_positions(m, vocab, d, noise, seed):
    """A code whose first min(d, m) positions are copied exactly (plus noise): c[j, t] = t·e_j, D_i reads e_i."""
    rng = np.random.default_rng(seed)
    C = np.zeros((m * vocab, d))
    D = np.zeros((d, m * vocab))
    for j in range(min(d, m)):
        C[j * vocab : (j + 1) * vocab, j] = np.arange(vocab)
        D[j, j * vocab : (j + 1) * vocab] = 2 * np.arange(vocab)
    b = np.zeros((1, m * vocab))
    for j in range(min(d, m)):
        b[0, j * vocab : (j + 1) * vocab] = -(np.arange(vocab) ** 2)  # logit_t = 2·t·x − t², largest at t = x
    p = {"C": C[None], "D": D[None], "b": b[None]}
    return {k: v + noise * rng.standard_normal(v.shape) for k, v in p.items()}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("m", "vocab", "d"), [(3, 3, 2), (4, 2, 2), (3, 4, 3), (5, 2, 1)])
def test_exact_positions_agrees_with_enumerating_every_input(m, vocab, d, seed):
    rng = np.random.default_rng(seed)
    random = linear_code_init([seed, seed + 50], m, vocab, d)
    random = {k: v * rng.uniform(0.5, 3) + rng.standard_normal(v.shape) for k, v in random.items()}
    built = _code_copying_first_positions(m, vocab, d, noise=0.05 * seed, seed=seed)
    for params in (random, built):
        np.testing.assert_array_equal(exact_positions(params, vocab), _exact_by_enumeration(params, vocab))
    assert exact_positions(built, vocab)[0].sum() >= (min(d, m) if seed == 0 else 0)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 4), st.integers(2, 4), st.integers(1, 3), st.floats(0.0, 0.5), st.integers(0, 10_000))
def test_no_linear_code_copies_more_than_d_positions_exactly(m, vocab, d, noise, seed):
    """prop-ch6-linear: at most d positions exact, also for codes built to copy as many as they can."""
    params = _code_copying_first_positions(m, vocab, d, noise, seed)
    exact = exact_positions(params, vocab)
    assert exact.sum() <= d
    np.testing.assert_array_equal(exact, _exact_by_enumeration(params, vocab))
    if noise == 0:
        assert exact.sum() == min(d, m)  # the bound is attained


def test_exact_positions_validates():
    p = linear_code_init([0], 2, 3, 2)
    with pytest.raises(ValueError, match="params"):
        exact_positions({**p, "D": p["D"][:, :1]}, 3)
    with pytest.raises(ValueError, match="multiple"):
        exact_positions(p, 4)


def test_mean_pool_without_positions_is_permutation_invariant():
    """Proposition 'mean pooling cannot see order': the harness's mean pool with positional="none"
    gives the same logits for every ordering of the input tokens (here for an untrained model)."""
    task = hz.copy_task(3, 8)
    cfg = hz.ModelConfig(d_model=16, encoder="mean_pool", positional="none")
    params = hz.init_params(cfg, task, (0, 1))
    x = task.sample(np.random.default_rng(0), 64).x
    perm = np.random.default_rng(1).permutation(x.shape[-1])
    np.testing.assert_allclose(
        hz.forward(params, cfg, task, x), hz.forward(params, cfg, task, x[:, perm]), atol=1e-9, rtol=1e-9
    )
