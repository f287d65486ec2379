"""One seed base for every random draw of the book, read from ``ATTN_SEED``.

A chapter names its draws with small labels: its generator (``au.rng(2017)``), its training
seeds (``au.seeds(range(8))``), its selection seeds (``au.seeds(range(100, 108))``). The labels
are what the reader sees; the seed base decides which draw each label means:

* ``ATTN_SEED`` unset (or ``0``): a label is its own seed, so ``au.rng(2017)`` is
  ``np.random.default_rng(2017)``. This is the draw that produced the committed outputs, and the
  one ``make test`` compares against.
* ``ATTN_SEED=b`` for any other ``b``: label ``l`` becomes the seed
  ``SeedSequence([b, l])``, a fresh 63-bit integer. Every label gets a new, independent draw, and
  two labels stay distinct (so selection seeds and evaluation seeds never coincide).

``make test-reseed SEED=b`` executes every chapter under base ``b`` and fails when any check
raises: a claim that holds only for the committed draw fails there. The base is read when a
function is called, not at import, so a notebook that sets ``os.environ["ATTN_SEED"]`` and
re-runs its cells gets the new draws.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

ENV_VAR = "ATTN_SEED"


def seed_base() -> int:
    """The seed base from ``ATTN_SEED`` (0 when unset or empty): a non-negative integer."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return 0
    try:
        base = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_VAR} must be a non-negative integer, received {raw!r}") from None
    if base < 0:
        raise ValueError(f"{ENV_VAR} must be a non-negative integer, received {base}")
    return base


def seed(label: int) -> int:
    """The seed that ``label`` means under the current base (``label`` itself under base 0)."""
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or label < 0:
        raise ValueError(f"label must be a non-negative integer, received {label!r}")
    base = seed_base()
    if base == 0:
        return int(label)
    state = np.random.SeedSequence([base, int(label)]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))  # 63 bits: a plain non-negative Python int


def seeds(labels: Iterable[int]) -> list[int]:
    """:func:`seed` of each label, e.g. ``au.seeds(range(8))`` for eight training seeds."""
    return [seed(label) for label in labels]


def rng(label: int) -> np.random.Generator:
    """A generator for ``label`` under the current base: ``np.random.default_rng(seed(label))``."""
    return np.random.default_rng(seed(label))
