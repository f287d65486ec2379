"""Chapter 16: where attention weight goes when there is nothing to attend to.

* :func:`sink_weights` — softmax with one extra key of logit ``z0`` and value 0 (``z0 = 0``: the
  "off-by-one" softmax); the weights of the real keys sum to less than 1.
* :func:`bigram_backcopy_task`, :func:`backcopy_chain` — BOS, a fixed random bigram table, and triggers
  whose successor copies the token before them (after Guo et al. 2024): the head is needed on triggers
  and idle elsewhere.
* :func:`train_groups` — groups of (task, sink on/off, learning rate) trained side by side from the same
  seeds in one vectorised loop (optionally with a rate schedule and a mid-run checkpoint), with selection
  data apart from evaluation data.
* :func:`backcopy_parking`, :func:`token_losses` — where an idle query's weight goes (BOS, the null key,
  its own token) and the per-position losses.
* :func:`excess_loss` — how far a model's expected loss sits above the lowest any model can reach (a
  convergence measure that cannot be faked by a rate that decays to 0); :func:`bigram_excess` — the
  same for the best model whose head learned nothing (it never copies).
* :func:`window_cache`, :func:`stream_losses` — the window caches of StreamingLLM over long streams.
* :func:`gaussian_entropy`, :func:`softcap`, :func:`softcap_grad` — the entropy of softmax over Gaussian
  logits, and logit soft-capping.
"""

from __future__ import annotations

import numpy as np

from .. import harness as hz
from ..harness.tasks import IGNORE
from ..softmax import log_softmax, softmax
from ..validation import int_at_least, positive_int, positive_scalar


# --------------------------------------------------------------------------- the sink as an extra key
def sink_weights(z, z0=0.0) -> np.ndarray:
    """Weights of the real keys when one more key with logit ``z0`` (value 0) takes part.

    z : (..., n) logits; z0 : scalar or broadcastable to z[..., :1]. Returns (..., n):
    ``e^{z_j} / (e^{z0} + Σ_i e^{z_i})``; the missing ``e^{z0} / (e^{z0} + Σ e^{z_i})`` went to the sink.
    """
    z = np.asarray(z, dtype=float)
    if z.ndim == 0:
        raise ValueError(f"z must have a key axis, received shape {z.shape}")
    z0 = np.broadcast_to(np.asarray(z0, dtype=float), z.shape[:-1] + (1,))
    return softmax(np.concatenate([z, z0], axis=-1))[..., :-1]


