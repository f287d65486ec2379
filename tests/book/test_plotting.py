"""Tests for attn_utils.book: plotting, glue, and the package layout."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attn_utils import PALETTE, attention_heatmap, figure, use_book_style
from attn_utils.book import glue
from attn_utils.book.plotting import BOOK_STYLE


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


def _displayed(monkeypatch):
    """Record what IPython would display (the glue outputs)."""
    import IPython.display

    calls = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False, metadata=None: calls.append((obj, metadata)))
    return calls


def test_glue_writes_what_myst_nb_glue_writes(monkeypatch):
    """The same output bundle and metadata as myst_nb.glue(name, text, display=False)."""
    import myst_nb.ext.glue as mg

    ours = _displayed(monkeypatch)
    glue.glue_text("frac", "1/9")
    theirs = []
    monkeypatch.setattr(mg, "ipy_display", lambda obj, raw=False, metadata=None: theirs.append((obj, metadata)))
    mg.glue("frac", "1/9", display=False)
    assert ours == theirs and glue.GLUE_PREFIX == mg.GLUE_PREFIX


def test_glue_number_formats_and_glues(monkeypatch):
    calls = _displayed(monkeypatch)
    out = glue.glue_number("var_ratio", np.float64(1.00321))
    assert out == "1"  # format(1.00321, ".3g")
    assert glue.glue_number("p_max", np.float64(0.5761168847658291), ".4f") == "0.5761"
    assert glue.glue_number("acc", 0.42, ".2f", approx=True) == "≈0.42"
    texts = [bundle[glue.GLUE_PREFIX + "text/plain"] for bundle, _ in calls]
    assert texts == ["'1'", "'0.5761'", "'≈0.42'"]  # a str's repr: never np.float64(...)
    assert [meta["scrapbook"]["name"] for _, meta in calls] == ["var_ratio", "p_max", "acc"]


def test_glue_text(monkeypatch):
    calls = _displayed(monkeypatch)
    assert glue.glue_text("frac", "1/9") == "1/9"
    assert calls[0][0] == {glue.GLUE_PREFIX + "text/plain": "'1/9'"}


def test_importing_attn_utils_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, attn_utils; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_importing_every_module_has_no_side_effects():
    """Importing any module of the package, experiments included, registers no score and
    loads no matplotlib: registration is an explicit call (ch07_scores.register_scores)."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, attn_utils\n"
        "for m in pkgutil.walk_packages(attn_utils.__path__, 'attn_utils.'):\n"
        "    importlib.import_module(m.name)\n"
        "from attn_utils.harness.training import SCORES\n"
        "sys.exit(f'registered {sorted(SCORES)}' if list(SCORES) != ['dot'] else 'matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_layers_import_one_way():
    """experiments → harness → book → core → validation: a lower layer never imports a higher one,
    and an experiment module imports only earlier chapters' modules."""
    import ast
    import pathlib

    rank = {"validation": 0, "core": 1, "book": 2, "harness": 3, "experiments": 4}
    root = pathlib.Path(__file__).resolve().parents[2] / "attn_utils"

    def layer(rel: str) -> str:
        top = rel.split("/")[0].split(".")[0]
        return top if top in rank else "core"

    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            target = (path.parent / ("../" * (node.level - 1)) / (node.module or "").replace(".", "/")).resolve()
            trel = target.relative_to(root).as_posix()
            assert rank[layer(trel)] <= rank[layer(rel)], f"{rel} imports {trel}"
            if layer(rel) == "experiments" and layer(trel) == "experiments" and trel != "experiments":
                assert trel.split("/")[-1] < path.stem, f"{rel} imports a later chapter's {trel}"
            names = [a.name for a in node.names]
            assert not any(n.startswith("_") and not n.startswith("__") for n in names), f"{rel} imports {names}"
