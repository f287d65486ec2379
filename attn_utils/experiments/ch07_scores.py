"""Chapter 7 — score functions: the ways a query and a key become an attention weight.

Eight scores, each written **once** (a ``_core`` function over an operation counter) and used
two ways:

* by the training harness: :func:`register_scores` adds every score to
  :data:`attn_utils.harness.training.SCORES` (``"dot"`` is the harness's own), after which
  ``ModelConfig(score=name, scale="none")`` trains a model with it (importing registers nothing);
* as a plain numpy function, :func:`score` (with :func:`score_weights` for the weights), whose
  ``counter`` argument tallies the arithmetic it actually performs into a :class:`ScoreCost`;
  :func:`score_cost` is the closed form of that count. Every matrix product also reports its
  multiply-adds to :func:`attn_utils.count_macs` (``with au.count_macs() as c: score(...)``).

=============== ==================================================== ============= ==================
name            raw score ``s(q, k)`` for ``q, k ∈ R^d``             weights       own parameters
=============== ==================================================== ============= ==================
``dot``         ``q·k``                                              softmax       —
``scaled_dot``  ``q·k / √d``                                         softmax       —
``bilinear``    ``qᵀ W k / √d``                                      softmax       ``W (d, d)``
``additive``    ``vᵀ tanh(q + k)``                                   softmax       ``v (d,)``
``cosine``      ``g · q·k / (‖q‖ ‖k‖)``, ``g = exp(log_gain)``        softmax       ``log_gain ()``
``distance``    ``−‖q − k‖² / (2√d)``                                softmax       —
``linear_elu``  ``φ(q)·φ(k)``, ``φ(x) = elu(x) + 1``                 normalize     —
``sigmoid``     ``q·k / √d − log n_k``                               sigmoid       —
=============== ==================================================== ============= ==================

``q`` and ``k`` are the per-head projections ``x W_Q`` and ``x W_K`` of the model, which every
score shares; in Bahdanau's additive score ``vᵀ tanh(W q + U k)`` the matrices ``W`` and ``U``
are these projections, so the additive score's own parameter is ``v`` alone (hidden size
``d_a = d``). The built-in constants (``1/√d``, ``1/(2√d)``, the gain initialised at ``√d``,
``v`` and ``W`` drawn with variance ``1/d``) give every score except ``dot`` logits of
``d``-independent size at initialisation; train them with ``scale="none"``.

Counting convention (:class:`ScoreCost`): ``macs`` = multiply-adds inside matrix products
(2 FLOPs each); ``elementwise`` = every other arithmetic operation, one per output element
(``+ − × ÷``, min, select; a sum of ``m`` terms costs ``m − 1``); ``transcendental`` = evaluations
of exp, tanh, sqrt, counted apart because their price varies by machine; ``peak`` = elements of
the largest array created. ``flops = 2·macs + elementwise``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import autograd.numpy as anp
import numpy as np
from autograd.extend import defvjp, primitive

from ..book.measuring import record_macs
from ..harness.training import SCORES, register_score
from ..softmax import softmax
from ..validation import as_float_array, check_same_leading, positive_int

SCORE_NAMES: tuple[str, ...] = (
    "dot",
    "scaled_dot",
    "bilinear",
    "additive",
    "cosine",
    "distance",
    "linear_elu",
    "sigmoid",
)
"""The chapter's scores, in the order its tables and figures use."""


# --------------------------------------------------------------------------- counting
@dataclass
class ScoreCost:
    """Operation counts of one score evaluation (see the module docstring for the convention)."""

    macs: int = 0
    elementwise: int = 0
    transcendental: int = 0
    peak: int = 0

    @property
    def flops(self) -> int:
        """``2·macs + elementwise`` (transcendental evaluations are reported separately)."""
        return 2 * self.macs + self.elementwise

    def as_tuple(self) -> tuple[int, int, int, int]:
        """``(macs, elementwise, transcendental, peak)``, for exact comparisons."""
        return (self.macs, self.elementwise, self.transcendental, self.peak)


