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


def run_chromium(url: str, user_dir: Path, *flags: str, budget_ms: int = 20000, timeout: int = 180):
    """Headless Chromium with ``--dump-dom`` on ``url``, no network (a dead proxy; loopback, as
    Chromium bypasses proxies for it, still works unless ``flags`` say otherwise) and no background
    services. Returns the completed process (its stdout is the page's DOM after ``budget_ms`` of
    virtual time)."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={user_dir}",
        "--proxy-server=127.0.0.1:9",
        *flags,
        f"--virtual-time-budget={budget_ms}",
        "--dump-dom",
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


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
    dom = run_chromium(
        page.as_uri(), tmp_path, "--disable-quic", "--proxy-bypass-list=<-loopback>", budget_ms=15000, timeout=120
    ).stdout
    assert "</html>" in dom, "Chromium did not return the page"
    rendered = len(re.findall(r"<mjx-container", dom))
    assert rendered > 0, f"MathJax rendered no math on {page.name}"
    assert "<mjx-merror" not in dom, f"MathJax reported an error on {page.name}"
    assert not re.search(r"<img [^>]*src=\"https?:", dom), "an image is loaded from the network"


PROBE = """
<script>
// Measures, once MathJax has typeset the page, what does not fit the reading column or cannot be reached.
window.addEventListener("load", async () => {
  const out = document.createElement("pre");
  out.id = "overflow-probe";
  try {
  await new Promise((done) => setTimeout(done, 8000));  // virtual time: MathJax has typeset by then
  const column = document.querySelector("article") || document.body;
  const edge = column.getBoundingClientRect();
  const right = edge.right + 1;
  const report = {cut: [], wide: [], lines: [], equations: 0, outputs: 0,
                  start_hidden: [], number_lost: [], off_centre: [], inline_cut: [], inlines: 0,
                  tables_cut: [], no_cue: [], tables: 0};
  const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const overflows = (el) => el.scrollWidth > el.clientWidth + 1;
  // A sideways scroll box says that it scrolls: its edge (or its wrapper's) fades or casts a shadow
  // over the content (a shadow under the content is hidden by opaque cells).
  const cued = (box) => [box, box.parentElement].some((el) => {
    const style = getComputedStyle(el);
    if ((style.maskImage || style.webkitMaskImage || "none") !== "none") return true;
    return ["::before", "::after"].some((pseudo) => {
      const shade = getComputedStyle(el, pseudo);
      return shade.content !== "none" && shade.backgroundImage !== "none" && Number(shade.opacity) > 0;
    });
  });
  const name = (el) => (el.id || (el.querySelector("[id]") || {}).id || el.textContent.slice(0, 40)).trim();
  // A formula can be read when every ancestor that clips it (overflow other than visible) either
  // scrolls to it or holds all of it, up to the column, which must hold the outermost one.
  const reachable = (el) => {
    let rect = el.getBoundingClientRect();
    for (let box = el.parentElement; box && box !== column; box = box.parentElement) {
      if (getComputedStyle(box).overflowX === "visible") continue;
      const inner = box.getBoundingClientRect();
      if (scrolls(box)) { rect = inner; continue; }
      if (rect.left < inner.left - 1 || rect.right > inner.right + 1) return false;
    }
    return rect.left >= edge.left - 1 && rect.right <= right;
  };
  document.querySelectorAll("div.math").forEach((box) => {
    report.equations += 1;
    const eq = box.querySelector("mjx-container");
    const label = name(box);
    if (box.getBoundingClientRect().right > right) report.cut.push(label);  // sticks out of the column
    else if (eq && overflows(box)) (scrolls(box) ? report.wide : report.cut).push(label);
    if (!eq) return;
    const number = box.querySelector("span.eqno");
    // An equation that fits is centred in the space beside its number (within 1em).
    const formula = eq.querySelector("mjx-math") || eq;
    const at = formula.getBoundingClientRect();
    const view = box.getBoundingClientRect();
    const space = [view.left, number ? number.getBoundingClientRect().left : view.right];
    const em = parseFloat(getComputedStyle(box).fontSize);
    if (!overflows(box) && Math.abs(at.left + at.right - space[0] - space[1]) / 2 > em) report.off_centre.push(label);
    // Opens at its start: the formula's left edge is in view and no box around it is scrolled.
    const start = at.left;
    for (let el = formula; el && el !== box.parentElement; el = el.parentElement) {
      if (el.scrollLeft !== 0 || start < el.getBoundingClientRect().left - 1) {
        report.start_hidden.push(label);
        break;
      }
    }
    // The equation number is in view or further along the box's scroll, not before its start.
    if (number) {
      const end = view.left - box.scrollLeft + box.scrollWidth;
      const place = number.getBoundingClientRect();
      if (place.left < view.left - 1 || place.right > end + 1) report.number_lost.push(label);
    }
    if (overflows(box) && !cued(box)) report.no_cue.push(label);
  });
  column.querySelectorAll("mjx-container:not([display='true'])").forEach((eq) => {
    if (eq.closest("div.math")) return;
    report.inlines += 1;
    if (!reachable(eq)) report.inline_cut.push(eq.textContent.slice(0, 40));
    const box = eq.closest("span.math");
    if (box && scrolls(box) && overflows(box) && !cued(box)) report.no_cue.push(eq.textContent.slice(0, 40));
  });
  // A table wider than its place scrolls inside a box that says so; nothing of it is out of reach.
  column.querySelectorAll("table").forEach((table) => {
    if (table.closest("div.cell_output")) return;
    report.tables += 1;
    const label = (table.querySelector("th, td") || table).textContent.trim().slice(0, 40);
    if (!reachable(table)) report.tables_cut.push(label);
    let box = table.parentElement;
    while (box !== column && !scrolls(box)) box = box.parentElement;
    if (box !== column && overflows(box) && !cued(box)) report.no_cue.push(label);
  });
  document.querySelectorAll("div.cell_output pre, div.output pre").forEach((pre) => {
    report.outputs += 1;
    if (overflows(pre)) report.lines.push(pre.textContent.slice(0, 60));
  });
  const sheet = document.querySelector("table.cheatsheet-table");
  report.table_bottom = sheet ? sheet.getBoundingClientRect().bottom : null;
  report.viewport_height = window.innerHeight;
  report.viewport_width = window.innerWidth;
  out.textContent = JSON.stringify(report);
  } catch (err) { out.textContent = JSON.stringify({error: String(err)}); }
  document.body.appendChild(out);
  if (window.parent !== window) window.parent.postMessage(out.textContent, "*");  // a phone-sized frame
});
</script>
"""


# Headless Chromium lays a page out at least this wide, whatever --window-size asks for (a 390 px
# window renders a 500 px page and crops it); a narrower page is measured inside a frame that wide.
NARROWEST_WINDOW = 500
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe src="{src}" style="border:0;width:{width}px;height:{height}px"></iframe>
<script>
window.addEventListener("message", (event) => {{
  const out = document.createElement("pre");
  out.id = "overflow-probe";
  out.textContent = event.data;
  document.body.appendChild(out);
}});
</script></body></html>
"""


