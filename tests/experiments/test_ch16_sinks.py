"""Chapter 16's module: the sink as an extra key, the bigram-backcopy task, the paired trainer, where the
weight parks, the window caches, the Gaussian entropy and soft-capping."""

import autograd.numpy as anp
import numpy as np
import pytest
from autograd import elementwise_grad

import attn_utils as au
from attn_utils import harness as hz
from attn_utils.experiments import ch16_sinks as ex


def test_off_by_one_softmax_is_an_extra_key_of_logit_zero_and_value_zero():
    z = np.random.default_rng(0).standard_normal((3, 5))
    w = ex.sink_weights(z)  # z0 = 0
    np.testing.assert_allclose(w, np.exp(z) / (1 + np.exp(z).sum(axis=-1, keepdims=True)), rtol=1e-12)
    z0 = np.array([[-2.0], [0.5], [3.0]])
    left = ex.sink_weights(z, z0).sum(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(1 - left, 1 / (1 + np.exp(lse - z0)), rtol=1e-12)
    one = np.zeros((4, 3))
    assert (np.diff(ex.sink_weights(one, np.array([[-1.0], [0.0], [1.0], [2.0]])).sum(axis=-1)) < 0).all()


def test_sink_weights_refuses_a_scalar():
    with pytest.raises(ValueError, match="key axis"):
        ex.sink_weights(1.0)


def test_bigram_backcopy_task_follows_its_rules():
    task = ex.bigram_backcopy_task(np.random.default_rng(3), n=12, n_tokens=8, n_triggers=2)
    b = task.sample(0, 3000)
    x, y, trig = b.x, b.y, b.info["trigger"]
    assert x.shape == (3000, 12) and (x[:, 0] == 8).all() and (x[:, 1] >= 2).all() and x[:, 1:].max() < 8
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    assert (y[:, -1] == hz.IGNORE).all()
    rows, cols = np.nonzero(trig)
    assert rows.size > 0 and (cols >= 2).all()
    np.testing.assert_array_equal(x[rows, cols + 1], x[rows, cols - 1])  # a trigger's successor copies
    # the successors of ordinary tokens follow the table's rows
    table = task.options["table"]
    a = x[:, 1:-1][~trig[:, 1:-1]]
    nxt = x[:, 2:][~trig[:, 1:-1]]
    counts = np.zeros((8, 8))
    np.add.at(counts, (a, nxt), 1)
    counts, table = counts[2:], table[2:]  # rows of the ordinary tokens (triggers are never followed by a draw)
    freq = counts / counts.sum(axis=1, keepdims=True)
    se = np.sqrt(table * (1 - table) / counts.sum(axis=1, keepdims=True))
    assert (np.abs(freq - table) <= 5 * se + 1e-9).all()
    with pytest.raises(ValueError, match="n_triggers"):
        ex.bigram_backcopy_task(np.random.default_rng(0), n_tokens=4, n_triggers=4)
    with pytest.raises(TypeError, match="Generator"):
        ex.bigram_backcopy_task(3)


def test_train_groups_none_is_the_plain_softmax_and_groups_are_paired():
    task = ex.bigram_backcopy_task(np.random.default_rng(1), n=6, n_tokens=6, n_triggers=1)
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True, sink="learned")
    run = ex.train_groups(cfg, [(task, "none", 0.02), (task, "learned", 0.02)], [4, 5], steps=15, eval_size=32)
    assert run["loss"].shape == (15, 4) and ex.group(run, 1) == slice(2, 4)
    plain = hz.train(
        hz.ModelConfig(d_model=8, d_k=4, causal=True),
        task,
        seeds=[4, 5],
        steps=15,
        lr=0.02,
        batch_size=16,
        eval_size=32,
        log_stats=False,
    )
    np.testing.assert_allclose(run["loss"][:, :2], plain.loss, rtol=1e-9)
    assert (run["params"]["L0.sink_logit"][:2] == ex.NO_SINK).all()
    assert (run["params"]["L0.sink_logit"][2:] != 0).all()
    np.testing.assert_array_equal(run["loss"][0, :2], run["loss"][0, 2:] * 0 + run["loss"][0, :2])
    stats = ex.backcopy_parking(run["params"], cfg, task, run["eval_batch"])
    assert set(stats) == {"bos", "sink", "self", "other", "prev", "loss_plain", "loss_trigger"}
    assert np.abs(stats["sink"][:2]).max() < 1e-12 and (stats["sink"][2:] > 0).all()
    with pytest.raises(ValueError, match="sink"):
        ex.train_groups(hz.ModelConfig(d_model=8), [(task, "none", 0.1)], [0], steps=1)


