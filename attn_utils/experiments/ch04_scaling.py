"""Chapter 4 — the logit scale ``d_k^(-alpha)``: softmax statistics at initialisation, and tools to read trained models.

Used by the chapter "Why √d_k and not another constant?":

* :func:`scale_exponent_sweep` — for every exponent ``alpha`` and key size ``d_k``, draw random
  queries, keys and values and measure what the softmax sees at initialisation (logit variance,
  normalised entropy, largest probability, size of ``∂o/∂q``), all from the *same* draws;
* :func:`train_scale_rules` — one-layer attention models trained under several scale rules and
  learning rates in *one* vectorised loop (every (rule, lr) member × every seed on the seed axis),
  so a learning-rate sweep costs little more than a single run;
The first layer's queries and keys of a trained model come from
:func:`attn_utils.harness.query_key_vectors`; learning curves are smoothed with
:func:`attn_utils.running_mean`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..attention import attention_query_jacobian
from ..softmax import entropy, softmax
from ..validation import as_float_array, positive_int


@dataclass(frozen=True)
class ScaleSweep:
    """Softmax statistics at initialisation; every array is (n_alphas, n_d): row ``a``, column ``j``
    is exponent ``alphas[a]`` at key size ``d_values[j]``.

    logit_var : variance of one logit ``d^(-alpha) q·k`` (over all draws and keys).
    entropy : mean attention entropy divided by ``log n_keys`` (1 = uniform, 0 = one-hot).
    max_prob : mean of the largest attention weight.
    grad_median : median over draws of ``‖∂o/∂q‖₂`` for a scalar value per key (``d_v = 1``).
    grad_mean : the mean of the same quantity (dominated by rare near-ties when the softmax saturates).
    *_se : the standard error of each statistic over its ``n_draws`` independent queries: the
        sample sd over √n_draws for the means (for ``logit_var``, of the per-query mean squared
        centred logit), and for the median the distribution-free order-statistic estimate
        (quantile(1/2 + 1/√n) − quantile(1/2 − 1/√n))/4, i.e. a ±2 SE band read off the sample.
    """

    alphas: np.ndarray
    d_values: np.ndarray
    n_keys: int
    n_draws: int
    logit_var: np.ndarray
    entropy: np.ndarray
    max_prob: np.ndarray
    grad_median: np.ndarray
    grad_mean: np.ndarray
    logit_var_se: np.ndarray
    entropy_se: np.ndarray
    max_prob_se: np.ndarray
    grad_median_se: np.ndarray
    grad_mean_se: np.ndarray


def _mean_se(x: np.ndarray) -> float:
    """Standard error of the mean of independent draws ``x`` (n,)."""
    return float(x.std(ddof=1) / np.sqrt(x.size))


def _median_se(x: np.ndarray) -> float:
    """Distribution-free standard error of the sample median of ``x`` (n,): the rank of the
    median has sd √n/2, so the quantiles 1/2 ± 1/√n sit about 2 SE on either side of it."""
    lo, hi = np.quantile(x, [0.5 - 1 / np.sqrt(x.size), 0.5 + 1 / np.sqrt(x.size)])
    return float((hi - lo) / 4)


def _one_d_array(name: str, values, *, integer: bool) -> np.ndarray:
    arr = as_float_array(name, values, min_ndim=1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must have shape (m,) with m >= 1, received shape {arr.shape}")
    if integer:
        if np.any(arr < 1) or np.any(arr != np.round(arr)):
            raise ValueError(f"{name} must hold integers >= 1, received {arr.tolist()}")
        return arr.astype(np.int64)
    return arr


def scale_exponent_sweep(
    rng: np.random.Generator,
    d_values,
    alphas,
    *,
    n_keys: int = 16,
    n_draws: int = 1000,
    method: str = "direct",
    rest_dof_shift: int = -1,
) -> ScaleSweep:
    """Measure the softmax at initialisation under the logit scale ``s = d^(-alpha)``.

    The model: ``n_draws`` queries ``q ~ N(0, I_d)``, each with ``n_keys`` keys ``k_j ~ N(0, I_d)``
    and scalar values ``v_j ~ N(0, 1)``, all independent; logits ``z_j = s q·k_j``, weights
    ``p = softmax(z)``, output ``o = Σ_j p_j v_j`` and its gradient ``∂o/∂q`` (a vector of length d).
    For each ``d`` one set of draws is shared by every exponent (common random numbers, so the
    differences between exponents are not sampling noise).

    method : ``"direct"`` forms the d-dimensional vectors and gets ``∂o/∂q`` from
        :func:`attn_utils.attention_query_jacobian`. ``"mixture"`` never forms them; it samples the
        exact representation of the chapter's proposition: ``z = σ g`` with ``g ~ N(0, I_n)`` and
        ``σ² = s² χ²_d``, and ``‖∂o/∂q‖² = s² ((w·g)² + ‖w‖² χ²_{d−1})`` with ``w = J(p) v``
        (``J = diag(p) − p pᵀ``) and an independent ``χ²_{d−1}``. Both give the same distribution,
        so they agree up to sampling error; ``"mixture"`` costs O(n_keys) per draw whatever ``d``.
    rest_dof_shift : ``"mixture"`` only: ``u`` has ``d + rest_dof_shift`` degrees of freedom. The
        proposition's −1 is the default; 0 (``χ²_d``, forgetting that one direction of the keys is
        already in ``w·g``) is the wrong count the chapter's check rules out.

    Parameters
    ----------
    rng : np.random.Generator
    d_values : (n_d,) key sizes, integers >= 1
    alphas : (n_alphas,) exponents (real numbers; 0 = unscaled, 0.5 = the Transformer, 1 = muP)
    n_keys : keys per query (>= 2)
    n_draws : queries per key size (>= 2)

    Returns
    -------
    ScaleSweep with (n_alphas, n_d) arrays.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    d_values = _one_d_array("d_values", d_values, integer=True)
    alphas = _one_d_array("alphas", alphas, integer=False)
    n_keys = positive_int("n_keys", n_keys)
    n_draws = positive_int("n_draws", n_draws)
    if n_keys < 2:
        raise ValueError(f"n_keys must be >= 2 (one key gives p = 1 always), received {n_keys}")
    if n_draws < 2:
        raise ValueError(f"n_draws must be >= 2, received {n_draws}")
    if method not in ("direct", "mixture"):
        raise ValueError(f"method must be 'direct' or 'mixture', received {method!r}")
    if rest_dof_shift not in (-1, 0):
        raise ValueError(
            f"rest_dof_shift must be -1 (the proposition) or 0 (the wrong count), received {rest_dof_shift!r}"
        )
    if rest_dof_shift != -1 and method != "mixture":
        raise ValueError("rest_dof_shift applies to method='mixture' only")
    shape = (alphas.size, d_values.size)
    names = ("logit_var", "entropy", "max_prob", "grad_median", "grad_mean")
    out = {name: np.empty(shape) for name in names + tuple(f"{name}_se" for name in names)}
    for j, d in enumerate(d_values):
        d = int(d)
        if method == "direct":
            q = rng.standard_normal((n_draws, d))
            k = rng.standard_normal((n_draws, n_keys, d))
            v = rng.standard_normal((n_draws, n_keys, 1))
            raw = np.einsum("nkd,nd->nk", k, q)  # (n_draws, n_keys) unscaled q·k_j
        else:
            g = rng.standard_normal((n_draws, n_keys))
            v = rng.standard_normal((n_draws, n_keys))
            norm_q = np.sqrt(rng.chisquare(d, n_draws))  # ‖q‖ for q ~ N(0, I_d)
            rest = d + rest_dof_shift
            chi_rest = rng.chisquare(rest, n_draws) if rest > 0 else np.zeros(n_draws)
            raw = norm_q[:, None] * g  # q·k_j given q is N(0, ‖q‖²), iid over j
        for a, alpha in enumerate(alphas):
            s = float(d) ** -float(alpha)
            z = s * raw
            p = softmax(z)
            ent = entropy(p) / np.log(n_keys)
            top = p.max(axis=-1)
            out["logit_var"][a, j] = np.var(z)
            out["logit_var_se"][a, j] = _mean_se(np.mean((z - z.mean()) ** 2, axis=-1))  # queries are independent
            out["entropy"][a, j], out["entropy_se"][a, j] = np.mean(ent), _mean_se(ent)
            out["max_prob"][a, j], out["max_prob_se"][a, j] = np.mean(top), _mean_se(top)
            if method == "direct":
                grad = np.linalg.norm(attention_query_jacobian(q, k, v, scale=s)[:, 0, :], axis=-1)
            else:
                w = p * (v - np.sum(p * v, axis=-1, keepdims=True))  # J v without forming J
                grad = s * np.sqrt(np.sum(w * g, axis=-1) ** 2 + np.sum(w * w, axis=-1) * chi_rest)
            out["grad_median"][a, j], out["grad_median_se"][a, j] = np.median(grad), _median_se(grad)
            out["grad_mean"][a, j], out["grad_mean_se"][a, j] = np.mean(grad), _mean_se(grad)
    return ScaleSweep(alphas, d_values, n_keys, n_draws, **out)


