"""Chapter 15: inference arithmetic — KV-cache bytes, grouped K/V heads, prefill vs decode.

* :class:`TransformerConfig` — a decoder's shape (layers, heads, key/value heads, widths) and what
  follows from it: cache numbers per token, weight count, bytes.
* :data:`CONFIGS` — published configurations (each with its source); :data:`RELEASED_PARAMS` — the
  parameter counts of the released checkpoints; :data:`A100_SXM_80GB`, :data:`H100_SXM_80GB` — the
  datasheet figures used for the roofline.
* :func:`init_stand_in`, :class:`GroupedKVCache`, :func:`run_positions` — a small decoder with
  grouped K/V heads that really runs: it fills a KV cache (stored in a chosen dtype, so its arrays
  have the bytes a server would hold) and tallies, per executed product, the multiply-adds and the
  bytes of every operand and result (:class:`Traffic`).
* :func:`step_cost` — the same tallies as formulas of the configuration, for models too large to run;
  :func:`ridge_batch` — the smallest decoding batch whose step reaches the ridge point (if any does).

Cost model (one "step" processes ``m`` new positions of each of ``B`` sequences whose caches hold
``n_prev`` positions; ``m = 1`` is a decoding step, ``n_prev = 0, m = n`` a prefill): every matrix
product reads its two operands from memory once and writes its result once; attention is one fused
operation (as in FlashAttention) that reads q, the cached K and V, and writes its output, so the
scores never travel to memory. Multiply-adds (MACs) are counted the book's way: a product
``(..., p, r) @ (..., r, s)`` is ``size(result)·r`` MACs; 1 MAC = 2 FLOPs.

Counted: the q, k, v and output projections; attention over every cached position (q·k and
weights·v, all ``m × n`` pairs, the causally masked ones included, as a dense kernel computes
them); the MLP; the read-out, for the last position of each sequence only. Not counted: the input
embedding lookup (one row per token, no multiply-adds), norms, softmax, activation, residual
additions and positional rotations (element-wise, assumed fused into the products).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..book.measuring import count_macs, counted_matmul
from ..multihead import group_size, grouped_attention, merge_heads, split_heads
from ..validation import nonneg_int, positive_int


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a decoder-only Transformer (or of the decoder of an encoder–decoder one).

    n_layers L; d_model d; h query heads; h_kv key/value heads (h for multi-head attention);
    d_k per-head size of queries, keys and values (d_v = d_k); d_ff hidden width of the MLP, which
    has ``mlp_matrices`` weight matrices of d × d_ff (2 for ReLU/GELU, 3 for SwiGLU); vocab size
    (untied input and output embeddings); ``norms_per_layer`` gain vectors of size d per layer and
    one final norm. ``source`` says where the numbers come from.
    """

    name: str
    n_layers: int
    d_model: int
    h: int
    h_kv: int
    d_k: int
    d_ff: int = 0
    vocab: int = 0
    mlp_matrices: int = 2
    norms_per_layer: int = 2
    source: str = ""

    def __post_init__(self):
        for name in ("n_layers", "d_model", "h", "h_kv", "d_k"):
            positive_int(name, getattr(self, name))
        for name in ("d_ff", "vocab", "mlp_matrices", "norms_per_layer"):
            nonneg_int(name, getattr(self, name))
        group_size(self.h, self.h_kv)

    @property
    def g(self) -> int:
        """Query heads per key/value head, ``h / h_kv``."""
        return self.h // self.h_kv

    def kv_numbers_per_token(self) -> int:
        """Numbers cached per token: ``2·L·h_kv·d_k`` (a key and a value per layer and K/V head)."""
        return 2 * self.n_layers * self.h_kv * self.d_k

    def kv_bytes(self, n_tokens: int = 1, bytes_per_number: int = 2, batch: int = 1) -> int:
        """Bytes of the cache of ``batch`` sequences of ``n_tokens`` tokens: ``2·L·h_kv·d_k·b·B·n``."""
        return (
            self.kv_numbers_per_token()
            * nonneg_int("n_tokens", n_tokens)
            * positive_int("bytes_per_number", bytes_per_number)
            * positive_int("batch", batch)
        )

    def layer_matmul_weights(self) -> int:
        """Weights one layer multiplies by: ``d·h·d_k + 2·d·h_kv·d_k + h·d_k·d + M·d·d_ff``."""
        d, dk = self.d_model, self.d_k
        return d * self.h * dk + 2 * d * self.h_kv * dk + self.h * dk * d + self.mlp_matrices * d * self.d_ff

    def matmul_weights(self) -> int:
        """Weights a step multiplies by: all layers plus the read-out ``d × vocab``."""
        return self.n_layers * self.layer_matmul_weights() + self.d_model * self.vocab

    def param_count(self) -> int:
        """All parameters: the matmul weights, the input embedding and the norm gains."""
        if not (self.d_ff and self.vocab):
            raise ValueError(f"{self.name}: param_count needs d_ff and vocab, received {self.d_ff}, {self.vocab}")
        norms = (self.n_layers * self.norms_per_layer + 1) * self.d_model
        return self.matmul_weights() + self.vocab * self.d_model + norms

    def with_kv_heads(self, h_kv: int) -> TransformerConfig:
        """The same model with ``h_kv`` key/value heads."""
        kw = {k: getattr(self, k) for k in self.__dataclass_fields__}
        kw.update(name=f"{self.name}, h_kv={h_kv}", h_kv=h_kv)
        return TransformerConfig(**kw)


