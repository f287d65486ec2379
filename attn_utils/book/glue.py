"""Putting computed numbers into the prose (myst-nb ``glue``).

Numbers are glued as pre-formatted strings, never numpy scalars: numpy 2 prints
``np.float64(…)`` and a format spec in the page would then fail.
"""

from __future__ import annotations


def glue_number(name: str, value, fmt: str = ".3g", approx: bool = False) -> str:
    """Glue ``format(float(value), fmt)`` under ``name`` without displaying it; returns the string.

    ``approx=True`` for a number measured on trained models: it is glued as ``≈0.42``, and
    the test suite does not compare its digits (they vary by machine; see :mod:`attn_utils.book.checks`).
    """
    from myst_nb import glue

    text = ("≈" if approx else "") + format(float(value), fmt)
    glue(name, text, display=False)
    return text


def glue_text(name: str, text: str) -> str:
    """Glue an already formatted string (e.g. ``"1/9"``) under ``name``."""
    from myst_nb import glue

    glue(name, str(text), display=False)
    return str(text)
