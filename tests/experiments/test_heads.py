"""Unit and property tests for attn_utils.experiments.ch09_heads (chapter 9)."""

import numpy as np
import pytest
from autograd import grad
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import init_mha_params, mha_param_count, multi_head_attention, softmax
from attn_utils.experiments.ch09_heads import (
    fit_attention_pattern,
    greedy_head_pruning,
    hard_pattern_factors,
    head_contributions,
    log_ratio_matrix,
    logit_factors,
    min_head_dim,
)
from attn_utils.harness.layers import self_attention_layer
from attn_utils.harness.tasks import two_relation_task
from attn_utils.harness.training import ModelConfig, init_params, loss, train

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


@pytest.mark.parametrize("h", [1, 2, 8, 64])
def test_parameters_and_attention_weights_at_d_over_h(h):
    """The shape counts chapter 9 prints: 4·d_model² weights and h·n² attention weights for every h."""
    rng = np.random.default_rng(0)
    d, n = 128, 16
    params = init_mha_params(rng, d, h)
    assert sum(w.size for w in params.values()) == 4 * d * d == mha_param_count(d, h)
    _, weights = self_attention_layer(rng.standard_normal((n, d)), params, h=h)
    assert weights.size == h * n * n


def test_parameters_grow_with_h_at_fixed_dk_and_harness_layers_match():
    rng = np.random.default_rng(0)
    fixed = {h: sum(w.size for w in init_mha_params(rng, 512, h, d_k=64, d_v=64).values()) for h in (8, 16)}
    assert fixed[16] == 2 * fixed[8]
    task = two_relation_task(n=6, vocab=4)
    sizes = {
        h: sum(
            v[0].size
            for k, v in init_params(ModelConfig(d_model=16, n_heads=h), task, (0,)).items()
            if k.startswith("L0.")
        )
        for h in (1, 2, 16)
    }
    assert sizes[1] == sizes[2] == sizes[16]


# ---------------------------------------------------------------- reachable patterns


def test_log_ratio_matrix_values_and_shape():
    p = np.array([[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]])
    r = log_ratio_matrix(p)
    assert r.shape == (2, 2)
    np.testing.assert_allclose(r, [[np.log(2), 0.0], [np.log(1 / 3), np.log(1 / 3)]])


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.array([[1.0, 0.0], [0.5, 0.5]]), "strictly positive"),
        (np.array([[0.6, 0.6], [0.5, 0.5]]), "sum to 1"),
        (np.array([[1.0], [1.0]]), "at least 2 keys"),
        (np.array([0.5, 0.5]), "at least 2 axes"),
    ],
)
def test_log_ratio_matrix_rejects_bad_patterns(bad, match):
    with pytest.raises(ValueError, match=match):
        log_ratio_matrix(bad)


@pytest.mark.parametrize("n", range(2, 9))
def test_identity_like_pattern_needs_n_minus_1(n):
    p = softmax(3.0 * np.eye(n))
    assert min_head_dim(p) == n - 1
    q, k = logit_factors(p, n - 1)
    np.testing.assert_allclose(softmax(q @ k.T), p, atol=1e-12)
    if n > 2:
        q, k = logit_factors(p, n - 2)
        assert np.abs(softmax(q @ k.T) - p).max() > 1e-3


@pytest.mark.parametrize("seed", range(5))
def test_random_pattern_has_full_log_ratio_rank(seed):
    """A random positive pattern (as in the chapter) has rank R = n − 1: the largest possible."""
    rng = np.random.default_rng(seed)
    for n in (2, 3, 5, 8):
        assert min_head_dim(softmax(2.0 * rng.standard_normal((n, n)))) == n - 1


def test_uniform_pattern_needs_no_dimension():
    p = np.full((4, 4), 0.25)
    assert min_head_dim(p) == 0
    q, k = logit_factors(p, 1)
    np.testing.assert_allclose(softmax(q @ k.T), p, atol=1e-15)


