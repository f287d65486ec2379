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

ROOT = Path(__file__).resolve().parents[2]
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


RAW_TEX = re.compile(r"\\[A-Za-z]+|\$[^$\s][^$]{0,60}\$")


BACK_MATTER = [SITE / "cheatsheet.html", SITE / "wrong_answers.html", SITE / "bibliography.html"]


@pytest.mark.parametrize("page", PAGES + BACK_MATTER, ids=lambda p: p.stem)
def test_no_raw_latex_in_the_text(page):
    """Math the page did not typeset shows as raw TeX (a line of a formula that starts with "- "
    becomes a list item and splits the formula; a bibliography title keeps its dollars). Outside
    math, code and scripts, a page's text contains no TeX command and no $...$."""
    import html as html_lib

    text = page.read_text(encoding="utf-8")
    for pattern in (
        r'<span class="math[^"]*">.*?</span>',
        r'<div class="math[^"]*".*?</div>',
        r"<pre.*?</pre>",
        r"<code.*?</code>",
        r"<script.*?</script>",
        r"<style.*?</style>",
        r"<head.*?</head>",
    ):
        text = re.sub(pattern, " ", text, flags=re.S)
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", text))
    found = RAW_TEX.search(text)
    assert found is None, f"raw TeX on {page.name}: …{text[max(found.start() - 60, 0) : found.end() + 40]}…"


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


PROBE = """
<script>
// Measures, once MathJax has typeset the page, what does not fit the reading column.
window.addEventListener("load", async () => {
  const out = document.createElement("pre");
  out.id = "overflow-probe";
  try {
  await new Promise((done) => setTimeout(done, 8000));  // virtual time: MathJax has typeset by then
  const column = document.querySelector("article") || document.body;
  const right = column.getBoundingClientRect().right + 1;
  const report = {cut: [], wide: [], lines: [], equations: 0, outputs: 0};
  document.querySelectorAll("div.math").forEach((box) => {
    report.equations += 1;
    const eq = box.querySelector("mjx-container");
    const label = (box.id || (box.querySelector("[id]") || {}).id || box.textContent.slice(0, 40)).trim();
    const scrolls = ["auto", "scroll"].includes(getComputedStyle(box).overflowX);
    if (box.getBoundingClientRect().right > right) report.cut.push(label);  // sticks out of the column
    else if (eq && box.scrollWidth > box.clientWidth + 1) (scrolls ? report.wide : report.cut).push(label);
  });
  document.querySelectorAll("div.cell_output pre, div.output pre").forEach((pre) => {
    report.outputs += 1;
    if (pre.scrollWidth > pre.clientWidth + 1) report.lines.push(pre.textContent.slice(0, 60));
  });
  const sheet = document.querySelector("table.cheatsheet-table");
  report.table_bottom = sheet ? sheet.getBoundingClientRect().bottom : null;
  report.viewport_height = window.innerHeight;
  out.textContent = JSON.stringify(report);
  } catch (err) { out.textContent = JSON.stringify({error: String(err)}); }
  document.body.appendChild(out);
});
</script>
"""


def overflow_report(page: Path, width: int, tmp_path: Path, height: int = 900) -> dict:
    """Load a copy of ``page`` with the probe in headless Chromium at ``width`` x ``height`` CSS pixels."""
    import json

    probe = page.with_name(f"_probe_{width}_{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        cmd = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--user-data-dir={tmp_path}",
            "--proxy-server=127.0.0.1:9",
            "--virtual-time-budget=20000",
            "--dump-dom",
            probe.as_uri(),
        ]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout
    finally:
        probe.unlink()
    found = re.search(r'<pre id="overflow-probe">(.*?)</pre>', dom, flags=re.S)
    assert found, f"the overflow probe did not run on {page.name}"
    import html

    return json.loads(html.unescape(found.group(1)))


LAPTOP, PHONE = 1366, 390


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_nothing_is_cut_off_on_a_phone_or_a_laptop(page, tmp_path):
    """No display equation or check line is cut off. On a laptop every equation fits its
    column; on a phone a long equation may scroll sideways inside its own box, but nothing sticks
    out of the column or hides behind the theme's overflow:hidden, and check lines wrap."""
    laptop = overflow_report(page, LAPTOP, tmp_path / "laptop")
    assert not laptop["cut"] and not laptop["wide"], f"equations wider than the column at {LAPTOP} px: {laptop}"
    assert not laptop["lines"], f"output lines overflow at {LAPTOP} px: {laptop['lines']}"
    phone = overflow_report(page, PHONE, tmp_path / "phone")
    assert not phone["cut"], f"equations cut off at {PHONE} px: {phone['cut']}"
    assert not phone["lines"], f"output lines overflow at {PHONE} px: {phone['lines']}"


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed")
def test_cheatsheet_table_fits_one_laptop_screen(tmp_path):
    """The cheat sheet's table, all fifteen questions, is read without scrolling in a
    1366 x 768 Chromium window (the page shows it in a viewport about 625 px high)."""
    report = overflow_report(SITE / "cheatsheet.html", LAPTOP, tmp_path, height=768)
    assert report["table_bottom"] is not None, "no cheat-sheet table on the page"
    assert report["table_bottom"] <= report["viewport_height"], (
        f"the table ends at {report['table_bottom']:.0f} px, below the window's {report['viewport_height']} px"
    )


def test_search_finds_chinese_words_and_english_stems():
    """The Chinese lines are segmented into words (jieba, html_search_language: zh), so a
    reader searching 梯度 or 注意力 finds the chapters; English words are still stemmed."""
    import json

    text = (SITE / "searchindex.js").read_text(encoding="utf-8")
    terms = json.loads(text[text.index("(") + 1 : text.rindex(")")])["terms"]
    for word in ("梯度", "注意力", "缩放", "饱和", "softmax", "gradient", "attent"):
        assert word in terms, f"{word!r} is not a term of the search index"