VASWANI = "Vaswani et al. 2017, arXiv:1706.03762 v5, Table 3 (base model)"
LLAMA2 = "Touvron et al. 2023, arXiv:2307.09288 (GQA for 34B/70B); Hugging Face model card config.json"
MISTRAL = "Jiang et al. 2023, arXiv:2310.06825, Table 1 (Mistral 7B v0.1)"

CONFIGS = {
    "transformer-base": TransformerConfig("Transformer base (decoder)", 6, 512, 8, 8, 64, d_ff=2048, source=VASWANI),
    "llama-2-7b": TransformerConfig(
        "Llama 2 7B", 32, 4096, 32, 32, 128, d_ff=11008, vocab=32000, mlp_matrices=3, source=LLAMA2
    ),
    "llama-2-70b": TransformerConfig(
        "Llama 2 70B", 80, 8192, 64, 8, 128, d_ff=28672, vocab=32000, mlp_matrices=3, source=LLAMA2
    ),
    "mistral-7b": TransformerConfig(
        "Mistral 7B v0.1", 32, 4096, 32, 8, 128, d_ff=14336, vocab=32000, mlp_matrices=3, source=MISTRAL
    ),
}
"""Published configurations. Transformer base: L = 6 decoder layers, d_model = 512, h = 8, d_k = 64,
d_ff = 2048. Llama 2 7B / 70B and Mistral 7B: SwiGLU MLP (3 matrices), vocabulary 32000, untied
embeddings, two RMSNorm gains per layer. Mistral 7B is its first release, v0.1 (the one with a sliding
window of 4096 positions); later releases changed the context length and dropped the window."""

RELEASED_PARAMS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-70b": 68_976_648_192,
    "mistral-7b": 7_241_732_096,
}
"""Parameters of the released Hugging Face checkpoints (meta-llama/Llama-2-7b-hf, Llama-2-70b-hf,
mistralai/Mistral-7B-v0.1): the parameter count ``transformers`` reports for them (``num_parameters()``).
Mistral's index file gives 14,483,464,192 bytes in bfloat16, twice its count. The Llama 2 weight files
hold more than the parameters: each layer also stores its rotary ``inv_freq`` buffer (64 float32
numbers), so their index totals exceed twice the count by 32 (7B) and 80 (70B) such buffers. An
independent record to compare :meth:`TransformerConfig.param_count` with."""

GiB = 2**30

A100_SXM_80GB = {
    "name": "NVIDIA A100 SXM 80GB",
    "peak_flops": 312e12,  # dense BF16/FP16 Tensor Core FLOP/s (624e12 is the 2:4-sparsity figure)
    "bandwidth": 2.039e12,  # HBM2e bytes/s
    "memory": 80 * GiB,  # bytes: the "80GB" of memory is 80 GiB = 85.9e9 bytes (capacities count in powers of 2)
    "source": "NVIDIA A100 Tensor Core GPU datasheet (document 1758950-r4, 2021)",
}

H100_SXM_80GB = {
    "name": "NVIDIA H100 SXM 80GB",
    "peak_flops": 989e12,  # dense BF16/FP16 Tensor Core FLOP/s (the datasheet's 1,979e12 assumes 2:4 sparsity)
    "bandwidth": 3.35e12,  # HBM3 bytes/s
    "memory": 80 * GiB,  # bytes (80 GB of HBM3, counted like the A100's)
    "source": "NVIDIA H100 Tensor Core GPU datasheet, 2023 edition (lists H100 SXM and H100 NVL)",
}


