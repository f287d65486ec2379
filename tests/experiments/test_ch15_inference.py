"""Unit tests for attn_utils.experiments.ch15_inference (chapter 15)."""

import dataclasses
import math

import numpy as np
import pytest

from attn_utils import causal_mask, grouped_attention, init_mha_params, multi_head_attention
from attn_utils.experiments import ch15_inference as ex


def tiny(h=4, h_kv=2, mlp=3, vocab=20, d_ff=48, n_layers=2):
    return ex.TransformerConfig("tiny", n_layers, 32, h, h_kv, 8, d_ff=d_ff, vocab=vocab, mlp_matrices=mlp)


def test_published_configurations():
    c = ex.CONFIGS
    assert c["transformer-base"].kv_numbers_per_token() == 2 * 6 * 512
    assert c["llama-2-7b"].kv_bytes(1, 2) == 512 * 1024  # 0.5 MiB per token in 16-bit
    assert c["llama-2-70b"].kv_bytes(1, 2) == 320 * 1024
    assert c["mistral-7b"].kv_bytes(1, 2) == 128 * 1024
    # parameter counts from the configurations (regression values; within 4% of the names 7B, 70B, 7B)
    assert c["llama-2-7b"].param_count() == 6_738_415_616
    assert c["llama-2-70b"].param_count() == 68_976_648_192
    assert c["mistral-7b"].param_count() == 7_241_732_096
    with pytest.raises(ValueError, match="param_count needs d_ff and vocab"):
        c["transformer-base"].param_count()


def test_config_validation_and_kv_heads():
    with pytest.raises(ValueError, match="h=8 must be a multiple of h_kv=3"):
        ex.TransformerConfig("bad", 2, 16, 8, 3, 2)
    cfg = tiny(h=8, h_kv=8)
    assert cfg.with_kv_heads(2).kv_numbers_per_token() * 4 == cfg.kv_numbers_per_token()
    assert cfg.with_kv_heads(1).g == 8


@pytest.mark.parametrize("mlp,vocab,d_ff", [(3, 20, 48), (2, 0, 40), (2, 11, 0)])
@pytest.mark.parametrize("h,h_kv", [(4, 4), (4, 2), (4, 1)])
def test_counted_traffic_equals_step_cost(mlp, vocab, d_ff, h, h_kv):
    rng = np.random.default_rng(150)
    cfg = tiny(h=h, h_kv=h_kv, mlp=mlp, vocab=vocab, d_ff=d_ff)
    model = ex.init_stand_in(rng, cfg)
    cache = ex.GroupedKVCache(cfg.n_layers)
    for B, m, n_prev in ((3, 5, 0), (3, 1, 5), (3, 2, 6)):
        t = ex.Traffic()
        ex.run_positions(model, rng.normal(size=(B, m, cfg.d_model)), cache, t)
        want = ex.step_cost(cfg, B, m, n_prev)
        got = dataclasses.asdict(t)
        for key in got:
            assert got[key] == want[key], key
        assert t.bytes == want["bytes"] and t.intensity == pytest.approx(want["intensity"], rel=1e-15)
    assert cache.length == 8 and cache.nbytes == cfg.kv_bytes(8, 2, batch=3)


def test_cache_dtype_and_tied_layers():
    rng = np.random.default_rng(151)
    cfg = tiny(n_layers=5)
    for dtype, b in ((np.float16, 2), (np.float32, 4)):
        model = ex.init_stand_in(rng, cfg, dtype=dtype, tie_layers=True)
        assert all(layer is model.layers[0] for layer in model.layers)
        cache = ex.GroupedKVCache(cfg.n_layers)
        ex.run_positions(model, rng.normal(size=(2, 3, 32)), cache)
        assert cache.nbytes == cfg.kv_bytes(3, b, batch=2)
    with pytest.raises(ValueError, match=r"x_new must have shape \(B, m, d_model=32\)"):
        ex.run_positions(model, rng.normal(size=(3, 32)), cache)


def test_cached_decoding_equals_one_pass():
    # the stand-in is a causal decoder: prefill + decode steps give the logits of one longer pass
    rng = np.random.default_rng(152)
    cfg = tiny()
    model = ex.init_stand_in(rng, cfg, dtype=np.float32)
    x = rng.normal(size=(2, 6, 32))
    for n in range(1, 7):
        full = ex.run_positions(model, x[:, :n], ex.GroupedKVCache(cfg.n_layers))
        stepped = ex.GroupedKVCache(cfg.n_layers)
        ex.run_positions(model, x[:, : n - 1], stepped) if n > 1 else None
        last = ex.run_positions(model, x[:, n - 1 : n], stepped)
        np.testing.assert_allclose(last, full, rtol=0, atol=1e-4)