class _Ops:
    """Array operations that add their cost to a :class:`ScoreCost` (or to nothing, with ``None``).

    With ``cost=None`` the methods are plain ``autograd.numpy`` calls, so the same score code
    runs inside the training harness and is differentiated there.
    """

    def __init__(self, cost: ScoreCost | None = None):
        self.cost = cost

    def _tally(self, out, field: str, count: int):
        if self.cost is not None:
            setattr(self.cost, field, getattr(self.cost, field) + int(count))
            self.cost.peak = max(self.cost.peak, int(np.size(out)))
        return out

    def matmul(self, a, b):
        out = anp.matmul(a, b)
        macs = np.size(out) * a.shape[-1]
        record_macs(macs)  # what ``with au.count_macs() as c:`` sees: the products actually executed
        return self._tally(out, "macs", macs if self.cost is not None else 0)

    def _ew(self, out):
        return self._tally(out, "elementwise", np.size(out) if self.cost is not None else 0)

    def add(self, a, b):
        return self._ew(a + b)

    def sub(self, a, b):
        return self._ew(a - b)

    def mul(self, a, b):
        return self._ew(a * b)

    def div(self, a, b):
        return self._ew(a / b)

    def elu_plus_one(self, x):
        """``φ(x) = elu(x) + 1``: ``x + 1`` where ``x > 0``, else ``exp(min(x, 0))``, counted as the
        operations that formula performs per element: min, add and select (3 elementwise), one exp."""
        out = _elu_plus_one_prim(x)
        if self.cost is not None:
            self._tally(out, "elementwise", 3 * np.size(out))
            self._tally(out, "transcendental", np.size(out))
        return out

    def matmul_weight(self, x, w):
        """``x (..., n, d) @ w`` for a weight matrix ``w``: ``(d, e)``, or from the harness ``(S, H, d, e)`` with
        ``x (S, B, H, n, d)``. The harness case folds the batch axis into the rows, so the gradient with
        respect to ``w`` is one matrix product per seed and head (not ``B`` products of ``(d, e)`` summed).
        Counted like :meth:`matmul`: ``size(out) · d`` multiply-adds."""
        if w.ndim == 2:
            return self.matmul(x, w)
        S, B, H, n, d = x.shape
        rows = anp.reshape(anp.transpose(x, (0, 2, 1, 3, 4)), (S, H, B * n, d))
        out = self.matmul(rows, w)
        return anp.transpose(anp.reshape(out, (S, H, B, n, w.shape[-1])), (0, 2, 1, 3, 4))

    def unit(self, x):
        """``x / √(‖x‖² + ε)`` along the last axis (one primitive, with its gradient in closed form), counted
        as the operations that formula performs: ``x·x``, the row sum, ``+ ε``, one sqrt per row, the division."""
        out = _unit_prim(x)
        if self.cost is not None:
            rows = np.size(x) // x.shape[-1]
            self._tally(out, "elementwise", 3 * np.size(x))  # x·x (n·d), row sums (n·d − n), + ε (n), ÷ (n·d)
            self._tally(out, "transcendental", rows)
        return out

    def rowsum(self, x):
        out = anp.sum(x, axis=-1, keepdims=True)
        return self._tally(out, "elementwise", (np.size(x) - np.size(out)) if self.cost is not None else 0)

    def _tr(self, out):
        return self._tally(out, "transcendental", np.size(out) if self.cost is not None else 0)

    def exp(self, x):
        return self._tr(anp.exp(x))

    def tanh(self, x):
        return self._tr(_tanh(x))

    def sqrt(self, x):
        return self._tr(anp.sqrt(x))


@primitive
def _tanh(x):
    """``tanh`` whose gradient reuses the output, ``1 − tanh²``: autograd's own rule evaluates
    ``1/cosh²(x)``, a second transcendental pass over the additive score's (…, n_q, n_k, d) array."""
    return np.tanh(x)


defvjp(_tanh, lambda ans, x: lambda g: g * (1 - ans * ans))