def ridge_point(hardware: dict) -> float:
    """Arithmetic intensity (FLOPs per byte) above which the roofline is flat: peak / bandwidth."""
    return hardware["peak_flops"] / hardware["bandwidth"]


def attainable_flops(intensity, hardware: dict):
    """Roofline: ``min(peak, intensity · bandwidth)`` FLOP/s."""
    return np.minimum(hardware["peak_flops"], np.asarray(intensity, float) * hardware["bandwidth"])


# ---------------------------------------------------------------- formulas


def step_cost(cfg: TransformerConfig, batch: int, m: int, n_prev: int, bytes_per_number: int = 2) -> dict:
    """MACs and bytes moved by one step (module docstring), as formulas of the configuration.

    What is and is not counted: module docstring. Returns ``macs`` (all products), ``attn_macs``
    (q·k and weights·v only), ``weight_bytes``,
    ``cache_bytes`` (the keys and values attention reads: all ``n_prev + m`` positions),
    ``act_bytes`` (every other operand and result), ``bytes`` (their sum) and ``intensity``
    (FLOPs per byte, ``2·macs / bytes``). The read-out is applied to the last position only.
    """
    B, m, n_prev = positive_int("batch", batch), positive_int("m", m), nonneg_int("n_prev", n_prev)
    b = positive_int("bytes_per_number", bytes_per_number)
    L, d, h, h_kv, dk, dff, M, V = (
        cfg.n_layers, cfg.d_model, cfg.h, cfg.h_kv, cfg.d_k, cfg.d_ff, cfg.mlp_matrices, cfg.vocab,
    )  # fmt: skip
    n, T = n_prev + m, B * m
    attn_macs = L * B * h * m * n * 2 * dk
    macs = L * T * cfg.layer_matmul_weights() + attn_macs + B * d * V
    weight_bytes = b * cfg.matmul_weights()
    cache_bytes = b * L * B * 2 * h_kv * n * dk
    act_per_layer = T * (4 * d + 4 * h * dk + 2 * h_kv * dk + (M * (d + dff) if dff else 0))
    act_bytes = b * (L * act_per_layer + (B * (d + V) if V else 0))
    total = weight_bytes + cache_bytes + act_bytes
    return {
        "macs": macs,
        "attn_macs": attn_macs,
        "weight_bytes": weight_bytes,
        "cache_bytes": cache_bytes,
        "act_bytes": act_bytes,
        "bytes": total,
        "intensity": 2 * macs / total,
    }


