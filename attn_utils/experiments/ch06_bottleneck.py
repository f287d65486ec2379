"""The fixed-length bottleneck and the "sentiment keyword" toy (chapter 6).

What is here
------------
* Bit budget of one vector: :func:`tokens_per_coordinate`, :func:`pack_tokens` and
  :func:`unpack_tokens` store a token sequence in ``d`` floating-point numbers *exactly* (base-``V``
  digits in the integer range of the significand) as far as the bits allow, and guess the rest;
  :func:`fano_bits` turns a per-position accuracy into a lower bound on the information
  that reached the decoder.
* Order blindness: :func:`bag_accuracy_bound` is the best expected per-token accuracy any
  permutation-invariant encoder can reach on the copy task.
* A linear "mean-pool" code: :func:`superposition_copy_accuracy` sums one random vector per
  (position, token) and decodes each position with a matched filter; :func:`train_linear_code`
  starts from that code and *learns* the vectors and a linear read-out (:class:`CodeRun`), and
  :func:`pick_learning_rate` chooses a rate from a sweep.
* The keyword toy of :func:`attn_utils.harness.tasks.keyword_task` with word labels
  (:func:`keyword_vocabulary`, :func:`words_to_ids`, :func:`ids_to_words`), the attention mass of
  the read-out position on the keyword (:func:`keyword_attention_mass`), and the same trained
  model with its attention made uniform at test time (:func:`with_uniform_attention`).
* Is a run still learning? :func:`relative_loss_drop` measures how much a training loss
  still falls over the second half of a run, per seed.

Token sequences are integer arrays ``s : (batch, m)`` with entries in ``[0, vocab)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..harness.tasks import Task, as_generator
from ..softmax import log_softmax_core
from ..validation import positive_int

_SIGNIFICAND_BITS = {"float16": 11, "float32": 24, "float64": 53}

KEYWORD_FILLERS: tuple[str, ...] = (
    "I",
    "this",
    "movie",
    "the",
    "was",
    "film",
    "plot",
    "and",
    "really",
    "so",
    "it",
    "actors",
    "story",
    "just",
    ".",
    "a",
)
"""Words for the filler ids ``0 … 15`` of :func:`~attn_utils.harness.tasks.keyword_task`."""
KEYWORD_POSITIVE: tuple[str, ...] = ("love", "great", "superb", "enjoyed")
"""Words for the positive keyword ids (label 1)."""
KEYWORD_NEGATIVE: tuple[str, ...] = ("hate", "awful", "boring", "terrible")
"""Words for the negative keyword ids (label 0)."""
CLS_WORD = "[CLS]"
"""Label of the read-out token that ends every keyword sequence."""


# --------------------------------------------------------------------------- validation
def _tokens(name: str, s, vocab: int) -> np.ndarray:
    arr = np.asarray(s)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integer tokens, received dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"{name} must have shape (batch, m) with m >= 1, received shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        raise ValueError(f"{name} tokens must lie in [0, {vocab}), received range [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64)


def _vocab(vocab) -> int:
    vocab = positive_int("vocab", vocab)
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, received {vocab}")
    return vocab


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _SIGNIFICAND_BITS:
        raise ValueError(f"dtype must be one of {tuple(_SIGNIFICAND_BITS)}, received {name!r}")
    return name


# --------------------------------------------------------------------------- bit budget
def tokens_per_coordinate(vocab: int, dtype="float32") -> int:
    """Largest ``k`` with ``vocab**k ≤ 2**p``, ``p`` the significand precision of ``dtype``
    (11, 24, 53 bits for float16/32/64).

    Every integer in ``[0, 2**p]`` is exactly representable, so one coordinate stores ``k``
    base-``vocab`` digits without loss. For ``vocab = 8`` and float32, ``k = 8`` (24 bits).
    """
    vocab, p = _vocab(vocab), _SIGNIFICAND_BITS[_dtype_name(dtype)]
    k = 0
    while vocab ** (k + 1) <= 2**p:  # exact integer arithmetic, no log rounding
        k += 1
    return k


def pack_tokens(s, vocab: int, d: int, dtype="float32") -> np.ndarray:
    """Encode each row of ``s (batch, m)`` into ``d`` floats: ``z (batch, d)`` of ``dtype``.

    Coordinate ``c`` holds tokens ``c·k … c·k + k − 1`` (``k`` = :func:`tokens_per_coordinate`)
    as the integer ``Σ_i s_{ck+i} · vocab**i``, which ``dtype`` represents exactly. Tokens beyond
    the first ``d·k`` are not stored at all: the code spends its whole bit budget on a prefix.
    """
    vocab, d = _vocab(vocab), positive_int("d", d)
    s = _tokens("s", s, vocab)
    name = _dtype_name(dtype)
    k = tokens_per_coordinate(vocab, name)
    batch, m = s.shape
    stored = np.zeros((batch, d * k), dtype=np.int64)
    keep = min(m, d * k)
    stored[:, :keep] = s[:, :keep]
    digits = stored.reshape(batch, d, k)
    weights = vocab ** np.arange(k, dtype=np.int64)  # ≤ 2**53 < 2**63: no overflow
    return (digits * weights).sum(axis=2).astype(name)


def unpack_tokens(z, vocab: int, m: int, guess: int = 0) -> np.ndarray:
    """Decode :func:`pack_tokens`: ``z (batch, d)`` → tokens ``(batch, m)``.

    Positions ``< d·k`` are read back from the base-``vocab`` digits; later positions were never
    stored, so the decoder outputs ``guess`` there (correct with probability ``1/vocab`` for
    uniform tokens, the best any decoder can do without information).
    """
    vocab, m = _vocab(vocab), positive_int("m", m)
    z = np.asarray(z)
    if z.ndim != 2:
        raise ValueError(f"z must have shape (batch, d), received shape {z.shape}")
    if not 0 <= int(guess) < vocab:
        raise ValueError(f"guess must lie in [0, {vocab}), received {guess}")
    k = tokens_per_coordinate(vocab, _dtype_name(z.dtype))
    ints = np.rint(z.astype(np.float64)).astype(np.int64)  # exact: the values are integers ≤ 2**p
    digits = (ints[:, :, None] // vocab ** np.arange(k, dtype=np.int64)) % vocab
    flat = digits.reshape(z.shape[0], -1)
    out = np.full((z.shape[0], m), int(guess), dtype=np.int64)
    keep = min(m, flat.shape[1])
    out[:, :keep] = flat[:, :keep]
    return out


def fano_bits(accuracy, vocab: int) -> np.ndarray:
    """Fano lower bound on the information (bits) a decoder's output carries about one token.

    For a token ``x_j`` uniform on ``vocab`` symbols and a guess ``xhat_j`` correct with probability
    ``a_j`` (``p`` below), ``MI(x_j; xhat_j) ≥ log2(vocab) − eta(1 − a_j) − (1 − a_j)·log2(vocab − 1)``
    (``eta`` the binary entropy, ``h`` below). The bound is 0 at ``a_j = 1/vocab`` and ``log2(vocab)``
    at ``a_j = 1``; below chance it is clipped to 0. ``accuracy`` : any shape, values in ``[0, 1]``;
    returns the same shape.
    """
    vocab = _vocab(vocab)
    p = np.asarray(accuracy, dtype=float)
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"accuracy must lie in [0, 1], received range [{np.min(p)}, {np.max(p)}]")
    e = 1.0 - p
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(e > 0, e * np.log2(e), 0.0) - np.where(p > 0, p * np.log2(p), 0.0)
    bits = math.log2(vocab) - h - e * math.log2(vocab - 1)
    return np.where(p > 1.0 / vocab, np.maximum(bits, 0.0), 0.0)


# --------------------------------------------------------------------------- order blindness
def bag_accuracy_bound(s, vocab: int) -> float:
    """Best expected per-token copy accuracy of any permutation-invariant encoder on rows like ``s``.

    Such an encoder sees only the multiset of a row, and every ordering of that multiset is
    equally likely under i.i.d. tokens, so the best guess at any position is a most frequent
    token: accuracy ``max_v count_v / m``. Returns its mean over the rows of ``s (batch, m)``.
    """
    vocab = _vocab(vocab)
    s = _tokens("s", s, vocab)
    counts = (s[:, :, None] == np.arange(vocab)).sum(axis=1)  # (batch, vocab)
    return float(counts.max(axis=1).mean() / s.shape[1])


# --------------------------------------------------------------------------- a linear code
def superposition_copy_accuracy(rng, m: int, d: int, vocab: int, batch: int = 2000) -> float:
    """Per-token accuracy of the simplest mean-pool code: ``z = Σ_j c[j, s_j]``, decode by matched filter.

    ``c (m, vocab, d)`` has i.i.d. ``N(0, 1/d)`` entries (fresh from ``rng`` on every call);
    position ``j`` is decoded as ``argmax_v ⟨z, c[j, v]⟩``. The signal is ``‖c[j, s_j]‖² ≈ 1``
    and each of the other ``m − 1`` codes adds interference of variance ``≈ 1/d``, so the
    accuracy depends on ``d/m``: keeping it fixed needs ``d ∝ m``. rng : Generator or int seed.
    """
    rng = as_generator(rng)
    m, d, vocab, batch = positive_int("m", m), positive_int("d", d), _vocab(vocab), positive_int("batch", batch)
    codes = rng.standard_normal((m, vocab, d)) / np.sqrt(d)
    s = rng.integers(0, vocab, size=(batch, m))
    z = codes[np.arange(m), s].sum(axis=1)  # (batch, d)
    scores = (z @ codes.reshape(m * vocab, d).T).reshape(batch, m, vocab)  # one BLAS product
    return float((scores.argmax(axis=-1) == s).mean())


# --------------------------------------------------------------------------- a learned linear code
def linear_code_init(seeds, m: int, vocab: int, d: int) -> dict:
    """Start of :func:`train_linear_code`: the random code of :func:`superposition_copy_accuracy`.

    Returns ``{"C": (S, m·vocab, d), "D": (S, d, m·vocab), "b": (S, 1, m·vocab)}``: code vectors
    ``c[j, v]`` (row ``j·vocab + v``) with i.i.d. ``N(0, 1/d)`` entries from
    ``default_rng([seed, 0])``, the matched-filter read-out ``D = Cᵀ`` and zero biases, so the
    untrained model *is* a random code decoded by matched filter.
    """
    seeds = tuple(int(s) for s in seeds)
    m, vocab, d = positive_int("m", m), _vocab(vocab), positive_int("d", d)
    if not seeds:
        raise ValueError("seeds must not be empty")
    C = np.stack([np.random.default_rng([s, 0]).standard_normal((m * vocab, d)) / np.sqrt(d) for s in seeds])
    return {"C": C, "D": C.transpose(0, 2, 1).copy(), "b": np.zeros((len(seeds), 1, m * vocab))}


def _one_hot_positions(s: np.ndarray, vocab: int, dtype=float) -> np.ndarray:
    """``s (S, B, m)`` → ``(S, B, m·vocab)`` with a 1 at column ``j·vocab + s_j`` for every ``j``."""
    S, B, m = s.shape
    return (s[..., None] == np.arange(vocab)).reshape(S, B, m * vocab).astype(dtype)


def linear_code_logits(params: dict, s, vocab: int) -> np.ndarray:
    """Logits ``(S, B, m, vocab)`` of the learned linear code for tokens ``s (S, B, m)``.

    Encoder: ``z = Σ_j c[j, s_j]`` (one vector of ``d`` numbers, a sum over positions); decoder:
    position ``i``'s logits are ``z D_i + b_i`` (linear in ``z``).
    """
    s = np.asarray(s)
    S, B, m = s.shape
    z = _one_hot_positions(s, vocab) @ params["C"]
    return (z @ params["D"] + params["b"]).reshape(S, B, m, vocab)


def linear_code_loss_and_grad(params: dict, s, vocab: int) -> tuple[np.ndarray, dict]:
    """Per-seed mean cross-entropy ``(S,)`` of copying ``s (S, B, m)`` and its gradient (hand-derived).

    The gradient is that of the *sum* over seeds, so each seed's parameters get their own
    loss's gradient (seeds do not interact), as in :func:`attn_utils.harness.train`.
    """
    s = np.asarray(s)
    S, B, m = s.shape
    dtype = params["C"].dtype
    hot = _one_hot_positions(s, vocab, dtype)  # (S, B, m·V)
    z = hot @ params["C"]  # (S, B, d)
    logits = (z @ params["D"] + params["b"]).reshape(S, B, m, vocab)
    logp = log_softmax_core(logits)  # the book's log-softmax, per (seed, sequence, position)
    loss = -(logp.reshape(S, B, -1) * hot).reshape(S, -1).sum(axis=1) / (B * m)
    g = (np.exp(logp).reshape(S, B, -1) - hot) / (B * m)  # ∂loss/∂logits, (S, B, m·V)
    grads = {
        "D": z.transpose(0, 2, 1) @ g,
        "b": np.ones((S, 1, B), dtype) @ g,
        "C": hot.transpose(0, 2, 1) @ (g @ params["D"].transpose(0, 2, 1)),
    }
    return loss, grads


def exact_positions(params: dict, vocab: int) -> np.ndarray:
    """Which positions a linear code copies correctly for *every* input sequence, ``(S, m)`` bools.

    params : ``{"C": (S, m·vocab, d), "D": (S, d, m·vocab), "b": (S, 1, m·vocab)}`` (one code per
    seed, as trained by :func:`train_linear_code`). The logits are a sum of one term per input
    position, ``U[j, t, i, :] = c[j, t] D_i`` for token ``t`` at ``j``, plus ``b_i``, so the worst case
    over all ``vocab**m`` inputs splits position by position: token ``τ`` at ``i`` beats ``σ`` on every
    input iff ``U[i,τ,i,τ] − U[i,τ,i,σ] + b_i[τ] − b_i[σ] + Σ_{j≠i} min_t (U[j,t,i,τ] − U[j,t,i,σ]) > 0``.
    Position ``i`` is copied exactly iff this holds for every pair ``τ ≠ σ`` (a tie counts as an
    error). Exact, no sampling: the certificate behind the proposition that at most ``d`` positions
    can be copied exactly.
    """
    C, D, b = (np.asarray(params[k], dtype=float) for k in ("C", "D", "b"))
    if C.ndim != 3 or D.shape != (C.shape[0], C.shape[2], C.shape[1]) or b.shape != (C.shape[0], 1, C.shape[1]):
        raise ValueError(
            f"params must hold C (S, m·vocab, d), D (S, d, m·vocab), b (S, 1, m·vocab); "
            f"received {C.shape}, {D.shape}, {b.shape}"
        )
    vocab = _vocab(vocab)
    S, mv, _ = C.shape
    if mv % vocab:
        raise ValueError(f"C has {mv} rows, not a multiple of vocab = {vocab}")
    m = mv // vocab
    U = (C @ D).reshape(S, m, vocab, m, vocab)  # U[s, j, t, i, τ]
    diff = U[..., :, None] - U[..., None, :]  # (S, j, t, i, τ, σ): logit τ minus logit σ at i
    worst = diff.min(axis=2)  # (S, j, i, τ, σ): the worst token at j
    others = worst.sum(axis=1) - np.einsum("sjjab->sjab", worst)  # Σ over j ≠ i, (S, i, τ, σ)
    own = np.einsum("siaiab->siab", diff)  # j = i and t = τ: the token that is there, (S, i, τ, σ)
    bias = b.reshape(S, m, vocab)
    margin = own + others + bias[..., :, None] - bias[..., None, :]
    margin[..., np.arange(vocab), np.arange(vocab)] = np.inf  # τ = σ is no competitor
    return (margin > 0).all(axis=(2, 3))


def copy_tokens(seeds, stream: int, count: int, m: int, vocab: int) -> np.ndarray:
    """The tokens ``s (S, count, m)`` of :func:`attn_utils.harness.copy_task` that the harness draws for
    these seeds from ``default_rng([seed, stream])`` (stream 1: the training batches of
    :func:`~attn_utils.harness.train`, in order; stream 2: its held-out sequences), without building
    the delimiter, blanks and targets around them."""
    m, vocab, count = positive_int("m", m), _vocab(vocab), positive_int("count", count)
    return np.stack([np.random.default_rng([int(s), stream]).integers(0, vocab, size=(count, m)) for s in seeds])


@dataclass
class CodeRun:
    """What :func:`train_linear_code` returns (``L`` learning rates × ``S`` seeds).

    loss : (steps, L, S) training loss before each update; accuracy, eval_loss : (L, S) on the
    held-out copy sequences of each seed (the ones :func:`attn_utils.harness.train` evaluates on);
    curve : (K, L, S) held-out accuracy at the steps ``checkpoints`` (K,) (the last is ``steps``).
    """

    m: int
    vocab: int
    d: int
    seeds: tuple
    lrs: tuple
    loss: np.ndarray
    accuracy: np.ndarray
    eval_loss: np.ndarray
    curve: np.ndarray
    checkpoints: np.ndarray
    params: dict = field(repr=False)
    eval_size: int = 512


def position_accuracy(run: CodeRun, rate: int = 0) -> np.ndarray:
    """Held-out accuracy of a trained code per output position, ``(S, m)``, at learning rate ``run.lrs[rate]``.

    Its mean over positions is ``run.accuracy[rate]``. It shows *how* a code falls short: a little
    at every position, or whole positions lost (near ``1/vocab``) while the others are exact.
    """
    if not isinstance(run, CodeRun):
        raise TypeError(f"run must be a CodeRun, received {type(run).__name__}")
    if not 0 <= int(rate) < len(run.lrs):
        raise ValueError(f"rate must index run.lrs (0 … {len(run.lrs) - 1}), received {rate}")
    held = copy_tokens(run.seeds, 2, run.eval_size, run.m, run.vocab)
    params = {k: v[int(rate)] for k, v in run.params.items()}
    return (linear_code_logits(params, held, run.vocab).argmax(axis=-1) == held).mean(axis=1)


def train_linear_code(
    m: int,
    vocab: int,
    d: int,
    seeds,
    lrs,
    steps: int,
    batch_size: int = 32,
    eval_size: int = 512,
    n_checkpoints: int = 8,
    dtype="float64",
) -> CodeRun:
    """Train the learned linear code (:func:`linear_code_logits`) on the copy task, every seed at every rate.

    Starts from :func:`linear_code_init` (the random code), then the book's Adam
    (:func:`attn_utils.harness.training.adam`: β = 0.9, 0.999, ε = 1e-8, constant learning rate)
    on the *same* fresh batches and held-out sequences that :func:`attn_utils.harness.train` uses
    for ``copy_task(m, vocab)`` and these seeds (:func:`copy_tokens`), so a seed's attention model
    and its code see identical data.
    ``lrs`` : learning rates, all trained in one vectorised loop. The held-out accuracy is also
    recorded at ``n_checkpoints`` evenly spaced steps. ``dtype`` : ``"float64"`` or ``"float32"``, the
    precision of the parameters, the arithmetic and Adam's moments (float32 is about a third faster).
    """
    from ..harness.training import adam, optimise, seed_tuple

    m, vocab, d = positive_int("m", m), _vocab(vocab), positive_int("d", d)
    steps, batch_size = positive_int("steps", steps), positive_int("batch_size", batch_size)
    eval_size, n_checkpoints = positive_int("eval_size", eval_size), positive_int("n_checkpoints", n_checkpoints)
    if n_checkpoints > steps:
        raise ValueError(f"n_checkpoints must be <= steps = {steps}, received {n_checkpoints}")
    seeds = seed_tuple(seeds)
    if dtype not in ("float32", "float64", np.float32, np.float64):
        raise ValueError(f"dtype must be 'float32' or 'float64', received {dtype!r}")
    dtype = np.dtype(dtype)
    lrs = tuple(float(lr) for lr in np.atleast_1d(lrs))
    if not lrs or not all(np.isfinite(lr) and lr > 0 for lr in lrs):
        raise ValueError(f"lrs must be positive learning rates, received {lrs}")
    S, L = len(seeds), len(lrs)
    xs = copy_tokens(seeds, 1, steps * batch_size, m, vocab).reshape(S, steps, batch_size, m).swapaxes(0, 1)
    held = np.tile(copy_tokens(seeds, 2, eval_size, m, vocab), (L, 1, 1))  # (L·S, eval, m)
    params = {k: np.tile(v, (L, 1, 1)).astype(dtype) for k, v in linear_code_init(seeds, m, vocab, d).items()}
    step = adam(params, lr=np.repeat(np.array(lrs, dtype), S)[:, None, None])  # slot = (rate, seed), rate-major
    checkpoints = np.linspace(steps / n_checkpoints, steps, n_checkpoints).round().astype(int)
    check_at, curve = set(checkpoints.tolist()), []

    def checkpoint(t, params, x):  # before update t, after t updates
        if t in check_at:
            curve.append((linear_code_logits(params, held, vocab).argmax(axis=-1) == held).mean(axis=(1, 2)))

    def objective(params, x, y):  # every rate sees the seeds' batch
        return linear_code_loss_and_grad(params, np.tile(x, (L, 1, 1)), vocab)

    losses, params = optimise(objective, params, xs, xs, step, record=checkpoint)  # copying: the target is x
    ev_loss, _ = linear_code_loss_and_grad(params, held, vocab)
    return CodeRun(
        m,
        vocab,
        d,
        seeds,
        lrs,
        losses.reshape(steps, L, S),
        curve[-1].reshape(L, S),
        ev_loss.reshape(L, S),
        np.array(curve).reshape(-1, L, S),
        checkpoints,
        {k: v.reshape((L, S) + v.shape[1:]) for k, v in params.items()},
        eval_size,
    )


def pick_learning_rate(lrs, accuracy, loss) -> int:
    """Index of the learning rate to use: highest mean held-out accuracy over seeds, ties
    (equal to 1e-9) broken by the lower mean held-out loss. accuracy, loss : (L, S)."""
    acc, lss = np.asarray(accuracy, dtype=float), np.asarray(loss, dtype=float)
    lrs = tuple(lrs)
    if acc.ndim != 2 or acc.shape != lss.shape or acc.shape[0] != len(lrs):
        raise ValueError(
            f"accuracy and loss must both have shape (len(lrs), S) = ({len(lrs)}, S); "
            f"received {acc.shape} and {lss.shape}"
        )
    mean_acc = acc.mean(axis=1)
    mean_loss = np.where(np.isfinite(lss), lss, np.inf).mean(axis=1)
    best = mean_acc >= mean_acc.max() - 1e-9
    return int(np.flatnonzero(best)[np.argmin(mean_loss[best])])


# --------------------------------------------------------------------------- keyword toy
def _keyword_options(task: Task) -> tuple[int, int]:
    if not isinstance(task, Task) or task.name != "keyword":
        raise TypeError(f"task must be a keyword_task, received {task!r}")
    n_filler, n_kw = int(task.options["n_filler"]), int(task.options["n_keywords"])
    if n_filler > len(KEYWORD_FILLERS) or n_kw > len(KEYWORD_POSITIVE):
        raise ValueError(
            f"word labels exist for n_filler <= {len(KEYWORD_FILLERS)} and n_keywords <= "
            f"{len(KEYWORD_POSITIVE)}, received n_filler={n_filler}, n_keywords={n_kw}"
        )
    return n_filler, n_kw


def keyword_vocabulary(task: Task) -> tuple[str, ...]:
    """Word label of every token id of a :func:`~attn_utils.harness.keyword_task` (fillers, positive, negative, CLS)."""
    n_filler, n_kw = _keyword_options(task)
    return KEYWORD_FILLERS[:n_filler] + KEYWORD_POSITIVE[:n_kw] + KEYWORD_NEGATIVE[:n_kw] + (CLS_WORD,)


def words_to_ids(words, task: Task) -> np.ndarray:
    """Token ids ``(n,)`` for a sentence of ``n − 1`` words; ``[CLS]`` is appended.

    The sentence must contain exactly one keyword (the task's format); unknown words raise.
    """
    vocab = keyword_vocabulary(task)
    words = list(words)
    n = task.seq_len
    if len(words) != n - 1:
        raise ValueError(f"words must hold n − 1 = {n - 1} words for this task, received {len(words)}")
    index = {w: i for i, w in enumerate(vocab[:-1])}
    unknown = [w for w in words if w not in index]
    if unknown:
        raise ValueError(f"unknown words {unknown}; known: {vocab[:-1]}")
    ids = np.array([index[w] for w in words] + [len(vocab) - 1], dtype=np.int64)
    n_keywords = int(((ids >= task.options["n_filler"]) & (ids < len(vocab) - 1)).sum())
    if n_keywords != 1:
        raise ValueError(f"a keyword sentence needs exactly one keyword, received {n_keywords}: {words}")
    return ids


def ids_to_words(x, task: Task) -> list:
    """Word labels for token ids ``x`` of any shape (nested lists of the same shape)."""
    vocab = keyword_vocabulary(task)
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer) or (x.size and (x.min() < 0 or x.max() >= len(vocab))):
        raise ValueError(f"x must hold token ids in [0, {len(vocab)}), received {x.dtype} array")
    return np.array(vocab, dtype=object)[x].tolist()


def keyword_attention_mass(weights, keyword_pos) -> np.ndarray:
    """Attention the read-out (last) position puts on the keyword, averaged over heads.

    weights : ``(S, batch, H, n, n)`` (one layer from :func:`~attn_utils.harness.training.attention_weights`);
    keyword_pos : ``(batch,)`` or ``(S, batch)`` ints (``info["keyword_pos"]``). Returns ``(S, batch)``.
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must have shape (S, batch, H, n, n), received shape {w.shape}")
    S, B, n = w.shape[0], w.shape[1], w.shape[-1]
    pos = np.asarray(keyword_pos)
    if not np.issubdtype(pos.dtype, np.integer):
        raise TypeError(f"keyword_pos must hold integers, received dtype {pos.dtype}")
    try:
        pos = np.broadcast_to(pos, (S, B))
    except ValueError:
        raise ValueError(f"keyword_pos must have shape ({B},) or ({S}, {B}), received shape {pos.shape}") from None
    if pos.min() < 0 or pos.max() >= n:
        raise ValueError(f"keyword_pos must lie in [0, {n}), received range [{pos.min()}, {pos.max()}]")
    last_row = w[:, :, :, -1, :].mean(axis=2)  # (S, batch, n)
    return np.take_along_axis(last_row, pos[:, :, None], axis=2)[:, :, 0]


def with_uniform_attention(params: dict, config) -> dict:
    """A copy of trained ``params`` whose every attention row is uniform: ``W_Q = 0``.

    With zero queries all dot-product logits are 0, so softmax gives weight ``1/n`` to every
    key; values, output projection and read-out are untouched. This is a test-time ablation:
    it asks whether *this trained model* relies on its attention, not whether the task needs
    attention. (Wiegreffe & Pinter's uniform baseline is different: they *train* a model with
    its attention frozen uniform.) Needs ``score="dot"`` and softmax weights (true for the
    default :class:`~attn_utils.harness.training.ModelConfig`).
    """
    from ..harness.training import SCORES, ModelConfig

    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, received {type(config).__name__}")
    if config.encoder != "attention":
        raise ValueError(f"config.encoder must be 'attention', received {config.encoder!r}")
    if config.score != "dot" or SCORES[config.score].weights != "softmax":
        raise ValueError(f"zero queries give uniform weights only for the softmax dot score, received {config.score!r}")
    if not isinstance(params, dict) or "E" not in params:
        raise TypeError("params must be the dict returned by init_params / train")
    out = {key: np.array(val, copy=True) for key, val in params.items()}
    for layer in range(config.n_layers):
        key = f"L{layer}.W_q"
        if key not in out:
            raise ValueError(f"params has no {key!r}; was it trained with this config?")
        out[key] = np.zeros_like(out[key])
    return out


# --------------------------------------------------------------------------- convergence
def relative_loss_drop(loss, window: int) -> np.ndarray:
    """How much a training loss still falls over the second half of a run, per seed.

    loss : ``(steps, S)`` per-step training loss (``TrainResult.loss``); window : how many steps
    to average at each end (smooths the noise of fresh mini-batches), ``≤ steps // 2``.
    Returns ``(S,)``: ``1 − mean(last window) / mean(window ending at the midpoint)``. About 0
    for a converged run (a flat loss), 0.5 when the loss halved over the second half; negative
    when it rose.
    """
    arr = np.asarray(loss, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"loss must have shape (steps, S), received shape {arr.shape}")
    window = positive_int("window", window)
    half = arr.shape[0] // 2
    if window > half:
        raise ValueError(f"window must be <= steps // 2 = {half}, received {window}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("loss must be finite (a diverged run has no meaningful trend)")
    mid = arr[half - window : half].mean(axis=0)
    end = arr[-window:].mean(axis=0)
    return 1.0 - end / mid


__all__ = [
    "KEYWORD_FILLERS",
    "KEYWORD_POSITIVE",
    "KEYWORD_NEGATIVE",
    "CLS_WORD",
    "tokens_per_coordinate",
    "pack_tokens",
    "unpack_tokens",
    "fano_bits",
    "bag_accuracy_bound",
    "superposition_copy_accuracy",
    "linear_code_init",
    "linear_code_logits",
    "linear_code_loss_and_grad",
    "exact_positions",
    "CodeRun",
    "copy_tokens",
    "train_linear_code",
    "position_accuracy",
    "pick_learning_rate",
    "keyword_vocabulary",
    "words_to_ids",
    "ids_to_words",
    "keyword_attention_mass",
    "with_uniform_attention",
    "relative_loss_drop",
]
