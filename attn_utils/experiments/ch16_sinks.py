"""Chapter 16: where attention weight goes when there is nothing to attend to.

* :func:`sink_weights` — softmax with one extra key of logit ``s`` and value 0 (``s = 0``: the
  "off-by-one" softmax); the weights of the real keys sum to less than 1.
* :func:`absent_keyword_task` — BOS, filler tokens, and a keyword on half of the sequences only:
  on the other half the last position has nothing to find.
* :func:`train_lr_sweep` — one vectorised run of several learning rates × seeds (Adam, the harness's
  loop), with a selection loss on data distinct from the evaluation batch.
* :func:`parking` — where the last query's weight goes on sequences without a keyword.
* :func:`stream_batch`, :func:`window_cache` — long sequences and the two window caches of StreamingLLM.
* :func:`gaussian_entropy`, :func:`softcap`, :func:`softcap_grad` — the entropy of softmax over Gaussian
  logits, and logit soft-capping.
"""

from __future__ import annotations

import numpy as np

from .. import harness as hz
from ..softmax import entropy, softmax
from ..validation import int_at_least, positive_int, positive_scalar


# --------------------------------------------------------------------------- the sink as an extra key
def sink_weights(z, s=0.0) -> np.ndarray:
    """Weights of the real keys when one more key with logit ``s`` (value 0) takes part.

    z : (..., n) logits; s : scalar or broadcastable to z[..., :1]. Returns (..., n):
    ``e^{z_j} / (e^s + Σ_i e^{z_i})``; the missing ``e^s / (e^s + Σ e^{z_i})`` went to the sink.
    """
    z = np.asarray(z, dtype=float)
    if z.ndim == 0:
        raise ValueError(f"z must have a key axis, received shape {z.shape}")
    s = np.broadcast_to(np.asarray(s, dtype=float), z.shape[:-1] + (1,))
    return softmax(np.concatenate([z, s], axis=-1))[..., :-1]


# --------------------------------------------------------------------------- the task
def absent_keyword_task(n: int = 12, n_filler: int = 64, n_keywords: int = 4) -> hz.Task:
    """BOS, then ``n − 1`` filler tokens; on half of the sequences one of them is a keyword.

    Token ids: filler ``[0, n_filler)``, keywords ``[n_filler, n_filler + n_keywords)``,
    ``BOS = n_filler + n_keywords`` at position 0. The keyword (if any) sits at a uniform position in
    ``[1, n)``, the last position included. Target (per sequence, read at the last position):
    0 = no keyword, ``1 + w`` = keyword ``w``. ``info["present"]`` (batch,) bool.
    """
    n = int_at_least("n", n, 3)
    n_filler = positive_int("n_filler", n_filler)
    n_kw = positive_int("n_keywords", n_keywords)
    bos = n_filler + n_kw

    def sample(rng: np.random.Generator, batch: int) -> hz.TaskBatch:
        x = rng.integers(0, n_filler, size=(batch, n))
        present = rng.random(batch) < 0.5
        word = rng.integers(0, n_kw, size=batch)
        pos = rng.integers(1, n, size=batch)
        rows = np.flatnonzero(present)
        x[rows, pos[rows]] = n_filler + word[rows]
        x[:, 0] = bos
        y = np.where(present, 1 + word, 0)
        return hz.TaskBatch(x.astype(np.int64), y.astype(np.int64), {"present": present})

    options = {"n": n, "n_filler": n_filler, "n_keywords": n_kw, "bos": bos}
    return hz.Task("absent_keyword", bos + 1, n, n_kw + 1, False, sample, options)