@dataclass
class ScaleRuleRuns:
    """What :func:`train_scale_rules` returns; member ``m`` is ``members[m] = (rule, lr)``,
    trained on the first ``n_seeds[m]`` of ``seeds``; the entries of seeds it was not trained on
    are NaN (:meth:`per_seed` returns only the trained ones).

    loss : (steps, M, S) training loss per step, member and seed (before that step's update).
    accuracy, eval_loss : (M, S) on the held-out batch ``eval_batch`` (the same for every member).
    scale : (M, S) the logit multiplier c at the end (constant for fixed rules).
    params : final parameters, each (M·S, …), member-major; :meth:`params_of` slices one member.
    config : the shared :class:`attn_utils.ModelConfig` (``scale="learned"``: the multiplier lives
        in ``L0.log_scale``, frozen for the fixed rules).
    eval_batch : the held-out :class:`attn_utils.TaskBatch` (x is (S, eval_size, n)), drawn from
        ``default_rng([seed, 2])`` as :func:`attn_utils.train` draws it.
    """

    members: tuple
    seeds: tuple
    n_seeds: tuple
    loss: np.ndarray
    accuracy: np.ndarray
    eval_loss: np.ndarray
    scale: np.ndarray
    params: dict
    config: object
    task: object
    eval_batch: object

    def index(self, rule: str, lr: float) -> int:
        """Position of member ``(rule, lr)`` in :attr:`members`."""
        for m, (r, l) in enumerate(self.members):
            if r == rule and np.isclose(l, lr, rtol=1e-12, atol=0.0):
                return m
        raise KeyError(f"no member ({rule!r}, {lr!r}); members are {self.members}")

    def per_seed(self, field: str, m: int) -> np.ndarray:
        """``field`` ("accuracy", "eval_loss", "scale" or "loss") of member ``m`` on the seeds it was
        trained on: (n_seeds[m],), or (steps, n_seeds[m]) for the loss."""
        values = getattr(self, field)
        return values[:, m, : self.n_seeds[m]] if field == "loss" else values[m, : self.n_seeds[m]]

    def params_of(self, m: int) -> dict:
        """Parameters of member ``m`` on the seeds it was trained on, each (n_seeds[m], …), for
        :func:`query_key_vectors` with :attr:`config`."""
        S = len(self.seeds)
        return {k: v[m * S : m * S + self.n_seeds[m]] for k, v in self.params.items()}


