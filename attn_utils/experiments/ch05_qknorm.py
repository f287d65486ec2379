"""Chapter 5: moving the 1/√d_k out of the logits, and cosine (QK-norm) attention.

Two ways to drop the explicit ``1/√d_k``:

* **Fold it into W_Q** (the T5 codebase): the model with logits
  ``s·(x W_Q)(x W_K)ᵀ`` and the unscaled model with ``W_Q' = s·W_Q`` compute the
  same function. :func:`fold_query_scale` performs the change of variables on
  trained or initial parameters; :func:`train_per_parameter` trains with a
  learning rate (and Adam ε) per parameter, which is what the two
  parametrisations differ by, and :func:`train_variants` trains several such
  variants of one model side by side (stacked on the seed axis), paired seed by seed
  (a learning-rate sweep is such a set of variants). A ``record`` hook sees the
  parameters at every step: :func:`attn_utils.harness.attention_stats` measures the
  attention logits there as training logs them, and the gain of QK-norm can be read directly.
* **Normalise q and k** and learn a gain: logits ``g·cos(q, k)`` are
  bounded by ``g`` (:func:`cosine_logits`), so a softmax over ``n`` keys can
  put at most :func:`cosine_max_weight` on one key; :func:`gain_for_max_weight`
  inverts that bound. :func:`cosine_score` is the same score for the training
  harness (``register_score``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import autograd.numpy as anp
import numpy as np

from ..harness.tasks import Task
from ..harness.training import (
    SCORES,
    ModelConfig,
    adam,
    init_params,
    loss_and_grad,
    optimise,
    register_score,
    seed_tuple,
    sgd,
    step_batches,
)
from ..validation import as_float_array, positive_int, positive_scalar

Params = dict[str, np.ndarray]

FIXED_SCALES = ("none", "quarter", "sqrt", "linear")


# --------------------------------------------------------------------------- folding the scale
def fold_query_scale(params: Params, config: ModelConfig) -> tuple[Params, ModelConfig]:
    """The unscaled model that computes the same function: ``W_Q ← s·W_Q`` in every layer, ``scale="none"``.

    params : the dict from :func:`attn_utils.init_params` or ``TrainResult.params`` (each entry (S, …)).
    config : a fixed scale rule (``"none" | "quarter" | "sqrt" | "linear"``), separate W_Q and W_K,
        no QK-norm (after normalisation the size of W_Q no longer reaches the logits).
    Returns new ``(params, config)``; the inputs are not modified. The new config records the
    factor in ``q_init_scale`` so that :func:`attn_utils.init_params` with it draws the folded
    initial parameters directly (the T5 initialisation when ``s = d_k^(-1/2)``).
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, received {type(config).__name__}")
    if config.scale not in FIXED_SCALES:
        raise ValueError(f"config.scale must be one of {FIXED_SCALES} to fold it, received {config.scale!r}")
    if config.qk_norm or config.share_qk or config.encoder != "attention":
        raise ValueError(
            "fold_query_scale needs an attention encoder with separate W_Q, W_K and no QK-norm; "
            f"received qk_norm={config.qk_norm}, share_qk={config.share_qk}, "
            f"encoder={config.encoder!r}"
        )
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, received {type(params).__name__}")
    s = config.fixed_scale()
    out = dict(params)
    for l in range(config.n_layers):
        key = f"L{l}.W_q"
        if key not in params:
            raise ValueError(f"params has no {key!r}: it does not belong to this config (n_layers={config.n_layers})")
        out[key] = params[key] * s
    return out, replace(config, scale="none", q_init_scale=config.q_init_scale * s)


