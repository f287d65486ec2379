"""The built website works offline: math renders in a real browser, figures and assets are local.

Runs after ``make html`` (CI calls ``make check-site``); skipped when the site is not built or
Chromium is missing, so ``make test`` still passes on a machine without them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
PAGES = sorted(SITE.glob("chapters/*.html")) + [SITE / "intro.html", SITE / "notation.html"]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)

pytestmark = pytest.mark.skipif(not (SITE / "index.html").exists(), reason="website not built (run make html)")


def local_refs(html: str, page: Path):
    for attr, url in re.findall(r'\b(src|href)="([^"#]+)', html):
        parsed = urlparse(url)
        if parsed.scheme or url.startswith("//") or url.startswith("mailto:"):
            continue
        yield attr, (page.parent / unquote(parsed.path)).resolve()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_local_asset_exists(page):
    html = page.read_text(encoding="utf-8")
    missing = [str(p.relative_to(SITE)) for attr, p in local_refs(html, page) if attr == "src" and not p.exists()]
    assert not missing, f"{page.name} refers to missing files: {missing[:5]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_script_or_stylesheet_from_the_network(page):
    html = page.read_text(encoding="utf-8")
    remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?:|//)[^"]*"', html)
    assert not remote, f"{page.name} loads {len(remote)} script/stylesheet(s) from the network"


def test_chapters_have_figures():
    for page in SITE.glob("chapters/*.html"):
        assert re.search(r'<img [^>]*src="[^"]+\.png"', page.read_text(encoding="utf-8")), f"no figure in {page.name}"


@pytest.mark.requires_chromium
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_math_renders_offline_in_chromium(page, tmp_path):
    """Headless Chromium with networking off loads the page from file:// and MathJax typesets it."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path}",
        "--proxy-server=127.0.0.1:9",
        "--proxy-bypass-list=<-loopback>",
        "--virtual-time-budget=15000",
        "--dump-dom",
        page.as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    assert "</html>" in dom, "Chromium did not return the page"
    rendered = len(re.findall(r"<mjx-container", dom))
    assert rendered > 0, f"MathJax rendered no math on {page.name}"
    assert "<mjx-merror" not in dom, f"MathJax reported an error on {page.name}"
    assert not re.search(r"<img [^>]*src=\"https?:", dom), "an image is loaded from the network"


def test_search_finds_chinese_words_and_english_stems():
    """Issue 14: the Chinese lines are segmented into words (jieba, html_search_language: zh), so a
    reader searching 梯度 or 注意力 finds the chapters; English words are still stemmed."""
    import json

    text = (SITE / "searchindex.js").read_text(encoding="utf-8")
    terms = json.loads(text[text.index("(") + 1 : text.rindex(")")])["terms"]
    for word in ("梯度", "注意力", "缩放", "饱和", "softmax", "gradient", "attent"):
        assert word in terms, f"{word!r} is not a term of the search index"