# --------------------------------------------------------------------------- the task
def bigram_backcopy_task(
    rng: np.random.Generator,
    n: int = 16,
    n_tokens: int = 16,
    n_triggers: int = 2,
    concentration: float = 0.2,
    first: str = "bos",
    trigger_rate: float = 0.0,
) -> hz.Task:
    """Bigram-backcopy (after Guo et al. 2024, arXiv:2410.13835v2): BOS, then tokens drawn from a fixed
    random bigram table, except that after a *trigger* token the next token copies the token before it.

    Token ids: ordinary tokens ``[0, n_tokens)``, of which ``[0, n_triggers)`` are triggers; BOS =
    ``n_tokens`` at position 0. Position 1 holds a uniform non-trigger token. For ``i ≥ 1``:
    ``x_{i+1} = x_{i−1}`` if ``x_i`` is a trigger, else ``x_{i+1} ~ table[x_i]``. The table (rows from a
    Dirichlet(``concentration``), drawn once from ``rng``) is fixed for the task. Per-position target
    ``y_i = x_{i+1}`` (positions ``0 … n − 2``; the last is not scored). ``info["trigger"]`` (batch, n)
    marks the scored positions whose token is a trigger (their target is a copy of ``x_{i−1}``).
    ``trigger_rate`` r mixes every row with a uniform draw among the triggers,
    ``(1 − r) · Dirichlet + r · uniform(triggers)``, so that triggers are frequent whatever the draw of the
    table (with r = 0 some tables almost never reach a trigger, and the head has nothing to learn).
    ``first="random"`` puts a uniform non-trigger ordinary token at position 0 instead of BOS (the BOS id
    stays in the vocabulary, unused): a first token that every query sees but that changes per sequence.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (the chapter's), received {type(rng).__name__}")
    n = int_at_least("n", n, 4)
    V = int_at_least("n_tokens", n_tokens, 2)
    T = positive_int("n_triggers", n_triggers)
    if T >= V:
        raise ValueError(f"n_triggers must be < n_tokens={V}, received {T}")
    conc = positive_scalar("concentration", concentration)
    if first not in ("bos", "random"):
        raise ValueError(f"first must be 'bos' or 'random', received {first!r}")
    r = float(trigger_rate)
    if not 0.0 <= r < 1.0:
        raise ValueError(f"trigger_rate must be in [0, 1), received {trigger_rate}")
    table = rng.dirichlet(np.full(V, conc), size=V)  # (V, V): row a is the law of the token after a
    table = (1 - r) * table + r * (np.arange(V) < T) / T

    def sample(g: np.random.Generator, batch: int) -> hz.TaskBatch:
        x = backcopy_chain(g, table, T, batch, n, bos=first == "bos")
        y = np.full((batch, n), IGNORE, dtype=np.int64)
        y[:, :-1] = x[:, 1:]
        trigger = np.zeros((batch, n), bool)
        trigger[:, 1:-1] = x[:, 1:-1] < T
        return hz.TaskBatch(x, y, {"trigger": trigger})

    options = {"n": n, "n_tokens": V, "n_triggers": T, "bos": V, "table": table, "first": first, "trigger_rate": r}
    return hz.Task("bigram_backcopy", V + 1, n, V, True, sample, options)


def backcopy_chain(
    g: np.random.Generator, table: np.ndarray, n_triggers: int, batch: int, length: int, bos: bool = True
) -> np.ndarray:
    """(batch, length) sequences of the bigram-backcopy chain: BOS (= ``len(table)``; with ``bos=False`` a
    uniform non-trigger token), a uniform non-trigger token, then bigram draws, a trigger's successor
    copying the token before the trigger."""
    V, T = len(table), n_triggers
    cumulative = np.cumsum(table, axis=1)
    x = np.empty((batch, length), dtype=np.int64)
    x[:, 0] = V
    x[:, 1] = g.integers(T, V, size=batch)
    if not bos:
        x[:, 0] = g.integers(T, V, size=batch)
    u = g.random((batch, length))
    for i in range(1, length - 1):  # a Markov chain: each token depends on the ones before
        drawn = np.minimum((u[:, i, None] > cumulative[x[:, i]]).sum(axis=1), V - 1)
        copy = x[:, i - 1] if i > 1 else drawn  # position 1 is never a trigger
        x[:, i + 1] = np.where(x[:, i] < T, copy, drawn)
    return x


# --------------------------------------------------------------------------- training
NO_SINK = -1e4
"""A sink logit that switches the sink off: ``exp(−10⁴)`` is exactly 0 in float32 and float64."""


def train_groups(
    config: hz.ModelConfig,
    groups,
    seeds,
    steps: int,
    batch_size: int = 16,
    eval_size: int = 256,
    schedule=None,
    checkpoint: int | None = None,
) -> dict:
    """Train several groups of models side by side in one vectorised loop (Adam, the harness's loop).

    config : a model with ``sink="learned"``; groups : a sequence of ``(task, sink, lr)`` with
    ``sink`` ``"none"`` (the sink logit set to :data:`NO_SINK` and never updated: exactly the plain
    softmax) or ``"learned"`` (init 0, trained); all tasks must share vocabulary and length.
    Every group uses the same ``seeds``: the same initialisation (the sink logit aside) and the same
    batch streams, so two groups on one task differ only in the sink and the rate (a paired comparison).
    Returns ``params`` and ``loss`` (steps, slots) with slots group-major (group ``g`` =
    ``slots g·S … g·S + S − 1``), ``select`` (slots,) held-out loss on stream 5 for choosing a rate and
    ``eval_batch`` from stream 2 for evaluation (never the same data). ``schedule`` : optional
    ``schedule(t) -> factor`` of the rate, as in :func:`attn_utils.harness.adam`. ``checkpoint`` : a step
    count ``0 … steps``; the parameters after that many updates are returned as ``params_at_checkpoint``.
    """
    if config.sink != "learned":
        raise ValueError(f"config.sink must be 'learned' (groups switch it off), received {config.sink!r}")
    seeds = hz.seed_tuple(seeds)
    groups = list(groups)
    if not groups:
        raise ValueError("groups must not be empty")
    for task, sink, _ in groups:
        if sink not in ("none", "learned"):
            raise ValueError(f"sink must be 'none' or 'learned', received {sink!r}")
        if (task.vocab_size, task.seq_len) != (groups[0][0].vocab_size, groups[0][0].seq_len):
            raise ValueError("every group's task must have the same vocab_size and seq_len")
    steps, batch_size = positive_int("steps", steps), positive_int("batch_size", batch_size)
    if checkpoint is not None and not (isinstance(checkpoint, (int, np.integer)) and 0 <= checkpoint <= steps):
        raise ValueError(f"checkpoint must be an int in [0, steps={steps}] or None, received {checkpoint!r}")
    S = len(seeds)

    def stack(parts, axis=0):
        return np.concatenate(parts, axis=axis)

    inits = [hz.init_params(config, task, seeds) for task, _, _ in groups]
    params = {k: stack([p[k] for p in inits]) for k in inits[0]}
    off = np.repeat([sink == "none" for _, sink, _ in groups], S)
    params["L0.sink_logit"] = np.where(off[:, None], NO_SINK, 0.0).astype(config.dtype)
    rate = np.repeat([positive_scalar("lr", lr) for _, _, lr in groups], S)
    rates = {k: rate.reshape((-1,) + (1,) * (v.ndim - 1)) for k, v in params.items()}
    rates["L0.sink_logit"] = np.where(off, 0.0, rate)[:, None]
    batches = [hz.step_batches(task, seeds, steps, batch_size) for task, _, _ in groups]
    xs, ys = stack([b[0] for b in batches], 1), stack([b[1] for b in batches], 1)
    kept = {}

    def keep(t, p, _):  # called before update t: p has had t updates (Adam returns new arrays)
        if t == checkpoint:
            kept.update(p)

    objective = hz.loss_and_grad(config, groups[0][0])
    losses, params = hz.optimise(objective, params, xs, ys, hz.adam(params, rates, schedule=schedule), record=keep)

    def held_out(stream):
        parts = [hz.seed_batches(task, seeds, stream, eval_size) for task, _, _ in groups]
        return hz.TaskBatch(
            stack([b.x for b in parts]),
            stack([b.y for b in parts]),
            {k: stack([b.info[k] for b in parts]) for k in parts[0].info},
        )

    select = held_out(5)
    return {
        "params": params,
        "params_at_checkpoint": kept or None,
        "loss": losses,
        "n_seeds": S,
        "select": hz.evaluate(params, config, groups[0][0], select)["loss"],
        "eval_batch": held_out(2),
    }


def group(run: dict, g: int) -> slice:
    """The slots of group ``g`` in a :func:`train_groups` result."""
    S = run["n_seeds"]
    return slice(g * S, (g + 1) * S)


def token_losses(params: dict, config: hz.ModelConfig, task: hz.Task, x, y) -> np.ndarray:
    """Cross-entropy of every scored position, (S, batch, n) (NaN where ``y`` is IGNORE)."""
    logp = log_softmax(hz.forward(params, config, task, x))
    y = np.broadcast_to(y, logp.shape[:-1])
    picked = np.take_along_axis(logp, np.where(y == IGNORE, 0, y)[..., None], axis=-1)[..., 0]
    return np.where(y == IGNORE, np.nan, -picked)


def backcopy_parking(params: dict, config: hz.ModelConfig, task: hz.Task, batch: hz.TaskBatch) -> dict:
    """Where the head's weight goes on the bigram-backcopy task, per slot (S,).

    Queries at positions ``2 … n − 2`` (at least three keys, and scored). On *non-trigger* queries:
    ``bos`` (weight on position 0), ``sink`` (weight on the extra key), ``self`` (on the query's own
    token), ``other`` (mean weight of one other earlier key, positions ``1 … i − 1``). On *trigger*
    queries: ``prev`` (weight on the token before the trigger, the one to copy).
    Losses: ``loss_plain`` (mean cross-entropy on non-trigger scored positions ≥ 1) and ``loss_trigger``.
    """
    w = hz.attention_weights(params, config, task, batch.x)[0][:, :, 0]  # (S, B, n, n)
    trig = np.asarray(batch.info["trigger"])
    n = w.shape[-1]
    query = np.zeros(n, bool)
    query[2 : n - 1] = True
    plain, copy = query & ~trig, query & trig
    own = np.diagonal(w, axis1=-2, axis2=-1)
    # the mean weight of one other earlier key (positions 1 … i − 1) of query i ≥ 2
    other = (w.sum(axis=-1) - w[..., 0] - own) / np.maximum(np.arange(n) - 1, 1)
    before = np.concatenate([np.zeros(w.shape[:-2] + (1,)), np.diagonal(w, offset=-1, axis1=-2, axis2=-1)], axis=-1)

    def mean(values, where):
        return (values * where).sum(axis=(1, 2)) / where.sum(axis=(1, 2))

    tl = token_losses(params, config, task, batch.x, batch.y)
    scored = np.zeros(n, bool)
    scored[1 : n - 1] = True
    return {
        "bos": mean(w[..., 0], plain),
        "sink": mean(np.clip(1.0 - w.sum(axis=-1), 0.0, 1.0), plain),  # 0 up to rounding without a sink
        "self": mean(own, plain),
        "other": mean(other, plain),
        "prev": mean(before, copy),
        "loss_plain": mean(np.nan_to_num(tl), scored & ~trig),
        "loss_trigger": mean(np.nan_to_num(tl), scored & trig),
    }


def excess_loss(params: dict, config: hz.ModelConfig, task: hz.Task, x) -> np.ndarray:
    """Mean over the scored positions of ``KL(true next-token law ‖ model)``, per slot (S,): how far the
    expected loss is above the lowest any model can reach on the bigram-backcopy task (the entropy of
    the true law), with no sampling noise from the targets. The true law at position 0 is uniform over the
    non-trigger tokens, at a trigger a point mass on the token before it, elsewhere the table's row."""
    o = task.options
    V, T, table = o["n_tokens"], o["n_triggers"], o["table"]
    x = np.asarray(x)
    logp = log_softmax(hz.forward(params, config, task, x))[..., :-1, :V]  # scored positions; BOS is never a target
    law = table[np.minimum(x[..., :-1], V - 1)]  # (…, n − 1, V); position 0 (maybe BOS = V) is set next
    law[..., 0, :] = (np.arange(V) >= T) / (V - T)
    trigger = np.zeros(x.shape[:-1] + (x.shape[-1] - 1,), bool)
    trigger[..., 1:] = x[..., 1:-1] < T
    law[trigger] = np.eye(V)[x[..., :-2][trigger[..., 1:]]]
    kl = (law * (np.log(np.where(law > 0, law, 1.0)) - logp)).sum(axis=-1)  # (S, B, n − 1)
    return kl.mean(axis=tuple(range(1, kl.ndim)))


def bigram_excess(task: hz.Task, x) -> np.ndarray:
    """The excess loss (as in :func:`excess_loss`) of the best model that predicts each next token from the
    current token alone, a head that learned nothing, per slot (S,) for x of shape (S, B, n).

    Its prediction equals the true law everywhere except after a trigger, where the target copies the
    token before the trigger; there it can only predict the law of that token given the trigger,
    ``q(a | t)``, and pays ``−ln q(x_{i−1} | x_i)``. ``q`` is the empirical law in ``x`` (all slots
    pooled), the best such predictor on this very sample, so the value is a lower bound for any
    predictor that ignores the token before the trigger."""
    T, V = task.options["n_triggers"], task.options["n_tokens"]
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (slots, batch, n), received shape {x.shape}")
    trig, prev = x[..., 1:-1], x[..., :-2]  # the scored trigger positions i = 1 … n − 2 and their x_{i−1}
    is_trig = trig < T
    counts = np.zeros((T, V))
    np.add.at(counts, (trig[is_trig], prev[is_trig]), 1.0)
    q = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    nll = np.zeros(trig.shape)
    nll[is_trig] = -np.log(q[trig[is_trig], prev[is_trig]])
    return nll.sum(axis=(1, 2)) / (x.shape[1] * (x.shape[2] - 1))  # mean over the n − 1 scored positions


def value_norms(params: dict, config: hz.ModelConfig, task: hz.Task, x) -> np.ndarray:
    """``‖W_O v_j‖``, the length of what key ``j`` adds to the output at full weight, (S, batch, n), for a
    one-layer model with learned positions: ``v_j = (E[x_j] + P[j]) W_V``."""
    if config.n_layers != 1 or config.positional != "learned":
        raise ValueError(
            f"value_norms needs one layer with learned positions, received n_layers={config.n_layers}, "
            f"positional={config.positional!r}"
        )
    E, P = params["E"], params["P"]
    S, n = E.shape[0], np.shape(x)[-1]
    x = np.broadcast_to(x, (S,) + np.shape(x)[-2:])  # (S, B, n): one batch for all, or one per slot
    h = E[np.arange(S)[:, None, None], x] + P[:, None, :n]  # (S, B, n, d)
    w_v = params["L0.W_v"].reshape(S, h.shape[-1], -1)
    w_o = params["L0.W_o"].reshape(S, w_v.shape[-1], -1)
    return np.linalg.norm(h @ w_v[:, None] @ w_o[:, None], axis=-1)


# --------------------------------------------------------------------------- streaming
def window_cache(x: np.ndarray, window: int, n_sink: int = 0) -> np.ndarray:
    """The tokens a window cache holds at the last step: the first ``n_sink`` and the last
    ``window − n_sink`` of each row of x (batch, length) → (batch, window). Positions are those
    within the cache (0 … window − 1), as StreamingLLM assigns them."""
    x = np.asarray(x)
    window = positive_int("window", window)
    if not 0 <= n_sink < window or window > x.shape[-1]:
        raise ValueError(
            f"need 0 <= n_sink < window <= length; received n_sink={n_sink}, window={window}, length={x.shape[-1]}"
        )
    return np.concatenate([x[..., :n_sink], x[..., x.shape[-1] - (window - n_sink) :]], axis=-1)


def stream_losses(
    params: dict, config: hz.ModelConfig, task: hz.Task, rng: np.random.Generator, length: int, batch: int = 1024
) -> dict:
    """Next-token loss at the last query of two window caches over long bigram-backcopy streams.

    Streams of ``length + 1`` tokens (BOS first, the task's chain); the cache holds ``w = task.seq_len − 1``
    tokens at positions ``0 … w − 1`` (positions inside the cache, as StreamingLLM assigns them). The query
    sits at position ``w − 1 = n − 2``, the last one the task scores, so its position embedding was trained
    (position ``n − 1`` never receives a loss); it predicts token ``length``. ``"window"``: the last w tokens
    (BOS dropped); ``"bos+window"``: BOS and the last w − 1. Both caches end with the same w − 1 tokens.
    Returns the two losses (S, batch) per stream and ``plain`` (batch,), True where the last cached
    token is not a trigger (the head has nothing to fetch there).
    """
    w = task.seq_len - 1
    length = int_at_least("length", length, w + 1)
    o = task.options
    x = backcopy_chain(rng, o["table"], o["n_triggers"], positive_int("batch", batch), length + 1)
    target = x[:, length]
    out = {"plain": x[:, length - 1] >= o["n_triggers"]}
    for name, n_sink in (("window", 0), ("bos+window", 1)):
        cache = window_cache(x[:, :length], w, n_sink)
        padded = np.pad(cache, ((0, 0), (0, 1)))  # one unread slot: the model's length; causal, so it changes nothing
        logp = log_softmax(hz.forward(params, config, task, padded)[:, :, w - 1])
        out[name] = -logp[:, np.arange(len(target)), target]  # (S, batch)
    return out


# --------------------------------------------------------------------------- entropy and soft-capping
def gaussian_entropy(n, beta, sigma=1.0, finite_n: bool = True):
    """Mean entropy (nats) of softmax(β z) over n i.i.d. N(0, σ²) logits.

    Large n: ``H − ln n → −(βσ)²/2``. With ``finite_n`` the first correction in 1/n is added,
    ``(a e^{a} − (e^{a} − 1)/2) / n`` with ``a = (βσ)²`` (second-order expansion of the two sample means in
    ``H = ln Σe^{x} − Σ x e^{x} / Σ e^{x}``); it is accurate when ``e^{a} ≪ n``.
    """
    a = (np.asarray(beta, dtype=float) * sigma) ** 2
    n = np.asarray(n, dtype=float)
    base = np.log(n) - 0.5 * a
    return base + (a * np.exp(a) - 0.5 * np.expm1(a)) / n if finite_n else base


def softcap(z, c: float):
    """Logit soft-capping ``c · tanh(z / c)``: |result| < c, slope 1 at 0 (Gemma 2)."""
    c = positive_scalar("c", c)
    return c * np.tanh(np.asarray(z, dtype=float) / c)


def softcap_grad(z, c: float):
    """d softcap / dz = ``1 − tanh²(z / c)``."""
    c = positive_scalar("c", c)
    return 1.0 - np.tanh(np.asarray(z, dtype=float) / c) ** 2


__all__ = [
    "sink_weights",
    "bigram_backcopy_task",
    "backcopy_chain",
    "NO_SINK",
    "train_groups",
    "group",
    "token_losses",
    "backcopy_parking",
    "excess_loss",
    "value_norms",
    "stream_losses",
    "window_cache",
    "gaussian_entropy",
    "softcap",
    "softcap_grad",
]