# --------------------------------------------------------------------------- training
def train_lr_sweep(
    config: hz.ModelConfig, task: hz.Task, seeds, lrs, steps: int = 300, batch_size: int = 32, eval_size: int = 512
) -> dict:
    """Train models at several learning rates in one vectorised loop (Adam, the harness's loop).

    seeds : ``len(lrs) · S`` distinct seeds; slot ``i·S + s`` trains at ``lrs[i]``, with its
    initialisation and batches drawn from ``default_rng([seed, …])`` as :func:`attn_utils.harness.train` does.
    Returns ``params`` (slots first), ``loss`` (steps, slots), ``select_loss`` (slots,) on
    held-out batches from stream 5 and ``eval`` (the :func:`attn_utils.harness.evaluate` dict) on
    stream 2, plus the ``eval_batch`` itself. Selection and evaluation never share data.
    """
    slots = hz.seed_tuple(seeds)
    lrs = [positive_scalar("lr", lr) for lr in lrs]
    if not lrs or len(slots) % len(lrs):
        raise ValueError(f"seeds must hold S seeds per learning rate; received {len(slots)} seeds for {len(lrs)} rates")
    S = len(slots) // len(lrs)
    params = hz.init_params(config, task, slots)
    rate = np.repeat(np.asarray(lrs), S)
    step = hz.adam(params, {k: rate.reshape((-1,) + (1,) * (v.ndim - 1)) for k, v in params.items()})
    xs, ys = hz.step_batches(task, slots, positive_int("steps", steps), positive_int("batch_size", batch_size))
    losses, params = hz.optimise(hz.loss_and_grad(config, task), params, xs, ys, step)
    select = hz.seed_batches(task, slots, 5, eval_size)
    held_out = hz.seed_batches(task, slots, 2, eval_size)
    return {
        "params": params,
        "loss": losses,
        "lrs": np.asarray(lrs),
        "n_seeds": S,
        "select_loss": hz.evaluate(params, config, task, select)["loss"],
        "eval": hz.evaluate(params, config, task, held_out),
        "eval_batch": held_out,
    }


def select_rate(run: dict) -> int:
    """Index of the learning rate with the lowest mean selection loss over seeds."""
    S = run["n_seeds"]
    return int(np.argmin(run["select_loss"].reshape(-1, S).mean(axis=1)))


def slots_of(run: dict, i: int) -> slice:
    """The slots of learning rate ``i`` in a :func:`train_lr_sweep` result."""
    S = run["n_seeds"]
    return slice(i * S, (i + 1) * S)


# --------------------------------------------------------------------------- where the weight goes
def parking(params: dict, config: hz.ModelConfig, task: hz.Task, batch: hz.TaskBatch) -> dict:
    """Where the last query's weight goes (layer 0, head 0) on the sequences *without* a keyword.

    Returns per-seed means (S,) of: ``first`` (weight on position 0, the BOS), ``sink`` (weight on
    the extra key, 0 without one), ``largest`` (the largest weight on a real token) and ``entropy``
    (of the weights over the real tokens and the sink, nats).
    """
    w = hz.attention_weights(params, config, task, batch.x)[0][:, :, 0, -1, :]  # (S, B, n)
    absent = ~np.asarray(batch.info["present"])  # (S, B)
    sink = 1.0 - w.sum(axis=-1, keepdims=True)
    full = np.concatenate([w, np.clip(sink, 0.0, 1.0)], axis=-1)

    def mean(values):  # (S, B) -> (S,) over the absent sequences
        return (values * absent).sum(axis=1) / absent.sum(axis=1)

    return {
        "first": mean(w[..., 0]),
        "sink": mean(sink[..., 0]),
        "largest": mean(w.max(axis=-1)),
        "entropy": mean(entropy(full)),
    }


# --------------------------------------------------------------------------- streaming
def stream_batch(rng: np.random.Generator, task: hz.Task, length: int, window: int, batch: int) -> hz.TaskBatch:
    """Sequences of ``length`` tokens in the task's vocabulary (BOS first); the keyword, on half of them,
    sits in the last ``window − 1`` positions, so every cache below still holds it."""
    length = int_at_least("length", length, task.seq_len)
    window = int_at_least("window", window, 2)
    if window > length:
        raise ValueError(f"window must be <= length={length}, received {window}")
    o = task.options
    x = rng.integers(0, o["n_filler"], size=(batch, length))
    present = rng.random(batch) < 0.5
    word = rng.integers(0, o["n_keywords"], size=batch)
    pos = rng.integers(length - window + 1, length, size=batch)
    rows = np.flatnonzero(present)
    x[rows, pos[rows]] = o["n_filler"] + word[rows]
    x[:, 0] = o["bos"]
    return hz.TaskBatch(x.astype(np.int64), np.where(present, 1 + word, 0).astype(np.int64), {"present": present})


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


# --------------------------------------------------------------------------- entropy and soft-capping
def gaussian_entropy(n, beta, sigma=1.0):
    """Large-n entropy of softmax(β z) over n i.i.d. N(0, σ²) logits: ``ln n − β²σ²/2`` (nats)."""
    return np.log(n) - 0.5 * (np.asarray(beta) * sigma) ** 2


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
    "absent_keyword_task",
    "train_lr_sweep",
    "select_rate",
    "slots_of",
    "parking",
    "stream_batch",
    "window_cache",
    "gaussian_entropy",
    "softcap",
    "softcap_grad",
]
