"""Chapter 17's module: the two normalisations, the residual stacks at initialisation, the trained stacks,
and the operation counter."""

import numpy as np
import pytest
from autograd import grad

from attn_utils.experiments import ch17_norm as ex


def test_layer_norm_and_rms_norm_definitions_and_invariances():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8))
    y = ex.layer_norm(x, eps=0.0)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1, rtol=1e-12)
    np.testing.assert_allclose(ex.layer_norm(2.5 * x + 4.0, eps=0.0), y, rtol=1e-10, atol=1e-12)
    r = ex.rms_norm(x, eps=0.0)
    np.testing.assert_allclose((r**2).mean(-1), 1, rtol=1e-12)
    np.testing.assert_allclose(ex.rms_norm(3.0 * x, eps=0.0), r, rtol=1e-12)
    assert not np.allclose(ex.rms_norm(x + 1.0, eps=0.0), r)
    # LN(x) = RMSNorm(x − mean): they coincide on zero-mean inputs
    np.testing.assert_allclose(ex.rms_norm(x - x.mean(-1, keepdims=True)), ex.layer_norm(x), rtol=1e-12)
    g, b = rng.uniform(0.5, 2, 8), rng.standard_normal(8)
    np.testing.assert_allclose(ex.layer_norm(x, g, b), ex.layer_norm(x) * g + b, rtol=1e-12)
    np.testing.assert_allclose(ex.rms_norm(x, g), ex.rms_norm(x) * g, rtol=1e-12)


def test_norm_arguments_are_validated():
    with pytest.raises(ValueError, match="gain must have last axis"):
        ex.layer_norm(np.ones((2, 4)), gain=np.ones(3))
    with pytest.raises(ValueError, match="x must have a last axis"):
        ex.layer_norm(np.ones((2, 1)))
    with pytest.raises(ValueError, match="where must be one of"):
        ex.residual_stack(np.ones((1, 1, 4)), [], [], "middle")
    with pytest.raises(ValueError, match="norm must be"):
        ex.norm_ops(np.tanh, 8)


def test_layer_norm_jacobian_is_projection_over_scale():
    rng = np.random.default_rng(1)
    z, w = rng.standard_normal(6), rng.standard_normal(6)
    g = grad(lambda v: np.sum(ex.layer_norm(v, eps=0.0) * w))(z)
    y = ex.layer_norm(z, eps=0.0)
    proj = np.eye(6) - np.ones((6, 6)) / 6 - np.outer(y, y) / 6
    np.testing.assert_allclose(g, proj @ w / z.std(), rtol=1e-10)


def test_stack_gradient_matches_closed_form_and_stream_laws():
    rng = np.random.default_rng(2)
    draw = ex.draw_mlp_stack(rng, 8, 4, 16, 32)
    for where in ex.PLACEMENTS:
        res = ex.init_stack_gradients(draw, where)
        assert res.grad_norm.shape == res.stream_var.shape == (8, 4)
        np.testing.assert_allclose(res.grad_norm[:, -1], ex.last_block_gradient(draw, where), rtol=1e-10)
    post = ex.init_stack_gradients(draw, "post")
    np.testing.assert_allclose(post.stream_var, 1.0, rtol=1e-4)  # LayerNorm outputs (ε = 1e-5)
    big = ex.depth_sweep(np.random.default_rng(3), (8,), n_draws=400, d=32, d_ff=64)
    se = big["pre"]["var"].std() / np.sqrt(400)
    assert abs(big["pre"]["var"].mean() - 9.0) < 5 * se
    only_pre = ex.depth_sweep(np.random.default_rng(3), (8,), n_draws=400, d=32, d_ff=64, placements=("pre",))
    assert set(only_pre) == {"pre"}  # the same draws, one placement differentiated
    np.testing.assert_array_equal(only_pre["pre"]["grad"], big["pre"]["grad"])
    with pytest.raises(ValueError, match="where must be one of"):
        ex.depth_sweep(np.random.default_rng(3), (8,), placements=("middle",))


