"""Chapter 5 helpers: folding the scale into W_Q, per-parameter training, cosine attention bounds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import softmax
from attn_utils.experiments.ch05_qknorm import (
    cosine_logits,
    cosine_max_weight,
    cosine_score,
    fold_query_scale,
    gain_for_max_weight,
    register_cosine_score,
    train_per_parameter,
    train_variants,
)
from attn_utils.harness.tasks import recall_task
from attn_utils.harness.training import SCORES, ModelConfig, attention_stats, forward, init_params, train

TASK = recall_task(n_pairs=3, n_keys=4, n_values=4)
SMALL = dict(d_model=8, n_heads=2)


# ------------------------------------------------------------------ folding
@pytest.mark.parametrize("scale", ["sqrt", "quarter", "linear", "none"])
def test_fold_keeps_the_function_and_matches_t5_init(scale):
    cfg = ModelConfig(**SMALL, n_layers=2, scale=scale)
    params = init_params(cfg, TASK, [0, 1])
    folded, cfg_f = fold_query_scale(params, cfg)
    assert cfg_f.scale == "none" and cfg.scale == scale  # input config untouched
    x = TASK.sample(0, 16).x
    np.testing.assert_allclose(forward(folded, cfg_f, TASK, x), forward(params, cfg, TASK, x), rtol=0, atol=1e-12)
    # the folded config's own initialisation draws exactly the folded parameters
    direct = init_params(cfg_f, TASK, [0, 1])
    for key in params:
        np.testing.assert_allclose(direct[key], folded[key], rtol=1e-15, atol=0)
    assert params["L0.W_q"] is not folded["L0.W_q"]


def test_fold_rejects_what_it_cannot_fold():
    params = init_params(ModelConfig(**SMALL), TASK, [0])
    for bad in (dict(qk_norm=True), dict(share_qk=True), dict(scale="learned")):
        cfg = ModelConfig(**SMALL, **bad)
        with pytest.raises(ValueError):
            fold_query_scale(init_params(cfg, TASK, [0]), cfg)
    with pytest.raises(ValueError, match="L1.W_q"):
        fold_query_scale(params, ModelConfig(**SMALL, n_layers=2))
    with pytest.raises(TypeError):
        fold_query_scale(params, "sqrt")


# ------------------------------------------------------------------ per-parameter training
@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.3), ("adam", 0.01)])
def test_no_multipliers_reproduces_the_harness(optimizer, lr):
    cfg = ModelConfig(**SMALL)
    hist, params = train_per_parameter(cfg, TASK, [0, 3], steps=12, lr=lr, optimizer=optimizer)
    ref = train(cfg, TASK, [0, 3], steps=12, lr=lr, optimizer=optimizer)
    assert hist.shape == (12, 2)
    np.testing.assert_allclose(hist, ref.loss, rtol=1e-12)
    for key in params:
        np.testing.assert_allclose(params[key], ref.params[key], rtol=1e-12, atol=1e-14)


def test_sgd_on_folded_model_equals_scaled_model_with_rescaled_query_rate():
    cfg = ModelConfig(**SMALL)
    c = cfg.fixed_scale()
    folded, cfg_f = fold_query_scale(init_params(cfg, TASK, [0, 1]), cfg)
    h_a, p_a = train_per_parameter(cfg, TASK, [0, 1], steps=20, lr=0.3)
    h_b, p_b = train_per_parameter(cfg_f, TASK, [0, 1], steps=20, lr=0.3, lr_mult={"L0.W_q": c**2}, params=folded)
    np.testing.assert_allclose(h_b, h_a, rtol=1e-10)
    np.testing.assert_allclose(p_b["L0.W_q"], c * p_a["L0.W_q"], atol=1e-12)
    h_naive, _ = train_per_parameter(cfg_f, TASK, [0, 1], steps=20, lr=0.3)
    assert np.abs(h_naive - h_a).max() > 1e-3


def test_adam_needs_lr_and_eps_rescaled():
    cfg = ModelConfig(**SMALL)
    c = cfg.fixed_scale()
    cfg_f = fold_query_scale(init_params(cfg, TASK, [0]), cfg)[1]
    h_b, _ = train_per_parameter(cfg_f, TASK, [0], steps=20, lr=0.01, optimizer="adam")
    h_a, _ = train_per_parameter(
        cfg, TASK, [0], steps=20, lr=0.01, optimizer="adam", lr_mult={"L0.W_q": 1 / c}, eps_mult={"L0.W_q": c}
    )
    np.testing.assert_allclose(h_a, h_b, rtol=1e-9)
    h_same, _ = train_per_parameter(cfg, TASK, [0], steps=20, lr=0.01, optimizer="adam")
    assert np.abs(h_same - h_b).max() > 1e-3


def test_variants_match_separate_runs_and_are_paired():
    cfg = ModelConfig(**SMALL)
    c = cfg.fixed_scale()
    variants = {
        "plain": {},
        "again": {},
        "W_Q fast": dict(lr_mult={"L0.W_q": 1 / c}, eps_mult={"L0.W_q": c}),
        "slow": dict(lr=0.003),
    }
    out = train_variants(cfg, TASK, variants, [0, 5], steps=10, lr=0.01, optimizer="adam")
    assert list(out) == list(variants)
    for name, spec in variants.items():
        spec = dict(spec)
        hist, params = train_per_parameter(
            cfg, TASK, [0, 5], steps=10, lr=spec.pop("lr", 0.01), optimizer="adam", **spec
        )
        assert out[name][0].shape == (10, 2)
        np.testing.assert_allclose(out[name][0], hist, rtol=1e-10)
        for key in params:
            np.testing.assert_allclose(out[name][1][key], params[key], rtol=1e-10, atol=1e-13)
    # same seeds, same batches: identical variants give identical runs, different ones differ
    np.testing.assert_allclose(out["again"][0], out["plain"][0], rtol=1e-12)
    np.testing.assert_allclose(out["plain"][0][0], out["slow"][0][0], rtol=1e-12)  # step 0: same model
    assert np.abs(out["slow"][0] - out["plain"][0]).max() > 1e-3


def test_variants_arguments():
    cfg = ModelConfig(**SMALL)
    with pytest.raises(TypeError, match="variants"):
        train_variants(cfg, TASK, {}, [0], steps=2)
    with pytest.raises(ValueError, match="keys among"):
        train_variants(cfg, TASK, {"a": {"momentum": 0.9}}, [0], steps=2)
    with pytest.raises(ValueError, match="unknown"):
        train_variants(cfg, TASK, {"a": {"lr_mult": {"W_nope": 2.0}}}, [0], steps=2)
    with pytest.raises(ValueError, match="lr"):
        train_variants(cfg, TASK, {"a": {"lr": 0.0}}, [0], steps=2)
    with pytest.raises(TypeError, match="seeds"):
        train_variants(cfg, TASK, {"a": {}}, 3, steps=2)


def test_train_per_parameter_arguments():
    cfg = ModelConfig(**SMALL)
    with pytest.raises(ValueError, match="unknown"):
        train_per_parameter(cfg, TASK, [0], steps=2, lr_mult={"W_nope": 2.0})
    with pytest.raises(ValueError, match="lr_mult"):
        train_per_parameter(cfg, TASK, [0], steps=2, lr_mult={"L0.W_q": -1.0})
    with pytest.raises(ValueError, match="optimizer"):
        train_per_parameter(cfg, TASK, [0], steps=2, optimizer="lion")
    with pytest.raises(TypeError, match="seeds"):
        train_per_parameter(cfg, TASK, 0, steps=2)


# ------------------------------------------------------------------ cosine attention
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(2, 8), st.floats(0.1, 20.0), st.integers(0, 2**31))
def test_cosine_logits_bounded_and_softmax_below_max_weight(n_q, n_k, d, gain, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, n_q, d)), rng.standard_normal((2, n_k, d))
    z = cosine_logits(q, k, gain)
    assert z.shape == (2, n_q, n_k)
    assert np.abs(z).max() <= gain * (1 + 1e-12)
    assert softmax(z).max() <= cosine_max_weight(n_k, gain) + 1e-12


@pytest.mark.parametrize("n, gain", [(2, 0.5), (9, 1.0), (1000, 5.0)])
def test_max_weight_is_attained_by_opposite_keys(n, gain):
    q = np.array([[1.0, 0.0, 0.0]])
    k = np.vstack([q, -np.ones((n - 1, 1)) * q])
    p = softmax(cosine_logits(q, k, gain))
    assert p[0, 0] == pytest.approx(cosine_max_weight(n, gain), rel=1e-12)
    assert gain_for_max_weight(cosine_max_weight(n, gain), n) == pytest.approx(gain, rel=1e-9)


def test_cosine_arguments():
    with pytest.raises(ValueError, match="last axis"):
        cosine_logits(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="leading"):
        cosine_logits(np.ones((2, 1, 3)), np.ones((3, 1, 3)))
    with pytest.raises(ValueError, match="zero"):
        cosine_logits(np.zeros((1, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="gain"):
        cosine_logits(np.ones((1, 3)), np.ones((1, 3)), gain=0.0)
    with pytest.raises(ValueError, match=r"\(1/n, 1\)"):
        gain_for_max_weight(0.2, 5)
    with pytest.raises(ValueError, match="n must be >= 2"):
        gain_for_max_weight(0.9, 1)
    assert cosine_max_weight(1, 0.3) == 1.0


def test_cosine_score_registers_and_matches_numpy():
    name = register_cosine_score("test_cosine_unit")
    try:
        assert register_cosine_score("test_cosine_unit") == name  # idempotent
        rng = np.random.default_rng(0)
        q, k = rng.standard_normal((1, 2, 1, 3, 4)), rng.standard_normal((1, 2, 1, 5, 4))
        np.testing.assert_allclose(cosine_score(q, k, {}), cosine_logits(q, k), atol=1e-12)
        cfg = ModelConfig(**SMALL, score=name, scale="learned", learned_scale_init=1.0)
        assert train(cfg, TASK, [0], steps=3).loss.shape == (3, 1)
        with pytest.raises(ValueError, match="different function"):
            register_cosine_score("dot")
    finally:
        SCORES.pop("test_cosine_unit", None)


# ------------------------------------------------------------------ recording a run
@pytest.mark.parametrize(
    "cfg",
    [ModelConfig(**SMALL), ModelConfig(**SMALL, qk_norm=True), ModelConfig(**SMALL, scale="none", q_init_scale=0.5)],
)
def test_recorded_logit_stats_match_the_harness_log(cfg):
    seen = {"max_logit": [], "attn_entropy": [], "t": []}

    def record(t, params, x):
        seen["t"].append(t)
        if x is not None:
            stats = attention_stats(params, cfg, TASK, x)
            seen["max_logit"].append(stats["max_logit"])
            seen["attn_entropy"].append(stats["attn_entropy"])

    loss, _ = train_per_parameter(cfg, TASK, [0, 1], steps=5, lr=0.05, optimizer="adam", record=record)
    ref = train(cfg, TASK, [0, 1], steps=5, lr=0.05)
    assert seen["t"] == list(range(6))  # before each update, and once after the last
    np.testing.assert_allclose(loss, ref.loss, rtol=1e-10)
    for key in ("max_logit", "attn_entropy"):
        np.testing.assert_allclose(np.array(seen[key]), ref.stats[key], rtol=1e-9)


def test_record_and_stats_arguments():
    with pytest.raises(TypeError, match="record"):
        train_per_parameter(ModelConfig(**SMALL), TASK, [0], steps=2, record=3)
    cfg = ModelConfig(**SMALL, encoder="mean_pool")
    with pytest.raises(ValueError, match="no attention logits"):
        attention_stats(init_params(cfg, TASK, [0]), cfg, TASK, np.zeros((2, TASK.seq_len), int))


def test_a_zero_rate_freezes_a_parameter_and_float32_stays_float32():
    cfg = ModelConfig(**SMALL, scale="learned", dtype="float32")
    runs = train_variants(
        cfg,
        TASK,
        {"learned": {}, "frozen": dict(lr_mult={"L0.log_scale": 0.0})},
        [0, 1],
        steps=4,
        lr=0.05,
        optimizer="adam",
    )
    start = init_params(cfg, TASK, [0, 1])["L0.log_scale"]
    np.testing.assert_array_equal(runs["frozen"][1]["L0.log_scale"], start)
    assert not np.array_equal(runs["learned"][1]["L0.log_scale"], start)
    assert all(v.dtype == np.float32 for v in runs["learned"][1].values())
    with pytest.raises(ValueError, match="eps_mult"):
        train_per_parameter(cfg, TASK, [0], steps=2, optimizer="adam", eps_mult={"L0.log_scale": 0.0})


def test_a_variant_can_start_a_parameter_elsewhere():
    cfg = ModelConfig(**SMALL, scale="learned", dtype="float32")
    fixed4 = {"lr_mult": {"L0.log_scale": 0.0}, "init": {"L0.log_scale": np.log(4.0)}}
    runs = train_variants(cfg, TASK, {"learned": {}, "fixed 4": fixed4}, [0, 1], steps=4, lr=0.05, optimizer="adam")
    np.testing.assert_allclose(np.exp(runs["fixed 4"][1]["L0.log_scale"]), 4.0, rtol=1e-6)
    # the same run as training from parameters that start there
    start = init_params(cfg, TASK, [0, 1])
    start["L0.log_scale"] = np.full_like(start["L0.log_scale"], np.log(4.0))
    hist, params = train_per_parameter(
        cfg, TASK, [0, 1], steps=4, lr=0.05, optimizer="adam", lr_mult=fixed4["lr_mult"], params=start
    )
    np.testing.assert_allclose(runs["fixed 4"][0], hist, rtol=1e-5)
    assert not np.allclose(runs["fixed 4"][0], runs["learned"][0])  # the other variant starts at the drawn gain
    with pytest.raises(ValueError, match="unknown"):
        train_variants(cfg, TASK, {"a": {"init": {"W_nope": 0.0}}}, [0], steps=2)
    with pytest.raises(ValueError, match="finite"):
        train_variants(cfg, TASK, {"a": {"init": {"L0.log_scale": np.inf}}}, [0], steps=2)
