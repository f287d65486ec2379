"""Instruments for the multi-head chapter (chapter 9): cost, reachable patterns, head contributions, pruning.

* :func:`mha_macs` — multiply-adds of one multi-head self-attention layer, by part, for any
  ``(h, d_k, d_v)`` (the Transformer's ``d_k = d_v = d_model/h`` is the default).
* Reachable attention patterns of one head. Softmax rows do not change when a constant is added
  to a row, so a positive row-stochastic ``P`` is ``softmax(S)`` exactly when
  ``S = log P + c 1ᵀ`` for some per-row constants ``c``. :func:`log_ratio_matrix` removes that
  freedom (``R_ij = log(P_ij / P_i,n−1)``), :func:`min_head_dim` is ``rank(R)`` — the smallest head
  size that produces ``P`` — and :func:`logit_factors` builds queries and keys that do.
  :func:`fit_attention_pattern` searches numerically (Adam on the row-wise KL divergence) for the
  closest pattern a head of size ``d_k`` can make.
* :func:`head_contributions` — the ``h`` terms ``head_i W_O^i`` whose *sum* is multi-head attention.
* :func:`greedy_head_pruning` — remove heads of a trained :mod:`attn_utils.training` model one at a
  time (always the one whose removal costs least accuracy), vectorised over seeds and candidates.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import scaled_dot_product_attention
from .multihead import split_heads
from .softmax import softmax
from .tasks import Task, TaskBatch
from .training import ModelConfig, evaluate
from .validation import as_float_array, check_axis_size, positive_int, positive_scalar


# ---------------------------------------------------------------- cost

def mha_macs(n: int, d_model: int, h: int, d_k: int | None = None, d_v: int | None = None) -> dict[str, int]:
    """Multiply-adds of multi-head self-attention on ``n`` tokens, split by part.

    Returns a dict with
    ``projections`` = ``n·d_model·h·(2·d_k + 2·d_v)`` (``W_Q, W_K, W_V`` and ``W_O``),
    ``scores`` = ``h·n²·d_k`` (``Q_i K_iᵀ`` for every head), ``weighted_sum`` = ``h·n²·d_v``
    (``A_i V_i``), ``total`` (their sum) and ``softmax_entries`` = ``h·n²`` (exponentials, not
    multiply-adds: the one part that grows with ``h`` at fixed ``d_model``).
    ``d_k`` and ``d_v`` default to ``d_model // h``; then ``projections = 4·n·d_model²`` and
    ``scores = weighted_sum = n²·d_model`` whatever ``h`` is.
    """
    n, d_model, h = positive_int("n", n), positive_int("d_model", d_model), positive_int("h", h)
    if (d_k is None or d_v is None) and d_model % h:
        raise ValueError(f"d_model={d_model} must be divisible by h={h} when d_k/d_v are not given")
    d_k = d_model // h if d_k is None else positive_int("d_k", d_k)
    d_v = d_model // h if d_v is None else positive_int("d_v", d_v)
    parts = {
        "projections": n * d_model * h * (2 * d_k + 2 * d_v),
        "scores": h * n * n * d_k,
        "weighted_sum": h * n * n * d_v,
    }
    parts["total"] = sum(parts.values())
    parts["softmax_entries"] = h * n * n
    return parts


# ---------------------------------------------------------------- reachable patterns

def _check_pattern(name: str, p) -> np.ndarray:
    p = as_float_array(name, p, min_ndim=2)
    if p.shape[-1] < 2:
        raise ValueError(f"{name} needs at least 2 keys (last axis), received shape {p.shape}")
    if (p <= 0).any():
        raise ValueError(f"{name} must be strictly positive (softmax never outputs 0); received min {p.min():.3g}")
    rows = p.sum(axis=-1)
    if not np.allclose(rows, 1.0, rtol=0, atol=1e-9):
        raise ValueError(f"{name} rows must sum to 1; received row sums in [{rows.min():.6g}, {rows.max():.6g}]")
    return p


def log_ratio_matrix(p) -> np.ndarray:
    """``R_ij = log(p_ij / p_{i, n_k−1})`` for ``j < n_k − 1``: the part of ``log p`` a softmax can see.

    p : (..., n_q, n_k) strictly positive, rows summing to 1 → (..., n_q, n_k − 1).
    ``p = softmax(S)`` holds exactly when ``S_ij − S_{i,n_k−1} = R_ij`` for every row.
    """
    p = _check_pattern("p", p)
    logp = np.log(p)
    return logp[..., :-1] - logp[..., -1:]


def min_head_dim(p, rtol: float = 1e-9) -> int:
    """Smallest head size ``d_k`` for which some rank-``d_k`` logit matrix gives ``softmax(S) = p``.

    p : (n_q, n_k) strictly positive row-stochastic. Equals ``rank(log_ratio_matrix(p))``,
    counting singular values above ``rtol`` times the largest (0 for a uniform ``p``).
    With full-rank inputs any rank-``d_k`` matrix is ``X W_Q W_Kᵀ Xᵀ`` for some ``W_Q, W_K``.
    """
    r = log_ratio_matrix(p)
    if r.ndim != 2:
        raise ValueError(f"p must be 2-D (n_q, n_k), received shape {np.shape(p)}")
    s = np.linalg.svd(r, compute_uv=False)
    if s.size == 0 or s[0] == 0:
        return 0
    return int((s > positive_scalar("rtol", rtol) * s[0]).sum())


def logit_factors(p, d_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Queries ``q (n_q, d_k)`` and keys ``k (n_k, d_k)`` with ``softmax(q kᵀ) = p`` when ``d_k ≥ min_head_dim(p)``.

    Builds ``S = [R, 0]`` (logits relative to the last key, which reproduce ``p`` exactly) and
    factors it by the SVD, ``q = U_d √Σ_d``, ``k = V_d √Σ_d``. For ``d_k`` below the rank this is the
    truncated SVD of that particular ``S`` — *a* rank-``d_k`` approximation, not the closest pattern
    (use :func:`fit_attention_pattern` for that). The logits are unscaled: compare ``softmax(q @ k.T)``.
    """
    r = log_ratio_matrix(p)
    if r.ndim != 2:
        raise ValueError(f"p must be 2-D (n_q, n_k), received shape {np.shape(p)}")
    d_k = positive_int("d_k", d_k)
    s_full = np.concatenate([r, np.zeros((r.shape[0], 1))], axis=1)
    u, s, vt = np.linalg.svd(s_full, full_matrices=False)
    m = min(d_k, s.size)
    q = np.zeros((s_full.shape[0], d_k))
    k = np.zeros((s_full.shape[1], d_k))
    q[:, :m] = u[:, :m] * np.sqrt(s[:m])
    k[:, :m] = vt[:m].T * np.sqrt(s[:m])
    return q, k


