"""Tests for attn_utils.plotting and attn_utils.book."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attn_utils import book  # noqa: E402
from attn_utils.plotting import BOOK_STYLE, PALETTE, attention_heatmap, figure, use_book_style  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_rc():
    with matplotlib.rc_context():
        plt.rcdefaults()
        yield
        plt.close("all")


def test_figure_applies_book_style():
    assert plt.rcParams["axes.spines.top"] is True  # rcdefaults, before
    fig, ax = figure()
    for key in ("font.size", "axes.grid", "axes.spines.top", "axes.spines.right", "lines.linewidth", "image.cmap"):
        assert plt.rcParams[key] == BOOK_STYLE[key], key
    assert plt.rcParams["axes.prop_cycle"].by_key()["color"] == PALETTE
    assert tuple(fig.get_size_inches()) == pytest.approx(BOOK_STYLE["figure.figsize"])
    assert fig.get_layout_engine() is not None
    assert not ax.spines["top"].get_visible()
    assert not ax.spines["right"].get_visible()


def test_figure_grid_sizes():
    fig, axes = figure(3, 2)
    assert axes.shape == (2, 3)
    assert tuple(fig.get_size_inches()) == pytest.approx((9.6, 5.8))
    fig, _ = figure(width=4.0, height=2.0)
    assert tuple(fig.get_size_inches()) == pytest.approx((4.0, 2.0))


def test_use_book_style_idempotent():
    use_book_style()
    first = {k: plt.rcParams[k] for k in BOOK_STYLE}
    use_book_style()
    assert {k: plt.rcParams[k] for k in BOOK_STYLE} == first


def test_attention_heatmap_draws_weights():
    fig, ax = figure()
    w = np.array([[0.7, 0.3], [0.1, 0.9], [0.5, 0.5]])
    im = attention_heatmap(ax, w, row_labels=["a", "b", "c"], col_labels=["x", "y"], title="t", annotate=True)
    np.testing.assert_array_equal(im.get_array(), w)
    assert im.get_clim() == (0.0, 1.0)
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query" and ax.get_title() == "t"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert len(ax.texts) == w.size and ax.texts[0].get_text() == "0.70"


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4), ()])
def test_attention_heatmap_rejects_non_2d(shape):
    _, ax = figure()
    with pytest.raises(ValueError, match=r"weights must be 2-D \(n_q, n_k\), received shape"):
        attention_heatmap(ax, np.zeros(shape))


def test_glue_number_formats_and_glues(monkeypatch):
    import myst_nb

    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: calls.append((name, value, display)))
    out = book.glue_number("var_ratio", np.float64(1.00321))
    assert out == "1"  # format(1.00321, ".3g")
    assert book.glue_number("p_max", np.float64(0.5761168847658291), ".4f") == "0.5761"
    assert calls == [("var_ratio", out, False), ("p_max", "0.5761", False)]
    assert all(type(v) is str for _, v, _ in calls)  # never a numpy scalar
    assert "np.float64" not in "".join(v for _, v, _ in calls)


def test_glue_text(monkeypatch):
    import myst_nb

    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: calls.append((name, value, display)))
    assert book.glue_text("frac", "1/9") == "1/9"
    assert calls == [("frac", "1/9", False)]


def test_importing_attn_utils_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, attn_utils; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
