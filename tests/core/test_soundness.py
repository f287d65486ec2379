"""Regression tests: the core attention never hangs, is safe from threads and after fork, leaves
no process-wide setting changed, and answers bad input with a clear error or a documented result."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
import threadpoolctl

from attn_utils import (
    attention_scores,
    causal_mask,
    init_mha_params,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
)
from attn_utils.book.measuring import single_thread_blas


def _in_thread(fn, timeout: float):
    """Run ``fn`` in a daemon thread; fail (instead of hanging the suite) if it does not return."""
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"call did not return within {timeout} s"
    return result["value"]


def _blas_threads() -> int:
    return threadpoolctl.threadpool_info()[0]["num_threads"]


# ---------------------------------------------------------------- no hangs


def test_one_query_against_two_million_keys_returns():
    """Used to deadlock: the tiled path ran its softmax on pool workers that waited on the same pool."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 2)), rng.standard_normal((2**21, 2)), rng.standard_normal((2**21, 1))
    out, w = _in_thread(lambda: scaled_dot_product_attention(q, k, v), timeout=60)
    assert out.shape == (4, 1) and w.shape == (4, 2**21)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-10)


def _attend_in_child(conn):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 512, 16)) for _ in range(3))
    out, _ = scaled_dot_product_attention(q, k, v)
    conn.send(float(out.sum()))
    conn.close()


def test_large_attention_in_a_forked_child_returns():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 512, 16)) for _ in range(3))
    expected = float(scaled_dot_product_attention(q, k, v)[0].sum())  # the parent has run it first
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_attend_in_child, args=(child,))
    with single_thread_blas():  # fork while a block is active in the parent
        proc.start()
    proc.join(60)
    alive = proc.is_alive()
    if alive:
        proc.kill()
    assert not alive, "attention in a forked child did not return within 60 s"
    assert proc.exitcode == 0 and parent.poll(1)
    assert parent.recv() == pytest.approx(expected, rel=1e-12)


def test_calls_from_several_threads_at_once_agree_with_sequential_calls():
    rng = np.random.default_rng(2)
    inputs = [tuple(rng.standard_normal((2, 3, 300, 16)) for _ in range(3)) for _ in range(6)]
    expected = [scaled_dot_product_attention(*x)[0] for x in inputs]
    results = [None] * len(inputs)

    def work(i):
        for _ in range(3):
            results[i] = scaled_dot_product_attention(*inputs[i])[0]

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- no process-wide state left changed


def test_single_thread_blas_restores_the_count_when_blocks_overlap_across_threads():
    """Used to leave BLAS at one thread for the rest of the process: each block restored "the
    previous value", which for the second of two overlapping blocks was the first block's 1."""
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        entered, leave = threading.Event(), threading.Event()

        def worker():
            with single_thread_blas():
                entered.set()
                leave.wait(10)

        with single_thread_blas():  # main thread enters first
            assert _blas_threads() == 1
            t = threading.Thread(target=worker, daemon=True)
            t.start()
            assert entered.wait(10)  # the worker's block overlaps the main block…
        assert _blas_threads() == before  # …and the main block leaves first
        leave.set()
        t.join(10)
        assert _blas_threads() == before  # the worker leaving changes nothing either
        t2 = threading.Thread(target=worker, daemon=True)
        entered.clear()
        leave.clear()
        t2.start()  # now the worker enters first
        assert entered.wait(10)
        with single_thread_blas():
            leave.set()
            t2.join(10)  # the worker leaves inside the main block
            assert _blas_threads() == 1
        assert _blas_threads() == before


def test_single_thread_blas_nests_and_restores():
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        with single_thread_blas():
            with single_thread_blas():
                assert _blas_threads() == 1
            assert _blas_threads() == 1
        assert _blas_threads() == 2


# ---------------------------------------------------------------- bad input: clear errors or documented results


def test_empty_key_axis_gives_the_fully_masked_result():
    """Used to end in numpy's "zero-size array to reduction operation" error. Nothing to attend
    to is the fully masked case: zero weights (none) and a zero output, as blocked_attention gives."""
    out, w = scaled_dot_product_attention(np.ones((4, 2)), np.ones((0, 2)), np.ones((0, 3)))
    assert w.shape == (4, 0) and out.shape == (4, 3) and not out.any()


