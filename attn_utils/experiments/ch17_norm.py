"""Chapter 17: where the normalisation goes (Post-LN, Pre-LN), and which learning rates each tolerates.

* :func:`layer_norm`, :func:`rms_norm`: the two normalisations, written once (autograd-differentiable).
* :func:`init_stack_gradients`: residual MLP stacks at initialisation, Post-LN or Pre-LN, of several
  depths; the residual stream's variance and the gradient of each block's weights, by autograd.
* :func:`train_stacks`: residual MLP stacks (no attention), Post-LN or Pre-LN, trained with the
  harness's Adam (or plain SGD) over seeds and learning rates at once, with or without a linear warm-up;
  the gradient by a hand-written backward pass, :func:`stack_loss_and_grad`.
* :func:`norm_ops`: the elementwise operations each normalisation executes, counted from its code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import autograd.numpy as anp
import numpy as np
from autograd import grad

from ..harness import training as tr
from ..softmax import log_softmax_core
from ..validation import positive_int, positive_scalar

PLACEMENTS = ("post", "pre")
EPS = 1e-5


# --------------------------------------------------------------------------- the two normalisations
def _check_gain(name: str, value, d: int) -> None:
    if value is not None and np.shape(value)[-1:] != (d,):
        raise ValueError(f"{name} must have last axis of size d = {d}, received shape {np.shape(value)}")


def layer_norm(x, gain=None, bias=None, eps: float = EPS):
    """LayerNorm over the last axis: ``(x − mean) / sqrt(var + eps) · gain + bias``.

    x : (..., d); gain, bias : (..., d) broadcasting against x, or ``None`` (1 and 0).
    The variance is the population variance (divide by d), as in the usual implementations.
    """
    if np.ndim(x) < 1 or np.shape(x)[-1] < 2:
        raise ValueError(f"x must have a last axis of size ≥ 2 (the features), received shape {np.shape(x)}")
    d = np.shape(x)[-1]
    _check_gain("gain", gain, d)
    _check_gain("bias", bias, d)
    centred = x - anp.mean(x, axis=-1, keepdims=True)
    y = centred / anp.sqrt(anp.mean(centred**2, axis=-1, keepdims=True) + eps)
    if gain is not None:
        y = y * gain
    if bias is not None:
        y = y + bias
    return y


def rms_norm(x, gain=None, eps: float = EPS):
    """RMSNorm over the last axis: ``x / sqrt(mean(x²) + eps) · gain`` (no centring, no bias).

    x : (..., d); gain : (..., d) or ``None``.
    """
    if np.ndim(x) < 1 or np.shape(x)[-1] < 1:
        raise ValueError(f"x must have a last axis (the features), received shape {np.shape(x)}")
    _check_gain("gain", gain, np.shape(x)[-1])
    y = x / anp.sqrt(anp.mean(x**2, axis=-1, keepdims=True) + eps)
    return y if gain is None else y * gain


# --------------------------------------------------------------------------- stacks at initialisation
def _placement(where: str) -> str:
    if where not in PLACEMENTS:
        raise ValueError(f"where must be one of {PLACEMENTS}, received {where!r}")
    return where


def residual_stack(h, w1, w2, where: str):
    """A residual stack of bias-free ReLU MLP blocks ``F(u) = relu(u W1) W2``, LayerNorms without gain or bias.

    h : (S, B, d) inputs (S independent models, B vectors each); w1 : list of L arrays (S, d, d_ff);
    w2 : list of L arrays (S, d_ff, d). Post-LN: ``x ← LN(x + F(x))``. Pre-LN: ``x ← x + F(LN(x))``,
    then a final LN. Returns ``(y (S, B, d), streams)`` with ``streams[l]`` the residual stream after
    block l (before Pre-LN's final LN).
    """
    where = _placement(where)
    x, streams = h, []
    for a, b in zip(w1, w2):
        u = x if where == "post" else layer_norm(x)
        f = anp.matmul(anp.maximum(anp.matmul(u, a), 0.0), b)
        x = layer_norm(x + f) if where == "post" else x + f
        streams.append(x)
    y = x if where == "post" else layer_norm(x)
    return y, streams


def draw_mlp_stack(rng: np.random.Generator, n_draws: int, n_layers: int, d: int, d_ff: int, w2_scale: float = 1.0):
    """Independent draws of an initialised stack: the input ``x0`` (N, d), a normalised Gaussian
    (mean 0, ``‖x0‖² = d``), the read-out ``w`` (N, d) ~ N(0, I), and per block ``W1`` ~ N(0, 2/d) (He)
    and ``W2`` ~ N(0, w2_scale²/d_ff)."""
    N, L = positive_int("n_draws", n_draws), positive_int("n_layers", n_layers)
    d, d_ff = positive_int("d", d), positive_int("d_ff", d_ff)
    w2_scale = positive_scalar("w2_scale", w2_scale)
    x0 = layer_norm(rng.standard_normal((N, d)), eps=0.0)
    w = rng.standard_normal((N, d))
    w1 = [rng.normal(0.0, (2.0 / d) ** 0.5, (N, d, d_ff)) for _ in range(L)]
    w2 = [rng.normal(0.0, w2_scale * d_ff**-0.5, (N, d_ff, d)) for _ in range(L)]
    return x0, w, w1, w2


def depth_sweep(
    rng, depths: Sequence[int], n_draws: int = 64, d: int = 32, d_ff: int = 64, w2_scale=None, placements=PLACEMENTS
):
    """For each depth L, ``n_draws`` fresh stacks, each differentiated in every placement of ``placements``
    (:func:`init_stack_gradients`). ``w2_scale(L)`` optionally shrinks the blocks' W2 at depth L.

    Returns ``{where: {"var": (N, K), "grad": (N, K), "branch": (N, K), "sum": (N, K)}}``: the stream's
    ``‖x_L‖²/d`` after the last block, the gradient norm of the last block's W2, and, per feature, what that
    block writes, ``‖F_L‖²/d``, and the sum it is added into, ``‖x_{L−1} + F_L‖²/d`` (the input of Post-LN's
    last LayerNorm; Pre-LN's stream ``x_L`` itself).
    """
    placements = tuple(_placement(w) for w in placements)
    out = {w: {"var": [], "grad": [], "branch": [], "sum": []} for w in placements}
    for L in depths:
        draw = draw_mlp_stack(rng, n_draws, L, d, d_ff, 1.0 if w2_scale is None else w2_scale(L))
        for where in placements:
            res = init_stack_gradients(draw, where)
            _, streams = residual_stack(draw[0][:, None, :], draw[2], draw[3], where)
            before = draw[0] if L == 1 else streams[-2][:, 0]  # x_{L−1}, the stream entering the last block
            u = before if where == "post" else layer_norm(before)
            f = np.einsum("nf,nfd->nd", np.maximum(np.einsum("nd,ndf->nf", u, draw[2][-1]), 0.0), draw[3][-1])  # F_L
            out[where]["var"].append(res.stream_var[:, -1])
            out[where]["grad"].append(res.grad_norm[:, -1])
            out[where]["branch"].append((f**2).mean(-1))
            out[where]["sum"].append(((before + f) ** 2).mean(-1))
    return {w: {k: np.stack(v, axis=1) for k, v in res.items()} for w, res in out.items()}


@dataclass(frozen=True)
class StackGradients:
    """What :func:`init_stack_gradients` measured for one placement and one depth.

    stream_var : (N, L) mean square over features, ``‖x_l‖²/d``, of the residual stream after each block.
    grad_norm : (N, L) Frobenius norm of ∂ℓ/∂W2 of each block, ℓ = w·y/√d.
    """

    where: str
    n_layers: int
    stream_var: np.ndarray
    grad_norm: np.ndarray


def init_stack_gradients(draw, where: str) -> StackGradients:
    """Differentiate, with autograd, the read-out loss ``ℓ = w·y/√d`` of initialised stacks with
    respect to every block's ``W2``, one input vector per draw.

    draw : ``(x0, w, w1, w2)`` from :func:`draw_mlp_stack` (the same draw serves both placements).
    """
    where = _placement(where)
    x0, w, w1, w2 = draw
    d = x0.shape[-1]
    x0, w = x0[:, None, :], w[:, None, :]  # (N, 1, d): a batch of one vector per draw

    def loss(w2_list):
        y, _ = residual_stack(x0, w1, w2_list, where)
        return anp.sum(y * w) / np.sqrt(d)  # the draws do not interact: each draw's gradient is its own

    grads = grad(loss)(list(w2))
    _, streams = residual_stack(x0, w1, w2, where)
    stream_var = np.stack([(s[:, 0] ** 2).mean(axis=-1) for s in streams], axis=1)
    norms = np.stack([np.sqrt((g**2).sum(axis=(1, 2))) for g in grads], axis=1)
    return StackGradients(where, len(w2), stream_var, norms)


def last_block_gradient(draw, where: str) -> np.ndarray:
    """The closed form of the last block's gradient norm, ``‖h_L‖ ‖Π_L w‖ / (√d s_L)`` (proposition),
    computed from the forward pass alone: (N,) per draw."""
    where = _placement(where)
    x0, w, w1, w2 = draw
    d = x0.shape[-1]
    _, streams = residual_stack(x0[:, None, :], w1, w2, where)
    before = x0[:, None, :] if len(w2) == 1 else streams[-2]  # the stream entering the last block
    u = before if where == "post" else layer_norm(before)
    hidden = np.maximum(u @ w1[-1], 0.0)[:, 0]  # h_L, (N, d_ff)
    z = (before + np.maximum(u @ w1[-1], 0.0) @ w2[-1])[:, 0]  # what the last LN normalises
    centred = z - z.mean(axis=-1, keepdims=True)
    s = np.sqrt((centred**2).mean(axis=-1) + EPS)
    y = centred / s[:, None]
    wc = w - w.mean(axis=-1, keepdims=True)
    proj = wc - y * ((y * wc).sum(axis=-1) / d)[:, None]  # Π w: centred, then y's direction removed
    return np.linalg.norm(hidden, axis=-1) * np.linalg.norm(proj, axis=-1) / (np.sqrt(d) * s)


def weighted_line(x: Sequence[float], values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares line ``mean ≈ a + b x`` through the per-column means of ``values``.

    x : (K,) abscissae; values : (N, K) independent draws per column. Each column's mean is weighted by
    the inverse of its squared standard error. Returns ``((a, b), (se_a, se_b))``.
    """
    x = np.asarray(x, float)
    v = np.asarray(values, float)
    if v.ndim != 2 or v.shape[1] != x.size or x.size < 2 or v.shape[0] < 2:
        raise ValueError(f"values must be (N ≥ 2, {x.size}) for {x.size} ≥ 2 abscissae, received shape {v.shape}")
    mean, se2 = v.mean(axis=0), v.var(axis=0, ddof=1) / v.shape[0]
    design = np.stack([np.ones_like(x), x], axis=1) / np.sqrt(se2)[:, None]
    cov = np.linalg.inv(design.T @ design)
    coef = cov @ design.T @ (mean / np.sqrt(se2))
    return coef, np.sqrt(np.diag(cov))


def ratio_of_means(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """``mean(num) / mean(den)`` over paired draws (N,), with its delta-method standard error
    ``sd(num − r·den) / (√N · mean(den))``."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    if num.shape != den.shape or num.ndim != 1 or num.size < 2:
        raise ValueError(f"num and den must be paired 1-d draws (N ≥ 2,), received {num.shape} and {den.shape}")
    r = num.mean() / den.mean()
    return float(r), float((num - r * den).std(ddof=1) / (np.sqrt(num.size) * den.mean()))


# --------------------------------------------------------------------------- a trained stack
@dataclass(frozen=True)
class TeacherTask:
    """Classify x ~ N(0, I_{d_in}) by a fixed random teacher: ``y = argmax(tanh(x A) B)``.

    A (d_in, width) ~ N(0, 1/d_in), B (width, n_classes) ~ N(0, 1); drawn once by :func:`teacher_task`.
    """

    A: np.ndarray
    B: np.ndarray

    @property
    def d_in(self) -> int:
        return self.A.shape[0]

    @property
    def n_classes(self) -> int:
        return self.B.shape[1]

    def sample(self, rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """x (batch, d_in), y (batch,) int labels."""
        x = rng.standard_normal((positive_int("batch", batch), self.d_in))
        return x, np.argmax(np.tanh(x @ self.A) @ self.B, axis=-1)


def teacher_task(rng: np.random.Generator, d_in: int = 16, width: int = 32, n_classes: int = 4) -> TeacherTask:
    """A :class:`TeacherTask` with its teacher drawn from ``rng``."""
    d_in, width = positive_int("d_in", d_in), positive_int("width", width)
    n_classes = positive_int("n_classes", n_classes)
    return TeacherTask(rng.normal(0, d_in**-0.5, (d_in, width)), rng.standard_normal((width, n_classes)))


_DRAWN: dict = {}  # (seed, stream) -> (x, y), the longest draw so far, for the task in _DRAWN["task"] only


def seed_data(task: TeacherTask, seeds: Sequence[int], stream: int, count: int):
    """``count`` examples per seed from ``default_rng([seed, stream])``: x (S, count, d_in), y (S, count).

    A generator draws in order, so the first rows of a longer draw are the shorter draw: each seed's
    longest draw for the task last used is kept and sliced (the chapter's runs of 200 and 1600 steps, of
    several depths and optimisers, share their batches without drawing them again).
    """
    count = positive_int("count", count)
    if _DRAWN.get("task") is not task:
        _DRAWN.clear()
        _DRAWN["task"] = task
    parts = []
    for s in seeds:
        kept = _DRAWN.get((s, stream))
        if kept is None or kept[1].shape[0] < count:
            kept = _DRAWN[(s, stream)] = task.sample(np.random.default_rng([s, stream]), count)
        parts.append((kept[0][:count], kept[1][:count]))
    return np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])


@dataclass(frozen=True)
class StackConfig:
    """A residual MLP classifier: ``h = x W_in``, then the :func:`residual_stack` of ``n_layers``
    blocks with its LayerNorms placed ``where``, then ``logits = y W_out + b_out``."""

    where: str = "post"
    d_model: int = 16
    d_ff: int = 32
    n_layers: int = 8

    def __post_init__(self) -> None:
        _placement(self.where)
        positive_int("d_model", self.d_model)
        positive_int("d_ff", self.d_ff)
        positive_int("n_layers", self.n_layers)


def init_stack(config: StackConfig, task: TeacherTask, seeds: Sequence[int]) -> tr.Params:
    """Parameters per seed from ``default_rng([seed, 0])`` (stacked on a leading axis S), drawn as in
    :func:`draw_mlp_stack`. The draws do not depend on ``where``: Post-LN and Pre-LN models of one
    seed start from the same numbers."""
    seeds = tr.seed_tuple(seeds)
    d, f, L = config.d_model, config.d_ff, config.n_layers
    per_seed = []
    for s in seeds:
        rng = np.random.default_rng([s, 0])
        p = {"W_in": rng.normal(0, task.d_in**-0.5, (task.d_in, d))}
        blocks = [(rng.normal(0, (2 / d) ** 0.5, (d, f)), rng.normal(0, f**-0.5, (f, d))) for _ in range(L)]
        p["W_1"] = np.stack([b[0] for b in blocks])  # (L, d, f): block l's weights are W_1[l]
        p["W_2"] = np.stack([b[1] for b in blocks])  # (L, f, d)
        p["W_out"] = rng.normal(0, d**-0.5, (d, task.n_classes))
        p["b_out"] = np.zeros(task.n_classes)
        per_seed.append(p)
    return {k: np.stack([p[k] for p in per_seed]) for k in per_seed[0]}


def stack_logits(p: tr.Params, config: StackConfig, x):
    """Logits (S, B, C) of the models for inputs x (S, B, d_in)."""
    S, C, L = x.shape[0], p["b_out"].shape[-1], config.n_layers
    w1 = [p["W_1"][:, l] for l in range(L)]
    w2 = [p["W_2"][:, l] for l in range(L)]
    y, _ = residual_stack(anp.matmul(x, p["W_in"]), w1, w2, config.where)
    return anp.matmul(y, p["W_out"]) + anp.reshape(p["b_out"], (S, 1, C))


def _cross_entropy(logits, y):
    """Mean cross-entropy per slot, (S,)."""
    onehot = y[..., None] == np.arange(logits.shape[-1])
    return -anp.mean(anp.sum(onehot * log_softmax_core(logits), axis=-1), axis=-1)


@dataclass
class StackRuns:
    """What :func:`train_stacks` returns; slots are (warm-up, rate, seed) triples, in that order.

    loss : (steps, W, R, S) training loss before each update; eval_loss, accuracy : (W, R, S) on
    held-out data (``default_rng([seed, 2])``); select_loss : (W, R, S) on a second held-out set
    (``default_rng([seed, 5])``), for choosing a rate without touching the evaluation data;
    accuracy_at : {step: (W, R, S)}, the held-out accuracy after that many updates, for each step of
    ``eval_at``.
    """

    config: StackConfig
    warmups: tuple[int, ...]
    lrs: tuple[float, ...]
    loss: np.ndarray
    eval_loss: np.ndarray
    accuracy: np.ndarray
    select_loss: np.ndarray
    accuracy_at: dict


def warmup_factor(t: int, t_warm) -> np.ndarray:
    """Linear warm-up: the rate factor ``min(1, t / t_warm)`` of update ``t`` (from 1); ``t_warm = 0``: 1."""
    t_warm = np.asarray(t_warm, float)
    if (t_warm < 0).any():
        raise ValueError(f"t_warm must be ≥ 0, received {t_warm}")
    return np.where(t_warm > 0, np.minimum(1.0, t / np.maximum(t_warm, 1.0)), 1.0)


_AVERAGERS: dict = {}  # (d, dtype) -> the (d, 1) column of 1/d


def _mean(v):
    """Mean over the last axis, kept: one matrix-vector product (over rows of 16 features, a third of the
    time numpy's reduction takes)."""
    key = (v.shape[-1], v.dtype)
    if key not in _AVERAGERS:
        _AVERAGERS[key] = np.full((v.shape[-1], 1), 1.0 / v.shape[-1], dtype=v.dtype)
    return v @ _AVERAGERS[key]


def _ln_forward(z):
    """LayerNorm without gain and bias, keeping what its backward pass needs: ``(y, 1/σ)``."""
    centred = z - _mean(z)
    inv = 1.0 / np.sqrt(_mean(centred * centred) + EPS)
    return centred * inv, inv


def _ln_backward(dy, y, inv):
    """∂ℓ/∂z from ∂ℓ/∂y for ``y = LN(z)``: ``(Π dy)/σ`` with Π the projection of the gradient proposition."""
    return (dy - _mean(dy) - y * _mean(dy * y)) * inv


def stack_loss_and_grad(p: tr.Params, config: StackConfig, x, y):
    """Each slot's mean cross-entropy (S,) and its gradient, by a hand-written backward pass.

    The same model as :func:`stack_logits` (whose autograd gradient the unit tests compare with this
    one); written out because autograd's bookkeeping, not the arithmetic, dominates the cost of these
    small stacks. x : (S, B, d_in); y : (S, B) int labels. Works in the parameters' dtype.
    """
    L, post = config.n_layers, config.where == "post"
    h = x @ p["W_in"]
    saved = []  # per block: (u, mask of relu, hidden a, the LN's (y, 1/σ))
    for l in range(L):
        w1, w2 = p["W_1"][:, l], p["W_2"][:, l]
        ln = None if post else _ln_forward(h)
        u = h if post else ln[0]
        pre = u @ w1
        a = np.maximum(pre, 0)
        z = h + a @ w2
        if post:
            ln = _ln_forward(z)
            h = ln[0]
        else:
            h = z
        saved.append((u, pre > 0, a, ln))
    out_ln = None if post else _ln_forward(h)
    top = h if post else out_ln[0]
    logits = top @ p["W_out"] + p["b_out"][:, None, :]
    logp = log_softmax_core(logits)
    onehot = y[..., None] == np.arange(logits.shape[-1])
    loss = -(logp * onehot).sum(axis=-1).mean(axis=-1)
    dlogits = (np.exp(logp) - onehot) / y.shape[-1]
    g = {"W_out": top.mT @ dlogits, "b_out": dlogits.sum(axis=1)}
    g["W_1"], g["W_2"] = np.empty_like(p["W_1"]), np.empty_like(p["W_2"])
    dh = dlogits @ p["W_out"].mT
    if not post:
        dh = _ln_backward(dh, *out_ln)
    for l in reversed(range(L)):
        u, on, a, ln = saved[l]
        dz = _ln_backward(dh, *ln) if post else dh
        g["W_2"][:, l] = a.mT @ dz
        da = (dz @ p["W_2"][:, l].mT) * on
        g["W_1"][:, l] = u.mT @ da
        du = da @ p["W_1"][:, l].mT
        dh = dz + (du if post else _ln_backward(du, *ln))
    g["W_in"] = x.mT @ dh
    return loss, g


OPTIMISERS = ("adam", "sgd")


def train_stacks(
    config: StackConfig,
    task: TeacherTask,
    seeds: Sequence[int],
    lrs: Sequence[float],
    warmups: Sequence[int] = (0,),
    steps: int = 150,
    batch_size: int = 32,
    eval_size: int = 512,
    optimizer: str = "adam",
    dtype: str = "float64",
    eval_at: Sequence[int] = (),
) -> StackRuns:
    """Train one model per (warm-up, rate, seed) with the harness's Adam (or plain SGD), in one
    vectorised loop (:func:`stack_loss_and_grad`, :func:`attn_utils.harness.training.optimise`).

    For a given seed every (warm-up, rate) starts from the same parameters and sees the same batches
    (paired runs). ``warmups`` : lengths of a linear warm-up in updates (0 = constant rate).
    ``optimizer`` : ``"adam"`` or ``"sgd"`` (plain, no momentum); ``dtype`` : ``"float64"`` or
    ``"float32"`` (the same draws, rounded; about twice as fast); ``eval_at`` : steps (1 … steps − 1)
    after which the held-out accuracy is also measured, mid-run.
    """
    seeds = tr.seed_tuple(seeds)
    lrs = tuple(positive_scalar("lrs", r) for r in lrs)
    warmups = tuple(int(w) for w in warmups)
    if not lrs or not warmups:
        raise ValueError(f"lrs and warmups must be non-empty, received {lrs} and {warmups}")
    if optimizer not in OPTIMISERS:
        raise ValueError(f"optimizer must be one of {OPTIMISERS}, received {optimizer!r}")
    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', received {dtype!r}")
    warmup_factor(1, warmups)  # validates
    steps = positive_int("steps", steps)
    eval_at = tuple(int(k) for k in eval_at)
    if any(not 0 < k < steps for k in eval_at):
        raise ValueError(f"eval_at must hold steps between 1 and steps − 1 = {steps - 1}, received {eval_at}")
    W, R, S = len(warmups), len(lrs), len(seeds)
    n = W * R
    base = init_stack(config, task, seeds)
    params = {k: np.concatenate([v] * n).astype(dtype) for k, v in base.items()}
    slot_rate = np.repeat(np.tile(np.asarray(lrs, float), W), S)
    slot_warm = np.repeat(np.asarray(warmups, float), R * S)

    def per_slot(values):
        return {k: values.reshape((n * S,) + (1,) * (v.ndim - 1)).astype(dtype) for k, v in params.items()}

    x, y = seed_data(task, seeds, 1, steps * batch_size)
    xs = np.concatenate([x] * n).astype(dtype).reshape(n * S, steps, batch_size, -1).swapaxes(0, 1)
    ys = np.concatenate([y] * n).reshape(n * S, steps, batch_size).swapaxes(0, 1)

    def objective(p, xb, yb):
        return stack_loss_and_grad(p, config, xb, yb)

    factory = tr.adam if optimizer == "adam" else tr.sgd
    schedule = None if not any(warmups) else lambda t: per_slot(warmup_factor(t, slot_warm))
    step = factory(params, per_slot(slot_rate), schedule=schedule)
    held_out = {}
    for name, stream in (("eval", 2), ("select", 5)):
        xe, ye = seed_data(task, seeds, stream, eval_size)
        held_out[name] = np.concatenate([xe] * n).astype(dtype), np.concatenate([ye] * n)

    def accuracy(logits):
        return (logits.argmax(-1) == held_out["eval"][1]).mean(axis=-1).reshape(W, R, S)

    accuracy_at = {}

    def record(t, p, _):
        if t in eval_at:
            accuracy_at[t] = accuracy(stack_logits(p, config, held_out["eval"][0]))

    with np.errstate(all="ignore"):
        losses, params = tr.optimise(objective, params, xs, ys, step, record=record if eval_at else None)
        out = {}
        for name, (xe, ye) in held_out.items():
            logits = stack_logits(params, config, xe)
            out[name] = np.asarray(_cross_entropy(logits, ye), float).reshape(W, R, S)
            if name == "eval":
                out["acc"] = accuracy(logits)
    return StackRuns(
        config, warmups, lrs, losses.reshape(steps, W, R, S), out["eval"], out["acc"], out["select"], accuracy_at
    )


# --------------------------------------------------------------------------- counting the work of a norm
class _CountingArray(np.ndarray):
    """An array that adds, to ``_CountingArray.log``, one entry per ufunc call made on it: the ufunc's
    name and the number of elements it touched (the output's size, or the input's for a reduction)."""

    log: list = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(v) if isinstance(v, _CountingArray) else v for v in inputs]
        if "out" in kwargs:  # numpy's mean divides in place: hand it the plain arrays
            kwargs["out"] = tuple(np.asarray(v) for v in kwargs["out"])
        out = getattr(ufunc, method)(*plain, **kwargs)
        touched = np.size(plain[0]) if method == "reduce" else np.size(out)
        _CountingArray.log.append((ufunc.__name__, int(touched)))
        return np.asarray(out).view(_CountingArray) if isinstance(out, np.ndarray) else out


def norm_ops(norm, d: int, affine: bool = True) -> dict[str, int]:
    """Element operations executed by ``norm`` on one vector of ``d`` features, counted by running it.

    norm : :func:`layer_norm` or :func:`rms_norm`; affine : with a gain (and LayerNorm's bias).
    Returns ``{"per_feature": …, "per_vector": …}``: operations over all d features (a reduction
    counts d), and scalar operations done once per vector (the mean's division, ε, the square root).
    """
    d = positive_int("d", d)
    if norm not in (layer_norm, rms_norm):
        raise ValueError(f"norm must be layer_norm or rms_norm, received {norm!r}")
    x = np.linspace(-1.0, 2.0, d).view(_CountingArray)
    kwargs = {}
    if affine:
        kwargs["gain"] = np.ones(d)
        if norm is layer_norm:
            kwargs["bias"] = np.zeros(d)
    _CountingArray.log = []
    norm(x, **kwargs)
    sizes = [n for _, n in _CountingArray.log]
    return {"per_feature": sum(n == d for n in sizes), "per_vector": sum(n == 1 for n in sizes)}
