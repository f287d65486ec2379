"""A small decoder-only Transformer, run three ways: in parallel, step by step, and with a KV cache.

The model (pre-LayerNorm, as in most current decoders; every part except attention acts on
each position separately)::

    x₀[t]   = E[y_t] + P[t]                                 token + learned position embedding
    u[t]    = x[t] + MHA(LN(x))[t]                          causal multi-head self-attention
    x'[t]   = u[t] + W₂ ReLU(W₁ LN(u[t]) + b₁) + b₂         position-wise MLP
    z[t]    = LN(x_L[t]) W_out                              logits over the vocabulary

``LN`` is layer normalisation without gain and bias. Shapes: tokens ``(..., n)`` (integers,
any leading batch axes), logits ``(..., n, vocab)``; cached keys and values
``(..., h, capacity, d_k)`` and ``(..., h, capacity, d_v)`` per layer.

* :func:`decoder_forward` — the parallel (teacher-forced) pass through
  :func:`attn_utils.multi_head_attention` with a causal mask: all positions at once.
* :func:`decoder_extend` — process ``m ≥ 1`` new positions against a :class:`KVCache`, appending
  their keys and values; ``m = 1`` is one decoding step, ``m = len(prompt)`` a prefill.
* :func:`greedy_generate` — greedy decoding, with the cache or by recomputing from scratch.
* :func:`decoding_macs` — matmul multiply-adds of processing ``m`` positions against ``n`` keys;
  the functions above can tally the multiply-adds they actually perform into a ``counter`` dict.
* :func:`products_only` — just the matrix products of a list of steps, on operands of the same
  shapes, to time them apart from everything else a step does.
* :func:`calls_only` — the same number of matmul calls on 1 × 1 operands: their fixed cost alone.
* :func:`kv_cache_values` — how many numbers a KV cache holds.

Cost convention (the book's): multiply-adds (MACs; 1 MAC = 2 FLOPs); only matrix products are
counted (softmax, layer norm, additions and the embedding lookup are lower order). Parts:
``"projections"`` (W_q, W_k, W_v, W_o), ``"attention"`` (q kᵀ and p v), ``"mlp"``, ``"readout"`` (W_out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..attention import causal_mask, scaled_dot_product_attention
from ..multihead import init_mha_params, merge_heads, multi_head_attention, split_heads
from ..validation import nonneg_int, positive_int

COST_PARTS = ("projections", "attention", "mlp", "readout")


@dataclass(frozen=True)
class DecoderParams:
    """Weights of the decoder.

    embed : (vocab, d_model); pos : (max_len, d_model); W_out : (d_model, vocab);
    layers : one dict per layer with ``W_q, W_k (d_model, h·d_k)``, ``W_v (d_model, h·d_v)``,
    ``W_o (h·d_v, d_model)``, ``W_1 (d_model, d_ff)``, ``b_1 (d_ff,)``, ``W_2 (d_ff, d_model)``,
    ``b_2 (d_model,)``; h : number of heads.
    """

    embed: np.ndarray
    pos: np.ndarray
    layers: tuple
    W_out: np.ndarray
    h: int

    @property
    def vocab(self) -> int:
        return self.embed.shape[0]

    @property
    def d_model(self) -> int:
        return self.embed.shape[1]

    @property
    def max_len(self) -> int:
        return self.pos.shape[0]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_ff(self) -> int:
        return self.layers[0]["W_1"].shape[1]

    @property
    def d_k(self) -> int:
        return self.layers[0]["W_q"].shape[1] // self.h

    @property
    def d_v(self) -> int:
        return self.layers[0]["W_v"].shape[1] // self.h


def init_decoder_params(
    rng: np.random.Generator, *, vocab: int, d_model: int, h: int, n_layers: int, d_ff: int, max_len: int
) -> DecoderParams:
    """Random decoder weights: attention as :func:`attn_utils.init_mha_params` (variance 1/fan_in),
    MLP and read-out with variance 1/fan_in, unit-variance token and position embeddings.

    ``d_k = d_v = d_model // h`` (``d_model`` must be divisible by ``h``).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    vocab, d_model, h = positive_int("vocab", vocab), positive_int("d_model", d_model), positive_int("h", h)
    n_layers, d_ff, max_len = (
        positive_int("n_layers", n_layers),
        positive_int("d_ff", d_ff),
        positive_int("max_len", max_len),
    )
    layers = []
    for _ in range(n_layers):
        layer = dict(init_mha_params(rng, d_model, h))  # attention weights, then the MLP weights beside them
        layer.update(
            W_1=rng.normal(0, d_model**-0.5, (d_model, d_ff)),
            b_1=np.zeros(d_ff),
            W_2=rng.normal(0, d_ff**-0.5, (d_ff, d_model)),
            b_2=np.zeros(d_model),
        )
        layers.append(layer)
    return DecoderParams(
        embed=rng.standard_normal((vocab, d_model)),
        pos=rng.standard_normal((max_len, d_model)),
        layers=tuple(layers),
        W_out=rng.normal(0, d_model**-0.5, (d_model, vocab)),
        h=h,
    )


