"""Chapter 13: masks — padding, fill values in 16-bit types, fully masked rows, masked decoding.

* :func:`round_to_bfloat16`, :func:`round_to` — emulate storing numbers in float16 or bfloat16
  (numpy has float16 but no bfloat16: bfloat16 keeps the top 16 bits of a float32).
* :func:`padding_keep` — the boolean ``(B, n)`` "real token" mask of right- or left-padded sequences.
* :func:`framework_softmax` — a masked softmax as a framework computes it: the mask applied in the
  storage type (fill value or additive bias, rounded to that type), then a plain max-subtracted
  softmax with no special case for a row with nothing left (so such a row gives NaN with ``-inf``).
* :func:`masked_attention` — attention with a boolean mask under a fully-masked-row *policy*:
  ``"zero"`` (the book's, :func:`attn_utils.scaled_dot_product_attention`) or ``"naive"`` (0/0 = NaN).
* :func:`token_loss` — a per-token loss of one self-attention layer over a padded batch, written
  with autograd so that gradients with respect to the inputs can be inspected;
  :func:`losses_against_real_keys` — the same layer's per-position losses computed without masks.
* :func:`stack_forward`, :func:`cached_decode` — a stack of residual self-attention layers over a
  padded batch, all positions at once and token by token with a KV cache; both run the layers through
  :func:`attend_with_cache`, new positions against cached keys and values under any boolean mask, with
  rotary positions optional (the rotation is passed in, e.g. chapter 14's ``rope``: an experiment module
  imports only earlier chapters).
* :func:`document_mask`, :func:`packed_positions`, :func:`packed_targets` — packing several documents
  into one row; :func:`prefix_lm_mask`; :func:`tree_mask`, :func:`tree_depths` — verifying a tree of
  draft tokens against a KV cache (a chain of ``k`` drafts is ``causal_mask(k, c + k)``).

Masks are boolean with ``True`` = may attend (keep), as everywhere in the book.
"""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np

from ..attention import causal_mask, scaled_dot_product_attention
from ..multihead import merge_heads, split_heads
from ..softmax import log_softmax_core, softmax_core

DTYPES = ("float32", "float16", "bfloat16")


def round_to_bfloat16(x) -> np.ndarray:
    """Round to the nearest bfloat16 (ties to even); returns float32 holding bfloat16 values.

    bfloat16 is the top half of a float32: 1 sign bit, the same 8 exponent bits (so the same
    range), and 7 of the 23 fraction bits. Rounding adds ``0x7FFF`` plus the lowest kept bit to
    the 32-bit pattern and clears the low 16 bits; values beyond the largest bfloat16 become ±inf
    (including the tie halfway to 2^128), NaN stays NaN. Input is first converted to float32, so a
    float64 input is rounded twice: in rare near-ties the result differs by one bfloat16 step from
    rounding the float64 value directly (every constant the book stores is exact in float32).
    """
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def round_to(x, dtype: str) -> np.ndarray:
    """The value(s) ``x`` becomes when stored as ``dtype`` ('float32', 'float16' or 'bfloat16').

    Returned as float32 (every float16 and bfloat16 value is exactly a float32). Overflow gives
    ±inf, as a cast does in hardware.
    """
    with np.errstate(over="ignore"):
        if dtype == "float32":
            return np.asarray(x, dtype=np.float32)
        if dtype == "float16":
            return np.asarray(x, dtype=np.float16).astype(np.float32)
        if dtype == "bfloat16":
            return round_to_bfloat16(x)
    raise ValueError(f"dtype must be one of {DTYPES}, received {dtype!r}")


def dtype_min(dtype: str) -> float:
    """The most negative finite number of ``dtype`` (``torch.finfo(dtype).min`` in PyTorch)."""
    if dtype == "bfloat16":
        return -float(np.array(0x7F7F0000, dtype=np.uint32).view(np.float32))  # (2 − 2⁻⁷)·2¹²⁷
    if dtype in ("float32", "float16"):
        return float(np.finfo(dtype).min)
    raise ValueError(f"dtype must be one of {DTYPES}, received {dtype!r}")