# --------------------------------------------------------------------------- per-parameter optimiser
def _multipliers(name: str, mult: Mapping[str, float] | None, keys, allow_zero: bool = False) -> dict[str, float]:
    """Each parameter's multiplier (default 1); ``allow_zero`` admits 0 (a learning rate of 0 freezes a parameter)."""
    mult = {} if mult is None else dict(mult)
    unknown = set(mult) - set(keys)
    if unknown:
        raise ValueError(f"{name} names unknown parameters {sorted(unknown)}; the parameters are {sorted(keys)}")
    out = {}
    for k in keys:
        value = mult.get(k, 1.0)
        if allow_zero and isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
            if value == 0:
                out[k] = 0.0
                continue
        out[k] = positive_scalar(f"{name}[{k!r}]", value)
    return out


def _optimise(
    config: ModelConfig, task: Task, p: Params, xs, ys, lrs: Params, epss: Params, optimizer: str, record=None
) -> tuple[np.ndarray, Params]:
    """The harness's optimiser with a rate (and Adam ε) per parameter, run by the book's one loop
    (:func:`attn_utils.harness.optimise`). lrs[k], epss[k] : (S,) per-seed rate and Adam ε of
    parameter k. ``record(t, params, x)``, if given, is called before update ``t`` with
    that step's batch ``x`` (S, batch, n), and with ``t = steps``, ``x = None`` after the last one.

    Returns (loss (steps, S) per seed before each update, final params)."""
    S = xs.shape[1]
    shape = {k: (S,) + (1,) * (v.ndim - 1) for k, v in p.items()}
    # in the parameters' own dtype, so that a float32 model trains in float32 (as in the harness)
    lrs = {k: np.reshape(v, shape[k]).astype(p[k].dtype) for k, v in lrs.items()}
    epss = {k: np.reshape(v, shape[k]).astype(p[k].dtype) for k, v in epss.items()}
    step = sgd(p, lrs) if optimizer == "sgd" else adam(p, lrs, eps=epss)
    return optimise(loss_and_grad(config, task), p, xs, ys, step, record=record)


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', received {optimizer!r}")


def train_per_parameter(
    config: ModelConfig,
    task: Task,
    seeds: Sequence[int] = (0,),
    steps: int = 100,
    lr: float = 1e-2,
    optimizer: str = "sgd",
    lr_mult: Mapping[str, float] | None = None,
    eps_mult: Mapping[str, float] | None = None,
    batch_size: int = 32,
    params: Params | None = None,
    record=None,
) -> tuple[np.ndarray, Params]:
    """Train like :func:`attn_utils.train` (same initial parameters, same batches), with per-parameter rates.

    Parameter ``k`` is updated with learning rate ``lr · lr_mult[k]`` (default multiplier 1; a
    multiplier 0 keeps the parameter at its initial value) and,
    for Adam (β = 0.9, 0.999, ε = 1e-8 as in the harness), with ``ε · eps_mult[k]``. With no
    multipliers this reproduces :func:`attn_utils.train` step for step.

    params : start here instead of ``init_params(config, task, seeds)`` (e.g. folded parameters).
    record : optional ``record(t, params, x)``, called before update ``t`` (``t = 0 … steps − 1``)
        with the current parameters (each (S, …)) and that step's batch ``x`` (S, batch, n), and
        once more with ``t = steps`` and ``x = None`` after the last update; its return value is
        ignored (keep what it measures in a closure).
    Returns ``(loss, params)``: loss (steps, S) is each seed's training loss before each update
    (as ``TrainResult.loss``); params the final parameters (each (S, …)).
    """
    _check_optimizer(optimizer)
    steps = positive_int("steps", steps)
    batch_size = positive_int("batch_size", batch_size)
    lr = positive_scalar("lr", lr)
    seeds = seed_tuple(seeds)
    p = init_params(config, task, seeds) if params is None else {k: np.array(v) for k, v in params.items()}
    S = len(seeds)
    lrs = {k: np.full(S, lr * m) for k, m in _multipliers("lr_mult", lr_mult, p, allow_zero=True).items()}
    epss = {k: np.full(S, 1e-8 * m) for k, m in _multipliers("eps_mult", eps_mult, p).items()}
    if record is not None and not callable(record):
        raise TypeError(f"record must be a function record(t, params, x), received {type(record).__name__}")
    xs, ys = step_batches(task, seeds, steps, batch_size)
    return _optimise(config, task, p, xs, ys, lrs, epss, optimizer, record)


