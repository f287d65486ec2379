"""Instruments for the multi-head chapter (chapter 9): reachable patterns, head contributions, pruning.

The cost of a layer by part, for any ``(h, d_k, d_v)``, is the harness's
:func:`attn_utils.harness.attention_macs` (``by_part=True``).
* Reachable attention patterns of one head. Softmax rows do not change when a constant is added
  to a row, so a positive row-stochastic ``P`` is ``softmax(S)`` exactly when
  ``S = log P + c 1ᵀ`` for some per-row constants ``c``. :func:`log_ratio_matrix` removes that
  freedom (``R_ij = log(P_ij / P_i,n−1)``), :func:`min_head_dim` is ``rank(R)`` — the smallest head
  size that produces ``P`` — and :func:`logit_factors` builds queries and keys that do.
  :func:`fit_attention_pattern` searches numerically (Adam on the row-wise KL divergence) for the
  closest pattern a head of size ``d_k`` can make.
* :func:`head_contributions` — the ``h`` terms ``head_i W_O^i`` whose *sum* is multi-head attention.
* :func:`greedy_head_pruning` — remove heads of a trained :mod:`attn_utils.harness.training` model one at a
  time (always the one whose removal costs least accuracy on a selection batch), vectorised over
  seeds and candidates, and report the path's accuracy on a separate evaluation batch.
* :func:`hard_pattern_factors` — size-2 queries and keys that put weight ``≥ w`` on any chosen key
  per query: the rank bound is about exact soft patterns, not about sharp "look here" patterns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..harness.tasks import IGNORE, Task, TaskBatch
from ..harness.training import ModelConfig, adam, evaluate, forward
from ..multihead import attention_heads
from ..softmax import softmax
from ..validation import as_float_array, positive_int, positive_scalar

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


def fit_attention_pattern(
    target, d_k: int, rng: np.random.Generator, *, restarts: int = 16, steps: int = 2000, lr: float = 0.05
) -> PatternFit:
    """Closest pattern ``softmax(Q Kᵀ)`` with ``Q, K`` of ``d_k`` columns to ``target``, by Adam.

    target : (n_q, n_k) strictly positive row-stochastic. Minimises the mean row KL divergence
    over free ``Q (n_q, d_k)`` and ``K (n_k, d_k)`` (arrays ``q``, ``k``) — the same family as
    ``X W_Q (X W_K)ᵀ`` for a full-rank input ``X``. All ``restarts`` run at once (a leading axis). The
    gradient of the loss with respect to the logits is ``(softmax(S) − target)/n_q``; chain rule gives
    ``G K`` and ``Gᵀ Q``.
    """
    t = _check_pattern("target", target)
    if t.ndim != 2:
        raise ValueError(f"target must be 2-D (n_q, n_k), received shape {t.shape}")
    d_k, restarts, steps = positive_int("d_k", d_k), positive_int("restarts", restarts), positive_int("steps", steps)
    lr = positive_scalar("lr", lr)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    n_q, n_k = t.shape
    theta = {"q": rng.standard_normal((restarts, n_q, d_k)), "k": rng.standard_normal((restarts, n_k, d_k))}
    step = adam(theta, lr, eps=1e-12)  # the book's one Adam
    for t_step in range(1, steps + 1):
        q, k = theta["q"], theta["k"]
        g = (softmax(q @ np.swapaxes(k, -1, -2)) - t) / n_q  # (R, n_q, n_k)
        theta = step(theta, {"q": g @ k, "k": np.swapaxes(g, -1, -2) @ q}, t_step)
    q, k = theta["q"], theta["k"]
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
    heads, _ = attention_heads(x_q, x_kv, params, h, mask, scale)  # (..., h, n_q, d_v), validated
    w_o = params["W_o"].reshape(h, -1, params["W_o"].shape[1])  # (h, d_v, d_model): W_O^i
    return heads @ w_o


# ---------------------------------------------------------------- pruning a trained model


@dataclass(frozen=True)
class PruningCurve:
    """Result of :func:`greedy_head_pruning` for ``S`` seeds and ``m = n_layers·n_heads`` heads.

    accuracy : (S, m + 1) accuracy after removing ``0, 1, …, m`` heads, measured on the
        evaluation batch (the selection batch when no separate one was given);
    order : (S, m) flat index ``layer·n_heads + head`` of the head removed at each step;
    alone : (S, m) selection-batch accuracy with only that one head removed (the first greedy step's scores);
    selection : (S, m + 1) the selection-batch accuracy along the same path (what chose the order).
    """

    accuracy: np.ndarray
    order: np.ndarray
    alone: np.ndarray
    selection: np.ndarray | None = None

    def removable(self, tol: float) -> np.ndarray:
        """(S,) the largest ``k`` such that removing the first ``j ≤ k`` heads never costs more than
        ``tol`` accuracy."""
        ok = self.accuracy >= self.accuracy[:, :1] - tol
        return np.cumprod(ok, axis=1).sum(axis=1) - 1


def _scored_onehot_stats(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean cross-entropy over scored targets; logits (..., B, n, C), y (B, n) → two (...) arrays."""
    scored = y != IGNORE
    count = max(int(scored.sum()), 1)
    safe_y = np.where(scored, y, 0)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    idx = np.broadcast_to(safe_y[..., None], shifted.shape[:-1] + (1,))
    logp_y = np.take_along_axis(shifted, idx, axis=-1)[..., 0] - np.log(np.exp(shifted).sum(axis=-1))
    hit = (logits.argmax(axis=-1) == safe_y) & scored
    axes = (-2, -1)
    return hit.sum(axis=axes) / count, -(logp_y * scored).sum(axis=axes) / count


def _per_head_logits(params: dict, config: ModelConfig, task: Task, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-layer model: logits with every head off (S, B, n, C) and each head's additive part (S, H, B, n, C).

    With one residual attention layer and a linear read-out, the logits are affine in the head mask:
    ``logits(m) = L(0) + Σ_i m_i (L(e_i) − L(0))``; ``H + 1`` forward passes give every mask's logits.
    """
    H = config.n_heads
    base = forward(params, config, task, x, head_mask=np.zeros(H))
    parts = np.stack([forward(params, config, task, x, head_mask=np.eye(H)[i]) - base for i in range(H)], axis=1)
    return base, parts


def greedy_head_pruning(
    params: dict, config: ModelConfig, task: Task, batch: TaskBatch, eval_batch: TaskBatch | None = None
) -> PruningCurve:
    """Remove heads one at a time, each time the one whose removal leaves the highest accuracy on ``batch``.

    params : trained parameters with a leading seed axis S (``TrainResult.params``); batch : the
    *selection* :class:`~attn_utils.harness.tasks.TaskBatch`, ``x (batch, n)`` shared by the seeds, on which
    every remaining candidate is scored (ties in accuracy go to the lower loss); eval_batch : an
    independent batch on which the accuracy along the chosen path is reported (``curve.accuracy``),
    so that the curve is not measured on the data that chose it. Without it ``accuracy`` is the
    selection accuracy.

    One-layer attention models with a per-position read-out use the exact affine dependence of
    the logits on the head mask (:func:`_per_head_logits`, ``H + 1`` forward passes in all);
    other models evaluate every remaining candidate of every seed in one call per step.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, received {type(config).__name__}")
    for name, b in (("batch", batch), ("eval_batch", eval_batch)):
        if b is None and name == "eval_batch":
            continue
        if not isinstance(b, TaskBatch):
            raise TypeError(f"{name} must be a TaskBatch, received {type(b).__name__}")
        if np.ndim(b.x) != 2:
            raise ValueError(f"{name}.x must be (batch, n), shared by all seeds; received shape {np.shape(b.x)}")
    S = params["E"].shape[0]
    L, H = config.n_layers, config.n_heads
    m = L * H
    keep = np.ones((S, m))
    sel = np.empty((S, m + 1))
    order = np.empty((S, m), dtype=int)
    rows = np.arange(S)
    affine = L == 1 and config.encoder == "attention" and task.per_position
    if affine:
        base, parts = _per_head_logits(params, config, task, batch.x)  # (S, B, n, C), (S, H, B, n, C)
        y = np.asarray(batch.y)

        def score(masks):  # masks (S, c, H) → (S, c) twice; 0/1 masks are exact in the model's dtype
            logits = base[:, None] + np.einsum("sch,shbnk->scbnk", masks.astype(parts.dtype), parts, optimize=True)
            return _scored_onehot_stats(logits, y)
    else:
        tiled = {key: np.repeat(val, m, axis=0) for key, val in params.items()}  # copy c of seed s at s·m + c

        def score(masks):
            c = masks.shape[1]
            full = np.concatenate([masks, np.ones((S, m - c, m))], axis=1) if c < m else masks
            res = evaluate(tiled, config, task, batch, head_mask=full.reshape(S * m, L, H))
            return res["accuracy"].reshape(S, m)[:, :c], res["loss"].reshape(S, m)[:, :c]

    sel[:, 0] = score(keep[:, None, :])[0][:, 0]
    alone = None
    for step in range(m):
        r = m - step
        remaining = np.nonzero(keep)[1].reshape(S, r)  # per seed, increasing
        cand = np.repeat(keep[:, None, :], r, axis=1)  # (S, r candidates, m heads)
        cand[rows[:, None], np.arange(r)[None, :], remaining] = 0.0
        a, l = score(cand)
        if alone is None:
            alone = a.copy()  # step 0: r = m, remaining = 0..m−1
        pick = np.lexsort((l, -a), axis=-1)[:, 0]
        order[:, step] = remaining[rows, pick]
        sel[:, step + 1] = a[rows, pick]
        keep[rows, order[:, step]] = 0.0
    if eval_batch is None:
        return PruningCurve(sel, order, alone, sel)
    path = np.ones((S, m + 1, m))
    for step in range(m):
        path[rows, step + 1 :, order[:, step]] = 0.0
    acc = np.stack(
        [
            evaluate(params, config, task, eval_batch, head_mask=path[:, k].reshape(S, L, H))["accuracy"]
            for k in range(m + 1)
        ],
        axis=1,
    )
    return PruningCurve(acc, order, alone, sel)


# ---------------------------------------------------------------- sharp patterns with two dimensions


def hard_pattern_factors(targets, n_k: int, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Queries ``q (n_q, 2)`` and keys ``k (n_k, 2)`` with ``softmax(q kᵀ)[i, targets[i]] ≥ weight`` for every row.

    Any *hard* pattern (query ``i`` looks at key ``targets[i]``) is reachable to any sharpness with
    ``d_k = 2``: keys on the unit circle at angles ``2πj/n_k`` and ``q_i = c·k_{targets[i]}``. The
    target logit is ``c``, every other logit at most ``c·cos(2π/n_k)``, so the target weight is at least
    ``1/(1 + (n_k − 1)·exp(−c·δ))`` with ``δ = 1 − cos(2π/n_k)``; ``c = log((n_k − 1)·w/(1 − w))/δ``
    makes that bound equal to ``weight``. The logits are unscaled: compare ``softmax(q @ k.T)``.
    """
    n_k = positive_int("n_k", n_k)
    if n_k < 2:
        raise ValueError(f"n_k must be at least 2, received {n_k}")
    targets = np.asarray(targets)
    if targets.ndim != 1 or not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(
            f"targets must be a 1-d integer array (one key per query), received dtype {targets.dtype}, "
            f"shape {targets.shape}"
        )
    if targets.size and (targets.min() < 0 or targets.max() >= n_k):
        raise ValueError(f"targets must lie in [0, {n_k}), received range [{targets.min()}, {targets.max()}]")
    weight = float(weight)
    if not 0 < weight < 1:
        raise ValueError(f"weight must lie strictly between 0 and 1, received {weight}")
    angle = 2 * np.pi * np.arange(n_k) / n_k
    k = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    delta = 1.0 - np.cos(2 * np.pi / n_k)
    c = max(np.log((n_k - 1) * weight / (1 - weight)), 0.0) / delta
    return c * k[targets], k


__all__ = [
    "log_ratio_matrix",
    "min_head_dim",
    "logit_factors",
    "PatternFit",
    "fit_attention_pattern",
    "head_contributions",
    "PruningCurve",
    "greedy_head_pruning",
    "hard_pattern_factors",
]
