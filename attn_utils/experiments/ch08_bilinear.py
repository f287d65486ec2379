"""Chapter 8 — the query–key bilinear form, shared vs separate ``W_Q`` / ``W_K``, and the self-mask.

Self-attention scores ``S = (X W_q)(X W_k)ᵀ`` are the bilinear form ``x_i (W_q W_kᵀ) x_jᵀ``. With
``W_k = W_q`` (*shared QK*) ``S`` is a Gram matrix: symmetric positive semi-definite, and every
off-diagonal entry is bounded by the diagonal (Cauchy–Schwarz), so a token's own key tends to win.

What is here
------------
* :func:`qk_scores` — raw scores for separate or shared projections, any leading (trial/batch) axes.
* :func:`argmax_offset_rate` — how often the row maximum sits at ``i + offset`` (0: the diagonal,
  −1: the previous token), optionally cyclic and with a mask.
* :func:`neighbour_weights` — each row's weight on its predecessor and on its successor; with
  symmetric scores and ``cyclic=True`` some row of every sequence gives its successor at least as much
  (chapter 8, the soft form of "no pointer cycles").
* :func:`predecessor_chains` — which sequences a head follows along the whole chain ``i → i − 1``,
  and whether their scores ``s[i, i−1]`` fall along it (required of a symmetric score).
* :func:`diagonal_max_probability` — the exact probability that a row's maximum is on the diagonal
  for Gaussian inputs and a shared projection, by a one-sided Monte Carlo over the query only.
* :func:`self_mask` — Reformer's rule: no attention to oneself unless nothing else is allowed.
* :func:`qk_attention_layer` — one self-attention layer with ``share_qk`` (one projection instead of
  two); its products are counted by :func:`attn_utils.book.measuring.count_macs`.
* :func:`factorization_rank` — the local dimension of the set of forms ``W_q W_kᵀ`` (or ``W Wᵀ``).
* For the training harness: :func:`dot_score_no_self` (a score to pass to
  :func:`attn_utils.harness.training.register_score`), :func:`cyclic_previous_token_task` and
  :func:`first_layer_queries`.
"""

from __future__ import annotations

import math

import autograd.numpy as anp
import numpy as np

from ..attention import causal_mask
from ..book.measuring import counted_matmul
from ..harness.tasks import Task, TaskBatch
from ..multihead import multi_head_attention
from ..validation import as_float_array, check_axis_size, int_at_least, positive_int

SELF_PENALTY: float = 1e5
"""Subtracted from a token's score for itself by :func:`dot_score_no_self`.

Large but finite, as in Reformer's appendix A (which uses 10⁵): a row whose only allowed key is
itself still gets a well-defined weight of 1 on it instead of a row of NaNs."""


# --------------------------------------------------------------------------- scores
def qk_scores(x, w_q, w_k=None) -> np.ndarray:
    """Raw (unscaled) self-attention scores ``(x W_q)(x W_k)ᵀ``; ``w_k=None`` shares ``W_k = W_q``.

    x : (..., n, d); w_q, w_k : (..., d, d_k), leading axes broadcast against x's.
    Returns (..., n, n). Shared projections are computed once (one product fewer); every product
    is counted by :func:`attn_utils.book.measuring.count_macs`.
    """
    x = as_float_array("x", x, min_ndim=2)
    w_q = as_float_array("w_q", w_q, min_ndim=2)
    check_axis_size("w_q", w_q, -2, x.shape[-1], "d, must match the last axis of x")
    q = counted_matmul(x, w_q)
    if w_k is None:
        k = q
    else:
        w_k = as_float_array("w_k", w_k, min_ndim=2)
        if w_k.shape[-2:] != w_q.shape[-2:]:
            raise ValueError(f"w_k must end in (d, d_k) = {w_q.shape[-2:]} like w_q, received shape {w_k.shape}")
        k = counted_matmul(x, w_k)
    return counted_matmul(q, np.swapaxes(k, -1, -2))