VARIANT_KEYS = ("lr", "lr_mult", "eps_mult", "init")


def train_variants(
    config: ModelConfig,
    task: Task,
    variants: Mapping[str, Mapping],
    seeds: Sequence[int] = (0,),
    steps: int = 100,
    lr: float = 1e-2,
    optimizer: str = "sgd",
    batch_size: int = 32,
) -> dict[str, tuple[np.ndarray, Params]]:
    """Several :func:`train_per_parameter` runs of one config, side by side in one vectorised loop.

    variants : ``{name: {"lr": …, "lr_mult": {…}, "eps_mult": {…}, "init": {…}}}`` (each key
        optional; ``lr`` overrides the common rate; ``init`` = ``{parameter: value}`` starts that
        parameter at the given value (broadcast over its entries) instead of its initial draw, e.g.
        ``{"L0.log_scale": np.log(4.0)}``, with ``lr_mult`` 0 a gain fixed at 4). Every variant trains
        every seed from the same initial parameters (apart from ``init``) on the same batches, so
        variants are paired seed by seed. The variants are
        stacked on the seed axis (the seeds repeated), which costs much less than separate
        calls for small models.
    Returns ``{name: (loss (steps, S), params)}``, each as :func:`train_per_parameter` with that
    variant's arguments would return it (equal up to rounding).
    """
    _check_optimizer(optimizer)
    steps = positive_int("steps", steps)
    batch_size = positive_int("batch_size", batch_size)
    lr = positive_scalar("lr", lr)
    seeds = seed_tuple(seeds)
    if not isinstance(variants, Mapping) or not variants:
        raise TypeError(
            "variants must be a non-empty dict {name: {'lr': …, 'lr_mult': {…}, 'eps_mult': {…}, 'init': {…}}}"
        )
    base = init_params(config, task, seeds)
    S, V = len(seeds), len(variants)
    lrs = {k: np.empty(S * V) for k in base}
    epss = {k: np.empty(S * V) for k in base}
    for i, (name, spec) in enumerate(variants.items()):
        if not isinstance(spec, Mapping) or set(spec) - set(VARIANT_KEYS):
            raise ValueError(f"variant {name!r} must be a dict with keys among {VARIANT_KEYS}, received {spec!r}")
        rate = positive_scalar(f"variants[{name!r}]['lr']", spec.get("lr", lr))
        part = slice(i * S, (i + 1) * S)
        for k, m in _multipliers(f"variants[{name!r}]['lr_mult']", spec.get("lr_mult"), base, allow_zero=True).items():
            lrs[k][part] = rate * m
        for k, m in _multipliers(f"variants[{name!r}]['eps_mult']", spec.get("eps_mult"), base).items():
            epss[k][part] = 1e-8 * m
    p = {k: np.concatenate([v] * V) for k, v in base.items()}
    for i, (name, spec) in enumerate(variants.items()):
        start = dict(spec.get("init") or {})
        unknown = set(start) - set(base)
        if unknown:
            raise ValueError(f"variants[{name!r}]['init'] names unknown parameters {sorted(unknown)}")
        for k, value in start.items():
            value = float(value)
            if not np.isfinite(value):
                raise ValueError(f"variants[{name!r}]['init'][{k!r}] must be finite, received {value}")
            p[k][i * S : (i + 1) * S] = value
    xs, ys = step_batches(task, seeds, steps, batch_size)
    xs, ys = np.concatenate([xs] * V, axis=1), np.concatenate([ys] * V, axis=1)
    history, p = _optimise(config, task, p, xs, ys, lrs, epss, optimizer)
    return {
        name: (history[:, i * S : (i + 1) * S], {k: v[i * S : (i + 1) * S] for k, v in p.items()})
        for i, name in enumerate(variants)
    }