def padding_keep(lengths, n: int, side: str = "right") -> np.ndarray:
    """Boolean ``(B, n)``: ``True`` at the real tokens of sequences of the given lengths padded to ``n``.

    ``side="right"`` puts the tokens first (``[t t t pad pad]``), ``"left"`` last (``[pad pad t t t]``).
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths < 0).any() or (lengths > n).any():
        raise ValueError(f"lengths must be a 1-d array of values in [0, n={n}], received {lengths}")
    pos = np.arange(n)
    if side == "right":
        return pos[None, :] < lengths[:, None]
    if side == "left":
        return pos[None, :] >= n - lengths[:, None]
    raise ValueError(f"side must be 'right' or 'left', received {side!r}")


def framework_softmax(scores, keep, fill: float, dtype: str, *, additive: bool = False, n_masks: int = 1):
    """Masked softmax as a framework computes it in ``dtype``; returns float64 weights (rounded to ``dtype``).

    The scores are stored in ``dtype``. ``additive=False`` replaces every masked score by ``fill``
    (``masked_fill``); ``additive=True`` adds a bias that is ``fill`` at masked entries, ``n_masks``
    times (e.g. a causal and a padding bias both built with ``fill`` and added), each addition
    rounded to ``dtype`` (the sum of two 16-bit numbers is formed in float32 and then rounded, which
    gives the correctly rounded 16-bit sum: float32 carries at least twice their precision plus 2 bits).
    The fill value itself is first rounded to ``dtype`` (−1e9 in float16 is
    −inf). The softmax is the plain max-subtracted formula, evaluated in float64 from the stored
    values (as kernels accumulate in a wider type), with no special case: a row whose entries are
    all −inf gives 0/0 = NaN. The weights are rounded to ``dtype`` at the end.

    scores : (..., n_k) ; keep : bool, broadcastable, True = may attend.
    """
    s = round_to(scores, dtype)
    f = round_to(fill, dtype)
    keep = np.broadcast_to(keep, s.shape)
    if additive:
        z = s
        for _ in range(n_masks):
            with np.errstate(over="ignore"):  # finfo.min + finfo.min overflows to -inf, as on hardware
                z = round_to(z + np.where(keep, np.float32(0), f), dtype)
    else:
        z = np.where(keep, s, f)
    z = z.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    return round_to(p, dtype).astype(np.float64)


def masked_attention(q, k, v, keep, policy: str = "zero"):
    """Scaled dot-product attention with a boolean mask (True = keep); returns the output.

    ``policy="zero"``: the book's attention (:func:`attn_utils.scaled_dot_product_attention`): a
    query with nothing to attend to gets a zero output. ``policy="naive"``: masked scores set to
    −inf and the plain softmax, as in most hand-written attention: such a query gets
    0/0 = NaN, and a NaN anywhere in ``v`` reaches every query, masked or not (0 · NaN = NaN).
    """
    if policy == "zero":
        return scaled_dot_product_attention(q, k, v, mask=keep)[0]
    if policy != "naive":
        raise ValueError(f"policy must be 'zero' or 'naive', received {policy!r}")
    z = np.where(keep, (q / np.sqrt(q.shape[-1])) @ np.swapaxes(k, -1, -2), -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return np.einsum("...qk,...kd->...qd", p, v)  # elementwise products: 0 · NaN stays NaN


def token_loss(
    x,
    w,
    targets,
    keep_tokens,
    *,
    key_mask: bool = True,
    query_mask: str | None = "multiply",
    causal: bool = False,
    policy: str = "zero",
):
    """Mean per-token loss of one self-attention layer over a padded batch (autograd-differentiable in ``x``).

    x : (B, n, d) token vectors, padded; w : dict with ``W_q``, ``W_k``, ``W_v`` (d, d) and ``W_out`` (d, c);
    targets : (B, n) integer classes; keep_tokens : (B, n) bool, True at real tokens.

    The layer is ``o = x + Attn(x W_q, x W_k, x W_v)`` (one head) and the loss of a position is the
    cross-entropy of ``o W_out`` against its target. ``key_mask`` removes padded keys from every
    softmax; ``causal`` adds the causal mask. ``query_mask`` says how padded positions leave the
    loss: ``None`` averages over all ``B·n`` positions; ``"multiply"`` multiplies the per-token loss
    by the 0/1 mask and ``"where"`` selects it with ``where``, both then divide by the number of real
    tokens. ``policy`` is the softmax of a row with nothing to attend to: ``"zero"`` (the book's
    :func:`attn_utils.softmax_core`) or ``"naive"`` (−inf and the plain formula: 0/0 = NaN).
    """
    n = x.shape[-2]
    q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]
    scores = q @ anp.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    keep = np.ones((1, n, n), dtype=bool)
    if key_mask:
        keep = keep & keep_tokens[:, None, :]
    if causal:
        keep = keep & causal_mask(n)
    keep = np.broadcast_to(keep, scores.shape)
    if policy == "zero":
        p = softmax_core(scores, mask=keep)
    elif policy == "naive":
        z = anp.where(keep, scores, -np.inf)
        e = anp.exp(z - anp.max(z, axis=-1, keepdims=True))
        p = e / anp.sum(e, axis=-1, keepdims=True)
    else:
        raise ValueError(f"policy must be 'zero' or 'naive', received {policy!r}")
    o = x + p @ v
    logits = o @ w["W_out"]
    shifted = logits - anp.max(logits, axis=-1, keepdims=True)  # max-subtracted log-softmax
    logp = shifted - anp.log(anp.sum(anp.exp(shifted), axis=-1, keepdims=True))
    per_token = -anp.sum(logp * np.eye(logits.shape[-1])[targets], axis=-1)  # (B, n)
    if query_mask is None:
        return anp.mean(per_token)
    if query_mask == "multiply":
        return anp.sum(per_token * keep_tokens) / keep_tokens.sum()
    if query_mask == "where":
        return anp.sum(anp.where(keep_tokens, per_token, 0.0)) / keep_tokens.sum()
    raise ValueError(f"query_mask must be None, 'multiply' or 'where', received {query_mask!r}")


def losses_against_real_keys(x, w, targets, keep_tokens) -> np.ndarray:
    """(B, n) per-position losses of :func:`token_loss`'s layer, every query seeing only its sequence's real keys.

    Computed without any mask: each sequence's padded keys and values are cut out and every position,
    real or padded, is a query of :func:`attn_utils.scaled_dot_product_attention` against the rest.
    At real positions this is the loss of the unpadded sequence (no causal mask); at padded positions
    it is what a key mask alone leaves in the loss. The mean over all ``B·n`` positions is
    ``token_loss(..., key_mask=True, query_mask=None)``.
    """
    out = np.empty(np.shape(targets), dtype=float)
    for b in range(x.shape[0]):
        real = x[b][keep_tokens[b]]
        o = x[b] + scaled_dot_product_attention(x[b] @ w["W_q"], real @ w["W_k"], real @ w["W_v"])[0]
        logits = o @ w["W_out"]
        top = logits.max(axis=-1)
        log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
        out[b] = log_norm - logits[np.arange(logits.shape[0]), targets[b]]
    return out


def _split_unchecked(x, h: int):
    """split_heads without its finiteness check: under ``policy="naive"`` x may hold NaN on purpose."""
    return np.swapaxes(x.reshape(*x.shape[:-1], h, -1), -3, -2)


def _merge_unchecked(x):
    """merge_heads without its finiteness check (see :func:`_split_unchecked`)."""
    return np.swapaxes(x, -3, -2).reshape(*x.shape[:-3], x.shape[-2], -1)


def attend_with_cache(
    x, layers, h: int, keep, *, caches=None, positions=None, rotate=None, key_positions=None, policy: str = "zero"
):
    """New positions ``x`` through residual self-attention layers ``x + MHA(x)``, against cached keys and values.

    x : (B, m, d_model) the new positions; layers : list of dicts of (d, d) matrices ``W_q, W_k, W_v, W_o``;
    caches : per layer ``(keys, values)`` of shape (B, h, c, d_k) from earlier calls, or None (c = 0);
    keep : bool mask broadcastable to (B, h, m, c + m), True = may attend: the keys are the c cached
    positions followed by the m new ones; rotate, positions : a rotary embedding ``rotate(x, positions)``
    (chapter 14's :func:`~attn_utils.experiments.ch14_positions.rope`) applied to every head's queries and
    keys at the (m,) positions of the new tokens, values untouched (cached keys are stored rotated), or
    None for no positions. key_positions : (m,) positions at which the new keys are rotated, if they
    differ from the queries' (default ``positions``); the chapter uses a mismatch only as a bug to rule out.
    Returns ``(outputs (B, m, d_model), caches)`` with every layer's cache extended by the m positions.
    """
    m = x.shape[-2]
    n_keys = m + (0 if caches is None else caches[0][0].shape[-2])
    if keep is not None and np.shape(keep)[-2:] not in ((m, n_keys), (1, n_keys)):
        raise ValueError(f"keep must end in (m, c + m) = ({m}, {n_keys}) or (1, c + m), received {np.shape(keep)}")
    if (rotate is None) != (positions is None):
        raise ValueError("rotate and positions go together: pass both (rotary positions) or neither")
    if key_positions is not None and rotate is None:
        raise ValueError("key_positions needs rotate and positions")
    key_positions = positions if key_positions is None else key_positions
    split, merge = (split_heads, merge_heads) if policy == "zero" else (_split_unchecked, _merge_unchecked)
    new_caches = []
    for i, layer in enumerate(layers):
        q, k, v = (split(x @ layer[name], h) for name in ("W_q", "W_k", "W_v"))
        if rotate is not None:
            q, k = rotate(q, positions), rotate(k, key_positions)
        if caches is not None:
            k, v = (np.concatenate([old, new], axis=-2) for old, new in zip(caches[i], (k, v)))
        new_caches.append((k, v))
        x = x + merge(masked_attention(q, k, v, keep, policy)) @ layer["W_o"]
    return x, new_caches


def stack_forward(x, layers, h: int, keep_tokens, *, policy: str = "zero"):
    """All positions at once through residual self-attention layers with causal + key-padding masks.

    x : (B, n, d_model), padded; keep_tokens : (B, n) bool; layers : list of dicts of (d, d) matrices.
    The combined mask is ``keep_tokens[:, None, None, :] & causal_mask(n)``: shape (B, 1, n, n),
    broadcast over the heads. No positional information is added (chapter 14), so each real
    token's output depends only on the real tokens at or before it.
    """
    keep = keep_tokens[:, None, None, :] & causal_mask(x.shape[-2])
    return attend_with_cache(x, layers, h, keep, policy=policy)[0]


def cached_decode(prompt, new_tokens, layers, h: int, keep_prompt, *, use_key_mask: bool = True, rotate=None):
    """Prefill a padded prompt batch, then feed ``new_tokens`` one position at a time with a KV cache.

    prompt : (B, P, d) left- or right-padded, keep_prompt : (B, P) bool; new_tokens : (B, T, d) real
    tokens appended to every sequence. Each step computes only the new position's query against the
    cached keys and values of every layer (the cache holds the padded slots too); the key mask is the
    prompt's padding mask followed by ``True`` for every generated position, or nothing at all when
    ``use_key_mask`` is False (a single new query sees every cached key, so no causal mask is needed).
    ``rotate`` (a rotary embedding ``rotate(x, positions)``, e.g. chapter 14's ``rope``) rotates queries and
    keys by their column index (prompt 0 … P−1, step t at P + t): rotary scores depend only on offsets,
    so a shift common to a sequence, such as its left padding, changes nothing. With right padding the
    new tokens would sit P − L columns too far from a prompt of length L, so ``rotate`` requires
    left-padded (or unpadded) prompts and raises ValueError otherwise.
    Returns the outputs of the last layer at the new positions, (B, T, d).
    """
    B, P, _ = prompt.shape
    keep_prompt = np.asarray(keep_prompt, dtype=bool)
    if keep_prompt.shape != (B, P):
        raise ValueError(f"keep_prompt must have shape (B, P) = ({B}, {P}), received {keep_prompt.shape}")
    padding_after_real = (keep_prompt[:, :-1] & ~keep_prompt[:, 1:]).any(axis=1)
    if rotate is not None and padding_after_real.any():
        raise ValueError(
            "rotate needs left-padded (or unpadded) prompts: rows "
            f"{np.flatnonzero(padding_after_real).tolist()} of keep_prompt have padding after a real token "
            "(right padding would rotate the new tokens by their column, not their position in the sequence)"
        )
    keep = keep_prompt[:, None, None, :] & causal_mask(P)
    _, caches = attend_with_cache(
        prompt, layers, h, keep, positions=None if rotate is None else np.arange(P), rotate=rotate
    )
    outputs = []
    keep_keys = keep_prompt
    for t in range(new_tokens.shape[1]):
        keep_keys = np.concatenate([keep_keys, np.ones((B, 1), dtype=bool)], axis=1)
        step_keep = keep_keys[:, None, None, :] if use_key_mask else None
        x, caches = attend_with_cache(
            new_tokens[:, t : t + 1, :],
            layers,
            h,
            step_keep,
            caches=caches,
            positions=None if rotate is None else [P + t],
            rotate=rotate,
        )
        outputs.append(x[:, 0, :])
    return np.stack(outputs, axis=1)


def _lengths(name: str, lengths) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0 or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 1).any():
        raise ValueError(f"{name} must be a non-empty 1-d array of positive integers, received {lengths!r}")
    return lengths


def document_ids(lengths) -> np.ndarray:
    """(n,) the document of each position when documents of the given lengths are packed into one row."""
    lengths = _lengths("lengths", lengths)
    return np.repeat(np.arange(lengths.size), lengths)


def document_mask(lengths) -> np.ndarray:
    """(n, n) bool: query i may see key j when both lie in the same packed document AND j ≤ i.

    Block-diagonal (one causal block per document); no row is empty, every token sees itself.
    """
    doc = document_ids(lengths)
    return (doc[:, None] == doc[None, :]) & causal_mask(doc.size)


def packed_positions(lengths) -> np.ndarray:
    """(n,) positions restarted at 0 at the first token of every packed document."""
    lengths = _lengths("lengths", lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(lengths.sum()) - starts


def packed_targets(tokens, lengths) -> np.ndarray:
    """(n,) next-token targets of a packed row: ``tokens[i + 1]`` inside a document, −1 (no target) at
    each document's last token, whose next token in the row belongs to the next document."""
    lengths = _lengths("lengths", lengths)
    tokens = np.asarray(tokens)
    if tokens.shape != (lengths.sum(),):
        raise ValueError(f"tokens must have shape ({lengths.sum()},) = (sum of lengths,), received {tokens.shape}")
    targets = np.append(tokens[1:], -1)
    targets[np.cumsum(lengths) - 1] = -1
    return targets


def token_losses(outputs, w_out, targets) -> np.ndarray:
    """Per-position cross-entropy ``−log softmax(o_i W_out)[targets_i]``; (..., n) from outputs (..., n, d).

    Positions whose target is −1 get NaN, so that a mean over them fails loudly instead of counting them.
    """
    targets = np.asarray(targets)
    logp = log_softmax_core(outputs @ w_out)
    picked = np.take_along_axis(logp, np.maximum(targets, 0)[..., None], axis=-1)[..., 0]
    return np.where(targets >= 0, -picked, np.nan)


def prefix_lm_mask(n: int, prefix: int) -> np.ndarray:
    """(n, n) bool prefix-LM mask: every query sees the whole prefix (keys 0 … prefix−1), and the
    suffix is causal (query i sees key j ≤ i)."""
    if not 0 <= prefix <= n:
        raise ValueError(f"prefix must lie in [0, n={n}], received {prefix}")
    return causal_mask(n) | (np.arange(n)[None, :] < prefix)


def _parents(parents) -> np.ndarray:
    parents = np.asarray(parents)
    if parents.ndim != 1 or parents.size == 0 or not np.issubdtype(parents.dtype, np.integer):
        raise ValueError(f"parents must be a non-empty 1-d integer array, received {parents!r}")
    if ((parents < -1) | (parents >= np.arange(parents.size))).any():
        raise ValueError(
            f"parents[i] must be −1 (a child of the cache's last token) or a node before i, received {parents}"
        )
    return parents


def tree_depths(parents) -> np.ndarray:
    """(N,) depth of each node of a draft tree (0 for the children of the cache's last token)."""
    parents = _parents(parents)
    depth = np.zeros(parents.size, dtype=int)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    return depth


def tree_mask(parents, n_cache: int) -> np.ndarray:
    """(N, n_cache + N) bool: node i sees every cached key and the nodes on its own root path (itself included).

    parents : (N,) with ``parents[i] < i`` the parent node of node i, or −1 for a child of the cache's
    last token (the nodes are listed parents first, e.g. breadth first).
    """
    parents = _parents(parents)
    n = parents.size
    ancestor = np.eye(n, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            ancestor[i] |= ancestor[p]
    return np.concatenate([np.ones((n, n_cache), dtype=bool), ancestor], axis=1)


def masked_weight_bound(c_minus_spread, m: int):
    """Upper bound on the total weight a finite additive mask ``−C`` leaves on ``m`` masked keys.

    With δ the largest masked score minus the largest kept score, the weight is at most
    ``r / (1 + r)`` with ``r = m·e^{−(C − δ)}``, attained when one kept key and all ``m`` masked
    keys sit at the two maxima (eq-ch13-leak).
    """
    r = m * np.exp(-np.asarray(c_minus_spread, dtype=float))
    return r / (1 + r)