def test_stand_in_attention_is_multi_head_attention_with_grouped_kv():
    # one layer without MLP: the attention update equals au.multi_head_attention with h_kv
    rng = np.random.default_rng(153)
    cfg = ex.TransformerConfig("one", 1, 16, 4, 2, 4)
    model = ex.init_stand_in(rng, cfg, dtype=np.float64)
    x = rng.normal(size=(1, 5, 16))
    out = ex.run_positions(model, x, ex.GroupedKVCache(1))
    params = {k: v.astype(float) for k, v in model.layers[0].items()}
    a = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    mha, _ = multi_head_attention(a, a, params, 4, mask=causal_mask(5), h_kv=2)
    y = x + mha
    want = y[:, -1] / np.sqrt(np.mean(y[:, -1] ** 2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-4)  # the stand-in computes in float32
    assert init_mha_params(rng, 16, 4, h_kv=2)["W_k"].shape == model.layers[0]["W_k"].shape


def test_roofline_and_max_batch():
    hw = ex.A100_SXM_80GB
    assert ex.ridge_point(hw) == pytest.approx(312 / 2.039)
    np.testing.assert_allclose(ex.attainable_flops([1.0, 1e6], hw), [2.039e12, 312e12])
    c = ex.CONFIGS["llama-2-7b"]
    b = ex.max_batch(c, 4096, hw["memory"])
    assert (
        c.kv_bytes(4096, 2, b) + 2 * c.param_count() <= hw["memory"] < c.kv_bytes(4096, 2, b + 1) + 2 * c.param_count()
    )
    assert ex.max_batch(c, 4096, 1e9) == 0


def test_decode_intensity_limits():
    # attention alone: 2g/b FLOPs per cache byte whatever the batch; weights: 2B/b per weight byte
    cfg = ex.CONFIGS["llama-2-70b"]
    for B in (1, 8, 64):
        s = ex.step_cost(cfg, B, 1, 4095)
        assert 2 * s["attn_macs"] / s["cache_bytes"] == cfg.g
        assert 2 * (s["macs"] - s["attn_macs"]) / s["weight_bytes"] == B


def test_rolling_buffer_equals_sliding_window_mask_and_caps_the_cache():
    rng = np.random.default_rng(154)
    cfg = tiny(n_layers=3)
    model = ex.init_stand_in(rng, cfg, dtype=np.float32)
    W = 4
    rolling, full = ex.GroupedKVCache(3, window=W), ex.GroupedKVCache(3, window=W, rolling=False)
    plain = ex.GroupedKVCache(3)
    x = rng.normal(size=(2, 11, 32))
    for cache in (rolling, full, plain):
        ex.run_positions(model, x[:, :3], cache)  # prefill shorter than the window
    for t in range(3, 11):
        a = ex.run_positions(model, x[:, t : t + 1], rolling)
        b = ex.run_positions(model, x[:, t : t + 1], full)
        c = ex.run_positions(model, x[:, t : t + 1], plain)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        assert rolling.length == min(t + 1, W) and full.length == t + 1
    assert np.max(np.abs(a - c)) > 1e-3  # the window changes the model once n > W
    assert rolling.nbytes == cfg.kv_bytes(W, 4, batch=2) and full.nbytes == cfg.kv_bytes(11, 4, batch=2)
    # a prefill longer than the window
    r2, f2 = ex.GroupedKVCache(3, window=W), ex.GroupedKVCache(3, window=W, rolling=False)
    np.testing.assert_allclose(ex.run_positions(model, x, r2), ex.run_positions(model, x, f2), rtol=0, atol=1e-5)
    assert r2.length == W and r2.start == 11 - W
    # the next query (position 11) after its key is appended: entries 7 … 11, the oldest now out of the window
    np.testing.assert_array_equal(r2.mask(1, W + 1), [[False] + [True] * W])


@pytest.mark.parametrize("h_kv", [8, 4, 2, 1])
def test_counted_grouped_attention_equals_the_core_and_counts_executed_products(h_kv):
    rng = np.random.default_rng(155)
    B, h, n_q, n_k, d = 2, 8, 3, 7, 5
    q = rng.normal(size=(B, h, n_q, d))
    k, v = rng.normal(size=(B, h_kv, n_k, d)), rng.normal(size=(B, h_kv, n_k, d))
    mask = np.tril(np.ones((n_q, n_k), bool), k=n_k - n_q)  # the last n_q of n_k positions, causal
    out, macs = ex.counted_grouped_attention(q, k, v, mask=mask)
    ref, _ = grouped_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    rep = np.repeat(k, h // h_kv, axis=-3), np.repeat(v, h // h_kv, axis=-3)
    np.testing.assert_allclose(out, grouped_attention(q, *rep, mask=mask)[0], rtol=0, atol=1e-12)
    # q·kᵀ and weights·v over every (query, key) pair of every query head: h_kv does not appear
    assert macs == B * h * n_q * n_k * 2 * d
    assert ex.counted_grouped_attention(q, k, v)[1] == macs  # the mask does not change the products
    with pytest.raises(ValueError, match="must be a multiple of h_kv"):
        ex.counted_grouped_attention(q, rng.normal(size=(B, 3, n_k, d)), rng.normal(size=(B, 3, n_k, d)))


def test_released_parameter_counts_and_hardware_constants():
    for key, released in ex.RELEASED_PARAMS.items():
        assert ex.CONFIGS[key].param_count() == released
    for hw in (ex.A100_SXM_80GB, ex.H100_SXM_80GB):
        assert hw["memory"] == 80 * 2**30  # "80GB" of memory is 80 GiB = 85.9e9 bytes
    assert ex.ridge_point(ex.H100_SXM_80GB) == pytest.approx(295.22, abs=0.01)
    assert ex.ridge_point(ex.A100_SXM_80GB) == pytest.approx(153.02, abs=0.01)


@pytest.mark.parametrize("key", ["transformer-base", "llama-2-7b", "llama-2-70b", "mistral-7b"])
def test_filled_cache_of_a_published_shape_holds_the_formula_bytes(key):
    # a stand-in with the configuration's L, h, h_kv, d_k (residual width 64, tied layers) fills its cache
    rng = np.random.default_rng(156)
    cfg = ex.CONFIGS[key]
    dtype, b = (np.float32, 4) if key == "transformer-base" else (np.float16, 2)
    small = ex.TransformerConfig(cfg.name, cfg.n_layers, 64, cfg.h, cfg.h_kv, cfg.d_k)
    model = ex.init_stand_in(rng, small, dtype=dtype, tie_layers=True)
    cache = ex.GroupedKVCache(small.n_layers)
    ex.run_positions(model, rng.normal(size=(2, 3, 64)), cache)
    assert cache.nbytes == 2 * 3 * 2 * cfg.n_layers * cfg.h_kv * cfg.d_k * b == cfg.kv_bytes(3, b, batch=2)


def test_grouping_shrinks_the_filled_cache_by_g():
    rng = np.random.default_rng(157)
    l70 = ex.CONFIGS["llama-2-70b"]
    nbytes = {}
    for h_kv in (64, 8, 1):
        small = ex.TransformerConfig("70B heads", l70.n_layers, 64, l70.h, h_kv, l70.d_k)
        cache = ex.GroupedKVCache(small.n_layers)
        ex.run_positions(ex.init_stand_in(rng, small, tie_layers=True), rng.normal(size=(1, 2, 64)), cache)
        nbytes[h_kv] = cache.nbytes
    assert nbytes[64] == 8 * nbytes[8] == 64 * nbytes[1]


@pytest.mark.parametrize("h_kv", [4, 1])
def test_cache_reaches_the_weights_where_the_crossover_formula_says(h_kv):
    # generate one token per sequence and step until the cache's arrays hold as many bytes as the weights'
    rng = np.random.default_rng(158)
    cfg = ex.TransformerConfig("toy", 2, 32, 4, h_kv, 8, d_ff=64, vocab=40)
    model = ex.init_stand_in(rng, cfg, dtype=np.float16)
    weight_bytes = sum(w.nbytes for layer in model.layers for w in layer.values()) + model.W_out.nbytes
    assert weight_bytes == 2 * cfg.matmul_weights()
    batch, cache = 4, ex.GroupedKVCache(cfg.n_layers)
    x = rng.normal(size=(batch, 1, cfg.d_model))
    while cache.nbytes < weight_bytes:
        ex.run_positions(model, x, cache)
    per_token = 2 * cfg.n_layers * cfg.h_kv * cfg.d_k * 2
    assert batch * cache.length == batch * math.ceil(weight_bytes / per_token / batch)


def test_counted_decode_steps_over_the_batch():
    # prop-ch15-decode on executed steps: weights read once per step, the cache once per sequence,
    # intensity rising with B, below max(2B/b, 2g/b) and below its limit
    rng = np.random.default_rng(159)
    cfg = ex.TransformerConfig("toy", 2, 64, 8, 2, 8, d_ff=256, vocab=100, mlp_matrices=3)
    model = ex.init_stand_in(rng, cfg)
    n, steps = 32, {}
    for B in (1, 2, 4, 8, 16):
        cache = ex.GroupedKVCache(cfg.n_layers)
        ex.run_positions(model, rng.normal(size=(B, n - 1, cfg.d_model)), cache)
        steps[B] = t = ex.Traffic()
        ex.run_positions(model, rng.normal(size=(B, 1, cfg.d_model)), cache, t)
    assert len({t.weight_bytes for t in steps.values()}) == 1
    assert len({t.cache_bytes // B for B, t in steps.items()}) == 1
    intensity = [steps[B].intensity for B in steps]
    assert all(np.diff(intensity) > 0)
    big = ex.step_cost(cfg, 10**6, 1, n - 1)
    limit = 2 * big["macs"] / (big["cache_bytes"] + big["act_bytes"])
    for B, t in steps.items():
        assert t.intensity < max(B, cfg.g)  # max(2B/b, 2g/b) with b = 2
        assert t.intensity < limit


@pytest.mark.parametrize("key", ["llama-2-7b", "mistral-7b"])
def test_prefill_intensity_stays_below_2gn_over_b(key):
    cfg = ex.CONFIGS[key]
    for n in (1, 16, 153, 512, 4096):
        assert ex.step_cost(cfg, 1, n, 0)["intensity"] < 2 * cfg.g * n / 2
    ridge = ex.ridge_point(ex.A100_SXM_80GB)
    shortest = next(n for n in range(1, 4097) if ex.step_cost(cfg, 1, n, 0)["intensity"] >= ridge)
    assert shortest > 2 * ridge / (2 * cfg.g)  # n > b·ridge/(2g)


@pytest.mark.parametrize("h_kv", [8, 64])
def test_max_batch_of_llama_2_70b_on_eight_gpus(h_kv):
    c = ex.CONFIGS["llama-2-70b"].with_kv_heads(h_kv)
    memory = 8 * ex.A100_SXM_80GB["memory"]
    fit = ex.max_batch(c, 4096, memory)
    weights = 2 * c.param_count()
    assert weights + fit * c.kv_bytes(4096, 2) <= memory < weights + (fit + 1) * c.kv_bytes(4096, 2)


@pytest.mark.parametrize(
    "key,n", [("llama-2-70b", 512), ("llama-2-70b", 2048), ("llama-2-7b", 128), ("mistral-7b", 256)]
)
@pytest.mark.parametrize("hw", [ex.A100_SXM_80GB, ex.H100_SXM_80GB], ids=["A100", "H100"])
def test_ridge_batch_is_the_smallest_batch_at_the_ridge(key, n, hw):
    cfg, ridge = ex.CONFIGS[key], ex.ridge_point(hw)
    B = ex.ridge_batch(cfg, n, hw)
    big = ex.step_cost(cfg, 10**9, 1, n - 1)["intensity"]
    if B is None:
        assert big < ridge
    else:
        assert ex.step_cost(cfg, B, 1, n - 1)["intensity"] >= ridge > ex.step_cost(cfg, B - 1, 1, n - 1)["intensity"]


def test_ridge_batch_of_llama_2_70b():
    # the numbers of the corrected wrong answer: B* on 8 A100s at 512, 1024, 2048 tokens; none at 4096
    l70, a100 = ex.CONFIGS["llama-2-70b"], ex.A100_SXM_80GB
    assert [ex.ridge_batch(l70, n, a100) for n in (512, 1024, 2048, 4096)] == [194, 250, 589, None]
    assert ex.ridge_batch(ex.CONFIGS["llama-2-7b"], 4096, a100) is None