def train_scale_rules(
    task,
    members: Sequence[tuple],
    seeds: Sequence[int] = range(8),
    *,
    d_model: int = 32,
    d_k: int,
    steps: int = 300,
    batch_size: int = 32,
    eval_size: int = 512,
    learned_scale_init: float = 1.0,
    dtype: str = "float64",
) -> ScaleRuleRuns:
    """Train one-layer, one-head attention models (:func:`attn_utils.train`'s model and Adam) for
    several (scale rule, learning rate) members at once.

    Each member is the run ``attn_utils.train(ModelConfig(d_model, d_k=d_k, scale=rule), task,
    seeds, steps, lr, batch_size=batch_size)`` — same initial weights and batches per seed — with
    the logit multiplier written as ``exp(L0.log_scale)``: frozen at the rule's constant for
    ``"none" | "quarter" | "sqrt" | "linear"``, learned from ``learned_scale_init`` for ``"learned"``.
    All M·S models share one forward/backward pass per step (the seed axis of the harness is
    member-major), which removes the per-call overhead of M separate :func:`attn_utils.train`
    calls; Adam gets a per-member learning rate. Results agree with the separate calls up to
    rounding (``tests/experiments/test_scaling.py``), which training then amplifies as it does between
    machines, so only statistics over seeds are comparable.

    members : sequence of (rule, lr) pairs, rule in ``attn_utils.SCALE_RULES``, lr > 0, or
        (rule, lr, n) triples: that member is trained on the first ``n`` seeds only (a claim that
        needs more seeds pools them where it needs them, and only there; the first ``n`` seeds
        are the same models as in a member trained on all of them).
    Returns a :class:`ScaleRuleRuns`.
    """
    from ..book.measuring import single_thread_blas
    from ..harness.tasks import TaskBatch
    from ..harness.training import (  # local import: training imports nothing from here
        SCALE_RULES,
        ModelConfig,
        adam,
        evaluate,
        init_params,
        loss_and_grad,
        optimise,
        seed_batches,
        seed_tuple,
        step_batches,
    )
    from ..validation import positive_scalar

    seeds = seed_tuple(seeds)
    steps, batch_size, eval_size = (
        positive_int(n, v) for n, v in (("steps", steps), ("batch_size", batch_size), ("eval_size", eval_size))
    )
    members = tuple(members)
    if not members:
        raise ValueError("members must hold at least one (rule, lr) pair")
    checked, counts = [], []
    for member in members:
        if not (isinstance(member, (tuple, list)) and len(member) in (2, 3)):
            raise TypeError(
                f"each member must be a (rule, lr) pair or a (rule, lr, n_seeds) triple, received {member!r}"
            )
        rule, lr = member[:2]
        if rule not in SCALE_RULES:
            raise ValueError(f"rule must be one of {SCALE_RULES}, received {rule!r}")
        n = positive_int("n_seeds", member[2]) if len(member) == 3 else len(seeds)
        if n > len(seeds):
            raise ValueError(f"n_seeds must be <= len(seeds) = {len(seeds)}, received {n} for member {member!r}")
        checked.append((rule, positive_scalar("lr", lr)))
        counts.append(n)
    members = tuple(checked)
    if len(set(members)) != len(members):
        raise ValueError(f"members must be distinct, received {members}")
    learned_scale_init = positive_scalar("learned_scale_init", learned_scale_init)
    config = ModelConfig(d_model=d_model, d_k=d_k, scale="learned", learned_scale_init=learned_scale_init, dtype=dtype)
    M, S = len(members), len(seeds)
    rows = np.concatenate([m * S + np.arange(n) for m, n in enumerate(counts)])  # trained (member, seed) slots
    fixed = {
        rule: ModelConfig(d_model=d_model, d_k=d_k, scale=rule).fixed_scale()
        for rule in SCALE_RULES
        if rule != "learned"
    }
    log_c = np.array([np.log(learned_scale_init if rule == "learned" else fixed[rule]) for rule, _ in members])
    learns = np.repeat([rule == "learned" for rule, _ in members], counts)  # (R,) R = Σ n_seeds
    base = init_params(config, task, seeds)  # (S, …) per entry
    params = {k: np.concatenate([v[:n] for n in counts]) for k, v in base.items()}  # member-major (R, …)
    params["L0.log_scale"] = np.repeat(log_c, counts)[:, None].astype(dtype)  # (R, 1 head)
    lr = np.repeat([lr for _, lr in members], counts).astype(dtype)  # (R,)

    xs, ys = step_batches(task, seeds, steps, batch_size)  # (steps, S, B, …)
    # the harness's Adam, with one learning rate per member (broadcast over each parameter)
    step = adam(params, {k: lr.reshape((-1,) + (1,) * (v.ndim - 1)) for k, v in params.items()})
    frozen = ~learns[:, None]

    def freeze(t, grads):
        grads["L0.log_scale"][frozen] = 0.0  # fixed rules: frozen (Adam's step is then exactly 0)

    xs_all = np.concatenate([xs[:, :n] for n in counts], axis=1)  # (steps, R, B, …)
    ys_all = np.concatenate([ys[:, :n] for n in counts], axis=1)
    # seeds and members do not interact: one gradient call for all of them
    losses, params = optimise(loss_and_grad(config, task), params, xs_all, ys_all, step, grad_hook=freeze)
    with single_thread_blas():
        held_out = seed_batches(task, seeds, 2, eval_size)
        tiled = TaskBatch(
            np.concatenate([held_out.x[:n] for n in counts]),
            np.concatenate([held_out.y[:n] for n in counts]),
            {k: np.concatenate([v[:n] for n in counts]) for k, v in held_out.info.items()},
        )
        ev = evaluate(params, config, task, tiled)

    def padded(values, lead=()):
        """(…, R, …) trained slots → (…, M·S, …) with NaN where a member was not trained."""
        out = np.full(lead + (M * S,) + values.shape[len(lead) + 1 :], np.nan, dtype=values.dtype)
        out[(slice(None),) * len(lead) + (rows,)] = values
        return out

    return ScaleRuleRuns(
        members,
        seeds,
        tuple(counts),
        padded(losses, (steps,)).reshape(steps, M, S),
        padded(ev["accuracy"]).reshape(M, S),
        padded(ev["loss"]).reshape(M, S),
        padded(np.exp(params["L0.log_scale"][:, 0])).reshape(M, S),
        {k: padded(v) for k, v in params.items()},
        config,
        task,
        held_out,
    )


__all__ = [
    "ScaleSweep",
    "scale_exponent_sweep",
    "ScaleRuleRuns",
    "train_scale_rules",
]
