"""Training harness: gradients vs finite differences, every variant learns, determinism,
independence of the seed axis, head masks, and argument errors."""

from dataclasses import replace

import autograd.numpy as anp
import numpy as np
import pytest
from autograd import grad

from attn_utils import causal_mask, scaled_dot_product_attention
from attn_utils.harness.tasks import (
    TaskBatch,
    copy_task,
    keyword_task,
    previous_token_task,
    recall_task,
    two_relation_task,
)
from attn_utils.harness.training import (
    SCORES,
    ModelConfig,
    _forward_core,
    adam,
    attention_weights,
    evaluate,
    forward,
    init_params,
    loss,
    loss_and_grad,
    optimise,
    per_seed_loss,
    query_key_vectors,
    register_score,
    sgd,
    step_batches,
    train,
)


# a score with its own parameters and a different weight rule, registered the way chapter 7 will
def _bilinear(q, k, params):
    return anp.matmul(anp.matmul(q, params["W"][:, None]), anp.swapaxes(k, -1, -2))


def _distance_biased(q, k, params):
    # written, as such scores are, for self-attention: query i sits at position i
    distance = np.abs(np.arange(q.shape[-2])[:, None] - np.arange(k.shape[-2])[None, :])
    return q @ anp.swapaxes(k, -1, -2) - distance


def _bilinear_init(rng, n_heads, d_k, d_model):
    return {"W": np.eye(d_k) + rng.normal(0, d_k**-0.5, (n_heads, d_k, d_k))}


@pytest.fixture(scope="module", autouse=True)
def _test_scores():
    register_score("test_bilinear", _bilinear, _bilinear_init, overwrite=True, rowwise=True)
    register_score(
        "test_sigmoid", lambda q, k, p: q @ anp.swapaxes(k, -1, -2), weights="sigmoid", overwrite=True, rowwise=True
    )
    # a score that depends on where the query sits (a distance bias): not rowwise
    register_score("test_distance_bias", _distance_biased, overwrite=True)
    yield
    SCORES.pop("test_bilinear", None)
    SCORES.pop("test_sigmoid", None)
    SCORES.pop("test_distance_bias", None)


BASE = dict(d_model=8, n_heads=2)
VARIANTS = {
    "sqrt": {},
    "none": {"scale": "none"},
    "quarter": {"scale": "quarter"},
    "linear": {"scale": "linear"},
    "learned": {"scale": "learned"},
    "share_qk": {"share_qk": True},
    "qk_norm": {"qk_norm": True},
    "qk_norm_shared": {"qk_norm": True, "share_qk": True},
    "t5": {"scale": "none", "q_init_scale": 0.5},
    "two_layers_causal": {"n_layers": 2, "causal": True},
    "head_mask": {"n_heads": 4, "d_k": 3, "d_v": 2, "head_mask": (1, 0, 1, 1)},
    "sinusoidal": {"positional": "sinusoidal"},
    "mean_readout": {"readout": "mean"},
    "bilinear": {"score": "test_bilinear"},
    "sigmoid": {"score": "test_sigmoid"},
    "distance_bias": {"score": "test_distance_bias"},
    "mean_pool": {"encoder": "mean_pool"},
    "last_state": {"encoder": "last_state"},
    "sink_logit": {"sink": "learned"},
    "sink_logit_causal": {"sink": "learned", "causal": True, "n_layers": 2},
    "sink_key": {"sink": "key", "qk_norm": True},
}