@dataclass(frozen=True)
class PatternFit:
    """Result of :func:`fit_attention_pattern`.

    kl : best mean row KL divergence ``mean_i KL(target_i ‖ fit_i)`` (nats) over restarts;
    kl_restarts : (restarts,) the final value of every restart; pattern : (n_q, n_k) the best fit;
    q, k : its queries (n_q, d_k) and keys (n_k, d_k) (unscaled: ``pattern = softmax(q kᵀ)``).
    """

    kl: float
    kl_restarts: np.ndarray
    pattern: np.ndarray
    q: np.ndarray
    k: np.ndarray


def _row_kl(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Mean over rows of KL(t‖p); t (n_q, n_k), p (..., n_q, n_k) → (...)."""
    return np.sum(t * (np.log(t) - np.log(np.maximum(p, 1e-300))), axis=-1).mean(axis=-1)


def fit_attention_pattern(target, d_k: int, rng: np.random.Generator, *, restarts: int = 16,
                          steps: int = 2000, lr: float = 0.05) -> PatternFit:
    """Closest pattern ``softmax(q kᵀ)`` with ``q, k`` of ``d_k`` columns to ``target``, by Adam.

    target : (n_q, n_k) strictly positive row-stochastic. Minimises the mean row KL divergence
    over free ``q (n_q, d_k)`` and ``k (n_k, d_k)`` — the same family as ``X W_Q (X W_K)ᵀ`` for a
    full-rank input ``X``. All ``restarts`` run at once (a leading axis). The gradient of the loss
    with respect to the logits is ``(softmax(S) − target)/n_q``; chain rule gives ``G k`` and ``Gᵀ q``.
    """
    t = _check_pattern("target", target)
    if t.ndim != 2:
        raise ValueError(f"target must be 2-D (n_q, n_k), received shape {t.shape}")
    d_k, restarts, steps = positive_int("d_k", d_k), positive_int("restarts", restarts), positive_int("steps", steps)
    lr = positive_scalar("lr", lr)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    n_q, n_k = t.shape
    theta = [rng.standard_normal((restarts, n_q, d_k)), rng.standard_normal((restarts, n_k, d_k))]
    m = [np.zeros_like(a) for a in theta]
    v = [np.zeros_like(a) for a in theta]
    b1, b2, eps = 0.9, 0.999, 1e-12
    for step in range(1, steps + 1):
        q, k = theta
        g = (softmax(q @ np.swapaxes(k, -1, -2)) - t) / n_q          # (R, n_q, n_k)
        grads = [g @ k, np.swapaxes(g, -1, -2) @ q]
        for i in range(2):
            m[i] = b1 * m[i] + (1 - b1) * grads[i]
            v[i] = b2 * v[i] + (1 - b2) * grads[i] ** 2
            theta[i] = theta[i] - lr * (m[i] / (1 - b1 ** step)) / (np.sqrt(v[i] / (1 - b2 ** step)) + eps)
    q, k = theta
    p = softmax(q @ np.swapaxes(k, -1, -2))
    kl = _row_kl(t, p)
    best = int(np.argmin(kl))
    return PatternFit(float(kl[best]), kl, p[best], q[best], k[best])


# ---------------------------------------------------------------- what each head adds

def head_contributions(x_q, x_kv, params: dict, h: int, mask=None, scale: float | None = None) -> np.ndarray:
    """The ``h`` terms ``softmax(Q_i K_iᵀ·scale) V_i W_O^i`` whose sum over heads is multi-head attention.

    x_q : (..., n_q, d_model); x_kv : (..., n_k, d_model); params from
    :func:`~attn_utils.multihead.init_mha_params`; ``W_O^i`` are the rows
    ``i·d_v … (i+1)·d_v − 1`` of ``W_o``. Returns (..., h, n_q, d_model);
    ``out.sum(axis=-3)`` equals :func:`~attn_utils.multihead.multi_head_attention`'s output.
    """
    x_q = as_float_array("x_q", x_q, min_ndim=2)
    x_kv = as_float_array("x_kv", x_kv, min_ndim=2)
    missing = {"W_q", "W_k", "W_v", "W_o"} - set(params)
    if missing:
        raise ValueError(f"params is missing {sorted(missing)}")
    h = positive_int("h", h)
    d_model = params["W_q"].shape[0]
    check_axis_size("x_q", x_q, -1, d_model, "d_model, rows of W_q")
    check_axis_size("x_kv", x_kv, -1, d_model, "d_model, rows of W_q")
    if params["W_o"].shape[0] % h:
        raise ValueError(f"W_o rows ({params['W_o'].shape[0]}) must be divisible by h={h}; "
                         f"received shape {params['W_o'].shape}")
    q = split_heads(x_q @ params["W_q"], h)
    k = split_heads(x_kv @ params["W_k"], h)
    v = split_heads(x_kv @ params["W_v"], h)
    heads, _ = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)   # (..., h, n_q, d_v)
    w_o = params["W_o"].reshape(h, -1, params["W_o"].shape[1])                 # (h, d_v, d_model)
    return heads @ w_o


# ---------------------------------------------------------------- pruning a trained model

@dataclass(frozen=True)
class PruningCurve:
    """Result of :func:`greedy_head_pruning` for ``S`` seeds and ``m = n_layers·n_heads`` heads.

    accuracy : (S, m + 1) accuracy after removing ``0, 1, …, m`` heads;
    order : (S, m) flat index ``layer·n_heads + head`` of the head removed at each step;
    alone : (S, m) accuracy with only that one head removed (the first greedy step's scores).
    """

    accuracy: np.ndarray
    order: np.ndarray
    alone: np.ndarray

    def removable(self, tol: float) -> np.ndarray:
        """(S,) the largest ``k`` such that removing the first ``j ≤ k`` heads never costs more than ``tol`` accuracy."""
        ok = self.accuracy >= self.accuracy[:, :1] - tol
        return np.cumprod(ok, axis=1).sum(axis=1) - 1


def greedy_head_pruning(params: dict, config: ModelConfig, task: Task, batch: TaskBatch) -> PruningCurve:
    """Remove heads one at a time, each time the one whose removal leaves the highest accuracy.

    params : trained parameters with a leading seed axis S (``TrainResult.params``); batch : a
    :class:`~attn_utils.tasks.TaskBatch` with ``x (batch, n)`` shared by the seeds. Each step
    evaluates every remaining candidate for every seed in one call (parameters repeated along the
    seed axis, one head mask per copy); ties in accuracy go to the lower loss.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, received {type(config).__name__}")
    if not isinstance(batch, TaskBatch):
        raise TypeError(f"batch must be a TaskBatch, received {type(batch).__name__}")
    if np.ndim(batch.x) != 2:
        raise ValueError(f"batch.x must be (batch, n), shared by all seeds; received shape {np.shape(batch.x)}")
    S = params["E"].shape[0]
    L, H = config.n_layers, config.n_heads
    m = L * H
    keep = np.ones((S, m))
    acc = np.empty((S, m + 1))
    order = np.empty((S, m), dtype=int)
    acc[:, 0] = evaluate(params, config, task, batch, head_mask=keep.reshape(S, L, H))["accuracy"]
    tiled = {key: np.repeat(val, m, axis=0) for key, val in params.items()}    # copy c of seed s at s·m + c
    rows = np.arange(S)
    alone = None
    for step in range(m):
        cand = np.repeat(keep[:, None, :], m, axis=1)                         # (S, m candidates, m heads)
        cand[:, np.arange(m), np.arange(m)] = 0.0
        res = evaluate(tiled, config, task, batch, head_mask=cand.reshape(S * m, L, H))
        a, l = res["accuracy"].reshape(S, m), res["loss"].reshape(S, m)
        if alone is None:
            alone = a.copy()
        a_ok = np.where(keep > 0, a, -np.inf)                                  # a removed head cannot go twice
        l_ok = np.where(keep > 0, l, np.inf)
        pick = np.lexsort((l_ok, -a_ok), axis=-1)[:, 0]
        order[:, step] = pick
        acc[:, step + 1] = a[rows, pick]
        keep[rows, pick] = 0.0
    return PruningCurve(acc, order, alone)


__all__ = ["mha_macs", "log_ratio_matrix", "min_head_dim", "logit_factors", "PatternFit",
           "fit_attention_pattern", "head_contributions", "PruningCurve", "greedy_head_pruning"]
