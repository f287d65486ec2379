"""Seeded toy tasks for the training chapters (4–9).

Every task is a :class:`Task`: a few integers that size the model (vocabulary,
sequence length, number of classes) plus a sampler. ``task.sample(rng, batch)``
takes a ``np.random.Generator`` or an int seed and returns a :class:`TaskBatch`
of integer arrays:

* ``x : (batch, n)`` int64 tokens in ``[0, vocab_size)``;
* ``y : (batch, n)`` per-position targets with :data:`IGNORE` (−1) where a
  position is not scored, or ``y : (batch,)`` one target per sequence
  (``task.per_position`` says which). Targets lie in ``[0, n_classes)``.

Per-sequence tasks put the position that must answer *last* (a query key or a
``CLS`` token), so a model reads its prediction from position ``n − 1`` and the
attention row of that position is the one to inspect.

Which task shows what:

=========================  =========================================================
:func:`recall_task`        key–value lookup; attention retrieves, one vector must memorise
:func:`copy_task`          copy a sequence after a delimiter; order must survive
:func:`previous_token_task`  target at i is token i−1: an asymmetric relation (ch. 8)
:func:`keyword_task`       "sentiment" toy: one keyword decides the class (ch. 6)
:func:`two_relation_task`  target needs tokens i−1 *and* i−2 (or 0) at once (ch. 9)
=========================  =========================================================
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..validation import int_at_least, positive_int

IGNORE: int = -1
"""Target value of a position that is not scored (per-position tasks)."""


@dataclass(frozen=True)
class TaskBatch:
    """One sampled batch.

    x : (batch, n) int64 tokens; y : (batch, n) with ``IGNORE`` or (batch,) int64 targets;
    info : extra per-example arrays (e.g. ``keyword_pos (batch,)``) for inspecting attention.
    """

    x: np.ndarray
    y: np.ndarray
    info: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """A toy task: sizes for the model and a seeded sampler.

    ``sampler(rng, batch) -> TaskBatch`` must draw everything from ``rng`` so the
    same seed gives the same batch.
    """

    name: str
    vocab_size: int
    seq_len: int
    n_classes: int
    per_position: bool
    sampler: Callable[[np.random.Generator, int], TaskBatch] = field(repr=False)
    options: Mapping[str, object] = field(default_factory=dict)

    def sample(self, rng: np.random.Generator | int, batch: int) -> TaskBatch:
        """Draw ``batch`` examples; ``rng`` is a Generator or an int seed."""
        return self.sampler(as_generator(rng), positive_int("batch", batch))


def as_generator(rng: np.random.Generator | int) -> np.random.Generator:
    """Return ``rng`` itself, or ``np.random.default_rng(rng)`` for an int seed."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (numbers.Integral, np.integer)) and not isinstance(rng, bool):
        if rng < 0:
            raise ValueError(f"rng seed must be >= 0, received {rng}")
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng must be a numpy Generator or an int seed, received {type(rng).__name__}")


def _distinct_rows(rng: np.random.Generator, batch: int, pool: int, k: int) -> np.ndarray:
    """(batch, k) draws without replacement from range(pool), independently per row."""
    # argsort of uniforms is a vectorised per-row permutation (no loop over the batch)
    return np.argsort(rng.random((batch, pool)), axis=1)[:, :k]