@PROPS
@given(seed=st.integers(0, 10_000), n=st.integers(2, 6), r=st.integers(1, 5))
def test_rank_r_logits_are_recovered_exactly(seed, n, r):
    """Property: any pattern made by rank-r logits (plus row shifts) has min_head_dim ≤ r and is rebuilt exactly."""
    rng = np.random.default_rng(seed)
    r = min(r, n)
    s = rng.standard_normal((n, r)) @ rng.standard_normal((r, n)) + rng.standard_normal((n, 1)) * 5
    p = softmax(s)
    assert min_head_dim(p, rtol=1e-8) <= r
    q, k = logit_factors(p, r)
    np.testing.assert_allclose(softmax(q @ k.T), p, atol=1e-10)


def test_fit_attention_pattern_floor():
    rng = np.random.default_rng(1)
    target = softmax(3.0 * np.eye(3))
    exact = fit_attention_pattern(target, 2, rng, restarts=4, steps=1500)
    short = fit_attention_pattern(target, 1, rng, restarts=4, steps=1500)
    assert exact.kl < 1e-8
    t, s = target[0, 0], target[0, 1]
    assert short.kl >= 0.5 * (t - s) ** 2 / 3  # Pinsker bound from the chapter
    np.testing.assert_allclose(short.pattern, softmax(short.q @ short.k.T))
    assert short.kl_restarts.shape == (4,)


def test_three_token_size_one_optimum():
    """The optimum chapter 9 checks its 16-restart fit against: 200 independent restarts of 3000 steps agree."""
    target = softmax(3.0 * np.eye(3))
    fit = fit_attention_pattern(target, 1, np.random.default_rng(12345), restarts=200, steps=3000)
    assert fit.kl == pytest.approx(0.27563, abs=5e-6)
    assert fit.kl_restarts.max() - fit.kl < 1e-4  # no restart ends in another local minimum
    t, s = target[0, 0], target[0, 1]
    assert fit.kl > 2 * (t - s) ** 2 / 6  # the Pinsker bound holds with room to spare


def test_fit_attention_pattern_validation():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match="rng"):
        fit_attention_pattern(np.full((2, 2), 0.5), 1, 0)
    with pytest.raises(ValueError, match="2-D"):
        fit_attention_pattern(np.full((2, 2, 2), 0.5), 1, rng)


# ---------------------------------------------------------------- head contributions


@PROPS
@given(seed=st.integers(0, 10_000), h=st.sampled_from([1, 2, 4, 8]), n=st.integers(1, 6))
def test_head_contributions_sum_to_multi_head_attention(seed, h, n):
    rng = np.random.default_rng(seed)
    d = 16
    params = init_mha_params(rng, d, h)
    x = rng.standard_normal((2, n, d))
    parts = head_contributions(x, x, params, h)
    assert parts.shape == (2, h, n, d)
    np.testing.assert_allclose(parts.sum(axis=-3), multi_head_attention(x, x, params, h)[0], atol=1e-12)


def test_head_contributions_validation():
    rng = np.random.default_rng(0)
    params = init_mha_params(rng, 8, 2)
    with pytest.raises(ValueError, match="x_q axis -1"):
        head_contributions(np.zeros((3, 7)), np.zeros((3, 8)), params, 2)
    with pytest.raises(ValueError, match="missing"):
        head_contributions(np.zeros((3, 8)), np.zeros((3, 8)), {"W_q": params["W_q"]}, 2)


# ---------------------------------------------------------------- pruning


def _replay(res, curve, batch, s, m):
    """Accuracies of seed s along curve.order, by explicit head masks on batch."""
    keep = np.ones(m)
    out = [res.evaluate(batch, head_mask=keep.reshape(res.config.n_layers, -1))["accuracy"][s]]
    for head in curve.order[s]:
        keep[head] = 0
        out.append(res.evaluate(batch, head_mask=keep.reshape(res.config.n_layers, -1))["accuracy"][s])
    return np.array(out)