def test_window_cache_and_stream_losses():
    x = np.arange(20).reshape(1, 20)
    np.testing.assert_array_equal(ex.window_cache(x, 5), [[15, 16, 17, 18, 19]])
    np.testing.assert_array_equal(ex.window_cache(x, 5, 1), [[0, 16, 17, 18, 19]])
    with pytest.raises(ValueError, match="n_sink"):
        ex.window_cache(x, 5, 5)
    task = ex.bigram_backcopy_task(np.random.default_rng(2), n=6, n_tokens=6, n_triggers=1)
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True, sink="learned")
    params = hz.init_params(cfg, task, [0, 1])
    out = ex.stream_losses(params, cfg, task, np.random.default_rng(0), 20, batch=64)
    assert out["window"].shape == (2, 64) and out["plain"].shape == (64,)
    assert (out["window"] > 0).all() and (out["bos+window"] > 0).all()
    with pytest.raises(ValueError, match="length"):
        ex.stream_losses(params, cfg, task, np.random.default_rng(0), 5)


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
    assert ex.gaussian_entropy(100, 2.0, 0.5, finite_n=False) == pytest.approx(np.log(100) - 0.5)
    # the 1/n term against a large simulation where it is resolved (n = 256, beta * sigma = 1)
    g = np.random.default_rng(0).standard_normal((20000, 256))
    H = au.entropy(au.softmax(g))
    se = H.std() / np.sqrt(H.size)
    assert abs(H.mean() - ex.gaussian_entropy(256, 1.0)) < 5 * se
    assert abs(H.mean() - ex.gaussian_entropy(256, 1.0, finite_n=False)) > 5 * se


def test_stream_losses_query_sits_at_a_scored_position():
    """The cache holds n − 1 tokens: the query is at position n − 2, the last one the task scores."""
    task = ex.bigram_backcopy_task(np.random.default_rng(2), n=6, n_tokens=6, n_triggers=1)
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True, sink="learned")
    params = hz.init_params(cfg, task, [0])
    rng = np.random.default_rng(5)
    out = ex.stream_losses(params, cfg, task, rng, 20, batch=4)
    x = ex.backcopy_chain(np.random.default_rng(5), task.options["table"], 1, 4, 21)
    cache = np.pad(ex.window_cache(x[:, :20], 5, 1), ((0, 0), (0, 1)))
    logp = au.log_softmax(hz.forward(params, cfg, task, cache)[:, :, 4])
    np.testing.assert_allclose(out["bos+window"], -logp[:, np.arange(4), x[:, 20]], rtol=1e-6)
    assert (task.sample(np.random.default_rng(0), 3).y[:, 4] >= 0).all()  # position n − 2 is scored


def test_random_first_token_variant():
    task = ex.bigram_backcopy_task(np.random.default_rng(3), n=8, n_tokens=6, n_triggers=2, first="random")
    b = task.sample(np.random.default_rng(1), 2000)
    first = b.x[:, 0]
    assert ((first >= 2) & (first < 6)).all() and len(np.unique(first)) == 4  # ordinary non-trigger tokens
    with pytest.raises(ValueError, match="first"):
        ex.bigram_backcopy_task(np.random.default_rng(3), first="none")


def test_value_norms_matches_the_head_output_at_full_weight():
    task = ex.bigram_backcopy_task(np.random.default_rng(3), n=6, n_tokens=6, n_triggers=1)
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True)
    params = hz.init_params(cfg, task, [0, 1])
    x = task.sample(np.random.default_rng(0), 3).x
    got = ex.value_norms(params, cfg, task, x)
    s, b, j = 1, 2, 3
    h = params["E"][s, x[b, j]] + params["P"][s, j]
    direct = h @ params["L0.W_v"][s].reshape(8, -1) @ params["L0.W_o"][s].reshape(-1, 8)
    assert got.shape == (2, 3, 6) and np.isclose(got[s, b, j], np.linalg.norm(direct))
    with pytest.raises(ValueError, match="n_layers"):
        ex.value_norms(params, hz.ModelConfig(d_model=8, n_layers=2), task, x)


def test_convex_combination_needs_zero_in_the_hull_not_a_zero_value():
    """Prop. 1: |o| ≤ max |v|, and o = 0 happens with opposing values none of which is zero."""
    g = np.random.default_rng(0)
    v = g.standard_normal((5, 3))
    w = au.softmax(4 * g.standard_normal((1000, 5)))
    assert (np.linalg.norm(w @ v, axis=1) <= np.linalg.norm(v, axis=1).max() + 1e-12).all()
    opposing = np.array([[1.0, 0, 0], [-1.0, 0, 0], [0, 1.0, 0]])
    assert np.linalg.norm(au.softmax(np.array([0.0, 0.0, -30.0])) @ opposing) < 1e-12
    # values all with first coordinate ≥ 1: 0 is outside the hull, no weights reach it
    far = np.abs(v) + 1.0
    assert ((w @ far)[:, 0] >= 1.0 - 1e-12).all()


def test_temperature_is_not_a_soft_cap():
    """No single temperature reproduces c·tanh(z/c) on a small-logit and a large-logit row, and the cap
    breaks softmax's shift invariance."""
    c = 50.0
    rows = [np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.0, 90.0, 100.0])]
    capped = [au.softmax(ex.softcap(r, c)) for r in rows]
    temps = np.geomspace(0.1, 100, 601)
    worst = [max(0.5 * np.abs(au.softmax(r / T) - p).sum() for r, p in zip(rows, capped)) for T in temps]
    assert min(worst) > 0.2
    np.testing.assert_allclose(au.softmax(rows[0] + 60.0), au.softmax(rows[0]))
    assert np.abs(au.softmax(ex.softcap(rows[0] + 60.0, c)) - capped[0]).max() > 0.1


