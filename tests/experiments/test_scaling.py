"""Unit and property tests for attn_utils.experiments.ch04_scaling (chapter 4)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import attn_utils as au
from attn_utils import harness as hz
from attn_utils import running_mean
from attn_utils.experiments.ch04_scaling import ScaleRuleRuns, ScaleSweep, scale_exponent_sweep, train_scale_rules
from attn_utils.harness.training import query_key_vectors

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------- scale_exponent_sweep


def test_sweep_shapes_and_types():
    sw = scale_exponent_sweep(np.random.default_rng(0), [4, 16, 64], [0.0, 0.5], n_keys=8, n_draws=50)
    assert isinstance(sw, ScaleSweep)
    for field in ("logit_var", "entropy", "max_prob", "grad_median", "grad_mean"):
        assert getattr(sw, field).shape == getattr(sw, field + "_se").shape == (2, 3)
        assert np.all(getattr(sw, field + "_se") >= 0)
    assert sw.d_values.dtype == np.int64 and sw.n_keys == 8 and sw.n_draws == 50


@pytest.mark.parametrize("method", ["direct", "mixture"])
def test_logit_variance_is_d_to_the_one_minus_two_alpha(method):
    d_values, alphas = np.array([4, 64, 256]), np.array([0.0, 0.25, 0.5, 1.0])
    sw = scale_exponent_sweep(np.random.default_rng(1), d_values, alphas, n_keys=8, n_draws=3000, method=method)
    theory = d_values[None, :] ** (1 - 2 * alphas[:, None])
    np.testing.assert_allclose(sw.logit_var / theory, 1.0, atol=0.08)


def test_statistics_are_bounded_and_ordered():
    sw = scale_exponent_sweep(np.random.default_rng(2), [16, 256], [0.0, 0.5, 1.0], n_keys=16, n_draws=400)
    assert np.all((sw.entropy >= 0) & (sw.entropy <= 1 + 1e-12))
    assert np.all((sw.max_prob >= 1 / 16 - 1e-12) & (sw.max_prob <= 1 + 1e-12))
    # a larger exponent means smaller logits: entropy increases and the largest weight decreases with alpha
    assert np.all(np.diff(sw.entropy, axis=0) > 0)
    assert np.all(np.diff(sw.max_prob, axis=0) < 0)


def test_half_is_flat_and_others_drift():
    sw = scale_exponent_sweep(
        np.random.default_rng(3), [16, 1024], [0.0, 0.5, 1.0], n_keys=16, n_draws=600, method="mixture"
    )
    assert sw.entropy[1, 1] / sw.entropy[1, 0] == pytest.approx(1.0, abs=0.05)
    assert sw.grad_median[1, 1] / sw.grad_median[1, 0] == pytest.approx(1.0, abs=0.1)
    assert sw.max_prob[0, 1] > 0.9 and sw.entropy[2, 1] > 0.99
    assert sw.grad_median[2, 1] / sw.grad_median[2, 0] == pytest.approx((16 / 1024) ** 0.5, rel=0.15)


def test_direct_and_mixture_agree_in_distribution():
    kw = dict(n_keys=8, n_draws=8000)
    direct = scale_exponent_sweep(np.random.default_rng(4), [8, 32], [0.25, 0.5, 1.0], **kw)
    mixture = scale_exponent_sweep(np.random.default_rng(5), [8, 32], [0.25, 0.5, 1.0], method="mixture", **kw)
    np.testing.assert_allclose(direct.entropy, mixture.entropy, atol=0.01)
    np.testing.assert_allclose(direct.max_prob, mixture.max_prob, atol=0.01)
    np.testing.assert_allclose(direct.grad_median, mixture.grad_median, rtol=0.05)
    np.testing.assert_allclose(direct.grad_mean, mixture.grad_mean, rtol=0.05)


def test_direct_gradient_matches_hand_formula_on_the_same_draws():
    # replay the generator: the direct method draws q, k, v in this order for each d
    d, n, m, alpha = 6, 5, 7, 0.5
    sw = scale_exponent_sweep(np.random.default_rng(6), [d], [alpha], n_keys=n, n_draws=m)
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((m, d)), rng.standard_normal((m, n, d)), rng.standard_normal((m, n))
    s = d**-alpha
    p = au.softmax(s * np.einsum("mkd,md->mk", k, q))
    w = p * (v - np.sum(p * v, axis=-1, keepdims=True))  # J v
    grad = np.linalg.norm(s * np.einsum("mk,mkd->md", w, k), axis=-1)
    assert sw.grad_median[0, 0] == pytest.approx(np.median(grad), rel=1e-12)
    assert sw.grad_mean[0, 0] == pytest.approx(np.mean(grad), rel=1e-12)
    # the standard errors, from their definitions on the same draws
    assert sw.grad_mean_se[0, 0] == pytest.approx(np.std(grad, ddof=1) / np.sqrt(m), rel=1e-12)
    lo, hi = np.quantile(grad, [0.5 - 1 / np.sqrt(m), 0.5 + 1 / np.sqrt(m)])
    assert sw.grad_median_se[0, 0] == pytest.approx((hi - lo) / 4, rel=1e-12)
    ent = au.entropy(p) / np.log(n)
    assert sw.entropy_se[0, 0] == pytest.approx(np.std(ent, ddof=1) / np.sqrt(m), rel=1e-12)
    z = s * np.einsum("mkd,md->mk", k, q)
    rows = np.mean((z - z.mean()) ** 2, axis=-1)
    assert sw.logit_var[0, 0] == pytest.approx(rows.mean(), rel=1e-12)
    assert sw.logit_var_se[0, 0] == pytest.approx(np.std(rows, ddof=1) / np.sqrt(m), rel=1e-12)


@pytest.mark.parametrize("field", ["logit_var", "entropy", "max_prob", "grad_median", "grad_mean"])
def test_standard_errors_match_the_spread_over_repeated_sweeps(field):
    # the reported SE is the sd of the statistic over independent sweeps (within the noise of 60 repeats)
    rng = np.random.default_rng(11)
    runs = [scale_exponent_sweep(rng, [8], [0.5], n_keys=8, n_draws=400, method="mixture") for _ in range(60)]
    values = np.array([getattr(r, field)[0, 0] for r in runs])
    reported = np.mean([getattr(r, field + "_se")[0, 0] for r in runs])
    assert values.std(ddof=1) == pytest.approx(reported, rel=0.3)


def test_rest_dof_shift_zero_is_the_chi2_d_law():
    # u ~ χ²_d instead of χ²_(d−1): same weights, larger gradients (by about √(d/(d−1)) at small d)
    kw = dict(n_keys=8, n_draws=20_000, method="mixture")
    right = scale_exponent_sweep(np.random.default_rng(12), [4], [0.5], **kw)
    wrong = scale_exponent_sweep(np.random.default_rng(12), [4], [0.5], rest_dof_shift=0, **kw)
    np.testing.assert_array_equal(right.entropy, wrong.entropy)  # the logits do not involve u
    assert wrong.grad_median[0, 0] > 1.05 * right.grad_median[0, 0]
    d1 = scale_exponent_sweep(np.random.default_rng(13), [1], [0.5], rest_dof_shift=0, **kw)
    assert np.all(np.isfinite(d1.grad_median))


def test_d_equal_one_is_allowed_in_mixture():
    sw = scale_exponent_sweep(np.random.default_rng(7), [1, 2], [0.5], n_keys=4, n_draws=100, method="mixture")
    assert np.all(np.isfinite(sw.grad_median))


def test_sweep_is_reproducible():
    a = scale_exponent_sweep(np.random.default_rng(8), [4, 8], [0.5], n_keys=4, n_draws=30)
    b = scale_exponent_sweep(np.random.default_rng(8), [4, 8], [0.5], n_keys=4, n_draws=30)
    np.testing.assert_array_equal(a.entropy, b.entropy)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(rng=0), TypeError, "rng"),
        (dict(d_values=[[4, 8]]), ValueError, "d_values"),
        (dict(d_values=[4.5]), ValueError, "d_values"),
        (dict(d_values=[0]), ValueError, "d_values"),
        (dict(alphas=[]), ValueError, "alphas"),
        (dict(n_keys=1), ValueError, "n_keys"),
        (dict(n_draws=1), ValueError, "n_draws"),
        (dict(method="exact"), ValueError, "method"),
        (dict(method="mixture", rest_dof_shift=1), ValueError, "rest_dof_shift"),
        (dict(rest_dof_shift=0), ValueError, "rest_dof_shift"),
    ],
)
def test_sweep_rejects_bad_arguments(kwargs, exc, match):
    args = dict(rng=np.random.default_rng(0), d_values=[4], alphas=[0.5])
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        scale_exponent_sweep(args.pop("rng"), args.pop("d_values"), args.pop("alphas"), **args)


# ---------------------------------------------------------------- query_key_vectors


def _tiny_model(**overrides):
    task = hz.recall_task()
    config = hz.ModelConfig(d_model=8, d_k=4, **overrides)
    return task, config, hz.init_params(config, task, (0, 1))


def test_query_key_vectors_match_a_manual_computation():
    task, config, params = _tiny_model()
    x = task.sample(np.random.default_rng(0), 3).x
    q, k = query_key_vectors(params, config, task, x)
    assert q.shape == k.shape == (2, 3, 1, task.seq_len, 4)
    h = params["E"][1][x] + params["P"][1]  # seed 1, (3, n, 8)
    np.testing.assert_allclose(q[1, :, 0], h @ params["L0.W_q"][1][:, 0, :], rtol=1e-12)
    np.testing.assert_allclose(k[1, :, 0], h @ params["L0.W_k"][1][:, 0, :], rtol=1e-12)


def test_query_key_vectors_dot_product_reproduces_model_attention():
    task, config, params = _tiny_model(scale="sqrt")
    x = task.sample(np.random.default_rng(1), 4).x
    q, k = query_key_vectors(params, config, task, x)
    weights = au.softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(4))
    np.testing.assert_allclose(weights, hz.attention_weights(params, config, task, x)[0], atol=1e-12)


def test_query_key_vectors_shared_and_per_seed_inputs():
    task, config, params = _tiny_model(share_qk=True)
    x = task.sample(np.random.default_rng(2), 2).x
    q, k = query_key_vectors(params, config, task, np.stack([x, x]))
    np.testing.assert_array_equal(q, k)


def test_query_key_vectors_rejects_bad_input():
    task, config, params = _tiny_model()
    with pytest.raises(ValueError, match="x must have shape"):
        query_key_vectors(params, config, task, np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="integer"):
        query_key_vectors(params, config, task, np.zeros((2, task.seq_len)))
    with pytest.raises(ValueError, match="tokens"):
        query_key_vectors(params, config, task, np.full((2, task.seq_len), task.vocab_size))
    with pytest.raises(TypeError, match="params"):
        query_key_vectors({"E": params["E"]}, config, task, np.zeros((2, task.seq_len), dtype=np.int64))
    with pytest.raises(ValueError, match="encoder"):
        query_key_vectors(
            params, hz.ModelConfig(d_model=8, encoder="mean_pool"), task, np.zeros((2, task.seq_len), dtype=np.int64)
        )


# ---------------------------------------------------------------- train_scale_rules

MEMBERS = (("sqrt", 1e-2), ("linear", 3e-3), ("learned", 2e-2), ("none", 1e-2))


@pytest.fixture(scope="module")
def small_grid():
    task = hz.recall_task()
    return task, train_scale_rules(task, MEMBERS, (0, 3), d_k=16, steps=12, batch_size=8, eval_size=32)


def test_grid_members_equal_separate_train_calls(small_grid):
    # same model, initial weights, batches and Adam as attn_utils.train, member by member
    task, grid = small_grid
    assert isinstance(grid, ScaleRuleRuns)
    assert grid.loss.shape == (12, 4, 2) and grid.accuracy.shape == grid.eval_loss.shape == grid.scale.shape == (4, 2)
    for m, (rule, lr) in enumerate(MEMBERS):
        extra = {"learned_scale_init": 1.0} if rule == "learned" else {}
        ref = hz.train(
            hz.ModelConfig(d_model=32, d_k=16, scale=rule, **extra),
            task,
            seeds=(0, 3),
            steps=12,
            lr=lr,
            batch_size=8,
            eval_size=32,
        )
        np.testing.assert_allclose(grid.loss[:, m], ref.loss, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grid.eval_loss[m], ref.eval_loss, rtol=1e-9)
        mine = grid.params_of(m)
        for key in ref.params:
            np.testing.assert_allclose(mine[key], ref.params[key], rtol=1e-8, atol=1e-12, err_msg=key)
        np.testing.assert_array_equal(grid.eval_batch.x, ref.eval_batch.x)
        assert grid.index(rule, lr) == m


def test_grid_fixed_rules_keep_their_scale_and_learned_moves(small_grid):
    _, grid = small_grid
    np.testing.assert_allclose(grid.scale[grid.index("sqrt", 1e-2)], 16**-0.5, rtol=1e-14)
    np.testing.assert_allclose(grid.scale[grid.index("linear", 3e-3)], 1 / 16, rtol=1e-14)
    np.testing.assert_allclose(grid.scale[grid.index("none", 1e-2)], 1.0, rtol=1e-14)
    learned = grid.scale[grid.index("learned", 2e-2)]
    assert np.all(learned != 1.0) and np.all(np.isfinite(learned))


def test_grid_params_feed_query_key_vectors(small_grid):
    task, grid = small_grid
    q, k = query_key_vectors(grid.params_of(1), grid.config, task, grid.eval_batch.x)
    assert q.shape == (2, 32, 1, task.seq_len, 16)


def test_grid_learned_scale_init_matches_train():
    # the chapter starts the learned temperature at c = 1 (unscaled); any init must match attn_utils.train
    task = hz.recall_task()
    grid = train_scale_rules(
        task,
        [("learned", 2e-2), ("sqrt", 2e-2)],
        (1, 4),
        d_k=8,
        steps=8,
        batch_size=8,
        eval_size=16,
        learned_scale_init=0.5,
    )
    ref = hz.train(
        hz.ModelConfig(d_model=32, d_k=8, scale="learned", learned_scale_init=0.5),
        task,
        seeds=(1, 4),
        steps=8,
        lr=2e-2,
        batch_size=8,
        eval_size=16,
    )
    np.testing.assert_allclose(grid.loss[:, 0], ref.loss, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grid.scale[0], np.exp(ref.params["L0.log_scale"][:, 0]), rtol=1e-9)
    np.testing.assert_allclose(grid.accuracy[0], ref.accuracy, rtol=0, atol=0)
    np.testing.assert_allclose(grid.scale[1], 8**-0.5, rtol=1e-14)  # the fixed member ignores the init


def test_grid_float32_keeps_its_dtype():
    grid = train_scale_rules(
        hz.recall_task(),
        [("linear", 1e-2), ("learned", 1e-2)],
        (0,),
        d_k=8,
        steps=3,
        batch_size=4,
        eval_size=8,
        dtype="float32",
    )
    assert all(v.dtype == np.float32 for v in grid.params.values())
    assert grid.scale[0, 0] == pytest.approx(1 / 8, rel=1e-6) and grid.scale[1, 0] != 1.0


def test_grid_seeds_are_independent_of_members():
    task = hz.recall_task()
    one = train_scale_rules(task, [("sqrt", 1e-2)], (5,), d_k=8, steps=6, batch_size=4, eval_size=8)
    two = train_scale_rules(task, [("none", 3e-2), ("sqrt", 1e-2)], (2, 5), d_k=8, steps=6, batch_size=4, eval_size=8)
    np.testing.assert_allclose(two.loss[:, 1, 1], one.loss[:, 0, 0], rtol=1e-12)


def test_grid_member_on_fewer_seeds_is_the_same_model():
    # (rule, lr, n): trained on the first n seeds only, the same models as with all seeds; the rest NaN
    task = hz.recall_task()
    kw = dict(d_k=8, steps=6, batch_size=4, eval_size=8)
    full = train_scale_rules(task, [("sqrt", 1e-2), ("learned", 1e-2)], (2, 5, 7), **kw)
    part = train_scale_rules(task, [("sqrt", 1e-2, 3), ("learned", 1e-2, 2)], (2, 5, 7), **kw)
    assert part.n_seeds == (3, 2) and part.loss.shape == (6, 2, 3) and part.accuracy.shape == (2, 3)
    assert np.isnan(part.accuracy[1, 2]) and np.isnan(part.scale[1, 2]) and np.all(np.isnan(part.loss[:, 1, 2]))
    for field in ("loss", "accuracy", "eval_loss", "scale"):
        np.testing.assert_allclose(part.per_seed(field, 0), full.per_seed(field, 0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(part.per_seed(field, 1), full.per_seed(field, 1)[..., :2], rtol=1e-9, atol=1e-12)
    assert part.per_seed("accuracy", 1).shape == (2,) and part.per_seed("loss", 1).shape == (6, 2)
    mine, ref = part.params_of(1), full.params_of(1)
    for name, value in mine.items():
        assert value.shape[0] == 2
        np.testing.assert_allclose(value, ref[name][:2], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "members, kwargs, exc, match",
    [
        ([], {}, ValueError, "members"),
        ([("sqrt", 1e-2, 2)], {}, ValueError, "n_seeds"),
        ([("sqrt", 1e-2, 0)], {}, ValueError, "n_seeds"),
        ([("sqrt",)], {}, TypeError, "pair"),
        ([("cube", 1e-2)], {}, ValueError, "rule"),
        ([("sqrt", -1.0)], {}, ValueError, "lr"),
        ([("sqrt", 1e-2), ("sqrt", 1e-2)], {}, ValueError, "distinct"),
        ([("sqrt", 1e-2)], {"steps": 0}, ValueError, "steps"),
        ([("sqrt", 1e-2)], {"seeds": (1, 1)}, ValueError, "distinct"),
    ],
)
def test_grid_rejects_bad_arguments(members, kwargs, exc, match):
    args = {"seeds": (0,), "d_k": 4, "steps": 2, "batch_size": 2, "eval_size": 2}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        train_scale_rules(hz.recall_task(), members, **args)


def test_grid_index_unknown_member(small_grid):
    with pytest.raises(KeyError, match="no member"):
        small_grid[1].index("sqrt", 3e-2)


# ---------------------------------------------------------------- running_mean


def test_running_mean_matches_definition():
    x = np.arange(10.0) ** 2
    out = running_mean(x, 3)
    expected = [np.mean(x[max(0, t - 2) : t + 1]) for t in range(10)]
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_running_mean_along_other_axis_and_long_window():
    x = np.random.default_rng(0).standard_normal((4, 7))
    np.testing.assert_allclose(running_mean(x, 3, axis=1), running_mean(x.T, 3).T, rtol=1e-12)
    np.testing.assert_allclose(running_mean(x, 100)[-1], x.mean(axis=0), rtol=1e-12)


@PROPS
@given(
    arrays(
        np.float64,
        array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=12),
        elements=st.floats(-1e3, 1e3, allow_nan=False),
    ),
    st.integers(1, 15),
)
def test_running_mean_properties(x, window):
    out = running_mean(x, window)
    assert out.shape == x.shape
    np.testing.assert_allclose(running_mean(x, 1), x, atol=1e-9)
    assert np.all(out <= x.max(axis=0) + 1e-9) and np.all(out >= x.min(axis=0) - 1e-9)


def test_running_mean_rejects_bad_window():
    with pytest.raises(ValueError, match="window"):
        running_mean(np.ones(3), 0)
    with pytest.raises(TypeError, match="window"):
        running_mean(np.ones(3), 2.5)