def _cfg(name, **extra):
    return ModelConfig(**{**BASE, **VARIANTS[name], **extra})


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("per_position", [True, False], ids=["per_position", "per_sequence"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_gradient_matches_central_differences(name, per_position):
    cfg = _cfg(name)
    task = two_relation_task(n=5, vocab=3) if per_position else keyword_task(n=5, n_filler=4, n_keywords=2)
    params = init_params(cfg, task, [0, 1])
    batch = task.sample(0, 6)
    f = lambda p: loss(p, cfg, task, batch.x, batch.y)  # noqa: E731
    g = grad(f)(params)
    rng = np.random.default_rng(1)
    for _ in range(3):  # directional derivatives along random directions cover every parameter at once
        u = {k: rng.normal(size=v.shape) for k, v in params.items()}
        eps = 1e-5
        plus = f({k: params[k] + eps * u[k] for k in params})
        minus = f({k: params[k] - eps * u[k] for k in params})
        fd = (plus - minus) / (2 * eps)
        ad = sum(np.sum(g[k] * u[k]) for k in params)
        assert abs(fd - ad) <= 1e-6 * max(1.0, abs(ad)), f"{name}: autograd {ad:.10g} vs central difference {fd:.10g}"


@pytest.mark.parametrize("name", [n for n in VARIANTS if n not in ("mean_readout", "mean_pool", "last_state")])
def test_reading_out_the_last_query_only_changes_nothing(name):
    """With readout="last" the last layer computes only the last query (an optimisation); its logits must
    equal the last position of the full layer, which the forward computes when it keeps the weights."""
    cfg = _cfg(name)
    task = keyword_task(n=5, n_filler=4, n_keywords=2)
    params = init_params(cfg, task, [0, 1])
    x = np.broadcast_to(task.sample(0, 6).x, (2, 6, 5))
    head_on = cfg.head_mask_array()
    short = _forward_core(params, cfg, False, x, head_on)[0]
    full, weights = _forward_core(params, cfg, False, x, head_on, keep_weights=True)
    assert weights[-1].shape[-2] == 5  # the full layer: every query
    np.testing.assert_allclose(short, full, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ every variant learns
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_trains_below_threshold(name):
    task = keyword_task(n=6, n_filler=6, n_keywords=2)
    cfg = _cfg(name, d_model=16)
    res = train(cfg, task, seeds=[0, 1], steps=120, lr=0.03, batch_size=16, eval_size=128)
    assert res.loss.shape == (120, 2)
    first, last = res.loss[:10].mean(axis=0), res.loss[-10:].mean(axis=0)
    assert (last < 0.15).all(), f"{name}: final loss {last} (started at {first})"
    assert (res.accuracy > 0.95).all(), f"{name}: accuracy {res.accuracy}"


def test_sgd_and_fixed_training_set():
    task = previous_token_task(n=6, vocab=4)
    res = train(
        ModelConfig(d_model=16),
        task,
        seeds=[0, 1],
        steps=150,
        lr=0.1,
        optimizer="sgd",
        momentum=0.9,
        train_size=64,
        batch_size=16,
        eval_size=64,
    )
    assert (res.loss[-10:].mean(axis=0) < 0.1).all() and (res.accuracy > 0.95).all()


def test_attention_beats_one_vector_bottleneck_on_copy():
    task = copy_task(length=6, vocab=8)
    kw = dict(seeds=[0, 1], steps=200, lr=0.01, eval_size=256)
    att = train(ModelConfig(d_model=32), task, **kw)
    pool = train(ModelConfig(d_model=32, encoder="mean_pool"), task, **kw)
    assert (att.accuracy > 0.95).all() and (pool.accuracy < 0.7).all(), (att.accuracy, pool.accuracy)


# ------------------------------------------------------------------ determinism and the seed axis
def test_same_seed_same_history():
    task = previous_token_task(n=6, vocab=4)
    a = train(_cfg("learned"), task, seeds=[3, 5], steps=30, eval_size=32)
    b = train(_cfg("learned"), task, seeds=[3, 5], steps=30, eval_size=32)
    assert np.array_equal(a.loss, b.loss) and np.array_equal(a.accuracy, b.accuracy)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)


@pytest.mark.parametrize("name", ["sqrt", "qk_norm", "head_mask", "last_state"])
def test_seeds_train_independently(name):
    task = two_relation_task(n=5, vocab=3)
    kw = dict(steps=25, lr=0.05, batch_size=8, eval_size=32)
    joint = train(_cfg(name), task, seeds=[0, 1], **kw)
    for i, s in enumerate([0, 1]):
        alone = train(_cfg(name), task, seeds=[s], **kw)
        np.testing.assert_allclose(joint.loss[:, i], alone.loss[:, 0], rtol=0, atol=1e-10)
        for k in joint.params:
            np.testing.assert_allclose(joint.params[k][i], alone.params[k][0], rtol=0, atol=1e-10)
        for k in joint.stats:
            np.testing.assert_allclose(joint.stats[k][:, i], alone.stats[k][:, 0], rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------ what the chapters rely on
def test_t5_fold_gives_identical_forward_at_init():
    task = previous_token_task(n=6, vocab=5)
    x = task.sample(0, 4).x
    sq = ModelConfig(d_model=16, n_heads=2)
    t5 = ModelConfig(d_model=16, n_heads=2, scale="none", q_init_scale=sq.head_dim**-0.5)
    out_sq = forward(init_params(sq, task, [0, 1]), sq, task, x)
    out_t5 = forward(init_params(t5, task, [0, 1]), t5, task, x)
    np.testing.assert_allclose(out_sq, out_t5, rtol=1e-12, atol=1e-12)


def test_scale_rules_and_learned_init():
    d_k = 16
    rules = {"none": 1.0, "quarter": d_k**-0.25, "sqrt": d_k**-0.5, "linear": 1 / d_k, "learned": d_k**-0.5}
    for rule, c in rules.items():
        assert ModelConfig(d_model=16, scale=rule).fixed_scale() == pytest.approx(c)
    cfg = ModelConfig(d_model=16, scale="learned", learned_scale_init=1.0)
    p = init_params(cfg, previous_token_task(), [0])
    assert np.allclose(p["L0.log_scale"], 0.0)


def test_qk_norm_bounds_logits_and_stats_shapes():
    task = previous_token_task(n=6, vocab=4)
    res = train(
        ModelConfig(d_model=16, qk_norm=True, scale="sqrt"), task, seeds=[0, 1, 2], steps=40, lr=0.05, eval_size=32
    )
    assert set(res.stats) == {"max_logit", "attn_entropy", "grad_norm"}
    assert all(v.shape == (40, 3) for v in res.stats.values())
    gain = np.exp(res.params["L0.log_gain"]).max(axis=1)  # (S,) final gain
    # |logit| <= c * gain * |q||k| = d_k^-1/2 * gain * d_k; the gain only moved a little per step
    assert (res.stats["max_logit"][-1] <= 16**0.5 * gain * 1.01).all()


def test_attention_weights_rows_and_causality():
    task = previous_token_task(n=6, vocab=4)
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=2, causal=True)
    p = init_params(cfg, task, [0, 1])
    ws = attention_weights(p, cfg, task, task.sample(0, 3).x)
    assert len(ws) == 2 and ws[0].shape == (2, 3, 2, 6, 6)
    np.testing.assert_allclose(ws[1].sum(axis=-1), 1.0)
    assert np.all(np.triu(np.ones((6, 6)), 1) * ws[0] == 0)


def test_trained_previous_token_attends_to_previous_position():
    task = previous_token_task(n=6, vocab=4)
    res = train(ModelConfig(d_model=16), task, seeds=[0], steps=150, lr=0.03)
    w = res.attention(task.sample(9, 64).x)[0][0, :, 0]  # (batch, n, n)
    assert (np.argmax(w.mean(axis=0), axis=1)[1:] == np.arange(5)).all()


def test_head_mask_pruning():
    task = two_relation_task(n=6, vocab=3)
    cfg = ModelConfig(d_model=16, n_heads=4)
    res = train(cfg, task, seeds=[0, 1], steps=150, lr=0.03)
    full = res.evaluate()["accuracy"]
    none = res.evaluate(head_mask=np.zeros(4))["accuracy"]
    assert (full > 0.9).all() and (none < 0.5).all()
    # a per-seed mask equals evaluating each seed with its own mask
    masks = np.array([[[1, 0, 1, 1]], [[0, 1, 1, 0]]])
    both = res.evaluate(head_mask=masks)["accuracy"]
    for s in range(2):
        one = res.evaluate(head_mask=masks[s, 0])["accuracy"][s]
        assert both[s] == one
    # masking through the config is the same as masking at evaluation
    masked_cfg = replace(cfg, head_mask=(1, 0, 1, 1))
    np.testing.assert_allclose(
        evaluate(res.params, masked_cfg, task, res.eval_batch)["loss"], res.evaluate(head_mask=(1, 0, 1, 1))["loss"]
    )


def test_float32_runs_and_matches_float64_closely():
    task = previous_token_task(n=6, vocab=4)
    r64 = train(ModelConfig(d_model=16), task, seeds=[0], steps=20, eval_size=32)
    r32 = train(ModelConfig(d_model=16, dtype="float32"), task, seeds=[0], steps=20, eval_size=32)
    assert r32.params["E"].dtype == np.float32
    np.testing.assert_allclose(r32.loss, r64.loss, rtol=1e-3)


# ------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        ({"scale": "cubic"}, ValueError, "scale"),
        ({"d_model": 0}, ValueError, "d_model"),
        ({"d_model": 10, "n_heads": 3}, ValueError, "d_k"),
        ({"n_heads": 2.0}, TypeError, "n_heads"),
        ({"score": "nope"}, ValueError, "score"),
        ({"encoder": "lstm"}, ValueError, "encoder"),
        ({"positional": "rotary"}, ValueError, "positional"),
        ({"share_qk": 1}, TypeError, "share_qk"),
        ({"q_init_scale": 0.0}, ValueError, "q_init_scale"),
        ({"n_heads": 2, "head_mask": (1, 0, 1)}, ValueError, "head_mask"),
        ({"head_mask": (0.5,)}, ValueError, "head_mask"),
        ({"dtype": "float16"}, ValueError, "dtype"),
        ({"sink": "null"}, ValueError, "sink"),
        ({"sink": True}, ValueError, "sink"),
        ({"sink": "learned", "score": "test_sigmoid"}, ValueError, "sink"),
    ],
)
def test_bad_config(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        ({"seeds": 3}, TypeError, "seeds"),
        ({"seeds": []}, ValueError, "seeds"),
        ({"seeds": [0, 0]}, ValueError, "seeds"),
        ({"seeds": [0.5]}, TypeError, "seeds"),
        ({"steps": 0}, ValueError, "steps"),
        ({"lr": -1.0}, ValueError, "lr"),
        ({"optimizer": "rmsprop"}, ValueError, "optimizer"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"momentum": 0.9}, ValueError, "momentum"),
        ({"train_size": 0}, ValueError, "train_size"),
    ],
)
def test_bad_train_arguments(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        train(ModelConfig(d_model=8), previous_token_task(), **{"steps": 2, **kwargs})


def test_bad_forward_arguments():
    task = previous_token_task(n=6, vocab=4)
    cfg = ModelConfig(d_model=8)
    p = init_params(cfg, task, [0, 1])
    with pytest.raises(TypeError, match="task"):
        train(cfg, "previous_token")
    with pytest.raises(TypeError, match="config"):
        train({"d_model": 8}, task)
    with pytest.raises(ValueError, match="x"):
        forward(p, cfg, task, np.zeros((3, 5), int))
    with pytest.raises(ValueError, match="x"):
        forward(p, cfg, task, np.full((3, 6), 9))
    with pytest.raises(TypeError, match="x"):
        forward(p, cfg, task, np.zeros((3, 6)))
    with pytest.raises(ValueError, match="head_mask"):
        forward(p, cfg, task, np.zeros((3, 6), int), head_mask=np.ones((3, 1, 1)))
    with pytest.raises(ValueError, match="y"):
        evaluate(p, cfg, task, TaskBatch(np.zeros((3, 6), int), np.zeros((3, 5), int)))
    with pytest.raises(ValueError, match="one-vector"):
        attention_weights(p, ModelConfig(d_model=8, encoder="mean_pool"), task, np.zeros((3, 6), int))
    with pytest.raises(ValueError, match="already registered"):
        register_score("dot", lambda q, k, p: q)
    with pytest.raises(ValueError, match="weights"):
        register_score("tmp", lambda q, k, p: q, weights="relu")


@pytest.mark.parametrize("causal", [False, True])
def test_the_trained_attention_is_the_core_attention(causal):
    # Training needs autograd, so the harness has its own attention layer; on random weights and
    # inputs its weights must be the core's softmax(q kᵀ/√d_k) (masked), the function the book derives.
    task = recall_task()
    cfg = ModelConfig(d_model=16, n_heads=2, causal=causal)
    params = init_params(cfg, task, (0, 1))
    x = task.sample(np.random.default_rng(3), 5).x
    q, k = query_key_vectors(params, cfg, task, x)  # (S, B, H, n, d_k)
    mask = causal_mask(q.shape[-2]) if causal else None
    _, want = scaled_dot_product_attention(q, k, k, mask=mask)
    np.testing.assert_allclose(attention_weights(params, cfg, task, x)[0], want, rtol=1e-12, atol=1e-15)


def test_the_one_training_loop_calls_its_hooks_and_reproduces_train():
    cfg, task = ModelConfig(d_model=8, scale="learned"), recall_task()
    ref = train(cfg, task, [0, 1], steps=4, lr=0.05, log_stats=False)
    params = init_params(cfg, task, [0, 1])
    xs, ys = step_batches(task, [0, 1], 4, 32)
    seen = []

    def freeze(t, grads):
        grads["L0.log_scale"][:] = 0.0  # a frozen parameter: Adam's step for it is exactly 0

    losses, out = optimise(
        loss_and_grad(cfg, task), params, xs, ys, adam(params, 0.05), record=lambda t, p, x: seen.append((t, x is None))
    )
    np.testing.assert_allclose(losses, ref.loss, rtol=1e-12)
    assert seen == [(0, False), (1, False), (2, False), (3, False), (4, True)]
    _, frozen = optimise(loss_and_grad(cfg, task), params, xs, ys, adam(params, 0.05), grad_hook=freeze)
    np.testing.assert_array_equal(frozen["L0.log_scale"], params["L0.log_scale"])
    assert not np.array_equal(frozen["L0.W_q"], params["L0.W_q"])


def test_the_objective_checks_its_batch_like_the_loss():
    cfg, task = ModelConfig(d_model=8), recall_task()
    params = init_params(cfg, task, [0, 1])
    batch = task.sample(0, 4)
    f = loss_and_grad(cfg, task)
    np.testing.assert_allclose(f(params, batch.x, batch.y)[0], per_seed_loss(params, cfg, task, batch.x, batch.y))
    with pytest.raises(ValueError, match="x tokens must lie in"):
        f(params, np.full_like(batch.x, -1), batch.y)  # -1 would index the last row of the one-hot silently
    with pytest.raises(ValueError, match="one batch per step"):
        optimise(f, params, batch.x[:0], batch.y[:0], adam(params, 0.1))


def _five_updates(seed: int):
    """Two parameters and five random gradients; ``run(step)`` applies the five updates of an optimiser."""
    rng = np.random.default_rng(seed)
    params = {"a": rng.standard_normal((2, 3)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(5)]

    def run(step):
        p = dict(params)
        for t, g in enumerate(grads, start=1):
            p = step(p, g, t)
        return p

    return params, run, grads


def test_adam_schedule_multiplies_the_rate_of_each_update():
    """``schedule(t)`` scales update t's rate: a constant factor is the same as a smaller rate, a linear
    warm-up's first update is 1/t_warm of the full one, and no schedule leaves Adam unchanged."""
    params, run, grads = _five_updates(0)

    half, scheduled = run(adam(params, 0.05)), run(adam(params, 0.1, schedule=lambda t: 0.5))
    for k in params:
        np.testing.assert_allclose(scheduled[k], half[k], rtol=1e-14)
    plain, none = run(adam(params, 0.1)), run(adam(params, 0.1, schedule=None))
    assert all(np.array_equal(plain[k], none[k]) for k in params)
    first_full = adam(params, 0.1)(params, grads[0], 1)
    first_warm = adam(params, 0.1, schedule=lambda t: min(1.0, t / 4))(params, grads[0], 1)
    for k in params:
        np.testing.assert_allclose(first_warm[k] - params[k], (first_full[k] - params[k]) / 4, rtol=1e-12)
    with pytest.raises(TypeError, match="schedule must be callable"):
        adam(params, 0.1, schedule=0.5)


def test_sgd_schedule_multiplies_the_rate_of_each_update():
    """The same opt-in ``schedule`` for SGD: update t moves by ``lr · schedule(t) · velocity``, one factor
    per parameter allowed; no schedule leaves SGD unchanged."""
    params, run, grads = _five_updates(1)

    for momentum in (0.0, 0.9):
        plain, none = run(sgd(params, 0.1, momentum)), run(sgd(params, 0.1, momentum, schedule=None))
        assert all(np.array_equal(plain[k], none[k]) for k in params)
    p = dict(params)
    warm = sgd(params, 0.1, schedule=lambda t: {"a": min(1.0, t / 4), "b": 1.0})
    for t, g in enumerate(grads, start=1):
        new = warm(p, g, t)
        np.testing.assert_allclose(new["a"], p["a"] - 0.1 * min(1.0, t / 4) * g["a"], rtol=1e-14)
        np.testing.assert_allclose(new["b"], p["b"] - 0.1 * g["b"], rtol=1e-14)
        p = new
    with pytest.raises(TypeError, match="schedule must be callable"):
        sgd(params, 0.1, schedule=0.5)


# ------------------------------------------------------------------ the sink key
@pytest.mark.parametrize("sink", ["learned", "key"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_sink_at_init_is_the_off_by_one_softmax(sink, causal):
    """sink="learned" / "key" start at logit 0: the real weights are e^z / (1 + Σ e^z), the other parameters are
    those of sink="none", and a sink logit s gives e^z / (e^s + Σ e^z)."""
    task = keyword_task(n=5, n_filler=4, n_keywords=2)
    plain, with_sink = ModelConfig(**BASE, causal=causal), ModelConfig(**BASE, causal=causal, sink=sink)
    p0, p1 = init_params(plain, task, [0, 1]), init_params(with_sink, task, [0, 1])
    assert set(p1) - set(p0) == {f"L0.sink_{'logit' if sink == 'learned' else 'key'}"}
    for k in p0:
        np.testing.assert_array_equal(p0[k], p1[k])
    x = task.sample(0, 6).x
    w0 = attention_weights(p0, plain, task, x)[0]
    w1 = attention_weights(p1, with_sink, task, x)[0]
    # with plain weights w0 = e^z / Z, the off-by-one weights are e^z / (1 + Z) = w0 · Z / (1 + Z)
    q, k = query_key_vectors(p0, plain, task, x)  # layer 0's raw q, k: logits z = q·k / sqrt(d_k)
    z = q @ np.swapaxes(k, -1, -2) * plain.fixed_scale()
    e = np.exp(z) * (causal_mask(5) if causal else 1.0)
    np.testing.assert_allclose(w1, e / (1.0 + e.sum(axis=-1, keepdims=True)), rtol=1e-12, atol=1e-15)
    rows = w1.sum(axis=-1, keepdims=True)
    assert (rows < 1).all() and (rows > 0).all()
    if sink == "learned":
        s = np.array([[0.7, -1.3], [2.0, 0.1]])  # (S, H)
        p2 = {**p1, "L0.sink_logit": s}
        w2 = attention_weights(p2, with_sink, task, x)[0]
        # Z = Σ e^z from the off-by-one rows: r = Z / (1 + Z); then rows with sink s are Z / (e^s + Z)
        Z = rows / (1 - rows)
        want = w0 * Z / (np.exp(s)[:, None, :, None, None] + Z)
        np.testing.assert_allclose(w2, want, rtol=1e-10, atol=1e-15)


def test_a_sink_needs_softmax_weights_and_sink_key_takes_the_query():
    task = keyword_task(n=5, n_filler=4, n_keywords=2)
    cfg = ModelConfig(**BASE, sink="key")
    p = init_params(cfg, task, [0])
    assert p["L0.sink_key"].shape == (1, BASE["n_heads"], BASE["d_model"] // BASE["n_heads"])
    x = task.sample(0, 4).x
    p["L0.sink_key"] = np.full_like(p["L0.sink_key"], 50.0)
    w = attention_weights(p, cfg, task, x)[0]
    # a huge sink key: queries aligned with it give almost everything to the sink, the others almost nothing
    rows = w.sum(axis=-1)
    assert rows.min() < 1e-6 and rows.max() > 1 - 1e-6