def argmax_offset_rate(scores, offset: int = 0, *, cyclic: bool = False, mask=None) -> np.ndarray:
    """Fraction of rows ``i`` whose maximum over the keys is at ``i + offset``.

    scores : (..., n, n), rows are queries; offset : 0 asks "is the diagonal the row max",
    −1 asks "is the previous token the row max". Without ``cyclic`` only rows with
    ``0 ≤ i + offset < n`` count; with it the target is ``(i + offset) mod n`` and every row counts.
    mask : bool broadcastable to (..., n, n), ``True`` = allowed; disallowed keys cannot be the max
    (a row with no allowed key is an error). Ties resolve to the first maximum (``np.argmax``).
    Returns an array of the leading shape ``(...)`` (a 0-d array for a single matrix).
    """
    s = as_float_array("scores", scores, min_ndim=2, allow_neg_inf=True)
    n = s.shape[-1]
    check_axis_size("scores", s, -2, n, "queries, must equal the number of keys")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an int, received {type(offset).__name__}")
    if not cyclic and abs(offset) >= n:
        raise ValueError(f"|offset| must be < n = {n} without cyclic=True, received offset={offset}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be boolean (True = allowed), received dtype {mask.dtype}")
        try:
            mask = np.broadcast_to(mask, s.shape)
        except ValueError:
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to scores of shape {s.shape}") from None
        if not mask.any(axis=-1).all():
            raise ValueError("mask leaves some row with no allowed key")
        s = np.where(mask, s, -np.inf)
    rows = np.arange(n)
    target = rows + offset
    if cyclic:
        target = target % n
    keep = (target >= 0) & (target < n)
    hit = s.argmax(axis=-1)[..., keep] == target[keep]
    return hit.mean(axis=-1)