# --------------------------------------------------------------------------- recall
def recall_task(n_pairs: int = 4, n_keys: int = 8, n_values: int = 8, layout: str = "fused") -> Task:
    """Associative recall: ``n_pairs`` distinct keys with values, then a query key.

    Target (per sequence, read at the last position) is the value index in
    ``[0, n_values)`` stored with the queried key. Two layouts:

    * ``"fused"`` (default): each of the first ``n_pairs`` positions holds one
      token per (key, value) pair, id ``n_keys + key·n_values + value``; the last
      position holds the query key (id ``key``). ``n = n_pairs + 1``. One
      attention layer solves it (the query matches the pair token and reads its
      value), while a one-vector encoder must memorise every pair: this is the
      retrieval task of chapter 6.
    * ``"interleaved"``: ``k₁ v₁ k₂ v₂ … q`` with key ids ``[0, n_keys)`` and value
      ids ``n_keys + value``; ``n = 2·n_pairs + 1``. The value sits one position
      after its key, so attention needs two layers (copy the key into the value
      position, then match) — the classic induction-style recall.

    ``info["query_pos"] (batch,)`` is the position of the pair/key that matches.
    """
    n_pairs = positive_int("n_pairs", n_pairs)
    n_keys = positive_int("n_keys", n_keys)
    n_values = int_at_least("n_values", n_values, 2)
    if n_keys < n_pairs:
        raise ValueError(f"n_keys must be >= n_pairs (keys are distinct), received n_keys={n_keys}, n_pairs={n_pairs}")
    if layout not in ("fused", "interleaved"):
        raise ValueError(f"layout must be 'fused' or 'interleaved', received {layout!r}")

    def sample(rng: np.random.Generator, batch: int) -> TaskBatch:
        keys = _distinct_rows(rng, batch, n_keys, n_pairs)  # (batch, P)
        values = rng.integers(0, n_values, size=(batch, n_pairs))  # (batch, P)
        which = rng.integers(0, n_pairs, size=batch)  # (batch,)
        rows = np.arange(batch)
        query, target = keys[rows, which], values[rows, which]
        if layout == "fused":
            body = n_keys + keys * n_values + values
            query_pos = which
        else:
            body = np.stack([keys, n_keys + values], axis=2).reshape(batch, 2 * n_pairs)
            query_pos = 2 * which
        x = np.concatenate([body, query[:, None]], axis=1).astype(np.int64)
        return TaskBatch(x, target.astype(np.int64), {"query_pos": query_pos})

    if layout == "fused":
        vocab, n = n_keys + n_keys * n_values, n_pairs + 1
    else:
        vocab, n = n_keys + n_values, 2 * n_pairs + 1
    return Task(
        "recall",
        vocab,
        n,
        n_values,
        False,
        sample,
        {"n_pairs": n_pairs, "n_keys": n_keys, "n_values": n_values, "layout": layout},
    )


# --------------------------------------------------------------------------- copy
def copy_task(length: int = 8, vocab: int = 8) -> Task:
    """Copy ``length`` random tokens after a delimiter.

    ``x = s₁ … s_m DELIM BLANK … BLANK`` (``n = 2m + 1``; ``DELIM = vocab``,
    ``BLANK = vocab + 1``). Targets are per position: ``IGNORE`` on the first
    ``m + 1`` positions, and ``s_j`` at position ``m + j``. Output position
    ``m + j`` only has to attend to position ``j − 1`` — a purely positional
    lookup one attention layer learns — while a one-vector encoder must pack all
    ``m`` tokens *in order* into ``d_model`` numbers, which fails as ``m`` grows.
    """
    m = positive_int("length", length)
    v = int_at_least("vocab", vocab, 2)

    def sample(rng: np.random.Generator, batch: int) -> TaskBatch:
        s = rng.integers(0, v, size=(batch, m))
        x = np.concatenate([s, np.full((batch, 1), v), np.full((batch, m), v + 1)], axis=1)
        y = np.concatenate([np.full((batch, m + 1), IGNORE), s], axis=1)
        return TaskBatch(x.astype(np.int64), y.astype(np.int64))

    return Task("copy", v + 2, 2 * m + 1, v, True, sample, {"length": m, "vocab": v})


# --------------------------------------------------------------------------- previous token
def previous_token_task(n: int = 8, vocab: int = 8) -> Task:
    """Target at position ``i`` is the token at ``i − 1`` (position 0 is ``IGNORE``).

    The relation "attend to the previous token" is asymmetric: position ``i``
    must prefer ``i − 1`` over ``i + 1``, which a symmetric score matrix
    (``W_K = W_Q``) cannot express (chapter 8).
    """
    n = int_at_least("n", n, 2)
    v = int_at_least("vocab", vocab, 2)

    def sample(rng: np.random.Generator, batch: int) -> TaskBatch:
        x = rng.integers(0, v, size=(batch, n))
        y = np.concatenate([np.full((batch, 1), IGNORE), x[:, :-1]], axis=1)
        return TaskBatch(x.astype(np.int64), y.astype(np.int64))

    return Task("previous_token", v, n, v, True, sample, {"n": n, "vocab": v})


