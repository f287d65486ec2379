"""Small attention models trained with ``autograd``, vectorised over seeds.

One :class:`ModelConfig` describes every variant the training chapters need
(scale rule, shared W_Q = W_K, QK-norm, heads, head mask, score function,
attention vs one-vector encoder); :func:`train` trains ``S`` independent
copies of it at once.

The seed axis
-------------
Every parameter has a leading axis ``S`` (one slice per seed). The forward pass
keeps that axis through batched matmuls, and the training loss is the *sum* of
the per-seed mean losses, so ``∂loss/∂θ_s`` only involves seed ``s``: one
autograd call trains ``S`` independent models. Adam and SGD act elementwise, so
the optimiser does not couple seeds either. Initial parameters come from
``default_rng([seed, 0])`` and batches from ``default_rng([seed, 1])``, so a
seed's run is the same whichever other seeds share the call.

Model (``encoder="attention"``)
-------------------------------
``h₀ = E[x] + P`` (token + learned or sinusoidal position embedding), then
``n_layers`` residual attention layers ``h ← h + MHA(h)`` (no MLP, no norm), then
a linear read-out: per position, or from the last position (``readout="last"``)
or the mean over positions (``readout="mean"``) for per-sequence tasks.
Per head the logits are ``c · score(q, k)`` with ``c`` from the scale rule:

=============  ======================================
``"none"``     ``c = 1``
``"quarter"``  ``c = d_k^(-1/4)``
``"sqrt"``     ``c = d_k^(-1/2)`` (the Transformer)
``"linear"``   ``c = d_k^(-1)`` (muP)
``"learned"``  ``c = exp(log_scale)``, one learned value per layer and head
=============  ======================================

``qk_norm=True`` rescales every q and k to length ``sqrt(d_k)`` (L2-normalise,
then multiply by ``sqrt(d_k)``, the length a unit-variance vector has) and
multiplies the logits by a learned gain ``exp(log_gain)`` (init 1) per layer and
head. At initialisation the logits therefore have the usual size, and
afterwards ``|logit| ≤ c · gain · d_k`` can only grow through the gain.

``sink="learned"`` gives every layer and head one more key that every query sees: its logit is a
learned number ``sink_logit`` = ``z_0`` (init 0) and its value is the zero vector. The weights of the
real keys are then ``e^{z_j} / (e^{z_0} + Σ_i e^{z_i})`` and sum to less than 1; the rest goes to the
sink and adds nothing to the output. With ``z_0 = 0`` this is the "off-by-one" softmax (chapter 16).

One-vector baselines (``encoder="mean_pool" | "last_state"``)
-------------------------------------------------------------
``mean_pool``: ``z = mean_j tanh((E[x_j] + P_j) W_enc + b_enc)``; ``last_state``:
the final state of an Elman RNN ``s_t = tanh((E[x_t] + P_t) W_enc + s_{t−1} W_rec + b_enc)``.
Per-sequence tasks read ``z W_out``; per-position tasks decode position ``i``
from ``tanh(z W_dec + P_dec[i]) W_out`` — everything must pass through ``z``.

Score functions
---------------
:data:`SCORES` maps a name to a :class:`ScoreSpec`; :func:`register_score`
adds one (a function ``fn(q, k, params)`` returning raw scores, an optional
initialiser for its own parameters, and how scores become weights).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import autograd.numpy as anp
import numpy as np
from autograd import value_and_grad
from autograd.extend import defvjp, primitive
from autograd.tracer import getval

from ..book.measuring import keep_freed_memory, single_thread_blas
from ..softmax import log_softmax_core, softmax_core
from ..validation import positive_int, positive_scalar
from .tasks import IGNORE, Task, TaskBatch

Params = dict[str, np.ndarray]

SCALE_RULES = ("none", "quarter", "sqrt", "linear", "learned")
ENCODERS = ("attention", "mean_pool", "last_state")
POSITIONAL = ("learned", "sinusoidal", "none")
READOUTS = ("last", "mean")
WEIGHT_RULES = ("softmax", "sigmoid", "normalize")
SINKS = ("none", "learned", "key")


# --------------------------------------------------------------------------- score registry
@dataclass(frozen=True)
class ScoreSpec:
    """How one score function turns queries and keys into attention weights.

    fn(q, k, params) : q (S, B, H, n_q, d_k), k (S, B, H, n_k, d_k) → raw scores
        (S, B, H, n_q, n_k), written with ``autograd.numpy``; ``params`` holds the
        score's own parameters for this layer (with leading seed axis S).
    init(rng, n_heads, d_k, d_model) → dict of arrays *without* the seed axis
        (called once per seed, so seeds stay independent); ``None`` = no parameters.
    weights : ``"softmax"`` (default), ``"sigmoid"`` (elementwise, no normalisation)
        or ``"normalize"`` (scores must be ≥ 0; divided by their row sum, as in
        linear/kernel attention).

    rowwise : each query's scores depend on that query and the keys only, not on where the query
        sits (true of the dot product and of chapter 7's scores, false of a score that masks the
        diagonal or adds a position bias). Only then may a last-position read-out compute the last
        layer for its last query alone.

    The scale rule multiplies the raw scores before ``weights`` is applied.
    """

    fn: Callable
    init: Callable | None = None
    weights: str = "softmax"
    rowwise: bool = False


def _dot_score(q, k, params):
    return q @ anp.swapaxes(k, -1, -2)


SCORES: dict[str, ScoreSpec] = {"dot": ScoreSpec(_dot_score, rowwise=True)}
"""Registered score functions; :func:`register_score` adds more."""


def register_score(
    name: str,
    fn: Callable,
    init: Callable | None = None,
    weights: str = "softmax",
    overwrite: bool = False,
    *,
    rowwise: bool = False,
) -> ScoreSpec:
    """Add a score function to :data:`SCORES` (see :class:`ScoreSpec` for the signatures)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, received {name!r}")
    if name in SCORES and not overwrite:
        raise ValueError(f"score {name!r} is already registered; pass overwrite=True to replace it")
    if not callable(fn):
        raise TypeError(f"fn must be callable, received {type(fn).__name__}")
    if init is not None and not callable(init):
        raise TypeError(f"init must be callable or None, received {type(init).__name__}")
    if weights not in WEIGHT_RULES:
        raise ValueError(f"weights must be one of {WEIGHT_RULES}, received {weights!r}")
    SCORES[name] = ScoreSpec(fn, init, weights, bool(rowwise))
    return SCORES[name]


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ModelConfig:
    """Architecture and initialisation of one model variant (task sizes come from the :class:`Task`).

    d_model : residual width; n_heads : heads per layer; d_k, d_v : per-head sizes
        (default ``d_model // n_heads``); n_layers : attention layers (≥ 1).
    scale : one of :data:`SCALE_RULES`; learned_scale_init : initial ``c`` for
        ``scale="learned"`` (default ``d_k^(-1/2)``).
    score : a key of :data:`SCORES`; share_qk : use ``W_K = W_Q``;
    qk_norm : normalise q and k and learn a logit gain (module docstring).
    positional : ``"learned"``, ``"sinusoidal"`` or ``"none"``.
    encoder : ``"attention"`` or a one-vector baseline ``"mean_pool"`` / ``"last_state"``.
    readout : per-sequence read-out from the ``"last"`` position or the ``"mean"``.
    causal : mask keys after the query.
    sink : ``"none"`` or ``"learned"``: one extra key per layer and head with a learned logit
        (init 0) and value 0 (module docstring; softmax weights only).
    q_init_scale : multiplies W_Q's initial std ``d_model^(-1/2)`` (T5: ``d_k^(-1/2)``
        with ``scale="none"`` gives the same forward pass at init as ``"sqrt"``).
    head_mask : 0/1 per head, shape (n_heads,) or (n_layers, n_heads); a masked
        head's output is zeroed (pruning). ``None`` = all heads on.
    dtype : ``"float64"`` (default; gradient checks need it) or ``"float32"``
        (about 1.5× faster for d_model ≥ 64; same random draws, rounded).
    """

    d_model: int = 32
    n_heads: int = 1
    d_k: int | None = None
    d_v: int | None = None
    n_layers: int = 1
    scale: str = "sqrt"
    learned_scale_init: float | None = None
    score: str = "dot"
    share_qk: bool = False
    qk_norm: bool = False
    positional: str = "learned"
    encoder: str = "attention"
    readout: str = "last"
    causal: bool = False
    sink: str = "none"
    q_init_scale: float = 1.0
    head_mask: tuple | None = None
    dtype: str = "float64"

    def __post_init__(self) -> None:
        positive_int("d_model", self.d_model)
        positive_int("n_heads", self.n_heads)
        positive_int("n_layers", self.n_layers)
        for name in ("d_k", "d_v"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
            elif self.d_model % self.n_heads:
                raise ValueError(
                    f"{name} must be given when d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
                )
        for name, allowed in (
            ("scale", SCALE_RULES),
            ("encoder", ENCODERS),
            ("positional", POSITIONAL),
            ("readout", READOUTS),
            ("sink", SINKS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, received {getattr(self, name)!r}")
        if self.score not in SCORES:
            raise ValueError(
                f"score must be one of {tuple(SCORES)} (register_score adds more), received {self.score!r}"
            )
        for name in ("share_qk", "qk_norm", "causal"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, received {type(getattr(self, name)).__name__}")
        if self.sink != "none" and SCORES[self.score].weights != "softmax":
            raise ValueError(
                f"sink={self.sink!r} needs softmax weights; score {self.score!r} uses {SCORES[self.score].weights!r}"
            )
        positive_scalar("q_init_scale", self.q_init_scale)
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be 'float64' or 'float32', received {self.dtype!r}")
        if self.learned_scale_init is not None:
            positive_scalar("learned_scale_init", self.learned_scale_init)
        if self.head_mask is not None:
            object.__setattr__(self, "head_mask", _as_tuple(self.head_mask_array()))

    @property
    def head_dim(self) -> int:
        """Per-head key/query size d_k."""
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def value_dim(self) -> int:
        """Per-head value size d_v."""
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    def fixed_scale(self) -> float:
        """The constant ``c`` of the scale rule (for ``"learned"``: its initial value)."""
        d_k = self.head_dim
        if self.scale == "learned":
            return d_k**-0.5 if self.learned_scale_init is None else float(self.learned_scale_init)
        return {"none": 1.0, "quarter": d_k**-0.25, "sqrt": d_k**-0.5, "linear": 1.0 / d_k}[self.scale]

    def head_mask_array(self, head_mask=None) -> np.ndarray:
        """``head_mask`` (or the config's) as float (n_layers, n_heads); all ones if ``None``."""
        mask = self.head_mask if head_mask is None else head_mask
        shape = (self.n_layers, self.n_heads)
        if mask is None:
            return np.ones(shape)
        arr = np.asarray(mask, dtype=float)
        if arr.shape == (self.n_heads,):
            arr = np.broadcast_to(arr, shape)
        if arr.shape != shape:
            raise ValueError(
                f"head_mask must have shape (n_heads,) = ({self.n_heads},) or (n_layers, n_heads) "
                f"= {shape}, received shape {arr.shape}"
            )
        if not np.isin(arr, (0.0, 1.0)).all():
            raise ValueError(f"head_mask entries must be 0 or 1, received {np.unique(arr)}")
        return np.array(arr)


def _as_tuple(arr: np.ndarray) -> tuple:
    return tuple(tuple(float(v) for v in row) for row in arr)


# --------------------------------------------------------------------------- parameters
def sinusoidal_positions(n: int, d: int) -> np.ndarray:
    """The Transformer's fixed position code, (n, d): sin on even, cos on odd features."""
    pos = np.arange(n)[:, None]
    freq = 10000.0 ** (-(np.arange(d) // 2 * 2) / d)
    angle = pos * freq[None, :]
    return np.where(np.arange(d) % 2 == 0, np.sin(angle), np.cos(angle))


def _init_one(seed: int, cfg: ModelConfig, task: Task) -> Params:
    """Parameters of one seed (no seed axis). Draw order is fixed whatever the variant,
    so two configs that differ only in scale rule / share_qk / q_init_scale start from
    the same random numbers and can be compared step by step."""
    rng = np.random.default_rng([seed, 0])
    d, H, dk, dv = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.value_dim
    V, n, C = task.vocab_size, task.seq_len, task.n_classes
    emb_std = 0.5**0.5  # token + position then have unit variance per feature
    p: Params = {"E": rng.normal(0, emb_std, (V, d))}
    pos = rng.normal(0, emb_std, (n, d))
    if cfg.positional == "learned":
        p["P"] = pos
    for l in range(cfg.n_layers):
        w_q = rng.normal(0, d**-0.5, (d, H, dk))
        w_k = rng.normal(0, d**-0.5, (d, H, dk))
        w_v = rng.normal(0, d**-0.5, (d, H, dv))
        w_o = rng.normal(0, (H * dv) ** -0.5, (H, dv, d))
        if cfg.encoder != "attention":
            continue
        p[f"L{l}.W_q"] = cfg.q_init_scale * w_q
        if not cfg.share_qk:
            p[f"L{l}.W_k"] = w_k
        p[f"L{l}.W_v"], p[f"L{l}.W_o"] = w_v, w_o
        if cfg.scale == "learned":
            p[f"L{l}.log_scale"] = np.full(H, np.log(cfg.fixed_scale()))
        if cfg.qk_norm:
            p[f"L{l}.log_gain"] = np.zeros(H)
        if cfg.sink == "learned":
            p[f"L{l}.sink_logit"] = np.zeros(H)  # no draw: the other parameters stay those of sink="none"
        if cfg.sink == "key":
            p[f"L{l}.sink_key"] = np.zeros((H, dk))
        spec = SCORES[cfg.score]
        if spec.init is not None:
            # a separate stream, so adding a score never shifts the other parameters
            extra = spec.init(np.random.default_rng([seed, 3, l]), H, dk, d)
            p.update({f"L{l}.score.{k}": np.asarray(v, dtype=float) for k, v in extra.items()})
    p["W_out"] = rng.normal(0, d**-0.5, (d, C))
    p["b_out"] = np.zeros(C)
    if cfg.encoder != "attention":
        p["W_enc"] = rng.normal(0, d**-0.5, (d, d))
        p["b_enc"] = np.zeros(d)
        if cfg.encoder == "last_state":
            p["W_rec"] = rng.normal(0, d**-0.5, (d, d)) * 0.5  # keeps the RNN contractive at init
        if task.per_position:
            p["W_dec"] = rng.normal(0, d**-0.5, (d, d))
            p["P_dec"] = rng.normal(0, 1.0, (n, d))
    return p


def init_params(config: ModelConfig, task: Task, seeds: Sequence[int]) -> Params:
    """Parameters for every seed, stacked on a leading axis: each entry is (S, …)."""
    seeds = seed_tuple(seeds)
    _check_config_task(config, task)
    per_seed = [_init_one(s, config, task) for s in seeds]  # once per run; keeps seeds independent
    return {k: np.stack([p[k] for p in per_seed]).astype(config.dtype) for k in per_seed[0]}


# --------------------------------------------------------------------------- forward pass
@primitive
def _part(x, index):
    """``x[index]`` for a basic index (slices, integers, ``None``, ``...``), with a fast gradient.

    autograd differentiates every index with ``np.add.at``, which fancy indices need (they may
    repeat an entry) and which costs some 40× a plain assignment; a basic index never repeats,
    so its gradient is the incoming one written into zeros.
    """
    if not all(isinstance(i, (slice, int, np.integer, type(None), type(Ellipsis))) for i in index):
        raise TypeError(f"_part takes a basic index (slices, ints, None, ...), received {index!r}")
    return x[index]


def _part_vjp(ans, x, index):
    def vjp(g):
        out = np.zeros(np.shape(x), dtype=np.asarray(x).dtype)  # as autograd does: the dtype of x
        out[index] = g
        return out

    return vjp


defvjp(_part, _part_vjp)


def _embed(p: Params, cfg: ModelConfig, x: np.ndarray):
    """x (S, B, n) ints → (S, B, n, d)."""
    S, B, n = x.shape
    V, d = p["E"].shape[1], p["E"].shape[2]
    # a one-hot matmul: its gradient is another matmul, much faster under autograd than
    # the scatter-add (np.add.at) that the gradient of fancy indexing needs
    onehot = np.zeros((S, B * n, V), dtype=cfg.dtype)
    onehot[np.arange(S)[:, None], np.arange(B * n), x.reshape(S, B * n)] = 1.0
    h = anp.reshape(anp.matmul(onehot, p["E"]), (S, B, n, d))
    if cfg.positional == "learned":
        h = h + _part(p["P"], np.s_[:, None, :, :])
    elif cfg.positional == "sinusoidal":
        h = h + sinusoidal_positions(n, d).astype(cfg.dtype)
    return h


def _heads(h, w):
    """h (S, B, n, d) @ w (S, d, H, e) → (S, B, H, n, e) as one matmul per seed."""
    S, B, n, d = h.shape
    H, e = w.shape[2], w.shape[3]
    out = anp.matmul(anp.reshape(h, (S, B * n, d)), anp.reshape(w, (S, d, H * e)))
    return anp.transpose(anp.reshape(out, (S, B, n, H, e)), (0, 1, 3, 2, 4))


def _weights(logits, rule: str, mask):
    if rule == "softmax":
        return softmax_core(logits, mask=mask)
    keep = np.ones(logits.shape[-2:], bool) if mask is None else mask
    if rule == "sigmoid":
        # tanh form: 1/(1+exp(-x)) overflows in float32 (and in its gradient) for x < -44
        return anp.where(keep, 0.5 * (1.0 + anp.tanh(0.5 * logits)), 0.0)
    pos = anp.where(keep, logits, 0.0)
    return pos / (anp.sum(pos, axis=-1, keepdims=True) + 1e-9)


def _attention_layer(
    p: Params, l: int, h, cfg: ModelConfig, head_on: np.ndarray, log: dict | None, last_only: bool = False
):
    """One multi-head attention block (the caller adds the residual).

    h (S, B, n, d) → (output (S, B, n_q, d), weights (S, B, H, n_q, n)): every query (n_q = n), or with
    ``last_only`` the last position's only (n_q = 1), when nothing else of this layer reaches the loss.
    """
    S, B, n, d = h.shape
    pre = f"L{l}."
    w_q = p[pre + "W_q"]
    rows = slice(-1, None) if last_only else slice(None)  # the positions whose output is used
    if cfg.share_qk:
        k = _heads(h, w_q)
        q = _part(k, np.s_[..., rows, :]) if last_only else k
    else:
        q = _heads(_part(h, np.s_[:, :, rows, :]) if last_only else h, w_q)
        k = _heads(h, p[pre + "W_k"])
    v = _heads(h, p[pre + "W_v"])
    dk = cfg.head_dim
    if cfg.qk_norm:
        # length sqrt(d_k): what an unscaled unit-variance q has, so init logits match plain attention
        k = k * (dk**0.5 / anp.sqrt(anp.sum(k * k, axis=-1, keepdims=True) + 1e-12))
        if cfg.share_qk:
            q = _part(k, np.s_[..., rows, :]) if last_only else k
        else:
            q = q * (dk**0.5 / anp.sqrt(anp.sum(q * q, axis=-1, keepdims=True) + 1e-12))
    spec = SCORES[cfg.score]
    score_params = {key[len(pre + "score.") :]: val for key, val in p.items() if key.startswith(pre + "score.")}
    logits = spec.fn(q, k, score_params)
    if cfg.scale == "learned":
        logits = logits * anp.reshape(anp.exp(p[pre + "log_scale"]), (S, 1, -1, 1, 1))
    else:
        logits = logits * cfg.fixed_scale()
    if cfg.qk_norm:
        logits = logits * anp.reshape(anp.exp(p[pre + "log_gain"]), (S, 1, -1, 1, 1))
    mask = np.tril(np.ones((n, n), bool))[rows] if cfg.causal else None
    if cfg.sink != "none":
        # one more key, logit sink_logit (or q·sink_key, scaled) and value 0: softmax over n + 1 keys, keep n
        n_q = logits.shape[3]
        if cfg.sink == "learned":
            sink = anp.reshape(p[pre + "sink_logit"], (S, 1, -1, 1, 1)) * np.ones((1, B, 1, n_q, 1), cfg.dtype)
        else:
            sink = anp.matmul(q, _part(p[pre + "sink_key"], np.s_[:, None, :, :, None])) * cfg.fixed_scale()
        sink_mask = None if mask is None else np.concatenate([mask, np.ones((n_q, 1), bool)], axis=1)
        weights = _part(_weights(anp.concatenate([logits, sink], axis=-1), "softmax", sink_mask), np.s_[..., :n])
    else:
        weights = _weights(logits, spec.weights, mask)
    if log is not None:
        lv = np.abs(getval(logits))
        if mask is not None:
            lv = np.where(mask, lv, 0.0)
        log["max_logit"] = np.maximum(log.get("max_logit", 0.0), lv.max(axis=(1, 2, 3, 4)))
        wv = getval(weights)
        ent = -np.sum(wv * np.log(np.where(wv > 0, wv, 1.0)), axis=-1).mean(axis=(1, 2, 3))
        log["attn_entropy"] = log.get("attn_entropy", 0.0) + ent / cfg.n_layers
    heads = anp.matmul(weights, v) * np.asarray(head_on, cfg.dtype)[..., :, None, None]  # (S, B, H, n, dv)
    H, n_q, dv = heads.shape[2], heads.shape[3], heads.shape[4]
    merged = anp.reshape(anp.transpose(heads, (0, 1, 3, 2, 4)), (S, B * n_q, H * dv))
    out = anp.matmul(merged, anp.reshape(p[pre + "W_o"], (S, H * dv, d)))
    return anp.reshape(out, (S, B, n_q, d)), weights


def _readout(p: Params, z):
    """z (S, …, d) → logits (S, …, C)."""
    S, d = z.shape[0], z.shape[-1]
    lead = z.shape[1:-1]
    flat = anp.matmul(anp.reshape(z, (S, -1, d)), p["W_out"]) + _part(p["b_out"], np.s_[:, None, :])
    return anp.reshape(flat, (S,) + lead + (p["W_out"].shape[-1],))


def _forward_core(
    p: Params,
    cfg: ModelConfig,
    per_position: bool,
    x: np.ndarray,
    head_on: np.ndarray,
    log: dict | None = None,
    keep_weights: bool = False,
):
    """Logits (S, B, n, C) or (S, B, C), plus attention weights per layer if asked."""
    S = p["E"].shape[0]
    h = _embed(p, cfg, x)
    all_w = []
    if cfg.encoder == "attention":
        # read out at the last position only: the last layer's other queries feed nothing (unless they are logged)
        last_only = (
            not per_position
            and cfg.readout == "last"
            and log is None
            and not keep_weights
            and SCORES[cfg.score].rowwise
        )
        for l in range(cfg.n_layers):
            final = last_only and l == cfg.n_layers - 1
            out, w = _attention_layer(p, l, h, cfg, head_on[..., l, :], log, last_only=final)
            h = (_part(h, np.s_[:, :, -1:, :]) if final else h) + out
            if keep_weights:
                all_w.append(getval(w))
        if per_position:
            return _readout(p, h), all_w
        z = _part(h, np.s_[:, :, -1, :]) if cfg.readout == "last" else anp.mean(h, axis=2)
        return _readout(p, z), all_w
    B, n, d = h.shape[1], h.shape[2], h.shape[3]
    pre = anp.reshape(anp.matmul(anp.reshape(h, (S, B * n, d)), p["W_enc"]), (S, B, n, d)) + _part(
        p["b_enc"], np.s_[:, None, None, :]
    )
    if cfg.encoder == "mean_pool":
        z = anp.mean(anp.tanh(pre), axis=2)
    else:
        z = anp.zeros((S, B, d), dtype=cfg.dtype)
        for t in range(n):  # the recurrence is sequential by nature: a loop over time, not over data
            z = anp.tanh(_part(pre, np.s_[:, :, t, :]) + anp.matmul(z, p["W_rec"]))
    if not per_position:
        return _readout(p, z), all_w
    dec = anp.tanh(_part(anp.matmul(z, p["W_dec"]), np.s_[:, :, None, :]) + _part(p["P_dec"], np.s_[:, None, :, :]))
    return _readout(p, dec), all_w


def _per_seed_ce(logits, y: np.ndarray):
    """Mean cross-entropy per seed over scored targets. logits (S, …, C), y (S, …) → (S,)."""
    logp = log_softmax_core(logits)
    C = logits.shape[-1]
    scored = y != IGNORE
    onehot = (np.where(scored, y, 0)[..., None] == np.arange(C)) & scored[..., None]
    axes = tuple(range(1, logits.ndim))
    counts = np.maximum(scored.reshape(y.shape[0], -1).sum(axis=1), 1).astype(getval(logits).dtype)
    return -anp.sum(onehot * logp, axis=axes) / counts


# --------------------------------------------------------------------------- public forward helpers
def _prepare(params: Params, config: ModelConfig, task: Task, x, head_mask) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, received {type(config).__name__}")
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task, received {type(task).__name__}")
    raw = getval(params)  # a DictBox while autograd traces loss()
    if not isinstance(raw, dict) or "E" not in raw:
        raise TypeError("params must be the dict returned by init_params / train")
    S = raw["E"].shape[0]
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"x must hold integer tokens, received dtype {x.dtype}")
    if x.ndim == 2:
        x = np.broadcast_to(x, (S,) + x.shape)  # one batch shared by every seed
    if x.ndim != 3 or x.shape[0] != S or x.shape[2] != task.seq_len:
        raise ValueError(
            f"x must have shape (batch, n) or (S, batch, n) with S={S}, n={task.seq_len}; received shape {x.shape}"
        )
    if x.min() < 0 or x.max() >= task.vocab_size:
        raise ValueError(f"x tokens must lie in [0, {task.vocab_size}), received range [{x.min()}, {x.max()}]")
    hm = config.head_mask_array(head_mask) if (head_mask is None or np.ndim(head_mask) < 3) else None
    if hm is None:  # per-seed masks (S, n_layers, n_heads)
        hm = np.asarray(head_mask, dtype=float)
        if hm.shape != (S, config.n_layers, config.n_heads):
            raise ValueError(
                f"head_mask with a seed axis must have shape (S, n_layers, n_heads) = "
                f"{(S, config.n_layers, config.n_heads)}, received shape {hm.shape}"
            )
        hm = hm[:, None]  # (S, 1, L, H) broadcasts against (S, B, …)
    return x, hm


def forward(params: Params, config: ModelConfig, task: Task, x, head_mask=None) -> np.ndarray:
    """Logits of every seed's model.

    x : (batch, n) shared by all seeds, or (S, batch, n).
    head_mask : (n_heads,), (n_layers, n_heads) or per seed (S, n_layers, n_heads); overrides the config's.
    Returns (S, batch, n, n_classes) for per-position tasks, else (S, batch, n_classes).
    """
    x, hm = _prepare(params, config, task, x, head_mask)
    return _forward_core(params, config, task.per_position, x, hm)[0]


def _prepare_y(task: Task, x: np.ndarray, y) -> np.ndarray:
    """y shared (batch, …) or per seed (S, batch, …) → (S, batch, n) or (S, batch)."""
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"y must hold integer targets, received dtype {y.dtype}")
    want = x.shape if task.per_position else x.shape[:2]
    try:
        return np.broadcast_to(y, want)
    except ValueError:
        raise ValueError(
            f"y must have shape {want[1:]} or {want} for task {task.name!r}, received shape {y.shape}"
        ) from None


def attention_stats(params: Params, config: ModelConfig, task: Task, x, head_mask=None) -> dict[str, np.ndarray]:
    """The attention statistics :func:`train` logs, measured on the batch ``x``: ``max_logit`` (largest
    |attention logit| over layers, heads, batch and positions) and ``attn_entropy`` (mean entropy of
    the attention rows, nats), each (S,). The same forward pass as training, so the same numbers.
    """
    if isinstance(config, ModelConfig) and config.encoder != "attention":
        raise ValueError(f"config.encoder is {config.encoder!r}: a one-vector baseline has no attention logits")
    x, hm = _prepare(params, config, task, x, head_mask)
    log: dict = {}
    _forward_core(params, config, task.per_position, x, hm, log)
    return log


def attention_weights(params: Params, config: ModelConfig, task: Task, x, head_mask=None) -> list[np.ndarray]:
    """Attention weights per layer for heatmaps: a list of ``n_layers`` arrays (S, batch, H, n, n).

    Row ``i`` of head ``h`` is the distribution position ``i`` attends with
    (masked heads still show their weights; the mask only zeroes their output).
    """
    if config.encoder != "attention":
        raise ValueError(f"config.encoder is {config.encoder!r}: a one-vector baseline has no attention weights")
    x, hm = _prepare(params, config, task, x, head_mask)
    return _forward_core(params, config, task.per_position, x, hm, keep_weights=True)[1]


def _accuracy(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    scored = y != IGNORE
    hit = (np.argmax(logits, axis=-1) == y) & scored
    axes = tuple(range(1, y.ndim))
    return hit.sum(axis=axes) / np.maximum(scored.sum(axis=axes), 1)


def evaluate(
    params: Params, config: ModelConfig, task: Task, batch: TaskBatch, head_mask=None
) -> dict[str, np.ndarray]:
    """Accuracy and loss per seed on ``batch`` (x, y shared by all seeds or with a seed axis).

    Returns ``{"accuracy": (S,), "loss": (S,)}``; accuracy counts scored targets only.
    ``head_mask`` as in :func:`forward` — pass a pruning mask here.
    """
    if not isinstance(batch, TaskBatch):
        raise TypeError(f"batch must be a TaskBatch, received {type(batch).__name__}")
    x, hm = _prepare(params, config, task, batch.x, head_mask)
    y = _prepare_y(task, x, batch.y)
    logits = _forward_core(params, config, task.per_position, x, hm)[0]
    return {"accuracy": _accuracy(logits, y), "loss": np.asarray(_per_seed_ce(logits, y))}


def per_seed_loss(params: Params, config: ModelConfig, task: Task, x, y, head_mask=None):
    """Each seed's mean cross-entropy, (S,) (autograd-differentiable in params).

    x : (S, batch, n) or (batch, n); y : matching (…, n) with ``IGNORE`` or (…,) per sequence.
    """
    x, hm = _prepare(params, config, task, x, head_mask)
    y = _prepare_y(task, x, y)
    logits = _forward_core(params, config, task.per_position, x, hm)[0]
    return _per_seed_ce(logits, y)


def loss(params: Params, config: ModelConfig, task: Task, x, y, head_mask=None):
    """Training objective: sum over seeds of each seed's mean cross-entropy (autograd-differentiable in params).

    Seeds do not interact, so one gradient of the sum trains every seed. Arguments as in
    :func:`per_seed_loss`.
    """
    return anp.sum(per_seed_loss(params, config, task, x, y, head_mask))


# --------------------------------------------------------------------------- optimisers
def _per_parameter(name: str, value, params: Params) -> dict:
    """``value`` for every parameter: one number for all, or a dict with an entry per parameter
    (a number, or an array that broadcasts against it, e.g. one value per seed of shape (S, 1, …))."""
    if isinstance(value, Mapping):
        missing = set(params) - set(value)
        if missing:
            raise ValueError(f"{name} has no entry for parameters {sorted(missing)}")
        return {k: value[k] for k in params}
    return {k: value for k in params}


def adam(params: Params, lr, beta1: float = 0.9, beta2: float = 0.999, eps=1e-8, schedule=None):
    """The book's one Adam: returns ``step(params, grads, t) -> params`` (``t`` counts from 1).

    The moments are kept in the parameters' dtype and updated in place; gradients of another
    dtype are cast to it (a float32 model trains in float32).

    ``lr`` and ``eps`` are a number, or per parameter (see :func:`_per_parameter`), so one loop
    can train many learning rates or ε (one per seed slot) at once.
    ``schedule`` : optional ``schedule(t) -> factor``; update ``t`` uses the rate ``lr · schedule(t)``
    (a linear warm-up is ``lambda t: min(1, t / t_warm)``). The factor is a number, or per parameter
    like ``lr`` (e.g. one factor per seed slot). ``None`` keeps the rate constant.
    """
    if schedule is not None and not callable(schedule):
        raise TypeError(f"schedule must be callable (t -> factor) or None, received {type(schedule).__name__}")
    lr, eps = _per_parameter("lr", lr, params), _per_parameter("eps", eps, params)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    s = {k: np.zeros_like(v) for k, v in params.items()}

    def step(params: Params, grads: Params, t: int) -> Params:
        out = {}
        factor = None if schedule is None else _per_parameter("schedule(t)", schedule(t), params)
        for k in params:
            # the moments in place (the same products and sums, so the same numbers, with fewer temporaries)
            m[k] *= beta1
            m[k] += (1 - beta1) * grads[k]
            s[k] *= beta2
            s[k] += (1 - beta2) * grads[k] ** 2
            m_hat, s_hat = m[k] / (1 - beta1**t), s[k] / (1 - beta2**t)
            rate = lr[k] if factor is None else lr[k] * factor[k]
            out[k] = params[k] - rate * m_hat / (np.sqrt(s_hat) + eps[k])
        return out

    return step


def sgd(params: Params, lr, momentum: float = 0.0, schedule=None):
    """SGD with optional momentum: ``step(params, grads, t) -> params``; ``lr`` and ``schedule``
    (the rate of update ``t`` is ``lr · schedule(t)``) as in :func:`adam`."""
    if schedule is not None and not callable(schedule):
        raise TypeError(f"schedule must be callable (t -> factor) or None, received {type(schedule).__name__}")
    lr = _per_parameter("lr", lr, params)
    vel = {k: np.zeros_like(v) for k, v in params.items()}

    def step(params: Params, grads: Params, t: int) -> Params:
        out = {}
        factor = None if schedule is None else _per_parameter("schedule(t)", schedule(t), params)
        for k in params:
            vel[k] = momentum * vel[k] + grads[k]
            rate = lr[k] if factor is None else lr[k] * factor[k]
            out[k] = params[k] - rate * vel[k]
        return out

    return step


OPTIMIZERS: dict[str, Callable] = {"adam": adam, "sgd": sgd}
"""name -> factory(params, lr, **options) returning ``step(params, grads, t) -> params`` (t from 1)."""


# --------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    """What :func:`train` returns.

    loss : (steps, S) training loss per step and seed (before that step's update).
    accuracy, eval_loss : (S,) on a held-out batch from ``default_rng([seed, 2])``.
    stats : per-step (steps, S) arrays: ``max_logit`` (largest |attention logit| over
        layers, heads, batch, positions), ``attn_entropy`` (mean entropy of attention
        rows, nats), ``grad_norm`` (global gradient norm of the seed's parameters).
        Attention stats are absent for one-vector encoders.
    params : final parameters (each (S, …)); seconds : wall time of the loop.
    """

    config: ModelConfig
    task: Task
    seeds: tuple[int, ...]
    loss: np.ndarray
    accuracy: np.ndarray
    eval_loss: np.ndarray
    params: Params
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0
    eval_batch: TaskBatch | None = field(default=None, repr=False)

    def forward(self, x, head_mask=None) -> np.ndarray:
        """:func:`forward` with this run's parameters."""
        return forward(self.params, self.config, self.task, x, head_mask)

    def attention(self, x) -> list[np.ndarray]:
        """:func:`attention_weights` with this run's parameters."""
        return attention_weights(self.params, self.config, self.task, x)

    def evaluate(self, batch: TaskBatch | None = None, head_mask=None) -> dict[str, np.ndarray]:
        """:func:`evaluate` on ``batch`` (default: this run's held-out batch)."""
        return evaluate(self.params, self.config, self.task, self.eval_batch if batch is None else batch, head_mask)


def seed_tuple(seeds) -> tuple[int, ...]:
    """``seeds`` validated: distinct non-negative ints, at least one."""
    if isinstance(seeds, (numbers.Integral, np.integer)) or isinstance(seeds, (str, bytes)):
        raise TypeError(f"seeds must be a sequence of ints such as range(4) or [0, 1], received {seeds!r}")
    try:
        out = tuple(seeds)
    except TypeError:
        raise TypeError(f"seeds must be a sequence of ints, received {type(seeds).__name__}") from None
    if not out:
        raise ValueError("seeds must not be empty")
    for s in out:
        if isinstance(s, bool) or not isinstance(s, (numbers.Integral, np.integer)) or s < 0:
            raise TypeError(f"seeds must hold non-negative ints, received {s!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"seeds must be distinct, received {out}")
    return tuple(int(s) for s in out)


def _check_config_task(config, task) -> None:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, received {type(config).__name__}")
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task (e.g. from recall_task), received {type(task).__name__}")


def seed_batches(task: Task, seeds: tuple[int, ...], stream: int, count: int) -> TaskBatch:
    """``count`` examples per seed from ``default_rng([seed, stream])``: x (S, count, n)."""
    parts = [task.sample(np.random.default_rng([s, stream]), count) for s in seeds]
    return TaskBatch(
        np.stack([b.x for b in parts]),
        np.stack([b.y for b in parts]),
        {k: np.stack([b.info[k] for b in parts]) for k in parts[0].info},
    )


def step_batches(task: Task, seeds: tuple[int, ...], steps: int, batch_size: int):
    """The fresh training batches of :func:`train`: x (steps, S, batch, n) and y to match, drawn
    in order from ``default_rng([seed, 1])``, so every trainer that uses them sees the same data."""
    S = len(seeds)
    data = seed_batches(task, seeds, 1, steps * batch_size)
    xs = data.x.reshape(S, steps, batch_size, -1).swapaxes(0, 1)
    ys = data.y.reshape((S, steps, batch_size) + data.y.shape[2:]).swapaxes(0, 1)
    return xs, ys


def loss_and_grad(config: ModelConfig, task: Task, *, log: dict | None = None):
    """The training objective as ``f(params, x, y) -> (per-seed losses (S,), gradients)``.

    The gradient is that of the *sum* over seeds (seeds do not interact, so each seed's parameters
    get their own loss's gradient); the per-seed values come from the same forward pass. With a
    ``log`` dict, each call also leaves the attention statistics of :attr:`TrainResult.stats` in it
    (``max_logit``, ``attn_entropy``; (S,) each).
    """
    _check_config_task(config, task)
    head_on = config.head_mask_array()
    per_seed: dict = {}

    def objective(p, x, y):
        logits = _forward_core(p, config, task.per_position, x, head_on, log)[0]
        values = _per_seed_ce(logits, y)
        per_seed["loss"] = getval(values)
        return anp.sum(values)

    vg = value_and_grad(objective)

    def f(params: Params, x, y):
        x, _ = _prepare(params, config, task, x, None)  # shapes and token range, as per_seed_loss checks them
        y = _prepare_y(task, x, y)
        if log is not None:
            log.clear()
        _, grads = vg(params, x, y)
        return per_seed["loss"], grads

    return f


def optimise(objective, params, xs, ys, step, *, record=None, grad_hook=None) -> tuple[np.ndarray, dict]:
    """The book's one training loop: ``len(xs)`` updates ``params ← step(params, grads, t)``.

    objective : ``f(params, x, y) -> (per-seed losses, gradients)`` (:func:`loss_and_grad`, or a
        hand-derived gradient); xs, ys : one batch per step (a leading step axis);
    step : an optimiser's update, from :func:`adam` or :func:`sgd`;
    record : ``record(t, params, x)``, called before update ``t`` (``t = 0 … steps − 1``) with that
        step's batch, and once more with ``t = steps`` and ``x = None`` after the last update;
    grad_hook : ``grad_hook(t, grads)``, called before update ``t``; it may change ``grads`` in
        place (zero a frozen parameter's gradient, so that Adam's step for it is exactly 0).

    Returns ``(losses (steps, S) before each update, final params)``. BLAS runs single-threaded.
    """
    steps = len(xs)
    if steps == 0 or len(ys) != steps:
        raise ValueError(f"xs and ys must hold one batch per step (at least one); received {steps} and {len(ys)}")
    losses = None
    keep_freed_memory()
    with single_thread_blas():
        for t in range(steps):
            if record is not None:
                record(t, params, xs[t])
            loss, grads = objective(params, xs[t], ys[t])
            if losses is None:
                losses = np.empty((steps,) + np.shape(loss))
            losses[t] = loss
            if grad_hook is not None:
                grad_hook(t, grads)
            params = step(params, grads, t + 1)
        if record is not None:
            record(steps, params, None)
    return losses, params


def train(
    config: ModelConfig,
    task: Task,
    seeds: Sequence[int] = (0,),
    steps: int = 300,
    lr: float = 1e-2,
    optimizer: str = "adam",
    batch_size: int = 32,
    train_size: int | None = None,
    eval_size: int = 512,
    momentum: float = 0.0,
    log_stats: bool = True,
) -> TrainResult:
    """Train one model per seed, all in one vectorised loop.

    Data: by default every step sees a *fresh* batch of ``batch_size`` examples
    per seed (all ``steps × batch_size`` drawn up front from ``default_rng([seed, 1])``,
    so there is nothing to overfit). With ``train_size`` a fixed training set of
    that many examples per seed is drawn once and each step samples a minibatch
    from it (for over-fitting / memorisation experiments).

    optimizer : ``"adam"`` (β = 0.9, 0.999) or ``"sgd"`` (with optional ``momentum``).
    A run that diverges is not stopped: its loss becomes NaN/inf from that step on, so
    a chapter can plot the instability (e.g. attention-logit growth at high ``lr``).
    BLAS runs single-threaded during training (see :func:`single_thread_blas`).
    Returns a :class:`TrainResult`.
    """
    _check_config_task(config, task)
    seeds = seed_tuple(seeds)
    steps = positive_int("steps", steps)
    lr = positive_scalar("lr", lr)
    batch_size = positive_int("batch_size", batch_size)
    eval_size = positive_int("eval_size", eval_size)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZERS)}, received {optimizer!r}")
    if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not 0 <= momentum < 1:
        raise ValueError(f"momentum must be a real number in [0, 1), received {momentum!r}")
    if optimizer == "adam" and momentum:
        raise ValueError("momentum applies to optimizer='sgd' only; Adam has its own beta1")
    S = len(seeds)

    params = init_params(config, task, seeds)
    step_fn = (
        OPTIMIZERS[optimizer](params, lr, momentum=momentum)
        if optimizer == "sgd"
        else OPTIMIZERS[optimizer](params, lr)
    )
    if train_size is None:
        xs, ys = step_batches(task, seeds, steps, batch_size)
    else:
        train_size = positive_int("train_size", train_size)
        data = seed_batches(task, seeds, 1, train_size)
        pick = np.stack(
            [np.random.default_rng([s, 4]).integers(0, train_size, (steps, batch_size)) for s in seeds], axis=1
        )  # (steps, S, B)
        rows = np.arange(S)[None, :, None]
        xs, ys = data.x[rows, pick], data.y[rows, pick]
    log: dict | None = {} if log_stats else None
    stats: dict[str, np.ndarray] = {}

    def log_stats_of(t, grads):
        gn = np.sqrt(sum(np.sum(g.reshape(S, -1) ** 2, axis=1) for g in grads.values()))
        for key, val in list(log.items()) + [("grad_norm", gn)]:
            stats.setdefault(key, np.empty((steps, S)))[t] = val

    t0 = time.perf_counter()
    losses, params = optimise(
        loss_and_grad(config, task, log=log), params, xs, ys, step_fn, grad_hook=log_stats_of if log_stats else None
    )
    seconds = time.perf_counter() - t0
    with single_thread_blas():
        held_out = seed_batches(task, seeds, 2, eval_size)
        ev = evaluate(params, config, task, held_out)
    return TrainResult(config, task, seeds, losses, ev["accuracy"], ev["loss"], params, stats, seconds, held_out)


def query_key_vectors(params: dict, config, task, x) -> tuple[np.ndarray, np.ndarray]:
    """First-layer queries and keys of models trained with :func:`train`.

    The input of layer 0 is the embedding ``h = E[x] + P``, so ``q = h W_q`` and ``k = h W_k``
    (``k = q`` when ``config.share_qk``). Scale rules and QK-norm are *not* applied: these are
    the raw vectors whose dot product the scale multiplies. The embedding and the head split are
    the training harness's own, so the vectors are exactly those of the model's forward pass
    (chapters 4 and 8 measure their norms and dot products).

    params : the dict of a :class:`TrainResult` (each entry (S, …))
    config : its :class:`ModelConfig` (``encoder="attention"``)
    task : its :class:`Task`
    x : (batch, n) int tokens shared by all seeds, or (S, batch, n)

    Returns ``q, k``, each (S, batch, n_heads, n, d_k), float64.
    """
    if isinstance(config, ModelConfig) and config.encoder != "attention":
        raise ValueError(f"config.encoder must be 'attention', received {config.encoder!r}")
    if not isinstance(params, dict) or "L0.W_q" not in params:
        raise TypeError("params must be the dict of a TrainResult (with 'E' and 'L0.W_q')")
    x, _ = _prepare(params, config, task, x, None)  # validates config, task, params and x
    h0 = _embed(params, config, x)  # (S, B, n, d): the input of layer 0, as in the forward pass
    q = _heads(h0, params["L0.W_q"])
    k = q if config.share_qk else _heads(h0, params["L0.W_k"])
    return np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)


__all__ = [
    "SCALE_RULES",
    "ENCODERS",
    "POSITIONAL",
    "READOUTS",
    "SINKS",
    "SCORES",
    "ScoreSpec",
    "register_score",
    "ModelConfig",
    "sinusoidal_positions",
    "init_params",
    "forward",
    "attention_weights",
    "attention_stats",
    "evaluate",
    "loss",
    "per_seed_loss",
    "query_key_vectors",
    "adam",
    "sgd",
    "loss_and_grad",
    "optimise",
    "seed_tuple",
    "seed_batches",
    "step_batches",
    "OPTIMIZERS",
    "TrainResult",
    "train",
]
