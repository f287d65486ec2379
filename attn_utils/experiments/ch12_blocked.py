"""Chapter 12 — attention computed block by block with an online softmax, never forming the n×n matrix.

The keys are visited in blocks of ``block_size``. For every query the function keeps three
running quantities (the *online softmax* state):

* ``m``   — the largest logit seen so far,
* ``ℓ``   — ``sum_j exp(z_j - m)`` over the keys seen so far,
* ``acc`` — ``sum_j exp(z_j - m) v_j`` over the keys seen so far (an unnormalised output).

When a block raises the maximum from ``m_old`` to ``m_new``, the old ``ℓ`` and ``acc`` are
multiplied by ``exp(m_old - m_new)`` so that they refer to the new maximum; the block's own
terms are then added. At the end ``acc / ℓ`` is exactly ``softmax(z) V``. The largest temporary
array is one ``(n_q_block, block_size)`` tile of logits, instead of ``(n_q, n_k)``.

Shapes follow :mod:`attn_utils.attention`: ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``,
``v (..., n_k, d_v)`` with identical leading (batch/head) axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..attention import check_mask, check_qkv, default_scale
from ..book.measuring import counted_matmul
from ..validation import positive_int, positive_scalar


@dataclass(frozen=True)
class BlockedAttentionStats:
    """What :func:`blocked_attention` did, counted from the shapes it actually processed.

    Attributes
    ----------
    lse : (..., n_q) array
        Log-sum-exp of each query's (scaled, masked) logits, ``m + log ℓ``; ``-inf`` for a
        query that sees no key. Enough to merge partial results or to recompute weights.
    n_tiles : int
        Number of (query block, key block) tiles computed.
    n_tiles_skipped : int
        Tiles skipped because every entry of the tile was masked.
    matmul_macs : int
        Multiply-adds of the two products per tile, ``b_q·b_k·d_k`` for the logits and
        ``b_q·b_k·d_v`` for the weighted values, summed over tiles and leading axes (the same
        products are also recorded by :func:`attn_utils.count_macs`, which counts them as they run).
    exp_evaluations : int
        Calls of ``exp`` on individual numbers: ``b_q·b_k`` per tile plus ``b_q`` for the
        rescaling factor.
    rescale_mults : int
        Extra multiplications that exact one-pass softmax does not need: ``b_q·(d_v + 1)`` per
        tile, the rescaling of ``acc`` and ``ℓ`` by ``exp(m_old - m_new)``.
    n_max_increases : int
        Number of (query, tile) pairs in which an already finite running maximum increased,
        i.e. in which the rescaling factor differs from exactly 1 (summed over leading axes).
    n_tiles_masked : int
        Tiles computed with some (not all) entries masked elementwise (with ``causal=True`` alone:
        the tiles that the diagonal crosses). Counted once per tile, like ``n_tiles``.
    """

    lse: np.ndarray
    n_tiles: int
    n_tiles_skipped: int
    matmul_macs: int
    exp_evaluations: int
    rescale_mults: int
    n_max_increases: int
    n_tiles_masked: int = 0


def blocked_attention(
    q,
    k,
    v,
    block_size,
    mask=None,
    scale: float | None = None,
    *,
    causal: bool = False,
    query_block_size: int | None = None,
    return_stats: bool = False,
):
    """Exact ``softmax(scale · q k^T) v`` computed one key block at a time (online softmax).

    Parameters
    ----------
    q : (..., n_q, d_k)
    k : (..., n_k, d_k)
    v : (..., n_k, d_v)
        Leading axes must be identical for q, k and v. Computation runs in the input's
        floating dtype (float32 inputs give float32 accumulators).
    block_size : int ≥ 1
        Number of keys per block; need not divide ``n_k`` (the last block is shorter).
    mask : bool (..., n_q, n_k), optional
        ``True`` where attention is allowed, broadcast over leading axes, exactly as in
        :func:`attn_utils.scaled_dot_product_attention`.
    scale : float > 0, optional
        Defaults to ``1/sqrt(d_k)``.
    causal : bool
        Apply the causal mask of :func:`attn_utils.causal_mask` (queries aligned with the last
        ``n_q`` keys) without building it: each tile makes its own ``(b_q, b_k)`` piece.
        Combined with ``mask`` by logical and. Requires ``n_k ≥ n_q``.
    query_block_size : int ≥ 1, optional
        Also split the queries into blocks of this size (default: all queries at once). Only
        with query blocks can whole tiles be skipped under a causal mask.
    return_stats : bool
        Also return a :class:`BlockedAttentionStats`.

    Returns
    -------
    output : (..., n_q, d_v)
        Equal to ``scaled_dot_product_attention(q, k, v, mask, scale)[0]`` up to rounding. A
        query with every key masked gets a zero output, as there.
    stats : BlockedAttentionStats
        Only when ``return_stats``.
    """
    q, k, v = check_qkv(q, k, v)
    block_size = positive_int("block_size", block_size)
    scale = default_scale(q.shape[-1]) if scale is None else positive_scalar("scale", scale)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, received {type(causal).__name__}")
    lead, (n_q, d_k), n_k, d_v = q.shape[:-2], q.shape[-2:], k.shape[-2], v.shape[-1]
    q_block = max(n_q, 1) if query_block_size is None else positive_int("query_block_size", query_block_size)
    if mask is not None:
        mask = np.broadcast_to(check_mask(mask, lead + (n_q, n_k)), lead + (n_q, n_k))  # a view; tiles slice it
    if causal and n_k < n_q:
        raise ValueError(f"causal attention needs n_k >= n_q, received n_q={n_q}, n_k={n_k}")
    offset = n_k - n_q  # query i sits at absolute position offset + i
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)

    out = np.empty(lead + (n_q, d_v), dtype=dtype)
    lse = np.empty(lead + (n_q,), dtype=dtype)
    n_lead = int(np.prod(lead, dtype=np.int64))
    n_tiles = n_skipped = n_masked = matmul_macs = n_exp = rescale_mults = n_increases = 0

    for q0 in range(0, n_q, q_block):
        q1 = min(q0 + q_block, n_q)
        qi = q[..., q0:q1, :]
        bq = q1 - q0
        m = np.full(lead + (bq, 1), -np.inf, dtype=dtype)  # running maximum
        ell = np.zeros(lead + (bq, 1), dtype=dtype)  # running sum exp(z - m)
        acc = out[..., q0:q1, :]  # running sum exp(z - m) v, kept in the output
        acc[...] = 0.0
        for k0 in range(0, n_k, block_size):
            k1 = min(k0 + block_size, n_k)
            keep = None if mask is None else mask[..., q0:q1, k0:k1]
            if causal:
                if k0 > offset + q1 - 1:  # no query of this block sees any key of this block
                    n_skipped += 1
                    continue
                tri = np.arange(k0, k1)[None, :] <= np.arange(offset + q0, offset + q1)[:, None]
                keep = tri if keep is None else keep & tri
            if keep is not None and not keep.any():
                n_skipped += 1
                continue
            n_masked += keep is not None and not keep.all()
            bk = k1 - k0
            s = counted_matmul(qi, np.swapaxes(k[..., k0:k1, :], -1, -2))  # (..., bq, bk): the only tile
            s *= scale
            if keep is not None:
                np.copyto(s, -np.inf, where=~keep)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            n_increases += int(np.count_nonzero((m_new > m) & np.isfinite(m)))
            m_ref = np.where(np.isfinite(m_new), m_new, 0.0)  # rows that have seen nothing stay at 0
            alpha = np.exp(m - m_ref)  # exp(m_old - m_new); 0 when m_old = -inf
            s -= m_ref
            p = np.exp(s, out=s)  # masked logits give exactly 0
            ell *= alpha
            ell += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += counted_matmul(p, v[..., k0:k1, :])
            del s, p  # free the tile before the next one exists
            m = m_new
            n_tiles += 1
            matmul_macs += n_lead * bq * bk * (d_k + d_v)
            n_exp += n_lead * (bq * bk + bq)
            rescale_mults += n_lead * bq * (d_v + 1)
        seen = ell > 0
        acc /= np.where(seen, ell, 1.0)  # rows with no visible key stay 0
        lse[..., q0:q1] = np.where(seen, m + np.log(np.where(seen, ell, 1.0)), -np.inf)[..., 0]

    if not return_stats:
        return out
    return out, BlockedAttentionStats(
        lse, n_tiles, n_skipped, matmul_macs, n_exp, rescale_mults, n_increases, int(n_masked)
    )


# ---------------------------------------------------------------- a two-level memory model (IO counts)
#
# FlashAttention's speed argument is about memory *traffic*: how many numbers move between a
# large slow memory (a GPU's HBM) and a small fast one (on-chip SRAM) of M numbers. The functions
# below run standard attention and the two FlashAttention loop orders against a simulated fast
# memory that counts every number loaded from or stored to slow memory, and refuses to hold more
# than M numbers at once. With ``compute=False`` the same loops run on shapes only (no arithmetic,
# no n×n arrays), so long sequences can be counted in a fraction of a second.


class _Shape:
    """Shape-only stand-in for an array when only the traffic is counted (``compute=False``)."""

    __slots__ = ("shape", "size")

    def __init__(self, shape):
        self.shape = tuple(map(int, shape))
        self.size = math.prod(self.shape)

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        sliced = tuple(len(range(*sl.indices(n))) for sl, n in zip(index, self.shape))
        return _Shape(sliced + self.shape[len(index) :])


class SlowArray:
    """An array in slow memory. Its numbers are reached only through :meth:`TwoLevelMemory.load`
    and :meth:`TwoLevelMemory.store` (numpy refuses to compute with it directly), and it records,
    for every one of its words, how many times that word was read and written.

    These per-word counters are a second, finer measurement than the memory's running totals: they
    say *which* words crossed and how often, so each line of the traffic proof ("every key row is
    read once per query block") can be checked word by word.
    """

    __slots__ = ("name", "data", "reads", "writes")

    def __init__(self, name: str, data: np.ndarray):
        self.name = name
        self.data = data
        self.reads = np.zeros(data.shape, dtype=np.int64)
        self.writes = np.zeros(data.shape, dtype=np.int64)

    @property
    def shape(self):
        return self.data.shape

    @property
    def size(self):
        return self.data.size

    def __array__(self, *args, **kwargs):
        raise TypeError(f"slow array {self.name!r} can only be reached through load and store")


class FastMemoryOverflow(MemoryError):
    """Raised when a loop would hold more numbers in fast memory than it has; ``held`` is how many."""

    def __init__(self, held: int, fast_size: int):
        super().__init__(f"fast memory holds {held} numbers, more than fast_size = {fast_size}")
        self.held, self.fast_size = held, fast_size


class TwoLevelMemory:
    """A slow memory of any size and a fast memory of ``fast_size`` numbers, with counters.

    ``slow`` makes a :class:`SlowArray` (the inputs start there; making one costs nothing),
    ``load`` copies a slice of it into fast memory (``reads`` += its size), ``store`` copies a fast
    block back (``writes`` += its size), ``scratch`` makes a block that lives only in fast memory
    (tiles, running statistics), ``free`` releases fast blocks. A load or scratch that would take
    fast memory past ``fast_size`` numbers raises :class:`FastMemoryOverflow`; ``peak`` is the
    most ever held. What is charged: every block a loop loads or makes with ``scratch``. What is
    not: numpy's elementwise temporaries inside one update (a few vectors of one number per row,
    and the product of a tile with a value block before it is added into the accumulator, which
    a GPU's matrix unit accumulates in place). With ``compute=False`` arrays are shapes only, the
    callers skip the arithmetic, and only the totals are counted.
    """

    def __init__(self, fast_size: int, *, compute: bool = True):
        self.fast_size = positive_int("fast_size", fast_size)
        self.compute = bool(compute)
        self.reads = self.writes = self.held = self.peak = 0
        self.arrays: dict[str, SlowArray] = {}

    def slow(self, name: str, shape, fill=0.0, *, data=None):
        """An array in slow memory (filling it costs nothing: it is where the inputs already are)."""
        if not self.compute:
            return _Shape(shape)
        if name in self.arrays:
            raise ValueError(f"slow array {name!r} exists already")
        array = SlowArray(name, np.array(data, dtype=float) if data is not None else np.full(shape, fill))
        self.arrays[name] = array
        return array

    def _hold(self, words: int) -> None:
        self.held += words
        self.peak = max(self.peak, self.held)
        if self.held > self.fast_size:
            raise FastMemoryOverflow(self.held, self.fast_size)

    def load(self, array, index):
        if self.compute:
            block = array.data[index].copy()
            array.reads[index] += 1
        else:
            block = array[index]
        self.reads += block.size
        self._hold(block.size)
        return block

    def store(self, array, index, block) -> None:
        self.writes += block.size
        if self.compute:
            array.data[index] = block
            array.writes[index] += 1

    def scratch(self, shape, fill=0.0):
        block = np.full(shape, fill) if self.compute else _Shape(shape)
        self._hold(block.size)
        return block

    def free(self, *blocks) -> None:
        for block in blocks:
            self.held -= block.size


@dataclass(frozen=True)
class TrafficCount:
    """Numbers moved between slow and fast memory by one attention call (:func:`attention_io`)."""

    algorithm: str
    reads: int
    writes: int
    peak_fast: int
    outer_block: int
    inner_block: int
    output: np.ndarray | None
    per_word: dict | None = None  # name -> (reads, writes) per word of each slow array; compute mode only

    @property
    def total(self) -> int:
        return self.reads + self.writes


IO_ALGORITHMS = ("standard", "flash1", "flash2")


def fast_words(algorithm: str, outer: int, inner: int, d: int) -> int:
    """Numbers held in fast memory at once by ``algorithm`` with ``outer``/``inner`` blocks (head size ``d``).

    standard : ``Q_i`` or ``O_i`` (outer·d) + ``K_j`` or ``V_j`` (inner·d) + one tile (outer·inner);
        its softmax pass holds one row (or, when a row does not fit, a chunk of it) and two numbers.
    flash1 : ``K_j, V_j`` (2·outer·d) + ``Q_i, O_i`` (2·inner·d) + ``ℓ_i, m_i`` and two new row
        statistics (4·inner) + one tile (outer·inner).
    flash2 : ``Q_i`` and the accumulator (2·outer·d) + ``m, ℓ`` and the new maximum (3·outer) +
        ``K_j, V_j`` (2·inner·d) + one tile (outer·inner).
    """
    if algorithm == "standard":
        return outer * d + inner * d + outer * inner
    if algorithm == "flash1":
        return 2 * outer * d + 2 * inner * d + 4 * inner + outer * inner
    if algorithm == "flash2":
        return 2 * outer * d + 3 * outer + 2 * inner * d + outer * inner
    raise ValueError(f"algorithm must be one of {IO_ALGORITHMS}, received {algorithm!r}")


def io_block_sizes(algorithm: str, fast_size: int, d: int) -> tuple[int, int]:
    """Block sizes ``(outer, inner)``: the largest outer block that fits with ``inner = min(outer, d)``.

    The block of the *outer* loop is the one kept in fast memory while the other operand streams
    past it, so it decides the traffic; the inner block is capped at ``d`` (as FlashAttention-1
    caps ``B_r`` at ``d``) so that the tile ``outer × inner`` never crowds it out. Raises
    ``ValueError`` when not even blocks of one row fit.
    """
    fast_size, d = positive_int("fast_size", fast_size), positive_int("d", d)
    lo, hi = 0, fast_size
    while lo < hi:  # fast_words grows with outer: binary search for the largest that fits
        mid = (lo + hi + 1) // 2
        if fast_words(algorithm, mid, min(mid, d), d) <= fast_size:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        raise ValueError(f"fast_size = {fast_size} is too small for {algorithm} attention with d = {d}")
    return lo, min(lo, d)


def loops_standard(mem, q, k, v, outer, inner, scale):
    """FlashAttention's Algorithm 0: S = QK^T, P = softmax(S), O = PV, each written to slow memory."""
    n, d = q.shape
    S = mem.slow("S", (n, n))
    out = mem.slow("O", (n, d))
    for i0 in range(0, n, outer):  # S = s·Q K^T, one row block of Q kept while K streams
        rows = slice(i0, min(i0 + outer, n))
        qi = mem.load(q, (rows,))
        for j0 in range(0, n, inner):
            cols = slice(j0, min(j0 + inner, n))
            kj = mem.load(k, (cols,))
            sij = mem.scratch((qi.shape[0], kj.shape[0]))
            if mem.compute:
                np.matmul(qi, kj.T, out=sij)
                sij *= scale
            mem.store(S, (rows, cols), sij)
            mem.free(kj, sij)
        mem.free(qi)
    P = mem.slow("P", (n, n))
    width = min(n, mem.fast_size - 2)  # a row chunk plus its running maximum and sum
    if width < 1:
        raise ValueError(f"fast_size = {mem.fast_size} is too small for the softmax pass")
    for i in range(n):  # P = softmax(S), one row at a time
        stats = mem.scratch((2,))  # running maximum and sum of the row
        if width == n:  # the row fits: one read
            row = mem.load(S, (slice(i, i + 1),))
            if mem.compute:
                row -= row.max()
                np.exp(row, out=row)
                row /= row.sum()
            mem.store(P, (slice(i, i + 1),), row)
            mem.free(row, stats)
            continue
        if mem.compute:
            stats[:] = -np.inf, 0.0
        for j0 in range(0, n, width):  # first pass: maximum and sum, online (the row does not fit)
            chunk = mem.load(S, (slice(i, i + 1), slice(j0, min(j0 + width, n))))
            if mem.compute:
                m_new = max(stats[0], chunk.max())
                stats[1] = stats[1] * np.exp(stats[0] - m_new) + np.exp(chunk - m_new).sum()
                stats[0] = m_new
            mem.free(chunk)
        for j0 in range(0, n, width):  # second pass: normalise and write
            cols = (slice(i, i + 1), slice(j0, min(j0 + width, n)))
            chunk = mem.load(S, cols)
            if mem.compute:
                chunk[...] = np.exp(chunk - stats[0]) / stats[1]
            mem.store(P, cols, chunk)
            mem.free(chunk)
        mem.free(stats)
    for i0 in range(0, n, outer):  # O = P V, one row block of O accumulated while V streams
        rows = slice(i0, min(i0 + outer, n))
        oi = mem.scratch((rows.stop - i0, v.shape[1]))
        for j0 in range(0, n, inner):
            cols = slice(j0, min(j0 + inner, n))
            pij, vj = mem.load(P, (rows, cols)), mem.load(v, (cols,))
            if mem.compute:
                oi += pij @ vj
            mem.free(pij, vj)
        mem.store(out, (rows,), oi)
        mem.free(oi)
    return out


def loops_flash1(mem, q, k, v, outer, inner, scale):
    """FlashAttention-1 (Algorithm 1 of arXiv:2205.14135): key/value blocks outermost; the
    normalised output and the row statistics live in slow memory and are read, rescaled and
    written back for every key block."""
    n, d = q.shape
    out, ell, m = mem.slow("O", (n, d)), mem.slow("l", (n, 1)), mem.slow("m", (n, 1))
    for i0 in range(0, n, inner):  # initialise O = 0, ℓ = 0, m = -inf in slow memory
        rows = slice(i0, min(i0 + inner, n))
        b = rows.stop - i0
        for array, fill, width in ((out, 0.0, d), (ell, 0.0, 1), (m, -np.inf, 1)):
            block = mem.scratch((b, width), fill)
            mem.store(array, (rows,), block)
            mem.free(block)
    for j0 in range(0, n, outer):
        cols = slice(j0, min(j0 + outer, n))
        kj, vj = mem.load(k, (cols,)), mem.load(v, (cols,))
        for i0 in range(0, n, inner):
            rows = slice(i0, min(i0 + inner, n))
            qi, oi = mem.load(q, (rows,)), mem.load(out, (rows,))
            li, mi = mem.load(ell, (rows,)), mem.load(m, (rows,))
            sij = mem.scratch((qi.shape[0], kj.shape[0]))
            m_new, l_new = mem.scratch(li.shape), mem.scratch(li.shape)
            if mem.compute:
                np.matmul(qi, kj.T, out=sij)
                sij *= scale
                m_tile = sij.max(axis=1, keepdims=True)
                np.exp(sij - m_tile, out=sij)  # P~ = exp(S - m~) and its row sums
                np.maximum(mi, m_tile, out=m_new)
                a_old, a_tile = np.exp(mi - m_new), np.exp(m_tile - m_new)
                l_new[...] = a_old * li + a_tile * sij.sum(axis=1, keepdims=True)
                oi[...] = (li * a_old * oi + a_tile * (sij @ vj)) / l_new  # normalised again
                li[...], mi[...] = l_new, m_new
            mem.store(out, (rows,), oi)
            mem.store(ell, (rows,), li)
            mem.store(m, (rows,), mi)
            mem.free(qi, oi, li, mi, sij, m_new, l_new)
        mem.free(kj, vj)
    return out


def loops_flash2(mem, q, k, v, outer, inner, scale):
    """FlashAttention-2 (arXiv:2307.08691, Section 3.1): query blocks outermost; the unnormalised
    accumulator and the statistics stay in fast memory; the output and the log-sum-exp are
    written once."""
    n, d = q.shape
    out, lse = mem.slow("O", (n, d)), mem.slow("lse", (n, 1))
    for i0 in range(0, n, outer):
        rows = slice(i0, min(i0 + outer, n))
        qi = mem.load(q, (rows,))
        b = qi.shape[0]
        acc, m, ell, m_new = mem.scratch((b, d)), mem.scratch((b, 1), -np.inf), mem.scratch((b, 1)), mem.scratch((b, 1))
        for j0 in range(0, n, inner):
            cols = slice(j0, min(j0 + inner, n))
            kj, vj = mem.load(k, (cols,)), mem.load(v, (cols,))
            sij = mem.scratch((b, kj.shape[0]))
            if mem.compute:
                np.matmul(qi, kj.T, out=sij)
                sij *= scale
                np.maximum(m, sij.max(axis=1, keepdims=True), out=m_new)
                alpha = np.exp(m - m_new)
                np.exp(sij - m_new, out=sij)
                ell *= alpha
                ell += sij.sum(axis=1, keepdims=True)
                acc *= alpha
                acc += sij @ vj
                m[...] = m_new
            mem.free(kj, vj, sij)
        if mem.compute:
            acc /= ell  # normalised once, at the end
            ell[...] = m + np.log(ell)
        mem.store(out, (rows,), acc)
        mem.store(lse, (rows,), ell)
        mem.free(qi, acc, m, ell, m_new)
    return out


def attention_io(
    q, k, v, fast_size: int, algorithm: str, *, compute: bool = True, blocks: tuple[int, int] | None = None
) -> TrafficCount:
    """Run one head of attention against a fast memory of ``fast_size`` numbers and count the traffic.

    Parameters
    ----------
    q, k, v : (n, d) arrays, or ``(n, d)`` as a tuple of two ints with ``compute=False``
    fast_size : int
        M, the numbers the fast memory holds. Blocks come from :func:`io_block_sizes`.
    algorithm : ``"standard"`` (writes S and P to slow memory), ``"flash1"`` (key/value blocks
        outermost, output rescaled in slow memory per block) or ``"flash2"`` (query blocks
        outermost, unnormalised accumulator in fast memory).
    compute : bool
        Also compute the output (scale ``1/sqrt(d)``) and count the traffic of every word. With
        ``False`` only the loops and the total counters run, on shapes.
    blocks : (outer, inner), optional
        Override the block sizes (to see the fast memory refuse blocks that do not fit).

    Returns
    -------
    TrafficCount with the numbers read from and written to slow memory, the most numbers ever
    held in fast memory, the block sizes, the output and the per-word counts (``None`` without
    ``compute``). Raises :class:`FastMemoryOverflow` if the blocks do not fit in ``fast_size``.
    """
    if algorithm not in IO_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {IO_ALGORITHMS}, received {algorithm!r}")
    mem = TwoLevelMemory(fast_size, compute=compute)
    if compute:
        q, k, v = check_qkv(q, k, v)
        if q.ndim != 2 or q.shape != k.shape or k.shape != v.shape:
            raise ValueError(f"q, k, v must all be (n, d), received {q.shape}, {k.shape}, {v.shape}")
        n, d = q.shape
        q, k, v = (mem.slow(name, x.shape, data=x) for name, x in (("Q", q), ("K", k), ("V", v)))
    else:
        if len(q) != 2:
            raise ValueError(f"with compute=False pass q as the shape (n, d), received {q!r}")
        n, d = positive_int("n", q[0]), positive_int("d", q[1])
        q = k = v = mem.slow("QKV", (n, d))
    if blocks is None:
        outer, inner = io_block_sizes(algorithm, fast_size, d)
    else:
        outer, inner = positive_int("outer block", blocks[0]), positive_int("inner block", blocks[1])
    run = {"standard": loops_standard, "flash1": loops_flash1, "flash2": loops_flash2}[algorithm]
    out = run(mem, q, k, v, outer, inner, default_scale(d))
    if mem.held != 0:
        raise RuntimeError(f"{algorithm}: {mem.held} numbers left in fast memory")  # a bookkeeping bug
    if not compute:
        return TrafficCount(algorithm, mem.reads, mem.writes, mem.peak, outer, inner, None)
    per_word = {name: (a.reads, a.writes) for name, a in mem.arrays.items()}
    return TrafficCount(algorithm, mem.reads, mem.writes, mem.peak, outer, inner, out.data, per_word)


def count_attention_io(n: int, d: int, fast_size: int, algorithm: str) -> TrafficCount:
    """:func:`attention_io` on shapes only: the same loops and counters, no arithmetic (fast for long ``n``)."""
    return attention_io((n, d), None, None, fast_size, algorithm, compute=False)


__all__ = [
    "blocked_attention",
    "count_attention_io",
    "BlockedAttentionStats",
    "TwoLevelMemory",
    "SlowArray",
    "FastMemoryOverflow",
    "TrafficCount",
    "attention_io",
    "io_block_sizes",
    "fast_words",
]