# --------------------------------------------------------------------------- keyword
def keyword_task(n: int = 8, n_filler: int = 16, n_keywords: int = 4) -> Task:
    """A "sentiment" toy: filler tokens, one keyword, and a ``CLS`` token last.

    Token ids: filler ``[0, n_filler)``, positive keywords
    ``[n_filler, n_filler + n_keywords)``, negative keywords the next
    ``n_keywords``, ``CLS = n_filler + 2·n_keywords``. Exactly one keyword sits
    at a uniformly random position in ``[0, n − 1)``; ``x[:, n−1] = CLS``.
    Target (per sequence) is 1 for a positive keyword, 0 for a negative one.
    ``info["keyword_pos"] (batch,)`` says where the attention of ``CLS`` should land.
    """
    n = int_at_least("n", n, 2)
    n_filler = positive_int("n_filler", n_filler)
    n_kw = positive_int("n_keywords", n_keywords)
    cls = n_filler + 2 * n_kw

    def sample(rng: np.random.Generator, batch: int) -> TaskBatch:
        x = rng.integers(0, n_filler, size=(batch, n))
        label = rng.integers(0, 2, size=batch)
        word = rng.integers(0, n_kw, size=batch)
        pos = rng.integers(0, n - 1, size=batch)
        # positive keywords come first, so label 1 -> offset 0, label 0 -> offset n_kw
        x[np.arange(batch), pos] = n_filler + word + (1 - label) * n_kw
        x[:, -1] = cls
        return TaskBatch(x.astype(np.int64), label.astype(np.int64), {"keyword_pos": pos})

    return Task("keyword", cls + 1, n, 2, False, sample, {"n": n, "n_filler": n_filler, "n_keywords": n_kw})


# --------------------------------------------------------------------------- two relations
def two_relation_task(n: int = 12, vocab: int = 8, other: str = "first") -> Task:
    """Target at position ``i`` needs two tokens at once: ``a = x[i−1]`` and ``b``.

    ``b = x[0]`` (``other="first"``, default) or ``b = x[i−2]`` (``other="prev2"``);
    the target class is ``a·vocab + b`` in ``[0, vocab²)``, scored for ``i ≥ 2``
    (``IGNORE`` before). Two heads can each fetch one token into their own
    subspace, and the class is then a linear read-out of the pair. One head must
    fetch both with a single distribution, i.e. a weighted *sum* ``α v(a) + (1−α) v(b)``;
    it has to keep ``a`` and ``b`` apart through unequal weights. With
    ``"prev2"`` (two fixed offsets) a single wide head often manages that; with
    ``"first"`` (one fixed position, one moving) it usually fails at n ≥ 12 —
    measure it for the sizes you use (chapter 9).
    """
    n = int_at_least("n", n, 3)
    v = int_at_least("vocab", vocab, 2)
    if other not in ("prev2", "first"):
        raise ValueError(f"other must be 'prev2' or 'first', received {other!r}")

    def sample(rng: np.random.Generator, batch: int) -> TaskBatch:
        x = rng.integers(0, v, size=(batch, n))
        a = x[:, 1:-1]  # x[i-1] for i = 2..n-1
        b = x[:, :-2] if other == "prev2" else np.repeat(x[:, :1], n - 2, axis=1)
        y = np.concatenate([np.full((batch, 2), IGNORE), a * v + b], axis=1)
        return TaskBatch(x.astype(np.int64), y.astype(np.int64))

    return Task("two_relation", v, n, v * v, True, sample, {"n": n, "vocab": v, "other": other})


__all__ = [
    "IGNORE",
    "Task",
    "TaskBatch",
    "as_generator",
    "recall_task",
    "copy_task",
    "previous_token_task",
    "keyword_task",
    "two_relation_task",
]
