"""Putting computed numbers into the prose (myst-nb ``glue``).

Numbers are glued as pre-formatted strings, never numpy scalars: numpy 2 prints
``np.float64(…)`` and a format spec in the page would then fail.
"""
from __future__ import annotations


def glue_number(name: str, value, fmt: str = ".3g") -> str:
    """Glue ``format(float(value), fmt)`` under ``name`` without displaying it; returns the string."""
    from myst_nb import glue

    text = format(float(value), fmt)
    glue(name, text, display=False)
    return text


def glue_text(name: str, text: str) -> str:
    """Glue an already formatted string (e.g. ``"1/9"``) under ``name``."""
    from myst_nb import glue

    glue(name, str(text), display=False)
    return str(text)
