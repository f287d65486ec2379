"""Unit and property tests for attn_utils.experiments.ch10_decoding (chapter 10)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.experiments.ch10_decoding import (
    COST_PARTS,
    KVCache,
    calls_only,
    decoder_extend,
    decoder_forward,
    decoding_macs,
    greedy_generate,
    init_decoder_params,
    kv_cache_values,
    products_only,
)

PROPS = settings(max_examples=25, deadline=None, derandomize=True, database=None)
TOL = dict(rtol=0, atol=1e-12)


def small(seed=0, **kw):
    cfg = dict(vocab=11, d_model=12, h=3, n_layers=2, d_ff=20, max_len=24)
    cfg.update(kw)
    return init_decoder_params(np.random.default_rng(seed), **cfg)


def prefix_by_prefix(params, tokens):
    """Reference: logits at t from a pass over tokens[..., :t+1] alone."""
    n = tokens.shape[-1]
    return np.stack([decoder_forward(params, tokens[..., : t + 1])[..., -1, :] for t in range(n)], axis=-2)


# ---------------------------------------------------------------- parallel = step by step


@pytest.mark.parametrize("n_layers,h,batch", [(1, 1, ()), (2, 3, ()), (3, 2, (2,)), (2, 4, (2, 3))])
def test_parallel_causal_pass_equals_prefix_by_prefix(n_layers, h, batch):
    params = small(1, n_layers=n_layers, h=h)
    tokens = np.random.default_rng(2).integers(0, params.vocab, (*batch, 9))
    out = decoder_forward(params, tokens)
    assert out.shape == (*batch, 9, params.vocab)
    np.testing.assert_allclose(out, prefix_by_prefix(params, tokens), **TOL)


def test_future_tokens_do_not_change_past_logits_only_with_mask():
    params = small(3)
    rng = np.random.default_rng(4)
    a = rng.integers(0, params.vocab, 10)
    b = a.copy()
    b[6:] = (b[6:] + 1) % params.vocab
    np.testing.assert_allclose(decoder_forward(params, a)[:6], decoder_forward(params, b)[:6], **TOL)
    leak = np.abs(decoder_forward(params, a, causal=False)[:6] - decoder_forward(params, b, causal=False)[:6])
    assert leak.min(axis=-1).max() > 1e-6  # without the mask, earlier logits see the change


def test_without_mask_parallel_differs_from_step_by_step():
    tokens = np.random.default_rng(6).integers(0, 11, 8)
    one = small(5, n_layers=1)
    diff = np.abs(decoder_forward(one, tokens, causal=False) - prefix_by_prefix(one, tokens))
    assert diff[-1].max() < 1e-12  # one layer: the last position sees the same inputs either way
    assert diff[0].max() > 1e-3
    two = small(5, n_layers=2)
    diff = np.abs(decoder_forward(two, tokens, causal=False) - prefix_by_prefix(two, tokens))
    assert diff[-1].max() > 1e-3  # two layers: its inputs from layer 1 saw later tokens


# ---------------------------------------------------------------- KV cache


@pytest.mark.parametrize("batch", [(), (3,)])
def test_cached_steps_equal_parallel_pass(batch):
    params = small(7)
    tokens = np.random.default_rng(8).integers(0, params.vocab, (*batch, 12))
    cache = KVCache(params, batch)
    steps = np.concatenate([decoder_extend(params, tokens[..., t : t + 1], cache) for t in range(12)], axis=-2)
    assert cache.length == 12
    np.testing.assert_allclose(steps, decoder_forward(params, tokens), **TOL)


@given(n=st.integers(1, 16), cuts=st.lists(st.integers(1, 15), max_size=4), seed=st.integers(0, 2**16))
@PROPS
def test_prop_any_chunking_of_the_prefill_equals_parallel(n, cuts, seed):
    params = small(seed % 7)
    tokens = np.random.default_rng(seed).integers(0, params.vocab, n)
    bounds = sorted({0, n, *(c for c in cuts if c < n)})
    cache = KVCache(params, capacity=n)
    chunks = [decoder_extend(params, tokens[a:b], cache) for a, b in zip(bounds[:-1], bounds[1:])]
    np.testing.assert_allclose(np.concatenate(chunks, axis=-2), decoder_forward(params, tokens), **TOL)


def test_cache_stores_the_parallel_keys():
    params = small(9)
    tokens = np.random.default_rng(10).integers(0, params.vocab, 7)
    cache = KVCache(params)
    for t in range(7):
        decoder_extend(params, tokens[t : t + 1], cache)
    # layer-0 keys are a position-wise function of the embeddings: recompute them directly
    x = params.embed[tokens] + params.pos[:7]
    a = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    k = (a @ params.layers[0]["W_k"]).reshape(7, params.h, params.d_k).transpose(1, 0, 2)
    np.testing.assert_allclose(cache.keys[0][:, :7], k, **TOL)


@pytest.mark.parametrize("batch_prompt", [(5,), (2, 5)])
def test_greedy_with_cache_equals_recompute(batch_prompt):
    params = small(11)
    prompt = np.random.default_rng(12).integers(0, params.vocab, batch_prompt)
    t_cache, l_cache = greedy_generate(params, prompt, 15)
    t_full, l_full = greedy_generate(params, prompt, 15, use_cache=False)
    assert t_cache.shape == (*batch_prompt[:-1], 20) and l_cache.shape == (*batch_prompt[:-1], 15, params.vocab)
    np.testing.assert_array_equal(t_cache, t_full)
    np.testing.assert_allclose(l_cache, l_full, **TOL)
    np.testing.assert_array_equal(t_cache[..., :5], prompt)
    np.testing.assert_array_equal(t_cache[..., 5:], np.argmax(l_cache, axis=-1))
    # the parallel pass over the finished sequence reproduces every step's logits (verification)
    np.testing.assert_allclose(decoder_forward(params, t_cache[..., :-1])[..., 4:, :], l_cache, **TOL)


def test_greedy_batch_equals_each_sequence():
    params = small(13)
    prompts = np.random.default_rng(14).integers(0, params.vocab, (3, 4))
    tokens, logits = greedy_generate(params, prompts, 6)
    for b in range(3):
        t1, l1 = greedy_generate(params, prompts[b], 6)
        np.testing.assert_array_equal(tokens[b], t1)
        np.testing.assert_allclose(logits[b], l1, **TOL)


def test_greedy_can_fill_max_len_exactly():
    params = small(15, max_len=8)
    tokens, _ = greedy_generate(params, np.array([1, 2, 3]), 6)  # feeds 3 + 6 − 1 = 8 positions
    assert tokens.shape == (9,)
    with pytest.raises(ValueError, match="exceeds max_len=8"):
        greedy_generate(params, np.array([1, 2, 3]), 7)


# ---------------------------------------------------------------- MAC counts


def test_counted_macs_match_formula_forward_and_extend():
    params = small(16, d_model=12, h=3, d_ff=20)
    tokens = np.random.default_rng(17).integers(0, params.vocab, (2, 9))
    counter = {}
    decoder_forward(params, tokens, counter=counter)
    formula = decoding_macs(params, 9, 9, batch=2)
    assert counter == {k: formula[k] for k in COST_PARTS}
    cache = KVCache(params, (2,))
    decoder_extend(params, tokens[:, :4], cache)
    counter = {}
    decoder_extend(params, tokens[:, 4:5], cache, counter=counter)
    formula = decoding_macs(params, 1, 5, batch=2)
    assert counter == {k: formula[k] for k in COST_PARTS}


def test_formula_by_hand_for_one_configuration():
    params = small(18, d_model=12, h=3, d_ff=20, vocab=11, n_layers=2)  # d_k = d_v = 4
    f = decoding_macs(params, 1, 10)
    assert f["projections"] == 8 * 12 * 12  # 2 layers × 4 projections of 12 × 12, one position
    assert f["attention"] == 4 * 10 * 12  # 2 layers × (q kᵀ + p v): 2 × 10 keys × h·d_k = 12
    assert f["mlp"] == 4 * 12 * 20  # 2 layers × (W_1 and W_2 of 12 × 20)
    assert f["readout"] == 12 * 11
    assert f["total"] == sum(f[k] for k in COST_PARTS)
    # attention of a full recompute step grows like n², with the cache like n
    assert decoding_macs(params, 10, 10)["attention"] == 10 * f["attention"]


def test_greedy_counters_sum_the_per_step_formulas():
    params = small(19)
    prompt = np.array([3, 1, 4])
    c_cache, c_full = {}, {}
    greedy_generate(params, prompt, 6, counter=c_cache)
    greedy_generate(params, prompt, 6, use_cache=False, counter=c_full)
    want_cache = decoding_macs(params, 3, 3)
    want_full = decoding_macs(params, 3, 3)
    for n in range(4, 9):
        for want, m in ((want_cache, 1), (want_full, n)):
            step = decoding_macs(params, m, n)
            for k in COST_PARTS:
                want[k] += step[k]
    assert c_cache == {k: want_cache[k] for k in COST_PARTS}
    assert c_full == {k: want_full[k] for k in COST_PARTS}


def test_products_only_counts_what_the_decoder_counts():
    params = small(22)
    steps = [(3, 3), (1, 4), (1, 5)]
    run, macs = products_only(params, steps, np.random.default_rng(23))
    assert macs == sum(decoding_macs(params, m, n)["total"] for m, n in steps)
    # the same schedule run by the decoder itself (a prefill of 3, then two steps)
    counter = {}
    cache = KVCache(params)
    for a, b in ((0, 3), (3, 4), (4, 5)):
        decoder_extend(params, np.arange(a, b), cache, counter=counter)
    assert macs == sum(counter.values())
    assert run() is None


def test_a_cached_step_does_one_mac_per_weight_and_per_cached_number():
    params = small(24)
    cache = KVCache(params)
    decoder_extend(params, np.arange(6) % params.vocab, cache)
    counter = {}
    decoder_extend(params, np.array([1]), cache, counter=counter)
    matrices = ("W_q", "W_k", "W_v", "W_o", "W_1", "W_2")
    weights = sum(layer[w].size for layer in params.layers for w in matrices) + params.W_out.size
    cached = sum(a[..., : cache.length, :].size for a in (*cache.keys, *cache.values))
    assert sum(counter.values()) == weights + cached


# ---------------------------------------------------------------- cache size


def test_kv_cache_values_matches_cache_object():
    params = small(20)
    cache = KVCache(params, (2,), capacity=10)
    decoder_extend(params, np.zeros((2, 7), dtype=int), cache)
    assert cache.num_values == kv_cache_values(params.n_layers, 7, params.h, params.d_k, params.d_v, batch=2)
    assert cache.num_values == 2 * 2 * params.n_layers * 7 * params.d_model
    assert cache.nbytes == 8 * kv_cache_values(params.n_layers, 10, params.h, params.d_k, batch=2)
    assert kv_cache_values(6, 100, 8, 64) == 8 * kv_cache_values(6, 100, 1, 64)  # multi-query: h times smaller


# ---------------------------------------------------------------- argument checks


def test_bad_arguments_name_the_argument():
    params = small(21)
    with pytest.raises(TypeError, match="tokens must hold integer"):
        decoder_forward(params, np.zeros(3))
    with pytest.raises(ValueError, match=r"tokens ids must lie in \[0, vocab=11\)"):
        decoder_forward(params, np.array([0, 11]))
    with pytest.raises(ValueError, match="tokens has n=25"):
        decoder_forward(params, np.zeros(25, dtype=int))
    with pytest.raises(ValueError, match=r"tokens must have shape \(\.\.\., n\)"):
        decoder_forward(params, np.zeros((2, 0), dtype=int))
    with pytest.raises(TypeError, match="params must be DecoderParams"):
        decoder_forward({"W_q": 1}, np.zeros(3, dtype=int))
    cache = KVCache(params, (2,), capacity=4)
    with pytest.raises(ValueError, match=r"batch_shape=\(2,\).*received shape \(3, 1\)"):
        decoder_extend(params, np.zeros((3, 1), dtype=int), cache)
    decoder_extend(params, np.zeros((2, 4), dtype=int), cache)
    with pytest.raises(ValueError, match="tokens_new has n=1 positions, more than the 0 allowed"):
        decoder_extend(params, np.zeros((2, 1), dtype=int), cache)
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        decoder_extend(params, np.zeros(1, dtype=int), {})
    with pytest.raises(ValueError, match="capacity must be <= max_len=24"):
        KVCache(params, capacity=25)
    with pytest.raises(ValueError, match=r"n \(keys\) must be >= m"):
        decoding_macs(params, 5, 4)
    with pytest.raises(ValueError, match=r"n \(keys\) must be >= m"):
        products_only(params, [(2, 1)], np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_new must be >= 1"):
        greedy_generate(params, np.array([1]), 0)
    with pytest.raises(ValueError, match="d_model=10 must be divisible by h=3"):
        init_decoder_params(np.random.default_rng(0), vocab=5, d_model=10, h=3, n_layers=1, d_ff=4, max_len=4)
    with pytest.raises(ValueError, match="h_kv must be >= 1"):
        kv_cache_values(6, 10, 0, 64)


def test_calls_only_makes_the_same_calls_on_one_entry_matrices():
    params = small(25)
    steps = [(3, 3), (1, 4), (1, 5)]
    run_full, _ = products_only(params, steps, np.random.default_rng(26))
    run_tiny, calls = calls_only(params, steps, np.random.default_rng(26))
    # per step: 8 products per layer (q, k, v, q kᵀ, p v, W_o, W_1, W_2) and the read-out
    assert calls == len(steps) * (8 * params.n_layers + 1)
    assert run_tiny() is None and run_full() is None
    with pytest.raises(ValueError, match=r"n \(keys\) must be >= m"):
        calls_only(params, [(2, 1)], np.random.default_rng(0))


def test_cache_size_and_crossover_follow_from_the_shapes():
    """The numbers chapter 10 prints for the base model: 2·L·d_model per token, crossover 2·d_model + d_ff."""
    L, d, h, d_ff = 3, 16, 4, 40
    params = init_decoder_params(np.random.default_rng(0), vocab=5, d_model=d, h=h, n_layers=L, d_ff=d_ff, max_len=4)
    cache = KVCache(params)
    decoder_extend(params, np.arange(4) % 5, cache)
    filled = [a[..., : cache.length, :] for a in (*cache.keys, *cache.values)]
    per_token = sum(a.size for a in filled) / cache.length
    assert per_token == 2 * L * d == kv_cache_values(L, 1, h, d // h)
    weights = sum(params.layers[0][w].size for w in ("W_q", "W_k", "W_v", "W_o", "W_1", "W_2"))
    per_layer = (filled[0].size + filled[L].size) / cache.length
    assert np.ceil(weights / per_layer) == 2 * d + d_ff


def test_recompute_over_cache_ratios_of_counted_macs():
    """Attention MACs recompute/cache = (2N+1)/3, MLP MACs = (N+1)/2 over N generated positions."""
    params = small(7)
    n_gen = 12
    recompute, cached = {}, {}
    cache = KVCache(params, capacity=n_gen)
    seq = np.arange(n_gen) % params.vocab
    for n in range(1, n_gen + 1):
        decoder_forward(params, seq[:n], counter=recompute)
        decoder_extend(params, seq[n - 1 : n], cache, counter=cached)
    assert recompute["attention"] * 3 == cached["attention"] * (2 * n_gen + 1)
    assert recompute["mlp"] * 2 == cached["mlp"] * (n_gen + 1)
