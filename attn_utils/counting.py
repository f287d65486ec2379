"""Counting multiply-adds: the book's one cost unit (a multiply-add, MAC; 1 MAC = 2 FLOPs).

It lives in the core, below everything that multiplies matrices, so that the core's own products
(:func:`~attn_utils.attention.scaled_dot_product_attention`, :func:`~attn_utils.multihead.multi_head_attention`)
go through :func:`counted_matmul` and ``with count_macs() as c:`` around any of them counts what
ran. Outside a counter the cost is one empty-list check per product.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


@dataclass
class MacCounter:
    """Running totals: ``macs`` multiply-adds and ``products`` array products executed."""

    macs: int = 0
    products: int = 0


_ACTIVE: list[MacCounter] = []


@contextmanager
def count_macs():
    """Count the multiply-adds of every array product run through :func:`counted_matmul` inside the block
    (the core's attention and multi-head attention, the harness layers, the chapters' experiments).

    ``with count_macs() as c: ...`` then read ``c.macs`` and ``c.products``. A product
    ``(..., m, p) @ (..., p, r)`` counts ``size(result) · p`` multiply-adds. Element-wise work
    (softmax, tanh, bias, masking) is not counted: it is ``O(n·n)`` or ``O(n·d)``, lower order than
    every product. Counters nest: an outer counter also sees what an inner one counts.
    """
    counter = MacCounter()
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)


def record_macs(macs: int, products: int = 1) -> None:
    """Add ``macs`` multiply-adds (in ``products`` matrix products) to every active :class:`MacCounter`."""
    for counter in _ACTIVE:
        counter.macs += int(macs)
        counter.products += products


def counted_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``, its multiply-adds recorded in every active :class:`MacCounter`."""
    out = a @ b
    record_macs(out.size * a.shape[-1])
    return out


__all__ = ["MacCounter", "count_macs", "record_macs", "counted_matmul"]