def overflow_report(page: Path, width: int, tmp_path: Path, height: int = 900) -> dict:
    """Load a copy of ``page`` with the probe in headless Chromium at ``width`` x ``height`` CSS pixels."""
    import json

    probe = page.with_name(f"_probe_{width}_{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    shown = probe
    if width < NARROWEST_WINDOW:
        shown = page.with_name(f"_frame_{width}_{page.name}")
        shown.write_text(FRAME.format(src=probe.name, width=width, height=height), encoding="utf-8")
    try:
        window = f"--window-size={max(width, NARROWEST_WINDOW)},{height}"
        run = run_chromium(shown.as_uri(), tmp_path, "--hide-scrollbars", window)
    finally:
        probe.unlink()
        shown.unlink(missing_ok=True)
    found = re.search(r'<pre id="overflow-probe">(.*?)</pre>', run.stdout, flags=re.S)
    assert found, f"the overflow probe did not run on {page.name} (exit {run.returncode}): {run.stderr[-500:]}"
    import html

    report = json.loads(html.unescape(found.group(1)))
    laid_out = report.get("viewport_width")
    assert laid_out == width, f"{page.name} was laid out {laid_out} px wide, not {width}"
    return report


LAPTOP, PHONE = 1366, 390


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_nothing_is_cut_off_on_a_phone_or_a_laptop(page, tmp_path):
    """No equation, formula, table or check line is cut off. On a laptop every display equation
    fits its column; on a phone a long one scrolls sideways inside its own box, which opens at the
    equation's start, shows that it scrolls, and keeps the number within reach. An inline formula
    or a table wider than the column scrolls too: nothing sticks out of the column or hides behind
    an overflow:hidden, and check lines wrap."""
    laptop = overflow_report(page, LAPTOP, tmp_path / "laptop")
    assert not laptop["cut"] and not laptop["wide"], f"equations wider than the column at {LAPTOP} px: {laptop}"
    assert not laptop["off_centre"], f"equations not centred at {LAPTOP} px: {laptop['off_centre']}"
    assert not laptop["inline_cut"], f"inline formulas cut off at {LAPTOP} px: {laptop['inline_cut']}"
    assert not laptop["tables_cut"], f"tables cut off at {LAPTOP} px: {laptop['tables_cut']}"
    assert not laptop["lines"], f"output lines overflow at {LAPTOP} px: {laptop['lines']}"
    phone = overflow_report(page, PHONE, tmp_path / "phone")
    assert not phone["cut"], f"equations cut off at {PHONE} px: {phone['cut']}"
    hidden = phone["start_hidden"]
    assert not hidden, f"{len(hidden)} of {phone['equations']} equations open with their start hidden: {hidden}"
    assert not phone["off_centre"], f"equations not centred at {PHONE} px: {phone['off_centre']}"
    assert not phone["number_lost"], f"equation numbers out of reach at {PHONE} px: {phone['number_lost']}"
    inline = phone["inline_cut"]
    assert not inline, f"{len(inline)} of {phone['inlines']} inline formulas cut off at {PHONE} px: {inline}"
    assert not phone["tables_cut"], f"tables cut off at {PHONE} px: {phone['tables_cut']}"
    assert not phone["no_cue"], f"boxes that scroll sideways with no visible cue at {PHONE} px: {phone['no_cue']}"
    assert not phone["lines"], f"output lines overflow at {PHONE} px: {phone['lines']}"


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed")
def test_cheatsheet_table_fits_one_laptop_screen(tmp_path):
    """The cheat sheet's table, every question of the book, is read without scrolling in a
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