@primitive
def _elu_plus_one_prim(x):
    """``elu(x) + 1`` elementwise. Its derivative is ``min(φ(x), 1)`` (1 where ``x > 0``, ``eˣ = φ(x)``
    elsewhere), so the gradient is one pass instead of autograd's rules for where, minimum and exp."""
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


defvjp(_elu_plus_one_prim, lambda ans, x: lambda g: g * np.minimum(ans, 1))


_EPS = 1e-12  # keeps the norm of a zero vector finite in cosine scores


@primitive
def _unit_prim(x):
    """``x / r`` with ``r = √(‖x‖² + ε)`` along the last axis. Its vector–Jacobian product is
    ``(g − u (u·g)) / r`` with ``u = x / r``: one pass, instead of autograd's rules for the five operations."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + _EPS)


defvjp(
    _unit_prim,
    lambda ans, x: (
        lambda g: (
            (g - ans * np.sum(g * ans, axis=-1, keepdims=True)) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + _EPS)
        )
    ),
)


def _t(x):
    return anp.swapaxes(x, -1, -2)


# --------------------------------------------------------------------------- the scores, written once
# q (..., n_q, d), k (..., n_k, d); prm holds the score's parameters already shaped to broadcast.
def _dot_core(ops, q, k, prm):
    return ops.matmul(q, _t(k))


def _scaled_dot_core(ops, q, k, prm):
    return ops.matmul(ops.mul(q, q.shape[-1] ** -0.5), _t(k))  # scale the n_q·d query numbers, not the n_q·n_k scores


def _bilinear_core(ops, q, k, prm):
    qw = ops.mul(ops.matmul_weight(q, prm["W"]), q.shape[-1] ** -0.5)
    return ops.matmul(qw, _t(k))


def _additive_core(ops, q, k, prm):
    # expand_dims, not q[..., :, None, :]: autograd differentiates indexing with np.add.at, which is slow
    hidden = ops.tanh(
        ops.add(anp.expand_dims(q, -2), anp.expand_dims(k, -3))
    )  # (..., n_q, n_k, d): a tanh unit per pair
    return ops.matmul(hidden, prm["v_col"])[..., 0]


def _cosine_core(ops, q, k, prm):
    return ops.matmul(ops.mul(ops.unit(q), prm["gain"]), _t(ops.unit(k)))


def _distance_core(ops, q, k, prm):
    c = 0.5 * q.shape[-1] ** -0.5
    qq = ops.rowsum(ops.mul(q, q))  # (..., n_q, 1)
    kk = ops.rowsum(ops.mul(k, k))  # (..., n_k, 1)
    cross = ops.matmul(ops.mul(q, 2 * c), _t(k))  # 2c · q·k
    return ops.sub(ops.sub(cross, ops.mul(qq, c)), _t(ops.mul(kk, c)))


def _elu_plus_one(ops, x):
    return ops.elu_plus_one(x)


def _linear_elu_core(ops, q, k, prm):
    return ops.matmul(_elu_plus_one(ops, q), _t(_elu_plus_one(ops, k)))


def _sigmoid_core(ops, q, k, prm):
    return ops.sub(_scaled_dot_core(ops, q, k, prm), math.log(k.shape[-2]))


_CORES = {
    "dot": _dot_core,
    "scaled_dot": _scaled_dot_core,
    "bilinear": _bilinear_core,
    "additive": _additive_core,
    "cosine": _cosine_core,
    "distance": _distance_core,
    "linear_elu": _linear_elu_core,
    "sigmoid": _sigmoid_core,
}


# --------------------------------------------------------------------------- parameters (one source)
def _bilinear_init(rng, n_heads, d_k, d_model):
    return {"W": rng.normal(0.0, d_k**-0.5, (n_heads, d_k, d_k))}


def _additive_init(rng, n_heads, d_k, d_model):
    return {"v": rng.normal(0.0, d_k**-0.5, (n_heads, d_k))}


def _cosine_init(rng, n_heads, d_k, d_model):
    return {"log_gain": np.full(n_heads, 0.5 * math.log(d_k))}  # gain √d_k: unit-variance logits at init


_INITS = {"bilinear": _bilinear_init, "additive": _additive_init, "cosine": _cosine_init}
_WEIGHTS = {"linear_elu": "normalize", "sigmoid": "sigmoid"}


def _param_shapes(name: str, d: int) -> dict[str, tuple[int, ...]]:
    return {"bilinear": {"W": (d, d)}, "additive": {"v": (d,)}, "cosine": {"log_gain": ()}}.get(name, {})


# --------------------------------------------------------------------------- harness adapters
def _harness_fn(name: str):
    core = _CORES[name]
    ops = _Ops(None)

    # harness parameters are (S, H, …); q, k are (S, B, H, n, d_k)
    if name == "bilinear":

        def fn(q, k, params):
            return core(ops, q, k, {"W": params["W"]})  # (S, H, d, d): see _Ops.matmul_weight
    elif name == "additive":

        def fn(q, k, params):
            return core(ops, q, k, {"v_col": params["v"][:, None, :, None, :, None]})
    elif name == "cosine":

        def fn(q, k, params):
            return core(ops, q, k, {"gain": anp.exp(params["log_gain"])[:, None, :, None, None]})
    else:

        def fn(q, k, params):
            return core(ops, q, k, {})

    fn.__name__ = f"{name}_score"
    fn.__doc__ = (
        f"Harness score {name!r}: q (S, B, H, n_q, d_k), k (S, B, H, n_k, d_k) → (S, B, H, n_q, n_k); "
        f"see attn_utils.experiments.ch07_scores."
    )
    fn._attn_utils_scores = name  # marks our registration, so a module reload may replace it
    return fn


def register_scores() -> tuple[str, ...]:
    """Register the score functions of this chapter with the training harness and return their names.

    Called explicitly (importing this module changes nothing); calling it again is harmless.
    """
    for name in SCORE_NAMES[1:]:  # "dot" is the harness's own
        old = SCORES.get(name)
        if old is not None and getattr(old.fn, "_attn_utils_scores", None) != name:
            raise ValueError(f"score {name!r} is already registered by another module")
        register_score(  # every score of this chapter is a function of (q_i, k_j) alone: rowwise
            name,
            _harness_fn(name),
            _INITS.get(name),
            weights=_WEIGHTS.get(name, "softmax"),
            overwrite=old is not None,
            rowwise=True,
        )
    return SCORE_NAMES[1:]


# --------------------------------------------------------------------------- numpy interface
def _check_name(name) -> str:
    if name not in SCORE_NAMES:
        raise ValueError(f"name must be one of {SCORE_NAMES}, received {name!r}")
    return name


def init_score_params(name: str, rng: np.random.Generator, d: int) -> dict[str, np.ndarray]:
    """One head's own parameters of score ``name`` for vectors of size ``d``, drawn by the same
    initialiser the training harness uses (``{}`` for a score without parameters).

    Shapes: bilinear ``{"W": (d, d)}``, additive ``{"v": (d,)}``, cosine ``{"log_gain": ()}``.
    """
    _check_name(name)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    d = positive_int("d", d)
    init = _INITS.get(name)
    return {} if init is None else {key: np.asarray(val[0], dtype=float) for key, val in init(rng, 1, d, d).items()}


def _numpy_params(name: str, params, d: int, dtype) -> dict:
    """Validated parameters, shaped to broadcast and cast to the dtype of q (so float32 stays float32)."""
    want = _param_shapes(name, d)
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (from init_score_params), received {type(params).__name__}")
    if set(params) != set(want):
        raise ValueError(
            f"score {name!r} with d={d} needs params with keys {sorted(want)}, received keys {sorted(params)}"
        )
    arrays = {}
    for key, shape in want.items():
        arr = as_float_array(f"params[{key!r}]", params[key], min_ndim=0)
        if arr.shape != shape:
            raise ValueError(f"params[{key!r}] must have shape {shape} for d={d}, received shape {arr.shape}")
        arrays[key] = arr.astype(dtype, copy=False)
    if name == "bilinear":
        return {"W": arrays["W"]}
    if name == "additive":
        return {"v_col": arrays["v"][:, None]}
    if name == "cosine":
        return {"gain": float(np.exp(arrays["log_gain"]))}
    return {}


def _check_qk(q, k) -> tuple[np.ndarray, np.ndarray]:
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k axis -1 (d) must have size {q.shape[-1]} like q, received q {q.shape}, k {k.shape}")
    check_same_leading(("q", "k"), (q, k), 2)
    return q, k


def score(name: str, q, k, params: dict | None = None, *, counter: ScoreCost | None = None) -> np.ndarray:
    """Raw scores of ``name`` (one of :data:`SCORE_NAMES`) for every query–key pair.

    q : (..., n_q, d), k : (..., n_k, d) with identical leading axes → (..., n_q, n_k).
    params : one head's parameters from :func:`init_score_params` (``None`` for scores without).
    counter : a :class:`ScoreCost` that the operations performed are added to.
    Computes in the common dtype of q and k (float32 inputs stay float32; the parameters are cast).
    The same code as the harness's registered score, so the two agree to rounding.
    """
    _check_name(name)
    q, k = _check_qk(q, k)
    if counter is not None and not isinstance(counter, ScoreCost):
        raise TypeError(f"counter must be a ScoreCost or None, received {type(counter).__name__}")
    dtype = np.result_type(q.dtype, k.dtype)
    q, k = q.astype(dtype, copy=False), k.astype(dtype, copy=False)
    prm = _numpy_params(name, params, q.shape[-1], dtype)
    return np.asarray(_CORES[name](_Ops(counter), q, k, prm))


def weight_rule(name: str) -> str:
    """How the raw scores of ``name`` become weights: ``"softmax"``, ``"sigmoid"`` or ``"normalize"``."""
    return _WEIGHTS.get(_check_name(name), "softmax")


def score_weights(name: str, q, k, params: dict | None = None) -> np.ndarray:
    """Attention weights (..., n_q, n_k) of score ``name``: its raw :func:`score` through its weight rule.

    softmax rows sum to 1; ``"normalize"`` (linear attention) divides the non-negative scores by their
    row sum; ``"sigmoid"`` is elementwise, so rows do *not* sum to 1.
    """
    s = score(name, q, k, params)
    rule = weight_rule(name)
    if rule == "softmax":
        return softmax(s)
    if rule == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * s))  # σ(s) without overflow of exp(−s)
    return s / s.sum(axis=-1, keepdims=True)


def score_cost(name: str, n_q: int, n_k: int, d: int, batch: int = 1) -> ScoreCost:
    """Closed form of what :func:`score` counts for ``batch`` independent (n_q, d) × (n_k, d) problems.

    Per problem, with ``P = n_q·n_k`` pairs and ``N = n_q + n_k`` vectors:

    ============  =============  ==========================  ==============  ==================
    name          macs           elementwise                 transcendental  peak
    ============  =============  ==========================  ==============  ==================
    dot           P·d            0                           0               P
    scaled_dot    P·d            n_q·d                       0               max(n_q·d, P)
    bilinear      P·d + n_q·d²   n_q·d                       0               max(n_q·d, P)
    additive      P·d            P·d                         P·d             P·d
    cosine        P·d            3·N·d + n_q·d               N               max(n_q·d, n_k·d, P)
    distance      P·d            2·N·d + n_q·d + 2·P         0               max(n_q·d, n_k·d, P)
    linear_elu    P·d            3·N·d                       N·d             max(n_q·d, n_k·d, P)
    sigmoid       P·d            n_q·d + P                   0               max(n_q·d, P)
    ============  =============  ==========================  ==============  ==================

    Every count is multiplied by ``batch`` (the arrays hold all problems at once, so ``peak`` too).
    """
    _check_name(name)
    n_q, n_k, d, batch = (positive_int(a, v) for a, v in (("n_q", n_q), ("n_k", n_k), ("d", d), ("batch", batch)))
    P, N = n_q * n_k, n_q + n_k
    vectors = max(n_q * d, n_k * d, P)
    table = {
        "dot": (P * d, 0, 0, P),
        "scaled_dot": (P * d, n_q * d, 0, max(n_q * d, P)),
        "bilinear": (P * d + n_q * d * d, n_q * d, 0, max(n_q * d, P)),
        "additive": (P * d, P * d, P * d, P * d),
        "cosine": (P * d, 3 * N * d + n_q * d, N, vectors),
        "distance": (P * d, 2 * N * d + n_q * d + 2 * P, 0, vectors),
        "linear_elu": (P * d, 3 * N * d, N * d, vectors),
        "sigmoid": (P * d, n_q * d + P, 0, max(n_q * d, P)),
    }
    return ScoreCost(*(batch * x for x in table[name]))


def score_param_count(name: str, d: int) -> int:
    """Number of parameters a score adds per head on top of W_Q and W_K: the sizes of the arrays
    :func:`init_score_params` returns (counted from their shapes, without drawing them)."""
    d = positive_int("d", d)
    return int(sum(math.prod(shape) for shape in _param_shapes(_check_name(name), d).values()))


# --------------------------------------------------------------------------- logits at initialisation
def sample_init_logits(name: str, rng: np.random.Generator, d: int, n_heads: int, n_keys: int) -> np.ndarray:
    """Raw logits at initialisation: ``n_heads`` independent heads, each with its own freshly drawn
    score parameters, one query and ``n_keys`` keys with iid standard normal components.

    Returns (n_heads, n_keys). Runs the function the harness trains with (heads on the H axis),
    so it measures exactly what a model starts from when its q and k have unit-variance components.
    """
    _check_name(name)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    d, n_heads, n_keys = positive_int("d", d), positive_int("n_heads", n_heads), positive_int("n_keys", n_keys)
    init = _INITS.get(_check_name(name))
    params = {} if init is None else {key: val[None] for key, val in init(rng, n_heads, d, d).items()}
    q = rng.standard_normal((1, 1, n_heads, 1, d))
    k = rng.standard_normal((1, 1, n_heads, n_keys, d))
    return np.asarray(_harness_fn(name)(q, k, params))[0, 0, :, 0, :]


# --------------------------------------------------------------------------- linear attention
def linear_attention(q, k, v, *, order: str = "linear", counter: ScoreCost | None = None) -> np.ndarray:
    """Kernel (linear) attention output ``Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)``, φ = elu + 1.

    q : (..., n_q, d), k : (..., n_k, d), v : (..., n_k, d_v) → (..., n_q, d_v).
    order : ``"quadratic"`` forms the (n_q, n_k) weight matrix, then multiplies by v;
    ``"linear"`` first contracts keys with values, ``φ(K)ᵀ V`` (d, d_v) and ``φ(K)ᵀ 1`` (d,),
    so no (n_q, n_k) array exists. Same result (associativity); ``counter`` shows the cost of each.
    """
    q, k = _check_qk(q, k)
    v = as_float_array("v", v, min_ndim=2)
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v axis -2 (n_k) must have size {k.shape[-2]} like k, received v {v.shape}, k {k.shape}")
    check_same_leading(("k", "v"), (k, v), 2)
    if order not in ("linear", "quadratic"):
        raise ValueError(f"order must be 'linear' or 'quadratic', received {order!r}")
    ops = _Ops(counter)
    fq, fk = _elu_plus_one(ops, q), _elu_plus_one(ops, k)
    if order == "quadratic":
        a = ops.matmul(fq, _t(fk))
        return np.asarray(ops.div(ops.matmul(a, v), ops.rowsum(a)))
    kv = ops.matmul(_t(fk), v)  # (..., d, d_v)
    ksum = _t(ops.rowsum(_t(fk)))  # (..., 1, d)
    return np.asarray(ops.div(ops.matmul(fq, kv), ops.rowsum(ops.mul(fq, ksum))))


# --------------------------------------------------------------------------- learning rates
LR_GRID: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 3e-2)
"""The Adam learning rates :func:`select_learning_rates` tries for every score and head size."""

LR_SELECTION_SEEDS: tuple[int, ...] = tuple(range(100, 108))
"""Seeds on which the learning rates are chosen; the chapter evaluates on other seeds (a seed fixes
the initial weights, the training batches and the held-out batch, so different seeds share no data)."""

SELECTION_ACCURACY: dict[tuple[str, int], tuple[float, ...]] = {
    ("dot", 2): (0.208, 0.402, 0.786, 0.752),
    ("additive", 2): (0.189, 0.339, 0.535, 0.517),
    ("dot", 8): (0.219, 0.44, 0.738, 0.329),
    ("additive", 8): (0.213, 0.399, 0.854, 0.81),
    ("dot", 32): (0.215, 0.387, 0.386, 0.207),
    ("additive", 32): (0.21, 0.427, 0.957, 0.936),
    ("dot", 64): (0.203, 0.294, 0.243, 0.174),
    ("additive", 64): (0.236, 0.496, 0.982, 0.948),
    ("scaled_dot", 8): (0.228, 0.495, 0.947, 0.941),
    ("scaled_dot", 64): (0.245, 0.57, 0.89, 0.518),
    ("bilinear", 64): (0.289, 0.617, 0.638, 0.204),
    ("cosine", 64): (0.244, 0.603, 0.918, 0.969),
    ("distance", 64): (0.223, 0.55, 0.894, 0.598),
    ("linear_elu", 64): (0.215, 0.367, 0.854, 0.972),
    ("sigmoid", 64): (0.254, 0.525, 0.76, 0.168),
}
"""Mean held-out accuracy over :data:`LR_SELECTION_SEEDS` at each rate of :data:`LR_GRID` (in that
order), recorded from ``select_learning_rates(recall_task(4, 8, 8), list(SELECTION_ACCURACY))`` with
its defaults (120 steps of 32 examples, float32); the chapter trains each ``(score, d_k)`` at the
rate :func:`selected_learning_rates` picks from it, so no rate is chosen on the seeds it reports."""


def select_learning_rates(
    task,
    configs,
    *,
    grid=LR_GRID,
    seeds=LR_SELECTION_SEEDS,
    steps: int = 120,
    batch_size: int = 32,
    eval_size: int = 256,
    d_model: int = 32,
    dtype: str = "float32",
) -> dict[tuple[str, int], tuple[float, ...]]:
    """Train every ``(score, d_k)`` of ``configs`` on ``seeds`` at every rate of ``grid`` (Adam, one head,
    ``scale="none"``) and return ``{(score, d_k): mean held-out accuracy per rate}``, in grid order.

    This is the selection run behind :data:`SELECTION_ACCURACY` (about a minute for the chapter's
    15 configurations); pass seeds that the evaluation does not use.
    """
    from ..harness.training import ModelConfig, train

    register_scores()
    out = {}
    for name, d_k in configs:
        cfg = ModelConfig(d_model=d_model, d_k=int(d_k), score=_check_name(name), scale="none", dtype=dtype)
        out[name, int(d_k)] = tuple(
            float(
                np.mean(
                    train(
                        cfg,
                        task,
                        seeds,
                        steps=steps,
                        lr=lr,
                        batch_size=batch_size,
                        eval_size=eval_size,
                        log_stats=False,
                    ).accuracy
                )
            )
            for lr in grid
        )
    return out


def selected_learning_rates(table: dict | None = None, grid=LR_GRID) -> dict[tuple[str, int], float]:
    """``{(score, d_k): rate}``: for each configuration the rate of ``grid`` with the highest mean
    accuracy in ``table`` (default :data:`SELECTION_ACCURACY`); the lower rate wins a tie."""
    table = SELECTION_ACCURACY if table is None else table
    return {key: float(grid[int(np.argmax(acc))]) for key, acc in table.items()}


__all__ = [
    "LR_GRID",
    "LR_SELECTION_SEEDS",
    "SELECTION_ACCURACY",
    "select_learning_rates",
    "selected_learning_rates",
    "register_scores",
    "SCORE_NAMES",
    "ScoreCost",
    "init_score_params",
    "score",
    "weight_rule",
    "score_weights",
    "score_cost",
    "score_param_count",
    "sample_init_logits",
    "linear_attention",
]