# --------------------------------------------------------------------------- validation


def _check_params(params) -> DecoderParams:
    if not isinstance(params, DecoderParams):
        raise TypeError(f"params must be DecoderParams (from init_decoder_params), received {type(params).__name__}")
    return params


def _check_tokens(name: str, tokens, params: DecoderParams, *, max_len: int | None = None) -> np.ndarray:
    """Integer token ids ``(..., n)`` with ``0 ≤ id < vocab`` and ``1 ≤ n ≤ max_len``."""
    arr = np.asarray(tokens)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integer token ids, received dtype {arr.dtype}")
    if arr.ndim < 1 or arr.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., n) with n >= 1, received shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= params.vocab):
        raise ValueError(f"{name} ids must lie in [0, vocab={params.vocab}), received min {arr.min()}, max {arr.max()}")
    limit = params.max_len if max_len is None else max_len
    if arr.shape[-1] > limit:
        raise ValueError(f"{name} has n={arr.shape[-1]} positions, more than the {limit} allowed; shape {arr.shape}")
    return arr


def _tally(counter, part: str, macs: int) -> None:
    if counter is not None:
        counter[part] = counter.get(part, 0) + int(macs)


def _matmul_macs(a: np.ndarray, b: np.ndarray) -> int:
    """Multiply-adds of ``a @ b``: (rows of a, all batch axes included)·(shared axis)·(columns of b)."""
    return math.prod(a.shape[:-1]) * a.shape[-1] * b.shape[-1]


def _tally_projections(counter, a: np.ndarray, merged: np.ndarray, layer) -> None:
    """MACs of the four projections: q, k, v from ``a`` and the output from the merged heads."""
    macs = sum(_matmul_macs(a, layer[w]) for w in ("W_q", "W_k", "W_v")) + _matmul_macs(merged, layer["W_o"])
    _tally(counter, "projections", macs)


# --------------------------------------------------------------------------- position-wise parts