def max_batch(cfg: TransformerConfig, n_ctx: int, memory_bytes: float, bytes_per_number: int = 2) -> int:
    """Most sequences of ``n_ctx`` tokens whose caches fit in memory beside the weights (0 if none)."""
    free = memory_bytes - bytes_per_number * cfg.param_count()
    return max(0, int(free // cfg.kv_bytes(n_ctx, bytes_per_number)))


def ridge_batch(cfg: TransformerConfig, n_ctx: int, hardware: dict, bytes_per_number: int = 2) -> int | None:
    """Smallest batch ``B`` whose decoding step at context ``n_ctx`` reaches the ridge point, or None.

    A decoding step of ``B`` sequences does ``B·f`` FLOPs and moves ``D_w + B·c`` bytes (:func:`step_cost`
    with ``m = 1``: ``f`` FLOPs and ``c`` cache and activation bytes per sequence, ``D_w`` weight bytes), so
    its intensity ``B·f / (D_w + B·c)`` reaches the ridge ``r`` exactly when ``B·(f − r·c) ≥ r·D_w``:
    never if ``f ≤ r·c`` (the limit ``f/c`` as ``B → ∞`` is at or below the ridge), else from
    ``B = ⌈r·D_w / (f − r·c)⌉``. Computed in exact rational arithmetic.
    """
    one = step_cost(cfg, 1, 1, n_ctx - 1, bytes_per_number)
    f = 2 * one["macs"]
    c = one["cache_bytes"] + one["act_bytes"]
    r = Fraction(int(hardware["peak_flops"]), int(hardware["bandwidth"]))
    if f <= r * c:
        return None
    return math.ceil(r * one["weight_bytes"] / (f - r * c))


# ---------------------------------------------------------------- a decoder that runs and counts


@dataclass
class Traffic:
    """Tallies of executed work: multiply-adds and bytes by kind (module docstring)."""

    macs: int = 0
    attn_macs: int = 0
    weight_bytes: int = 0
    cache_bytes: int = 0
    act_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.cache_bytes + self.act_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: ``2·macs / bytes``."""
        return 2 * self.macs / self.bytes


@dataclass
class StandIn:
    """Weights of a runnable decoder with the shape of ``cfg`` (random values; stored in ``dtype``).

    ``layers`` : one dict per layer (``W_q, W_k, W_v, W_o`` and the MLP matrices ``W_1 … W_M``);
    with ``tie_layers`` all layers share one dict (the cache and the tallies do not depend on the
    values of the weights, and a model with the real widths then fits in memory).
    """

    cfg: TransformerConfig
    layers: list
    W_out: np.ndarray | None
    dtype: np.dtype = field(default=np.dtype(np.float16))


def init_stand_in(rng: np.random.Generator, cfg: TransformerConfig, dtype=np.float16, tie_layers=False) -> StandIn:
    """Random weights (variance 1/fan_in) with the shapes of ``cfg``, stored in ``dtype``."""
    dtype = np.dtype(dtype)
    d, dk = cfg.d_model, cfg.d_k

    def w(rows, cols):
        return rng.normal(0, rows**-0.5, (rows, cols)).astype(dtype)

    def layer():
        p = {"W_q": w(d, cfg.h * dk), "W_k": w(d, cfg.h_kv * dk), "W_v": w(d, cfg.h_kv * dk), "W_o": w(cfg.h * dk, d)}
        if cfg.d_ff:
            for i in range(cfg.mlp_matrices - 1):
                p[f"W_{i + 1}"] = w(d, cfg.d_ff)
            p[f"W_{cfg.mlp_matrices}"] = w(cfg.d_ff, d)
        return p

    layers = [layer()] * cfg.n_layers if tie_layers else [layer() for _ in range(cfg.n_layers)]
    return StandIn(cfg, layers, w(d, cfg.vocab) if cfg.vocab else None, dtype)


class GroupedKVCache:
    """Keys and values of every layer, ``(B, h_kv, n, d_k)`` per layer, in the model's storage dtype.

    The arrays are the outputs of the key and value projections, split into ``h_kv`` heads and
    appended position by position; :attr:`nbytes` is what they occupy.

    ``window = W`` means sliding-window attention: a query at position ``t`` sees positions
    ``t − W + 1 … t`` only. With ``rolling=True`` (a rolling buffer, as in Mistral 7B) the cache
    then keeps only the last ``W`` positions; with ``rolling=False`` it keeps everything and the
    window is applied by the mask alone (the reference the rolling buffer must equal).
    """

    def __init__(self, n_layers: int, window: int | None = None, rolling: bool = True):
        self.keys: list = [None] * positive_int("n_layers", n_layers)
        self.values: list = [None] * n_layers
        self.window = None if window is None else positive_int("window", window)
        self.rolling = bool(rolling)
        self.position = 0  # absolute position of the next token
        self.start = 0  # absolute position of the first cached entry

    @property
    def length(self) -> int:
        """Positions held in the cache."""
        return 0 if self.keys[0] is None else self.keys[0].shape[-2]

    def mask(self, m: int, n: int) -> np.ndarray:
        """Boolean (m, n): new position ``i`` (absolute ``position + i``) may see cached entry ``j``."""
        q_pos = self.position + np.arange(m)[:, None]
        k_pos = self.start + np.arange(n)[None, :]
        keep = k_pos <= q_pos
        if self.window is not None:
            keep &= k_pos > q_pos - self.window
        return keep

    def finish_step(self, m: int):
        """Advance by ``m`` positions; a rolling buffer drops entries no future query can see."""
        self.position += m
        if self.window is not None and self.rolling and self.length > self.window:
            drop = self.length - self.window
            self.keys = [k[..., drop:, :] for k in self.keys]  # views: copy so nbytes is what is kept
            self.keys = [np.ascontiguousarray(k) for k in self.keys]
            self.values = [np.ascontiguousarray(v[..., drop:, :]) for v in self.values]
            self.start += drop

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values) if a is not None)

    def append(self, layer: int, k: np.ndarray, v: np.ndarray):
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = np.concatenate([self.keys[layer], k], axis=-2)
            self.values[layer] = np.concatenate([self.values[layer], v], axis=-2)
        return self.keys[layer], self.values[layer]


def _matmul(t: Traffic | None, a: np.ndarray, w: np.ndarray, dtype) -> np.ndarray:
    """``a @ w`` computed in float32 and stored in ``dtype``; tallies MACs, the weight and a/result bytes."""
    out = (a.astype(np.float32) @ w.astype(np.float32)).astype(dtype)
    if t is not None:
        t.macs += out.size * a.shape[-1]
        t.weight_bytes += w.nbytes
        t.act_bytes += a.nbytes + out.nbytes
    return out


def counted_grouped_attention(q, k, v, mask=None) -> tuple[np.ndarray, int]:
    """Grouped-query attention (:func:`~attn_utils.multihead.grouped_attention`, the core) and the
    multiply-adds its two products execute, counted as they run, not from a formula.

    q : (..., h, n_q, d_k); k, v : (..., h_kv, n_k, d_k); mask : bool, broadcastable to
    (..., h, n_q, n_k). Returns ``(output (..., h, n_q, d_v), macs)``.
    """
    with count_macs() as counter:
        out, _ = grouped_attention(q, k, v, mask, matmul=counted_matmul)
    return out, counter.macs


def _rms(x):
    x = x.astype(np.float32)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def run_positions(model: StandIn, x_new, cache: GroupedKVCache, traffic: Traffic | None = None) -> np.ndarray:
    """Process ``m`` new positions of ``B`` sequences against ``cache``; return the last position's logits.

    x_new : (B, m, d_model) input vectors of the new positions (they stand in for token embeddings).
    Each layer (pre-norm): q, k, v projections; k and v split into ``h_kv`` heads and appended to
    the cache; grouped attention of the ``h`` query heads over the cached positions (causal among
    the new ones, and within the cache's sliding window if it has one: :meth:`GroupedKVCache.mask`);
    output projection; MLP (ReLU for 2 matrices, SwiGLU for 3); residuals.
    Returns logits (B, vocab) of the last new position (or its hidden state if ``vocab = 0``).
    """
    cfg, dt = model.cfg, model.dtype
    x = np.asarray(x_new, np.float32)
    if x.ndim != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"x_new must have shape (B, m, d_model={cfg.d_model}), received {x.shape}")
    m = x.shape[1]
    for l, p in enumerate(model.layers):
        a = _rms(x).astype(dt)
        q = split_heads(_matmul(traffic, a, p["W_q"], dt), cfg.h)
        k_new = split_heads(_matmul(traffic, a, p["W_k"], dt), cfg.h_kv).astype(dt)
        v_new = split_heads(_matmul(traffic, a, p["W_v"], dt), cfg.h_kv).astype(dt)
        k, v = cache.append(l, k_new, v_new)
        n = k.shape[-2]
        o, macs = counted_grouped_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                                            mask=cache.mask(m, n))  # fmt: skip
        o = merge_heads(o).astype(dt)
        if traffic is not None:  # one fused op: reads q and the cached K, V; writes o
            traffic.macs += macs  # executed by the two products of the attention kernel
            traffic.attn_macs += macs
            traffic.act_bytes += q.nbytes + o.nbytes
            traffic.cache_bytes += k.nbytes + v.nbytes  # the cache arrays the kernel was given
        x = x + _matmul(traffic, o, p["W_o"], dt).astype(np.float32)
        if cfg.d_ff:
            a = _rms(x).astype(dt)
            if cfg.mlp_matrices == 3:
                gate = _matmul(traffic, a, p["W_1"], dt).astype(np.float32)
                up = _matmul(traffic, a, p["W_2"], dt).astype(np.float32)
                hidden = (gate / (1 + np.exp(-gate)) * up).astype(dt)
            else:
                hidden = a
                for i in range(1, cfg.mlp_matrices):
                    hidden = np.maximum(_matmul(traffic, hidden, p[f"W_{i}"], dt), 0)
            x = x + _matmul(traffic, hidden, p[f"W_{cfg.mlp_matrices}"], dt).astype(np.float32)
    cache.finish_step(m)
    last = _rms(x[:, -1]).astype(dt)
    if model.W_out is None:
        return last
    return _matmul(traffic, last, model.W_out, dt)


__all__ = [
    "TransformerConfig",
    "CONFIGS",
    "RELEASED_PARAMS",
    "A100_SXM_80GB",
    "H100_SXM_80GB",
    "ridge_point",
    "attainable_flops",
    "step_cost",
    "max_batch",
    "ridge_batch",
    "Traffic",
    "StandIn",
    "init_stand_in",
    "GroupedKVCache",
    "run_positions",
    "counted_grouped_attention",
]