def neighbour_weights(weights, *, cyclic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each row's weight on its predecessor and on its successor: ``(w[i, i−1], w[i, i+1])``.

    weights : (..., n, n), rows are queries (attention weights or raw scores: anything ordered like
    them within a row). With ``cyclic`` the neighbours of ``i`` are ``(i ∓ 1) mod n``; without it the
    missing neighbours (the predecessor of row 0, the successor of row n−1) are NaN.
    Returns two (..., n) arrays. For a symmetric score matrix and ``n ≥ 3``, every sequence has a row
    with ``succ ≥ pred`` when ``cyclic`` (otherwise ``s[i, i−1] > s[i, i+1] = s[i+1, i]`` for every ``i``
    would go round the cycle and give ``s[1, 0] > s[1, 0]``); softmax weights keep each row's order.
    """
    w = as_float_array("weights", weights, min_ndim=2)
    n = w.shape[-1]
    check_axis_size("weights", w, -2, n, "queries, must equal the number of keys")
    rows = np.arange(n)
    if cyclic:
        return w[..., rows, (rows - 1) % n], w[..., rows, (rows + 1) % n]
    pred = np.full(w.shape[:-1], np.nan)
    succ = np.full(w.shape[:-1], np.nan)
    pred[..., 1:] = w[..., rows[1:], rows[:-1]]
    succ[..., :-1] = w[..., rows[:-1], rows[1:]]
    return pred, succ


def predecessor_chains(scores, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """Whether each sequence is a full predecessor chain, and whether its scores fall along it.

    scores : (..., n, n) raw scores ``s[i, j]``; weights : the matrix whose row maxima are the head's
    choices (the attention weights, e.g. after a mask), same shape; default ``scores``.
    Returns ``(chained, falling)``, bool arrays of the leading shape: ``chained`` — every row
    ``i ≥ 1`` has its maximum at ``i − 1`` (first maximum, as ``np.argmax``); ``falling`` —
    ``s[1, 0] > s[2, 1] > … > s[n−1, n−2]``. With symmetric scores and full attention a chained
    sequence is always falling (chapter 8, ``eq-ch8-chain``): ``s[i, i−1] > s[i, i+1] = s[i+1, i]``.
    """
    s = as_float_array("scores", scores, min_ndim=2)
    n = s.shape[-1]
    check_axis_size("scores", s, -2, n, "queries, must equal the number of keys")
    if n < 2:
        raise ValueError(f"scores must have n >= 2 tokens, received n={n}")
    w = s if weights is None else as_float_array("weights", weights, min_ndim=2)
    if w.shape != s.shape:
        raise ValueError(f"weights must have the shape of scores {s.shape}, received shape {w.shape}")
    chained = (w.argmax(axis=-1)[..., 1:] == np.arange(n - 1)).all(axis=-1)
    falling = (np.diff(np.diagonal(s, offset=-1, axis1=-2, axis2=-1), axis=-1) < 0).all(axis=-1)
    return chained, falling


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    """Φ(z) elementwise, accurate in both tails (via erfc)."""
    return 0.5 * np.vectorize(math.erfc, otypes=[float])(-np.asarray(z, float) / math.sqrt(2.0))


def diagonal_max_probability(w, n: int, rng: np.random.Generator, n_samples: int = 20_000):
    """P(row max of the shared-QK scores is on the diagonal) for rows of ``X`` i.i.d. ``N(0, I_d)``.

    With ``a = x W`` the rows are ``N(0, Σ)``, ``Σ = Wᵀ W``. Given ``a_i``, the off-diagonal scores
    ``a_i·a_j`` (j ≠ i) are independent ``N(0, a_iᵀ Σ a_i)``, so

        P = E[ Φ(‖a_i‖² / sqrt(a_iᵀ Σ a_i))^(n−1) ],

    an expectation over ``a_i`` alone, estimated here with ``n_samples`` draws from ``rng``.
    w : (d, d_k), or a stack (T, d, d_k) of T matrices (one estimate each); n : tokens per sequence (≥ 2).
    Returns a float for one matrix, an array (T,) for a stack.
    """
    w = as_float_array("w", w, min_ndim=2)
    if w.ndim not in (2, 3):
        raise ValueError(f"w must be (d, d_k) or a stack (T, d, d_k), received shape {w.shape}")
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2, received {n}")
    n_samples = positive_int("n_samples", n_samples)
    a = rng.standard_normal((*w.shape[:-2], n_samples, w.shape[-2])) @ w  # (…, n_samples, d_k)
    sigma = np.swapaxes(w, -1, -2) @ w
    z = np.einsum("...sk,...sk->...s", a, a) / np.sqrt(np.einsum("...sk,...sk->...s", a @ sigma, a))
    p = np.mean(_normal_cdf(z) ** (n - 1), axis=-1)
    return float(p) if w.ndim == 2 else p


def self_mask(n: int, *, causal: bool = False) -> np.ndarray:
    """Reformer's self-mask: bool (n, n), ``True`` = may attend.

    A token may not attend to itself unless it has no other allowed key; with ``causal`` the
    future is masked too, so only position 0 (which sees nothing else) keeps its diagonal.
    """
    n = positive_int("n", n)
    allowed = causal_mask(n) if causal else np.ones((n, n), bool)
    off_diag = allowed & ~np.eye(n, dtype=bool)
    alone = ~off_diag.any(axis=1)
    return off_diag | (np.eye(n, dtype=bool) & alone[:, None])


def qk_attention_layer(x, params: dict, h: int | None = None, *, share_qk: bool = False, mask=None):
    """Self-attention ``concat_i(softmax(Q_i K_iᵀ/√d_k) V_i) W_o`` with ``K = Q`` when ``share_qk``.

    x : (..., n, d); params : ``W_q, W_v (d, h·d_k)``, ``W_o (h·d_v, d)`` and, unless ``share_qk``,
    ``W_k (d, h·d_k)`` (ignored when shared); mask : bool (n, n), ``True`` = may attend
    (e.g. :func:`self_mask`); h : the head count, taken from :class:`attn_utils.MHAParams` and required
    for a plain dict (as in :func:`attn_utils.multi_head_attention`). With ``share_qk=False`` this is
    :func:`attn_utils.harness.layers.self_attention_layer`. Products are counted by ``count_macs``:
    sharing saves exactly the ``n·d·h·d_k`` multiply-adds of the key projection.
    Returns ``(output (..., n, d), weights (..., h, n, n))``.
    """
    return multi_head_attention(x, x, params, h, mask, share_qk=share_qk)  # the core layer, K = Q when shared


def factorization_rank(w_q, w_k=None) -> int:
    """Rank of the differential of ``(W_q, W_k) ↦ W_q W_kᵀ`` (or of ``W ↦ W Wᵀ`` when ``w_k`` is None).

    w_q, w_k : (d, d_k). At a generic point this is the dimension of the set of bilinear forms the
    parametrisation reaches near it: ``d_k(2d − d_k)`` for separate factors (``W_q A``, ``W_k A⁻ᵀ``
    give the same form for every invertible ``A``) and ``d·d_k − d_k(d_k − 1)/2`` for a shared one
    (``W Q`` with ``Q`` orthogonal gives the same ``W Wᵀ``). Builds a (d², #params) Jacobian: keep d small.
    """
    w_q = as_float_array("w_q", w_q, min_ndim=2)
    if w_q.ndim != 2:
        raise ValueError(f"w_q must be 2-D (d, d_k), received shape {w_q.shape}")
    d, r = w_q.shape
    eye = np.eye(d)

    # d(A Bᵀ)[i, j] / dA[a, b] = δ_ia B[j, b];   d(A Bᵀ)[i, j] / dB[c, b] = A[i, b] δ_jc
    def wrt_left(b_mat):
        return np.einsum("ia,jb->ijab", eye, b_mat).reshape(d * d, d * r)

    def wrt_right(a_mat):
        return np.einsum("ib,jc->ijcb", a_mat, eye).reshape(d * d, d * r)

    if w_k is None:
        jac = wrt_left(w_q) + wrt_right(w_q)
    else:
        w_k = as_float_array("w_k", w_k, min_ndim=2)
        if w_k.shape != w_q.shape:
            raise ValueError(f"w_k must have the shape of w_q {w_q.shape}, received shape {w_k.shape}")
        jac = np.concatenate([wrt_left(w_k), wrt_right(w_q)], axis=1)
    return int(np.linalg.matrix_rank(jac))


# --------------------------------------------------------------------------- training harness
def dot_score_no_self(q, k, params):
    """Dot-product score with a token's own key removed (Reformer's self-mask), for ``register_score``.

    q : (S, B, H, n, d_k), k : (S, B, H, n, d_k) → (S, B, H, n, n) raw scores ``q kᵀ`` minus
    :data:`SELF_PENALTY` on the diagonal (self-attention only: ``n_q`` must equal ``n_k``). Written
    with ``autograd.numpy``; ``params`` is unused (the score has no parameters of its own).
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_q != n_k:
        raise ValueError(f"the self-mask needs n_q == n_k (self-attention), received n_q={n_q}, n_k={n_k}")
    return anp.matmul(q, anp.swapaxes(k, -1, -2)) - SELF_PENALTY * np.eye(n_q)


def cyclic_previous_token_task(n: int = 8, vocab: int = 8) -> Task:
    """Target at position ``i`` is the token at ``(i − 1) mod n``: every position is scored.

    The wrap-around makes the pointer pattern ``i → i − 1`` a cycle of length ``n``, which no
    symmetric score matrix can realise as row maxima for ``n ≥ 3`` (chapter 8), while the
    non-cyclic :func:`attn_utils.harness.tasks.previous_token_task` is a chain, which one can.
    """
    n = int_at_least("n", n, 3)
    v = int_at_least("vocab", vocab, 2)

    def sample(rng: np.random.Generator, batch: int) -> TaskBatch:
        x = rng.integers(0, v, size=(batch, n))
        return TaskBatch(x.astype(np.int64), np.roll(x, 1, axis=1).astype(np.int64))

    return Task("cyclic_previous_token", v, n, v, True, sample, {"n": n, "vocab": v})


def first_layer_queries(params: dict, config, task: Task, x) -> np.ndarray:
    """Queries of the first attention layer of a trained harness model: ``(E[x] + P) W_q``.

    params, config : from :func:`attn_utils.harness.training.train` (``result.params``, ``result.config``);
    x : (batch, n) tokens shared by all seeds, or (S, batch, n). Returns (S, batch, H, n, d_k).
    With ``config.share_qk`` these are also the keys, so ``‖q_i‖`` is the norm in the bounds of
    chapter 8. (Layer 0 only: its input is the embedding, before any residual update.)
    """
    from ..harness.training import query_key_vectors  # one implementation of "layer-0 q and k" for the book

    return query_key_vectors(params, config, task, x)[0]


__all__ = [
    "SELF_PENALTY",
    "qk_scores",
    "argmax_offset_rate",
    "neighbour_weights",
    "predecessor_chains",
    "diagonal_max_probability",
    "self_mask",
    "qk_attention_layer",
    "factorization_rank",
    "dot_score_no_self",
    "cyclic_previous_token_task",
    "first_layer_queries",
]