def test_trigger_rate_mixes_every_row_with_the_triggers():
    task = ex.bigram_backcopy_task(np.random.default_rng(4), n=8, n_tokens=6, n_triggers=2, trigger_rate=0.3)
    table = task.options["table"]
    np.testing.assert_allclose(table.sum(axis=1), 1.0)
    assert (table[:, :2].sum(axis=1) >= 0.3 - 1e-12).all()
    with pytest.raises(ValueError, match="trigger_rate"):
        ex.bigram_backcopy_task(np.random.default_rng(4), trigger_rate=1.0)


def test_train_groups_schedule_and_checkpoint():
    task = ex.bigram_backcopy_task(np.random.default_rng(1), n=6, n_tokens=6, n_triggers=1)
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True, sink="learned")
    groups = [(task, "none", 0.02), (task, "learned", 0.02)]
    start = ex.train_groups(cfg, groups, [4, 5], steps=6, eval_size=8, checkpoint=0)
    end = ex.train_groups(cfg, groups, [4, 5], steps=6, eval_size=8, checkpoint=6)
    for k, v in end["params"].items():  # checkpoint 0 is the initialisation, checkpoint = steps the end
        np.testing.assert_array_equal(end["params_at_checkpoint"][k], v)
        np.testing.assert_array_equal(start["params"][k], v)
        assert not np.array_equal(start["params_at_checkpoint"][k], v) or k == "L0.sink_logit"
    assert ex.train_groups(cfg, groups, [4, 5], steps=2, eval_size=8)["params_at_checkpoint"] is None
    # the schedule multiplies the rate: eta = 0.02 at half rate is eta = 0.01
    halved = ex.train_groups(cfg, groups, [4, 5], steps=6, eval_size=8, schedule=lambda t: 0.5)
    slower = ex.train_groups(cfg, [(task, "none", 0.01), (task, "learned", 0.01)], [4, 5], steps=6, eval_size=8)
    np.testing.assert_array_equal(halved["loss"], slower["loss"])
    assert not np.array_equal(halved["loss"], start["loss"])
    for bad in (-1, 7, 2.5):
        with pytest.raises(ValueError, match="checkpoint"):
            ex.train_groups(cfg, groups, [4, 5], steps=6, checkpoint=bad)


@pytest.mark.parametrize("first", ["bos", "random"])
def test_excess_loss_is_the_expected_loss_above_the_entropy_of_the_true_law(first):
    task = ex.bigram_backcopy_task(
        np.random.default_rng(0), n=8, n_tokens=6, n_triggers=2, trigger_rate=0.3, first=first
    )
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True, sink="learned")
    params = hz.init_params(cfg, task, [0, 1])
    b = task.sample(np.random.default_rng(1), 4000)
    excess = ex.excess_loss(params, cfg, task, b.x)
    assert excess.shape == (2,) and (excess > 0).all()
    # sampled targets: mean loss minus the entropy of the law they were drawn from has mean `excess`
    V, T = 6, 2
    law = task.options["table"][np.minimum(b.x[:, :-1], V - 1)]
    law[:, 0] = (np.arange(V) >= T) / (V - T)
    entropy = np.where(b.info["trigger"][:, :-1], 0.0, au.entropy(law))
    d = ex.token_losses(params, cfg, task, b.x, b.y)[..., :-1] - entropy
    se = d.std(axis=(1, 2)) / np.sqrt(d[0].size)
    assert (np.abs(d.mean(axis=(1, 2)) - excess) < 5 * se).all()


def test_bigram_excess_is_the_cost_of_never_copying():
    task = ex.bigram_backcopy_task(np.random.default_rng(0), n=8, n_tokens=6, n_triggers=2, trigger_rate=0.3)
    x = np.stack([task.sample(np.random.default_rng(s), 2000).x for s in (1, 2)])
    got = ex.bigram_excess(task, x)
    # by hand: -ln q(x_{i-1} | x_i) at every trigger, with q the pooled empirical law, over all n - 1 scored positions
    trig, prev = x[..., 1:-1].ravel(), x[..., :-2].ravel()
    keep = trig < 2
    q = {(t, a): np.mean(prev[keep][trig[keep] == t] == a) for t in (0, 1) for a in range(6)}
    nll = np.array([-np.log(q[t, a]) if t < 2 else 0.0 for t, a in zip(trig, prev)]).reshape(2, -1)
    np.testing.assert_allclose(got, nll.sum(axis=1) / (2000 * 7))
    assert (got > 0.05).all()  # never copying costs something on this task
    # an untrained model pays more than the bigram model
    cfg = hz.ModelConfig(d_model=8, d_k=4, causal=True)
    assert (ex.excess_loss(hz.init_params(cfg, task, [0, 1]), cfg, task, x) > got).all()
    with pytest.raises(ValueError, match="x must have shape"):
        ex.bigram_excess(task, x[0])
