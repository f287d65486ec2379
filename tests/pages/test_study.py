"""The study tools of tools/build_study.py: the Anki deck, the one-page cheat sheet PDFs, the self-test page.

The expected counts are read from the notebooks here, not from the tool. The PDF tests skip without
xelatex, the site tests without a built site (make html) or Chromium.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).parent))

import build_study  # noqa: E402
from test_site import CHROMIUM, SITE, local_refs, run_chromium  # noqa: E402

NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


def markdown(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


WRONG_TARGETS = [t for p in NOTEBOOKS for t in re.findall(r"^\((wrong-[a-z0-9-]+)\)=\s*$", markdown(p), re.M)]


def test_selftest_page_is_generated_from_the_chapters():
    """selftest.md must match what tools/build_study.py generates (run: make summaries)."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_study.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_selftest_page_asks_every_chapter_question_in_both_languages():
    page = (ROOT / "selftest.md").read_text(encoding="utf-8")
    assert page.count("{container} selftest-item") == len(NOTEBOOKS)
    for path in NOTEBOOKS:
        md = markdown(path)
        title = re.search(r"^# (.+)$", md, re.M).group(1).strip()
        question_zh = re.search(r"^\*\*中文：(.+?)\*\*", md, re.M).group(1).strip()
        assert f"**{title}**" in page and question_zh in page, path.name


# ---------------------------------------------------------------------------------------------- deck


def read_deck(path: Path) -> tuple[dict, list[tuple]]:
    """The note types (id -> name) and notes (note type id, guid, fields) of an .apkg."""
    with zipfile.ZipFile(path) as apkg:
        names = apkg.namelist()
        assert "collection.anki2" in names, f"no Anki collection in the package: {names}"
        db = path.with_suffix(".anki2")
        db.write_bytes(apkg.read("collection.anki2"))
    con = sqlite3.connect(db)
    try:
        models = {int(k): m["name"] for k, m in json.loads(con.execute("select models from col").fetchone()[0]).items()}
        notes = con.execute("select mid, guid, flds from notes").fetchall()
    finally:
        con.close()
    return models, [(mid, guid, flds.split("\x1f")) for mid, guid, flds in notes]


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    """The deck built twice, once with a base URL for the links."""
    out = []
    for i, base in enumerate(("", "https://example.org/book")):
        folder = tmp_path_factory.mktemp(f"deck{i}")
        build_study.main(["deck", "--out", str(folder), "--base-url", base])
        out.append(read_deck(folder / build_study.DECK_FILE))
    return out


def test_deck_has_one_note_per_chapter_and_per_wrong_answer(decks):
    models, notes = decks[0]
    per_model = {name: sum(1 for mid, _, _ in notes if mid == m) for m, name in models.items()}
    assert per_model == {
        "Attention, Derived: question": len(NOTEBOOKS),
        "Attention, Derived: wrong answer": len(WRONG_TARGETS),
    }


def test_deck_ids_are_stable_across_builds(decks):
    """Same note types and note GUIDs in two builds (even with other links): a re-import updates the notes."""
    (models_a, notes_a), (models_b, notes_b) = decks
    assert models_a == models_b
    assert sorted((m, g) for m, g, _ in notes_a) == sorted((m, g) for m, g, _ in notes_b)
    assert len({g for _, g, _ in notes_a}) == len(notes_a), "two notes share a GUID"


def test_deck_fields_are_rendered(decks):
    """No MyST markup left on a card; math in Anki's \\( \\); a card's link is absolute when a base URL is given."""
    for (_, notes), base in zip(decks, ("", "https://example.org/book/")):
        for _, _, fields in notes:
            text = " ".join(fields)
            assert not re.search(r"\{[a-z:]+\}`|\$|\*\*", text), text[:300]
            assert text.count("\\(") == text.count("\\)")
            hrefs = re.findall(r'href="([^"]*)"', text)
            assert all(h.startswith(base + "chapters/") for h in hrefs) if base else not hrefs, hrefs


