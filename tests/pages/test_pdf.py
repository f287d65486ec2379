"""The PDF agrees with the website: same equation, figure, proposition and exercise numbers for the
same label, a Bibliography chapter that holds the list, no "((1.1))" and no "Page 98, 6" marks.

Runs after ``make html`` and ``make pdf`` (CI runs it after the PDF); skipped when either is not
built, so ``make test`` still passes on a machine without LaTeX. Numbers are read from what LaTeX
wrote (the .aux file: the number each label got when typeset) and from the .tex (the titles Sphinx
numbered), and compared with the numbers on the website's pages.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
LATEX = ROOT / "_build" / "latex"
NAME = "attention-derived"
PDF, TEX, AUX, TOC = (LATEX / f"{NAME}.{ext}" for ext in ("pdf", "tex", "aux", "toc"))

pytestmark = [
    pytest.mark.skipif(not all(p.exists() for p in (PDF, TEX, AUX)), reason="PDF not built (run make pdf)"),
    pytest.mark.skipif(not (SITE / "index.html").exists(), reason="website not built (run make html)"),
]


@cache
def pdf_pages() -> list[str]:
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext (poppler-utils) is not installed")
    text = subprocess.run(["pdftotext", "-layout", str(PDF), "-"], capture_output=True, text=True, check=True).stdout
    return text.split("\f")


@cache
def aux_numbers() -> dict[str, tuple[str, str]]:
    """label -> (number, hyperref anchor) for every label LaTeX wrote to the .aux file."""
    found = {}
    for label, number, anchor in re.findall(
        r"^\\newlabel\{([^}]*)\}\{\{([^}]*)\}\{[^}]*\}\{.*\}\{([^}]*)\}\{[^}]*\}\}$",
        AUX.read_text(encoding="utf-8"),
        flags=re.M,
    ):
        found[label] = (number, anchor)
    return found


def site_pages() -> dict[str, str]:
    """docname -> HTML of the numbered pages (the chapters)."""
    return {f"chapters/{page.stem}": page.read_text(encoding="utf-8") for page in sorted(SITE.glob("chapters/*.html"))}


def test_equation_numbers_match_the_website():
    compared = []
    for doc, html in site_pages().items():
        for label, eqno in re.findall(r'id="equation-([^"]+)">\s*<span class="eqno">\(([^)<]+)\)', html):
            latex = aux_numbers().get(f"equation:{doc}:{label}")
            if latex is not None:
                compared.append((doc, label, eqno, latex[0]))
    assert len(compared) >= 20, "too few labelled equations found in both outputs to compare"
    differ = [c for c in compared if c[2] != c[3]]
    assert not differ, f"{len(differ)} of {len(compared)} equations differ (doc, label, site, PDF): {differ[:5]}"


def test_figure_numbers_match_the_website():
    compared = []
    for doc, html in site_pages().items():
        for label, number in re.findall(
            r'<figure[^>]*\bid="([^"]+)"[^>]*>.*?<span class="caption-number">Fig\. ([\d.]+)', html, flags=re.S
        ):
            latex = aux_numbers().get(f"{doc}:{label}")
            if latex is not None and latex[1].startswith("figure."):
                compared.append((doc, label, number, latex[0]))
    assert len(compared) >= 10, "too few labelled figures found in both outputs to compare"
    differ = [c for c in compared if c[2] != c[3]]
    assert not differ, f"{len(differ)} of {len(compared)} figures differ (doc, label, site, PDF): {differ[:5]}"


def test_proposition_and_exercise_numbers_match_the_website():
    """Sphinx numbers these itself; the .tex has the number in the box title after the label."""
    tex = TEX.read_text(encoding="utf-8")
    label_then_title = r"\\label\{(?:exercise:|[^{}:]*:)([^{}]+)\}\s*\\begin\{sphinxadmonition\}\{note\}\{(\w+ [\d.]+)"
    in_pdf = dict(re.findall(label_then_title, tex))
    compared = []
    for html in site_pages().values():
        for label, title in re.findall(
            r'<div class="(?:proof|exercise)\b[^"]*" id="([^"]+)">\s*<p class="admonition-title">'
            r'<span class="caption-number">(\w+ [\d.]+) ',
            html,
        ):
            compared.append((label, title, in_pdf.get(label)))
    kinds = {title.split()[0] for _, title, _ in compared}
    assert {"Proposition", "Exercise"} <= kinds, f"expected numbered propositions and exercises, found {kinds}"
    differ = [c for c in compared if c[1] != c[2]]
    assert not differ, f"{len(differ)} of {len(compared)} differ (label, site, PDF): {differ[:5]}"


def test_no_doubled_parentheses_around_equation_numbers():
    doubled = [m for page in pdf_pages() for m in re.findall(r"\(\(\d+(?:\.\d+)*\)\)", page)]
    assert not doubled, f"{len(doubled)} equation references print in double parentheses: {doubled[:5]}"


def test_repeated_footnote_marks_do_not_read_page_n_m():
    marks = [m for page in pdf_pages() for m in re.findall(r"Page \d+, \d+", page)]
    assert not marks, f'{len(marks)} footnote marks read like "Page 98, 6": {marks[:5]}'


def bib_keys() -> list[str]:
    """The entries of references.bib (the Bibliography page lists them all: ``:all:``)."""
    return re.findall(
        r"^@(?!comment|string|preamble)\w+\s*\{\s*([^,\s]+)", (ROOT / "references.bib").read_text(), flags=re.M | re.I
    )


def test_bibliography_chapter_holds_the_list():
    expected = len(bib_keys())
    assert expected > 0
    pages = pdf_pages()
    # The chapter's first page: a line that is only the heading (the contents' line has a page number).
    start = next(
        (i for i, page in enumerate(pages) if re.search(r"^\s*Bibliography\s*$", page, flags=re.M) and i > 2),
        None,
    )
    assert start is not None, "no page starts the Bibliography chapter"
    entries = 0
    for i, page in enumerate(pages[start:]):
        on_page = len(re.findall(r"^\s*\[\d+\]\s+\S", page, flags=re.M))
        if i and not on_page:
            break  # the list has ended (or never started under the heading)
        entries += on_page
    assert entries >= expected, f"the Bibliography chapter lists {entries} entries, references.bib has {expected}"


def test_bibliography_is_in_the_contents_once():
    if not TOC.exists():
        pytest.skip("no .toc file")
    lines = re.findall(r"\\contentsline \{\w+\}\{Bibliography\}", TOC.read_text(encoding="utf-8"))
    assert len(lines) == 1, f"the contents list the Bibliography {len(lines)} times"


def test_each_exercise_names_the_page_of_its_solution():
    """Solutions follow all of a chapter's exercises; each exercise says where its solution is, and
    that page (the number in the page's footer) is where the solution's box starts."""
    pointer, solution_page, exercise = {}, {}, None
    for page in pdf_pages():
        lines = [line for line in page.splitlines() if line.strip()]
        footer = re.search(r"(\d+)\s*$", lines[-1]) if lines else None
        for line in lines:
            if m := re.match(r"\s*Exercise (\d+\.\d+)\s*$", line):
                exercise = m.group(1)
            if (m := re.search(r"Solution: p\.\s*(\d+)", line)) and exercise:
                pointer[exercise] = m.group(1)
            if (m := re.match(r"\s*Solution to Exercise (\d+\.\d+)", line)) and footer:
                solution_page[m.group(1)] = footer.group(1)
    assert solution_page, "no solutions found in the PDF"
    assert pointer.keys() == solution_page.keys(), "an exercise without a pointer to its solution, or the reverse"
    wrong = {k: (pointer[k], solution_page[k]) for k in pointer if pointer[k] != solution_page[k]}
    assert not wrong, f"exercise: (page named, page of the solution) {wrong}"
