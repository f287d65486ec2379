"""Unit and property tests for attn_utils.experiments.ch06_bottleneck (chapter 6)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import harness as hz
from attn_utils.experiments.ch06_bottleneck import (
    bag_accuracy_bound,
    fano_bits,
    ids_to_words,
    keyword_attention_mass,
    keyword_vocabulary,
    pack_tokens,
    relative_loss_drop,
    superposition_copy_accuracy,
    tokens_per_coordinate,
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