def test_empty_query_or_batch_axis_gives_empty_results():
    out, w = scaled_dot_product_attention(np.ones((0, 2)), np.ones((3, 2)), np.ones((3, 5)))
    assert out.shape == (0, 5) and w.shape == (0, 3)
    out, w = scaled_dot_product_attention(np.ones((0, 4, 2)), np.ones((0, 3, 2)), np.ones((0, 3, 5)))
    assert out.shape == (0, 4, 5) and w.shape == (0, 4, 3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_inputs_whose_scores_overflow_are_a_clear_error(dtype):
    big = np.sqrt(np.finfo(dtype).max)  # q·k = d_k · big² overflows
    q, k = np.full((2, 4), big, dtype), np.full((3, 4), big, dtype)
    with pytest.raises(ValueError, match=f"overflowed {np.dtype(dtype).name}"):
        scaled_dot_product_attention(q, k, np.ones((3, 1), dtype), scale=1.0)
    with pytest.raises(ValueError, match="overflowed"):
        attention_scores(q, k, scale=1.0)


@pytest.mark.parametrize("name, bad", [("q", np.inf), ("q", -np.inf), ("k", np.nan), ("v", np.inf)])
def test_non_finite_inputs_are_rejected_by_name(name, bad):
    args = {"q": np.ones((2, 3)), "k": np.ones((4, 3)), "v": np.ones((4, 2))}
    args[name] = args[name].copy()
    args[name][0, 0] = bad
    with pytest.raises(ValueError, match=f"^{name} contains 1 non-finite value"):
        scaled_dot_product_attention(**args)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtypes_are_kept_and_agree_with_float64(dtype):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 5, 8)) for _ in range(3))
    out, w = scaled_dot_product_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype))
    ref_out, ref_w = scaled_dot_product_attention(q, k, v)
    assert out.dtype == w.dtype == dtype
    tol = {np.float16: 5e-3, np.float32: 1e-6, np.float64: 1e-15}[dtype]
    np.testing.assert_allclose(w, ref_w, atol=tol)
    np.testing.assert_allclose(out, ref_out, atol=10 * tol)


def test_key_padding_mask_of_shape_b_1_1_nk_broadcasts():
    rng = np.random.default_rng(4)
    B, H, n_q, n_k = 2, 3, 4, 6
    q, k, v = (
        rng.standard_normal((B, H, n_q, 5)),
        rng.standard_normal((B, H, n_k, 5)),
        rng.standard_normal((B, H, n_k, 2)),
    )
    lengths = np.array([6, 3])
    pad = (np.arange(n_k) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, n_k)
    out, w = scaled_dot_product_attention(q, k, v, mask=pad)
    full = np.broadcast_to(pad, (B, H, n_q, n_k)).copy()
    np.testing.assert_array_equal(w, scaled_dot_product_attention(q, k, v, mask=full)[1])
    assert not w[1, ..., 3:].any()
    # equal to attention over the kept keys only
    np.testing.assert_allclose(out[1], scaled_dot_product_attention(q[1], k[1, :, :3], v[1, :, :3])[0], rtol=1e-12)
    both = pad & causal_mask(n_q, n_k)  # padding and causal combined
    assert scaled_dot_product_attention(q, k, v, mask=both)[1].shape == (B, H, n_q, n_k)


def test_masks_that_would_enlarge_the_scores_or_are_not_boolean_are_rejected():
    q, k, v = np.ones((2, 4, 3)), np.ones((2, 5, 3)), np.ones((2, 5, 1))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4, 5\) must broadcast"):
        scaled_dot_product_attention(q, k, v, mask=np.ones((3, 4, 5), bool))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\)"):
        scaled_dot_product_attention(q, k, v, mask=np.ones((4, 4), bool))
    with pytest.raises(TypeError, match="mask must be boolean"):
        scaled_dot_product_attention(q, k, v, mask=np.ones((4, 5)))


def test_fully_masked_rows_give_zero_weights_and_zero_output():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    mask = np.ones((3, 5), bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not w[1].any() and not out[1].any()
    np.testing.assert_allclose(w[[0, 2]].sum(-1), 1.0)
    assert np.isfinite(softmax(np.full((2, 3), -np.inf))).all()


def test_multi_head_parameters_carry_their_head_count():
    rng = np.random.default_rng(6)
    params = init_mha_params(rng, 8, 2)
    x = rng.standard_normal((3, 8))
    out, w = multi_head_attention(x, x, params)
    assert w.shape == (2, 3, 3)
    np.testing.assert_array_equal(out, multi_head_attention(x, x, params, 2)[0])
    with pytest.raises(ValueError, match=r"h must be the head count the parameters were made for \(2\), received h=4"):
        multi_head_attention(x, x, params, 4)  # used to split into 4 heads, silently changing d_k
    with pytest.raises(TypeError, match="h is required"):
        multi_head_attention(x, x, dict(params))
    assert sum(a.size for a in params.values()) == 4 * 8 * 8  # the head count is not a weight
