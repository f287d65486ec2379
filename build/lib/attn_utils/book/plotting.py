"""One figure style for the whole book, and an attention-heatmap helper.

matplotlib is imported when the first figure is made, not with ``attn_utils``: importing the
package stays fast for code that only computes.
"""

from __future__ import annotations

import numpy as np

# Colours chosen to stay distinguishable in greyscale print and for common colour-blindness.
PALETTE = ["#1b5e9e", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#a6761d", "#666666"]

BOOK_STYLE = {
    "figure.figsize": (6.4, 3.4),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.6,
    "image.cmap": "viridis",
}


def use_book_style() -> None:
    """Apply the book's matplotlib style (idempotent)."""
    import matplotlib

    matplotlib.rcParams.update(BOOK_STYLE)
    matplotlib.rcParams["axes.prop_cycle"] = matplotlib.cycler(color=PALETTE)


def figure(ncols: int = 1, nrows: int = 1, *, width: float | None = None, height: float | None = None, **kwargs):
    """``plt.subplots`` in the book's style; ``width``/``height`` in inches (defaults scale with the grid)."""
    import matplotlib.pyplot as plt

    use_book_style()
    w = width if width is not None else min(3.3 * ncols, 9.6) if ncols > 1 else BOOK_STYLE["figure.figsize"][0]
    h = height if height is not None else 2.9 * nrows if nrows > 1 else BOOK_STYLE["figure.figsize"][1]
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), layout="constrained", **kwargs)
    return fig, axes


def attention_heatmap(
    ax,
    weights,
    row_labels=None,
    col_labels=None,
    *,
    title: str | None = None,
    annotate: bool = False,
    vmax: float | None = 1.0,
):
    """Draw an ``(n_q, n_k)`` attention matrix on ``ax``: rows are queries, columns keys.

    Returns the image so the caller can add a colour bar.
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (n_q, n_k), received shape {w.shape}")
    im = ax.imshow(w, vmin=0.0, vmax=vmax, cmap="viridis", aspect="auto")
    ax.grid(False)
    if col_labels is not None:
        ax.set_xticks(range(w.shape[1]), col_labels, rotation=45 if max(map(len, map(str, col_labels))) > 3 else 0)
    if row_labels is not None:
        ax.set_yticks(range(w.shape[0]), row_labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if annotate:
        for (i, j), val in np.ndenumerate(w):
            ax.text(
                j,
                i,
                f"{val:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if val < 0.6 * (vmax or w.max()) else "black",
            )
    return im
