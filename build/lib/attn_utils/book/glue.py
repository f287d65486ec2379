"""Putting computed numbers into the prose (myst-nb's ``glue``).

Numbers are glued as pre-formatted strings, never numpy scalars: numpy 2 prints
``np.float64(…)`` and a format spec in the page would then fail.

The output is exactly what ``myst_nb.glue(name, text, display=False)`` writes (a display
output under myst-nb's ``application/papermill.record/`` prefix with ``scrapbook`` metadata),
made here with IPython alone: importing ``myst_nb`` loads nbformat's schema validator and cost
every chapter more than a second. A test compares the two outputs.
"""

from __future__ import annotations

GLUE_PREFIX = "application/papermill.record/"  # myst_nb.ext.glue.GLUE_PREFIX


def _glue(name: str, text: str) -> None:
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    bundle, metadata = format_display_data(text)
    metadata["scrapbook"] = {"name": name, "mime_prefix": GLUE_PREFIX}
    display({GLUE_PREFIX + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


def glue_number(name: str, value, fmt: str = ".3g", approx: bool = False) -> str:
    """Glue ``format(float(value), fmt)`` under ``name`` without displaying it; returns the string.

    ``approx=True`` for a number measured on trained models: it is glued as ``≈0.42``, and
    the test suite does not compare its digits (they vary by machine; see :mod:`attn_utils.book.checks`).
    """
    text = ("≈" if approx else "") + format(float(value), fmt)
    _glue(name, text)
    return text


def glue_text(name: str, text: str) -> str:
    """Glue an already formatted string (e.g. ``"1/9"``) under ``name``."""
    _glue(name, str(text))
    return str(text)