def _layer_norm(x, eps: float = 1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def _mlp(x, layer, counter):
    hidden = np.maximum(x @ layer["W_1"] + layer["b_1"], 0.0)
    _tally(counter, "mlp", _matmul_macs(x, layer["W_1"]) + _matmul_macs(hidden, layer["W_2"]))
    return hidden @ layer["W_2"] + layer["b_2"]


def _readout(x, params, counter):
    a = _layer_norm(x)
    _tally(counter, "readout", _matmul_macs(a, params.W_out))
    return a @ params.W_out


# --------------------------------------------------------------------------- parallel pass


def decoder_forward(params: DecoderParams, tokens, *, causal: bool = True, counter: dict | None = None) -> np.ndarray:
    """Logits for every position in one parallel pass (teacher forcing).

    tokens : int (..., n), n ≤ max_len → logits (..., n, vocab).
    ``causal=True`` applies the causal mask (position t sees positions ≤ t); ``causal=False``
    lets every position see every other one (an encoder-style, bidirectional pass).
    ``counter`` (dict, optional) accumulates the matmul multiply-adds performed, by part.
    """
    params = _check_params(params)
    tokens = _check_tokens("tokens", tokens, params)
    n = tokens.shape[-1]
    x = params.embed[tokens] + params.pos[:n]
    mask = causal_mask(n) if causal else None
    for layer in params.layers:
        a = _layer_norm(x)
        attn, weights = multi_head_attention(a, a, layer, params.h, mask=mask)
        _tally_projections(counter, a, attn, layer)
        # weights (..., h, n_q, n_k): each entry costs d_k multiply-adds in q kᵀ and d_v in p v
        _tally(counter, "attention", weights.size * (params.d_k + params.d_v))
        x = x + attn
        x = x + _mlp(_layer_norm(x), layer, counter)
    return _readout(x, params, counter)


# --------------------------------------------------------------------------- KV cache


class KVCache:
    """Preallocated keys and values of every layer for a batch of sequences.

    ``keys[l]`` : (*batch_shape, h, capacity, d_k), ``values[l]`` : (*batch_shape, h, capacity, d_v);
    positions ``0 … length − 1`` are filled. Appending one position writes one slice (O(h·d_k)).
    """

    def __init__(self, params: DecoderParams, batch_shape: tuple = (), capacity: int | None = None):
        params = _check_params(params)
        capacity = params.max_len if capacity is None else positive_int("capacity", capacity)
        if capacity > params.max_len:
            raise ValueError(f"capacity must be <= max_len={params.max_len}, received {capacity}")
        batch_shape = tuple(int(b) for b in batch_shape)
        if any(b < 1 for b in batch_shape):
            raise ValueError(f"batch_shape entries must be >= 1, received {batch_shape}")
        self.batch_shape, self.capacity, self.length = batch_shape, capacity, 0
        self.keys = [np.zeros((*batch_shape, params.h, capacity, params.d_k)) for _ in params.layers]
        self.values = [np.zeros((*batch_shape, params.h, capacity, params.d_v)) for _ in params.layers]

    @property
    def num_values(self) -> int:
        """Numbers stored for the filled positions: ``L · batch · length · h · (d_k + d_v)``."""
        return sum(math.prod(a.shape[:-2]) * self.length * a.shape[-1] for a in (*self.keys, *self.values))

    @property
    def nbytes(self) -> int:
        """Bytes allocated (all ``capacity`` positions, float64)."""
        return sum(a.nbytes for a in (*self.keys, *self.values))


def decoder_extend(params: DecoderParams, tokens_new, cache: KVCache, *, counter: dict | None = None) -> np.ndarray:
    """Process ``m`` new positions after the ``cache.length`` already cached ones.

    tokens_new : int (*cache.batch_shape, m) → logits (*cache.batch_shape, m, vocab) for the new
    positions. Their keys and values are appended to ``cache`` (``cache.length`` grows by ``m``).
    Past keys and values are read from the cache, never recomputed: one step (``m = 1``) at
    context length ``n`` costs O(n·d) attention work.
    """
    params = _check_params(params)
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, received {type(cache).__name__}")
    tokens_new = _check_tokens("tokens_new", tokens_new, params, max_len=cache.capacity - cache.length)
    if tokens_new.shape[:-1] != cache.batch_shape:
        raise ValueError(
            f"tokens_new must have shape (*batch_shape, m) with batch_shape={cache.batch_shape}, "
            f"received shape {tokens_new.shape}"
        )
    start, m = cache.length, tokens_new.shape[-1]
    end = start + m
    x = params.embed[tokens_new] + params.pos[start:end]
    mask = causal_mask(m, end) if m > 1 else None  # a single new query may see every cached key
    for l, layer in enumerate(params.layers):
        a = _layer_norm(x)
        q = split_heads(a @ layer["W_q"], params.h)
        cache.keys[l][..., start:end, :] = split_heads(a @ layer["W_k"], params.h)
        cache.values[l][..., start:end, :] = split_heads(a @ layer["W_v"], params.h)
        keys, values = cache.keys[l][..., :end, :], cache.values[l][..., :end, :]
        heads, _ = scaled_dot_product_attention(q, keys, values, mask=mask)
        merged = merge_heads(heads)
        _tally_projections(counter, a, merged, layer)
        _tally(
            counter,
            "attention",
            _matmul_macs(q, np.swapaxes(keys, -1, -2)) + math.prod(q.shape[:-1]) * end * values.shape[-1],
        )
        x = x + merged @ layer["W_o"]
        x = x + _mlp(_layer_norm(x), layer, counter)
    cache.length = end
    return _readout(x, params, counter)


# --------------------------------------------------------------------------- generation


def greedy_generate(
    params: DecoderParams, prompt, n_new: int, *, use_cache: bool = True, counter: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decoding: append ``argmax`` of the last logits, ``n_new`` times.

    prompt : int (..., p) → ``(tokens (..., p + n_new), logits (..., n_new, vocab))``, where
    ``logits[..., i, :]`` produced token ``p + i``. With ``use_cache`` the prompt is processed in
    one parallel prefill and each later step feeds one token through :func:`decoder_extend`;
    without, every step reruns :func:`decoder_forward` on the whole sequence so far.
    Requires ``p + n_new − 1 ≤ max_len`` (the last token is produced, never fed back).
    """
    params = _check_params(params)
    n_new = positive_int("n_new", n_new)
    prompt = _check_tokens("prompt", prompt, params)
    total = prompt.shape[-1] + n_new - 1
    if total > params.max_len:
        raise ValueError(
            f"prompt length {prompt.shape[-1]} + n_new {n_new} − 1 = {total} exceeds max_len={params.max_len}"
        )
    tokens, step_logits = prompt, []
    if use_cache:
        cache = KVCache(params, prompt.shape[:-1], capacity=total)
        logits = decoder_extend(params, prompt, cache, counter=counter)[..., -1, :]
    else:
        logits = decoder_forward(params, prompt, counter=counter)[..., -1, :]
    for i in range(n_new):
        step_logits.append(logits)
        nxt = np.argmax(logits, axis=-1)[..., None]
        tokens = np.concatenate([tokens, nxt], axis=-1)
        if i < n_new - 1:
            if use_cache:
                logits = decoder_extend(params, nxt, cache, counter=counter)[..., -1, :]
            else:
                logits = decoder_forward(params, tokens, counter=counter)[..., -1, :]
    return tokens, np.stack(step_logits, axis=-2)


# --------------------------------------------------------------------------- cost formulas


def decoding_macs(params: DecoderParams, m: int, n: int, *, readout: int | None = None, batch: int = 1) -> dict:
    """Matmul multiply-adds (MACs; 1 MAC = 2 FLOPs) of pushing ``m`` positions through the decoder
    whose attention covers ``n`` keys, as :func:`decoder_forward` (``m = n``) and
    :func:`decoder_extend` (``m`` new positions, ``n`` = cached + new) compute them.

    Per layer: projections ``m·d·h(2d_k + d_v) + m·h·d_v·d``; attention ``m·n·h(d_k + d_v)``
    (the full ``m × n`` score block, masked entries included); MLP ``2m·d·d_ff``. Read-out
    ``readout·d·vocab`` with ``readout`` (positions read out) defaulting to ``m``. Everything
    is multiplied by ``batch``. Returns a dict with the parts of ``COST_PARTS`` and ``"total"``.
    """
    params = _check_params(params)
    m, n, batch = positive_int("m", m), positive_int("n", n), positive_int("batch", batch)
    if n < m:
        raise ValueError(f"n (keys) must be >= m (new positions), received m={m}, n={n}")
    readout = m if readout is None else nonneg_int("readout", readout)
    d, h, d_k, d_v, L = params.d_model, params.h, params.d_k, params.d_v, params.n_layers
    parts = {
        "projections": L * (m * d * h * (2 * d_k + d_v) + m * h * d_v * d),
        "attention": L * m * n * h * (d_k + d_v),
        "mlp": L * 2 * m * d * params.d_ff,
        "readout": readout * d * params.vocab,
    }
    parts = {k: batch * v for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def _product_operands(params: DecoderParams, steps, rng: np.random.Generator, *, tiny: bool) -> list:
    """Operand pairs of the matrix products of ``steps`` (see :func:`products_only`); with ``tiny``
    every operand is shrunk to one entry per matrix (batched products keep their ``h`` axis)."""
    params = _check_params(params)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, received {type(rng).__name__}")
    h, d_k, d_v = params.h, params.d_k, params.d_v

    def rand(*shape):  # a random operand of this shape, or of (*batch axes, 1, 1) with tiny
        return rng.standard_normal((*shape[:-2], 1, 1) if tiny else shape)

    def weight(w):
        return rng.standard_normal((1, 1)) if tiny else w

    pairs = []
    for m, n in steps:
        m, n = positive_int("m", m), positive_int("n", n)
        if n < m:
            raise ValueError(f"n (keys) must be >= m (new positions), received m={m}, n={n}")
        for layer in params.layers:
            a = rand(m, params.d_model)
            pairs += [(a, weight(layer["W_q"])), (a, weight(layer["W_k"])), (a, weight(layer["W_v"]))]
            pairs.append((rand(h, m, d_k), rand(h, d_k, n)))  # q kᵀ
            pairs.append((rand(h, m, n), rand(h, n, d_v)))  # p v
            pairs.append((rand(m, h * d_v), weight(layer["W_o"])))
            pairs += [(a, weight(layer["W_1"])), (rand(m, params.d_ff), weight(layer["W_2"]))]
        pairs.append((rand(m, params.d_model), weight(params.W_out)))
    return pairs


def products_only(params: DecoderParams, steps, rng: np.random.Generator):
    """Just the matrix products of a sequence of decoder steps, to time them apart from the rest.

    steps : iterable of ``(m, n)`` pairs, one per call of :func:`decoder_extend` (``m`` new
    positions against ``n`` keys; ``(n, n)`` is the parallel pass). Returns ``(run, macs)``:
    ``run()`` performs, with the decoder's own weight matrices and random operands of the shapes
    the step would have (batch 1), exactly the products whose MACs :func:`decoding_macs` counts,
    in the same order and nothing else (no embedding, layer norm, softmax, mask, residual,
    validation or cache writes); ``macs`` is their multiply-adds, counted from the operands.
    """
    pairs = _product_operands(params, steps, rng, tiny=False)
    macs = sum(_matmul_macs(a, b) for a, b in pairs)

    def run() -> None:
        for a, b in pairs:
            np.matmul(a, b)

    return run, macs


def calls_only(params: DecoderParams, steps, rng: np.random.Generator):
    """The same ``np.matmul`` calls as :func:`products_only`, each on operands of one entry per matrix.

    Returns ``(run, calls)``: ``run()`` makes as many calls as the products of ``steps`` have, in
    the same order and with the same number of axes (the per-head products keep their ``h``
    axis), but every matrix is 1 × 1, so the time of ``run()`` is the fixed cost of the calls
    with almost no arithmetic and no data to move; ``calls`` is how many calls it makes.
    """
    pairs = _product_operands(params, steps, rng, tiny=True)

    def run() -> None:
        for a, b in pairs:
            np.matmul(a, b)

    return run, len(pairs)


def kv_cache_values(n_layers: int, n_ctx: int, h_kv: int, d_k: int, d_v: int | None = None, batch: int = 1) -> int:
    """Numbers a KV cache holds: ``batch · n_layers · n_ctx · h_kv · (d_k + d_v)``.

    ``h_kv`` is the number of key/value heads: ``h`` for multi-head attention, 1 for multi-query
    attention, in between for grouped-query attention. ``d_v`` defaults to ``d_k``; with
    ``h_kv·d_k = h_kv·d_v = d_model`` this is ``2·L·n·d_model`` per sequence.
    """
    d_k = positive_int("d_k", d_k)
    d_v = d_k if d_v is None else positive_int("d_v", d_v)
    return (
        positive_int("batch", batch)
        * positive_int("n_layers", n_layers)
        * nonneg_int("n_ctx", n_ctx)
        * positive_int("h_kv", h_kv)
        * (d_k + d_v)
    )


__all__ = [
    "COST_PARTS",
    "DecoderParams",
    "init_decoder_params",
    "decoder_forward",
    "KVCache",
    "decoder_extend",
    "greedy_generate",
    "decoding_macs",
    "products_only",
    "calls_only",
    "kv_cache_values",
]