# --------------------------------------------------------------------------- cosine attention
def cosine_logits(q, k, gain=1.0) -> np.ndarray:
    """Cosine-similarity logits with a gain: ``gain · q̂·k̂`` with q̂ = q/‖q‖, k̂ = k/‖k‖.

    q : (..., n_q, d), k : (..., n_k, d) with the same leading axes; gain : a positive scalar.
    Returns (..., n_q, n_k), every entry in ``[−gain, gain]``. Zero vectors are rejected
    (their direction is undefined).
    """
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    gain = positive_scalar("gain", gain)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last axis (d); received q {q.shape}, k {k.shape}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must have identical leading axes; received q {q.shape}, k {k.shape}")
    qn, kn = np.linalg.norm(q, axis=-1, keepdims=True), np.linalg.norm(k, axis=-1, keepdims=True)
    if (qn == 0).any() or (kn == 0).any():
        raise ValueError("q and k must not contain zero vectors (cosine similarity is undefined)")
    return gain * np.clip((q / qn) @ np.swapaxes(k / kn, -1, -2), -1.0, 1.0)


def cosine_max_weight(n: int, gain=1.0) -> float:
    """Largest softmax weight any one of ``n`` keys can get when every logit lies in ``[−gain, gain]``.

    ``e^g / (e^g + (n − 1) e^{−g}) = 1 / (1 + (n − 1) e^{−2g})``, attained when the winning
    key points along q and the other ``n − 1`` keys point the opposite way.
    """
    n = positive_int("n", n)
    gain = positive_scalar("gain", gain)
    return float(1.0 / (1.0 + (n - 1) * np.exp(-2.0 * gain)))


def gain_for_max_weight(p: float, n: int) -> float:
    """Smallest gain g with :func:`cosine_max_weight` ``(n, g) = p``: ``g = ½ log(p (n − 1) / (1 − p))``.

    p must lie in ``(1/n, 1)`` (a weight ≤ 1/n needs no gain; weight 1 needs an infinite one).
    """
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2 (one key always gets weight 1), received {n}")
    p = positive_scalar("p", p)
    if not 1.0 / n < p < 1.0:
        raise ValueError(f"p must lie in (1/n, 1) = ({1.0 / n:.4g}, 1), received {p}")
    return float(0.5 * np.log(p * (n - 1) / (1.0 - p)))


def cosine_score(q, k, params):
    """Score function for the harness: ``q̂·k̂`` (no gain; a scale rule supplies the gain).

    q (S, B, H, n_q, d_k), k (S, B, H, n_k, d_k) → (S, B, H, n_q, n_k), written with
    ``autograd.numpy``. Use with ``scale="none"`` for fixed gain 1 or ``scale="learned"``
    for a learned one.
    """
    qh = q / anp.sqrt(anp.sum(q * q, axis=-1, keepdims=True) + 1e-12)
    kh = k / anp.sqrt(anp.sum(k * k, axis=-1, keepdims=True) + 1e-12)
    return qh @ anp.swapaxes(kh, -1, -2)


def register_cosine_score(name: str = "cosine_unit") -> str:
    """Register :func:`cosine_score` under ``name`` (idempotent) and return the name."""
    spec = SCORES.get(name)
    if spec is not None and spec.fn is not cosine_score:
        raise ValueError(f"score {name!r} is already registered with a different function")
    if spec is None:
        register_score(name, cosine_score, rowwise=True)  # q̂·k̂: a query's scores ignore its position
    return name


__all__ = [
    "fold_query_scale",
    "train_per_parameter",
    "train_variants",
    "cosine_logits",
    "cosine_max_weight",
    "gain_for_max_weight",
    "cosine_score",
    "register_cosine_score",
]