@pytest.mark.parametrize("where", ex.PLACEMENTS)
def test_hand_gradient_matches_autograd(where):
    """stack_loss_and_grad's backward pass, written out, against autograd through stack_logits."""
    import autograd.numpy as anp

    task = ex.teacher_task(np.random.default_rng(10), d_in=6, width=8, n_classes=3)
    cfg = ex.StackConfig(where=where, d_model=8, d_ff=12, n_layers=3)
    p = ex.init_stack(cfg, task, [1, 2])
    p = {k: v + 0.1 * np.random.default_rng(11).standard_normal(v.shape) for k, v in p.items()}  # b_out ≠ 0
    x, y = ex.seed_data(task, [1, 2], 1, 5)
    loss, g = ex.stack_loss_and_grad(p, cfg, x, y)

    def total(q):
        return anp.sum(ex._cross_entropy(ex.stack_logits(q, cfg, x), y))

    want = grad(total)(p)
    assert set(g) == set(p)
    for k in p:
        np.testing.assert_allclose(g[k], want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    np.testing.assert_allclose(loss.sum(), total(p), rtol=1e-12)
    g32 = ex.stack_loss_and_grad({k: v.astype("float32") for k, v in p.items()}, cfg, x.astype("float32"), y)[1]
    assert all(v.dtype == np.float32 for v in g32.values())
    for k in p:  # the same gradient, rounded: float32's relative precision is about 6e-8
        np.testing.assert_allclose(g32[k], g[k], rtol=1e-3, atol=1e-6, err_msg=k)


def test_seed_data_reuses_a_longer_draw_exactly():
    task = ex.teacher_task(np.random.default_rng(12), d_in=4, width=6, n_classes=3)
    short = ex.seed_data(task, [1, 2], 1, 5)
    long = ex.seed_data(task, [2, 1], 1, 9)  # draws anew (longer), in another seed order
    again = ex.seed_data(task, [1], 1, 5)  # sliced from the longer draw
    fresh = task.sample(np.random.default_rng([1, 1]), 5)
    for got in (short, again):
        np.testing.assert_array_equal(got[0][0], fresh[0])
        np.testing.assert_array_equal(got[1][0], fresh[1])
    np.testing.assert_array_equal(long[0][1, :5], fresh[0])
    other = ex.teacher_task(np.random.default_rng(13), d_in=4, width=6, n_classes=3)
    np.testing.assert_array_equal(ex.seed_data(other, [1], 1, 5)[0][0], fresh[0])  # the same inputs, its own labels
    own = other.sample(np.random.default_rng([1, 1]), 5)[1]
    np.testing.assert_array_equal(ex.seed_data(other, [1], 1, 5)[1][0], own)


def test_warmup_factor():
    np.testing.assert_allclose(ex.warmup_factor(5, [0, 10, 4]), [1.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="t_warm"):
        ex.warmup_factor(1, [-1])


def test_train_stacks_shapes_pairing_and_seed_independence():
    task = ex.teacher_task(np.random.default_rng(4), d_in=8, width=8, n_classes=3)
    cfg = ex.StackConfig(where="post", d_model=8, d_ff=8, n_layers=2)
    both = ex.train_stacks(cfg, task, [5, 6], [1e-2, 3e-2], warmups=(0, 5), steps=6, batch_size=4, eval_size=16)
    assert both.loss.shape == (6, 2, 2, 2) and both.accuracy.shape == (2, 2, 2)
    # the first loss is before any update: the same for every (warm-up, rate) of a seed
    np.testing.assert_allclose(both.loss[0], np.broadcast_to(both.loss[0, 0, 0], (2, 2, 2)), rtol=1e-12)
    one = ex.train_stacks(cfg, task, [6], [3e-2], warmups=(5,), steps=6, batch_size=4, eval_size=16)
    np.testing.assert_allclose(one.loss[:, 0, 0, 0], both.loss[:, 1, 1, 1], rtol=1e-9)
    with pytest.raises(ValueError, match="lrs and warmups"):
        ex.train_stacks(cfg, task, [5], [], steps=2)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        ex.train_stacks(cfg, task, [5], [1e-2], steps=2, optimizer="rmsprop")
    with pytest.raises(ValueError, match="dtype must be"):
        ex.train_stacks(cfg, task, [5], [1e-2], steps=2, dtype="float16")
    # plain SGD with a warm-up: the first update of a 5-step warm-up is a fifth of the constant rate's
    sgd = ex.train_stacks(cfg, task, [5], [0.5], warmups=(0, 5), steps=2, batch_size=4, eval_size=16, optimizer="sgd")
    assert np.isfinite(sgd.loss).all() and sgd.loss[1, 0, 0, 0] != sgd.loss[1, 1, 0, 0]
    f32 = ex.train_stacks(cfg, task, [6], [3e-2], warmups=(5,), steps=6, batch_size=4, eval_size=16, dtype="float32")
    np.testing.assert_allclose(f32.loss, one.loss, rtol=1e-4)  # the same draws, rounded
    # a mid-run evaluation after k updates is the final evaluation of a run of k steps (same weights, batches)
    mid = ex.train_stacks(
        cfg, task, [5, 6], [1e-2, 3e-2], warmups=(0, 5), steps=6, batch_size=4, eval_size=16, eval_at=(3,)
    )
    short = ex.train_stacks(cfg, task, [5, 6], [1e-2, 3e-2], warmups=(0, 5), steps=3, batch_size=4, eval_size=16)
    assert set(mid.accuracy_at) == {3} and short.accuracy_at == {}
    np.testing.assert_array_equal(mid.accuracy_at[3], short.accuracy)
    np.testing.assert_array_equal(mid.accuracy, both.accuracy)
    with pytest.raises(ValueError, match="eval_at must hold steps"):
        ex.train_stacks(cfg, task, [5], [1e-2], steps=4, eval_at=(4,))


def test_norm_ops_counts():
    assert ex.norm_ops(ex.layer_norm, 32) == {"per_feature": 7, "per_vector": 4}
    assert ex.norm_ops(ex.rms_norm, 32) == {"per_feature": 4, "per_vector": 3}
    assert ex.norm_ops(ex.layer_norm, 32, affine=False)["per_feature"] == 5
    assert ex.norm_ops(ex.rms_norm, 32, affine=False)["per_feature"] == 3


def test_rms_norm_and_layer_norm_cosine_after_a_shift():
    # proposition (iii): a zero-mean x shifted by c standard deviations gives cos = 1/sqrt(1 + c²)
    rng = np.random.default_rng(7)
    shifts = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    x = rng.standard_normal((shifts.size, 64))
    x -= x.mean(axis=-1, keepdims=True)
    z = x + shifts[:, None] * x.std(axis=-1, keepdims=True)
    a, b = ex.rms_norm(z, eps=0.0), ex.layer_norm(z, eps=0.0)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    np.testing.assert_allclose(cos, 1 / np.sqrt(1 + shifts**2), rtol=1e-12)
    # the invariances the chapter quotes: LN ignores a shift, RMSNorm (with a gain) ignores a rescaling
    v, g = rng.standard_normal(16), rng.uniform(0.5, 2.0, 16)
    np.testing.assert_allclose(ex.layer_norm(v + 3.0), ex.layer_norm(v), rtol=1e-9)
    np.testing.assert_allclose(ex.rms_norm(5 * v, g, eps=0.0), ex.rms_norm(v, g, eps=0.0), rtol=1e-9)
    assert np.abs(ex.rms_norm(v + 3.0) - ex.rms_norm(v)).max() > 0.1


def test_depth_sweep_branch_and_sum_match_the_stream():
    sweep = ex.depth_sweep(np.random.default_rng(8), (1, 3), n_draws=6, d=16, d_ff=32)
    for where in ex.PLACEMENTS:
        assert sweep[where]["branch"].shape == sweep[where]["sum"].shape == (6, 2)
    # in Pre-LN the sum x_(L−1) + F_L is the stream x_L itself
    np.testing.assert_allclose(sweep["pre"]["sum"], sweep["pre"]["var"], rtol=1e-10)
    # in Post-LN the last LayerNorm normalises the sum: its output has unit mean square
    np.testing.assert_allclose(sweep["post"]["var"], 1.0, rtol=1e-4)


def test_weighted_line_and_ratio_of_means():
    rng = np.random.default_rng(9)
    x = np.array([1.0, 2.0, 4.0, 8.0])
    values = 1.0 + 2.0 * x + rng.normal(0, 0.01, (200, 4))
    (a, b), (se_a, se_b) = ex.weighted_line(x, values)
    assert abs(a - 1.0) < 5 * se_a and abs(b - 2.0) < 5 * se_b and se_a < 0.01 and se_b < 0.01
    with pytest.raises(ValueError, match="values must be"):
        ex.weighted_line(x, values[:, :3])
    num, den = rng.uniform(1, 2, 400), rng.uniform(3, 4, 400)
    r, se = ex.ratio_of_means(num, den)
    assert r == pytest.approx(num.mean() / den.mean()) and 0 < se < 0.01
    with pytest.raises(ValueError, match="paired"):
        ex.ratio_of_means(num, den[:10])