@pytest.mark.parametrize("n_layers", [1, 2])
def test_greedy_head_pruning_matches_direct_evaluation(n_layers):
    """Both code paths (affine in the mask for one layer, tiled candidates otherwise) replay exactly."""
    task = two_relation_task(n=6, vocab=4)
    cfg = ModelConfig(d_model=8, n_heads=4 // n_layers, n_layers=n_layers)
    m = 4
    res = train(cfg, task, seeds=(0, 1), steps=20, log_stats=False, eval_size=16)
    batch = task.sample(np.random.default_rng(5), 32)
    curve = greedy_head_pruning(res.params, cfg, task, batch)
    assert curve.accuracy.shape == (2, m + 1) and curve.order.shape == (2, m)
    np.testing.assert_array_equal(curve.selection, curve.accuracy)  # no eval batch: one and the same
    for s in range(2):
        assert sorted(curve.order[s]) == list(range(m))  # every head removed exactly once
        np.testing.assert_allclose(curve.accuracy[s], _replay(res, curve, batch, s, m))
    np.testing.assert_allclose(curve.accuracy[:, 0], res.evaluate(batch)["accuracy"])
    for s in range(2):  # the first step's scores: one head removed
        for head in range(m):
            keep = np.ones(m)
            keep[head] = 0
            acc = res.evaluate(batch, head_mask=keep.reshape(n_layers, -1))["accuracy"][s]
            assert acc == pytest.approx(curve.alone[s, head])
    # greedy: the first removal is the best single removal
    np.testing.assert_allclose(curve.accuracy[:, 1], curve.alone.max(axis=1))
    assert (curve.removable(1.0) == m).all()


def test_greedy_head_pruning_reports_on_a_separate_batch():
    task = two_relation_task(n=6, vocab=4)
    cfg = ModelConfig(d_model=8, n_heads=4)
    res = train(cfg, task, seeds=(0, 1, 2), steps=30, log_stats=False, eval_size=16)
    sel, ev = task.sample(np.random.default_rng(5), 16), task.sample(np.random.default_rng(6), 64)
    curve = greedy_head_pruning(res.params, cfg, task, sel, eval_batch=ev)
    alone = greedy_head_pruning(res.params, cfg, task, sel)
    np.testing.assert_array_equal(curve.order, alone.order)  # the order depends on the selection batch only
    np.testing.assert_allclose(curve.selection, alone.accuracy)
    for s in range(3):
        np.testing.assert_allclose(curve.accuracy[s], _replay(res, curve, ev, s, 4))
        np.testing.assert_allclose(curve.selection[s], _replay(res, curve, sel, s, 4))
    assert not np.allclose(curve.accuracy, curve.selection)  # two different batches, two curves


def test_greedy_head_pruning_validation():
    task = two_relation_task(n=6, vocab=4)
    cfg = ModelConfig(d_model=8, n_heads=2)
    params = init_params(cfg, task, (0,))
    batch = task.sample(np.random.default_rng(0), 4)
    with pytest.raises(TypeError, match="TaskBatch"):
        greedy_head_pruning(params, cfg, task, batch.x)
    with pytest.raises(TypeError, match="ModelConfig"):
        greedy_head_pruning(params, "cfg", task, batch)
    with pytest.raises(TypeError, match="eval_batch"):
        greedy_head_pruning(params, cfg, task, batch, eval_batch=batch.x)
    with pytest.raises(ValueError, match="eval_batch.x"):
        greedy_head_pruning(params, cfg, task, batch, eval_batch=type(batch)(batch.x[None], batch.y[None]))


def test_identical_heads_get_identical_gradients():
    """The symmetry argument of the chapter: nothing in the loss tells two equal heads apart."""
    task = two_relation_task(n=6, vocab=4)
    cfg = ModelConfig(d_model=8, n_heads=2)
    p = init_params(cfg, task, (0,))
    for name in ("L0.W_q", "L0.W_k", "L0.W_v"):
        p[name][:, :, 1] = p[name][:, :, 0]
    p["L0.W_o"][:, 1] = p["L0.W_o"][:, 0]
    batch = task.sample(np.random.default_rng(0), 8)
    g = grad(loss)(p, cfg, task, batch.x, batch.y)
    for name in ("L0.W_q", "L0.W_k", "L0.W_v"):
        np.testing.assert_allclose(g[name][:, :, 0], g[name][:, :, 1], atol=1e-12)
    np.testing.assert_allclose(g["L0.W_o"][:, 0], g["L0.W_o"][:, 1], atol=1e-12)


# ---------------------------------------------------------------- sharp patterns with d_k = 2


@PROPS
@given(seed=st.integers(0, 10_000), n=st.integers(2, 60), w=st.sampled_from([0.5, 0.9, 0.99, 0.999999]))
def test_hard_pattern_factors_reach_any_sharp_pattern(seed, n, w):
    """Property: any map query → key gets weight ≥ w on its key with d_k = 2, and the bound is tight."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, n, size=rng.integers(1, 2 * n))
    q, k = hard_pattern_factors(targets, n, w)
    assert q.shape == (targets.size, 2) and k.shape == (n, 2)
    p = softmax(q @ k.T)
    on_target = p[np.arange(targets.size), targets]
    assert (on_target >= w - 1e-9).all()
    if n > 2 and w > 1 / n:  # the two nearest neighbours alone hold 2ε, ε = (1 − w)/(w(n − 1)): little slack
        eps = (1 - w) / (w * (n - 1))
        assert on_target.max() <= 1 / (1 + 2 * eps) + 1e-9


def test_hard_pattern_factors_identity_beats_the_rank_bound():
    """softmax(a·I) needs d_k = n − 1 exactly, but its sharp limit needs only d_k = 2."""
    n = 12
    q, k = hard_pattern_factors(np.arange(n), n, 0.99)
    p = softmax(q @ k.T)
    assert np.diag(p).min() >= 0.99
    assert min_head_dim(p) <= 2 < n - 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_rank_limited_logits_make_identity_sharp_for_unit_vectors(seed):
    """Chapter 9: n = 50 distinct unit vectors in 8 dimensions; c = log((n−1)w/(1−w))/(1 − max cos) on c·XXᵀ
    puts at least w on the diagonal (the circle argument with δ = 1 − max cos)."""
    rng = np.random.default_rng(seed)
    n, d, w = 50, 8, 0.999
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cos_max = (x @ x.T - 2 * np.eye(n)).max()
    c = np.log((n - 1) * w / (1 - w)) / (1 - cos_max)
    assert np.diag(softmax(c * x @ x.T)).min() >= w


@pytest.mark.parametrize(
    "args, err, match",
    [
        ((np.array([0, 1]), 1, 0.9), ValueError, "at least 2"),
        ((np.array([0, 3]), 3, 0.9), ValueError, "lie in"),
        ((np.array([0.0, 1.0]), 3, 0.9), TypeError, "integer"),
        ((np.array([[0, 1]]), 3, 0.9), TypeError, "1-d"),
        ((np.array([0, 1]), 3, 1.0), ValueError, "strictly between"),
    ],
)
def test_hard_pattern_factors_validation(args, err, match):
    with pytest.raises(err, match=match):
        hard_pattern_factors(*args)


@PROPS
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30))
def test_size_one_head_aims_at_two_keys_at_most(seed, n):
    """Part (c): with d_k = 1 every row's maximum sits on the largest or the smallest key value."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((n, 1)), rng.standard_normal((n, 1))
    top = softmax(q @ k.T).argmax(axis=1)
    assert set(top) <= {int(k.argmax()), int(k.argmin())}
    assert np.unique(top).size <= 2


# ---------------------------------------------------------------- one head carrying two tokens


@pytest.mark.parametrize("vocab", [2, 3, 8])
def test_two_token_average_collapses_only_at_one_half(vocab):
    """alpha e_a + (1 - alpha) e_b: at alpha = 1/2 the V² pairs give V + V(V-1)/2 vectors (a = b, plus
    one per unordered pair); at alpha = 0.7 all V² differ, and largest → a, second → b reads every pair back."""
    E = np.eye(vocab)
    a, b = np.divmod(np.arange(vocab * vocab), vocab)
    half = 0.5 * E[a] + 0.5 * E[b]
    assert len(np.unique(half, axis=0)) == vocab + vocab * (vocab - 1) // 2
    out = 0.7 * E[a] + 0.3 * E[b]
    assert len(np.unique(out, axis=0)) == vocab * vocab
    order = np.argsort(-out, axis=1)
    decoded_b = np.where(a == b, a, order[:, 1])
    assert np.all(order[:, 0] == a) and np.all(decoded_b == b)
