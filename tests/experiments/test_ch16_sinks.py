"""Chapter 16's module: the sink as an extra key, the absent-keyword task, the window caches,
the Gaussian entropy and soft-capping."""

import autograd.numpy as anp
import numpy as np
import pytest
from autograd import elementwise_grad

import attn_utils as au
from attn_utils import harness as hz
from attn_utils.experiments import ch16_sinks as ex


def test_off_by_one_softmax_is_an_extra_key_of_logit_zero_and_value_zero():
    rng = np.random.default_rng(0)
    z, v = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
    w = ex.sink_weights(z)  # s = 0
    np.testing.assert_allclose(w, np.exp(z) / (1.0 + np.exp(z).sum(axis=-1, keepdims=True)), rtol=1e-14)
    # the same output as attention over the 7 keys plus a key of logit 0 whose value is 0
    full = au.softmax(np.concatenate([z, np.zeros((5, 1))], axis=1))
    np.testing.assert_allclose(w @ v, full @ np.vstack([v, np.zeros((1, 3))]), rtol=1e-13, atol=1e-15)
    # a sink logit s: what remains for the real keys is Σe^z / (e^s + Σe^z)
    s = np.array([[-2.0], [0.0], [1.0], [3.0], [10.0]])
    left = ex.sink_weights(z, s).sum(axis=-1, keepdims=True)
    Z = np.exp(z).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(left, Z / (np.exp(s) + Z), rtol=1e-13)
    one = np.repeat(z[:1], 4, axis=0)
    assert (np.diff(ex.sink_weights(one, np.array([[-1.0], [0.0], [1.0], [2.0]])).sum(axis=-1)) < 0).all()


def test_sink_weights_refuses_a_scalar():
    with pytest.raises(ValueError, match="z"):
        ex.sink_weights(1.0)


def test_absent_keyword_task():
    task = ex.absent_keyword_task(n=10, n_filler=8, n_keywords=3)
    b = task.sample(0, 2000)
    assert b.x.shape == (2000, 10) and (b.x[:, 0] == task.options["bos"]).all()
    kw = (b.x >= 8) & (b.x < 11)
    np.testing.assert_array_equal(kw.sum(axis=1), b.info["present"].astype(int))
    np.testing.assert_array_equal(b.y > 0, b.info["present"])
    rows = np.flatnonzero(b.info["present"])
    assert (b.x[rows][kw[rows]] - 8 + 1 == b.y[rows]).all()
    assert abs(b.info["present"].mean() - 0.5) < 0.05
    with pytest.raises(ValueError, match="n"):
        ex.absent_keyword_task(n=2)


def test_window_cache_and_stream_batch():
    x = np.arange(20).reshape(1, 20)
    np.testing.assert_array_equal(ex.window_cache(x, 5), [[15, 16, 17, 18, 19]])
    np.testing.assert_array_equal(ex.window_cache(x, 5, 1), [[0, 16, 17, 18, 19]])
    with pytest.raises(ValueError, match="n_sink"):
        ex.window_cache(x, 5, 5)
    task = ex.absent_keyword_task(n=8, n_filler=8, n_keywords=2)
    b = ex.stream_batch(np.random.default_rng(1), task, 30, 8, 400)
    assert b.x.shape == (400, 30)
    kw = (b.x >= 8) & (b.x < 10)
    # the keyword always stays inside both caches
    for n_sink in (0, 1):
        cached = ex.window_cache(b.x, 8, n_sink)
        np.testing.assert_array_equal(((cached >= 8) & (cached < 10)).sum(axis=1), kw.sum(axis=1))
    with pytest.raises(ValueError, match="window"):
        ex.stream_batch(np.random.default_rng(1), task, 30, 40, 4)


def test_train_lr_sweep_matches_train_per_rate():
    task = ex.absent_keyword_task(n=6, n_filler=8, n_keywords=2)
    cfg = hz.ModelConfig(d_model=8, causal=True, positional="none", sink="learned")
    run = ex.train_lr_sweep(cfg, task, [0, 1, 2, 3], (0.01, 0.03), steps=20, batch_size=8, eval_size=32)
    assert run["loss"].shape == (20, 4) and run["n_seeds"] == 2
    one = hz.train(cfg, task, seeds=[2, 3], steps=20, lr=0.03, batch_size=8, eval_size=32, log_stats=False)
    np.testing.assert_allclose(run["loss"][:, 2:], one.loss, rtol=1e-10)
    np.testing.assert_allclose(run["eval"]["loss"][2:], one.eval_loss, rtol=1e-10)
    assert ex.slots_of(run, 1) == slice(2, 4) and ex.select_rate(run) in (0, 1)
    P = ex.parking(run["params"], cfg, task, run["eval_batch"])
    for key in ("first", "sink", "largest", "entropy"):
        assert P[key].shape == (4,)
    assert (P["sink"] > 0).all() and (P["first"] <= P["largest"] + 1e-15).all()
    with pytest.raises(ValueError, match="seeds"):
        ex.train_lr_sweep(cfg, task, [0, 1, 2], (0.01, 0.03), steps=2)


def test_softcap_bound_and_gradient():
    z = np.linspace(-300, 300, 601)
    c = 50.0
    capped = ex.softcap(z, c)
    assert (np.abs(capped) < c + 1e-12).all() and np.isclose(ex.softcap(1e-8, c), 1e-8)
    auto = elementwise_grad(lambda t: c * anp.tanh(t / c))(z)
    np.testing.assert_allclose(ex.softcap_grad(z, c), auto, rtol=1e-10, atol=1e-15)
    with pytest.raises(ValueError, match="c"):
        ex.softcap(z, 0.0)


def test_gaussian_entropy_formula():
    assert ex.gaussian_entropy(100, 0.0) == pytest.approx(np.log(100))
    assert ex.gaussian_entropy(100, 2.0, 0.5) == pytest.approx(np.log(100) - 0.5)