# ---------------------------------------------------------------------------------------------- PDFs


@pytest.fixture(scope="module")
def sheets(tmp_path_factory):
    if shutil.which("xelatex") is None:
        pytest.skip("xelatex not installed")
    out = tmp_path_factory.mktemp("sheets")
    build_study.main(["pdf", "--out", str(out)])
    return {paper: out / name for paper, name in build_study.SHEET_FILES.items()}


@pytest.mark.parametrize("paper, size", [("a4", (595, 842)), ("letter", (612, 792))])
def test_cheatsheet_pdf_is_one_page(sheets, paper, size):
    info = subprocess.run(["pdfinfo", sheets[paper]], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^Pages:\s+1$", info, re.M), info
    width, height = map(float, re.search(r"Page size:\s+([\d.]+) x ([\d.]+)", info).groups())
    assert (round(width), round(height)) == size


@pytest.mark.parametrize("paper", ["a4", "letter"])
def test_cheatsheet_pdf_text_is_at_least_6pt(sheets, paper):
    """Every font size the page sets (the Tf operators of its content streams) is 6 pt or more."""
    data = sheets[paper].read_bytes()
    sizes = []
    for stream in re.findall(rb"stream\r?\n(.*?)endstream", data, re.S):
        try:
            sizes += [float(s) for s in re.findall(rb"/F\d+\s+([\d.]+)\s+Tf", zlib.decompress(stream))]
        except zlib.error:
            continue
    assert sizes, "no text found in the PDF"
    # Sizes are in PostScript points (1/72 in); 6 TeX points are 5.98 of them.
    assert min(sizes) >= 6 * 72 / 72.27 - 1e-3, f"smallest text {min(sizes):.2f} bp"


def words(pdf: Path) -> tuple[tuple[float, float], list[tuple[float, float, float, float, str]]]:
    """The page size and every word's box (x0, y0, x1, y1, text), from pdftotext -bbox."""
    out = subprocess.run(["pdftotext", "-bbox", pdf, "-"], capture_output=True, text=True, check=True).stdout
    size = tuple(map(float, re.search(r'<page width="([\d.]+)" height="([\d.]+)"', out).groups()))
    boxes = re.findall(r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">(.*?)</word>', out)
    return size, [(*map(float, b[:4]), html.unescape(b[4])) for b in boxes]


@pytest.mark.parametrize("paper", ["a4", "letter"])
def test_cheatsheet_pdf_stays_on_the_page(sheets, paper):
    """A table taller than the page is cut off, not moved to a second page: every word, down to the
    note under the table, lies inside the page with a margin of at least 5 mm."""
    (width, height), boxes = words(sheets[paper])
    margin = 5 / 25.4 * 72
    outside = [w for w in boxes if w[0] < margin or w[1] < margin or w[2] > width - margin or w[3] > height - margin]
    assert not outside, f"words outside the page: {outside[:5]}"
    assert boxes[-1][4] == "code.", f"the note under the table is missing; last word: {boxes[-1]}"


@pytest.mark.parametrize("paper", ["a4", "letter"])
def test_cheatsheet_pdf_has_every_question(sheets, paper):
    """The question column, read top to bottom, holds every chapter's question in English and its first
    question in Chinese (the whole 中文 line is on the site), in order."""
    _, boxes = words(sheets[paper])
    left = next(w for w in boxes if w[4] == "Question")[0]
    right = next(w for w in boxes if w[4] == "Answer")[0]
    # Lines top to bottom, words left to right; Chinese and Latin boxes of one line differ in height.
    lines: list[list] = []
    for w in sorted((w for w in boxes if left <= w[0] < right), key=lambda w: w[1] + w[3]):
        if lines and abs((w[1] + w[3]) - (lines[-1][0][1] + lines[-1][0][3])) < 6:
            lines[-1].append(w)
        else:
            lines.append([w])
    column = "".join(w[4] for line in lines for w in sorted(line))
    pos = 0
    for ch in build_study.load():
        for text in (ch.sheet["ask"], ch.first_question_zh):
            found = column.find("".join(text.split()), pos)
            assert found >= 0, f"{ch.path.name}: {text!r} not in the question column after position {pos}"
            pos = found


# ---------------------------------------------------------------------------------------------- site

site_built = pytest.mark.skipif(not (SITE / "selftest.html").exists(), reason="website not built (run make html)")


@site_built
@pytest.mark.parametrize("name", ["selftest.html", "intro.html"])
def test_study_links_of_the_site_resolve(name):
    """The deck and the PDFs the pages link to are next to them (make html builds them)."""
    page = SITE / name
    study = {build_study.DECK_FILE, *build_study.SHEET_FILES.values()}
    linked = {p.name: p for _, p in local_refs(page.read_text(encoding="utf-8"), page) if p.name in study}
    assert set(linked) == study, f"{name} does not link to {sorted(study - set(linked))}"
    missing = sorted(n for n, p in linked.items() if not p.exists())
    assert not missing, f"{name} links to missing files: {missing} (make html builds them; or make study)"


PROBE = """
<script>
// Runs the self-test as a reader would and reports what it saw.
window.addEventListener("load", async () => {
  const out = document.createElement("pre");
  out.id = "selftest-probe";
  const report = {};
  try {
    await new Promise((done) => setTimeout(done, 6000));  // virtual time: MathJax has typeset by then
    const items = () => Array.from(document.querySelectorAll("div.selftest > div.selftest-item"));
    const order = () => items().map((i) => i.dataset.question).join(",");
    // A closed <details> keeps its content laid out but not rendered: ask whether it is visible.
    const shown = (el) => el.checkVisibility() && el.getBoundingClientRect().height > 0;
    const answers = () => items().map((i) => i.querySelector("details"));
    report.count = items().length;
    report.source = items().map((_, k) => String(k + 1)).join(",");
    report.first = order();
    const bilingual = (text) => /[\\u4e00-\\u9fff]/.test(text) && /[A-Za-z]{3}/.test(text);
    report.bilingual = items().every((i) => bilingual(i.textContent));
    report.closed = answers().every((d) => d && !d.open && !shown(d.querySelector(".sd-summary-content")));
    const first = answers()[0];
    first.querySelector("summary").click();
    await new Promise((done) => setTimeout(done, 500));
    report.opened = first.open && shown(first.querySelector(".sd-summary-content"));
    report.math = first.querySelectorAll("mjx-container").length;
    report.errors = document.querySelectorAll("mjx-merror").length;
    document.querySelector("button.selftest-shuffle").click();
    report.second = order();
    report.closedAfterShuffle = answers().every((d) => !d.open);
  } catch (e) { report.error = String(e); }
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
});
</script>
"""


@site_built
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed")
def test_selftest_works_offline_in_chromium(tmp_path):
    page = SITE / "selftest.html"
    probe = page.with_name("_probe_selftest.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        dom = run_chromium(probe.as_uri(), tmp_path).stdout  # no network: everything the page needs is local
    finally:
        probe.unlink()
    found = re.search(r'<pre id="selftest-probe"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run"
    report = json.loads(html.unescape(found.group(1)))
    assert "error" not in report, report
    assert report["count"] == len(NOTEBOOKS)
    assert report["bilingual"], "a question lacks its English or Chinese text"
    assert report["closed"], "an answer is visible before the reader asks for it"
    assert report["opened"], "clicking the answer's summary did not show it"
    assert report["math"] > 0 and report["errors"] == 0, "the answer's math is not typeset"
    assert report["first"] != report["source"], "the questions are in the book's order, not shuffled"
    assert report["second"] != report["first"], "Shuffle did not change the order"
    assert sorted(report["second"].split(",")) == sorted(report["source"].split(",")), "Shuffle lost a question"
    assert report["closedAfterShuffle"]
