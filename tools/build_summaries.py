"""Generate the cheat sheet and the wrong-answers catalogue from the chapter notebooks.

Usage: python tools/build_summaries.py [--check]

- cheatsheet.md: a compact table (question | one-line answer | formula | number to remember), then
  every chapter's "Short answer" box in English and Chinese, linking to the chapter. The row comes
  from the chapter notebook's metadata ``"cheatsheet": {"ask": …, "answer": …, "formula": "$…$",
  "remember": "… {glue:text}`key` …"}``.
- chapters/*.ipynb: right after each chapter's short answer, a small "at a glance" table of the
  same formula and number (the chapter's first screen shows them).
- wrong_answers.md: every "(wrong-…)=" target in a chapter's "Common wrong answers" section: the
  claim (the paragraph's opening in bold) and its one-sentence correction from the notebook's
  metadata ``"wrong_answers": {target: correction}``, linking to the paragraph and the cell that
  refutes it.

The chapters are the single source; these pages are generated so they cannot drift.
``--check`` exits 1 if the committed pages differ from what would be generated (used by the tests).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = re.compile(r"^\((wrong-[a-z0-9-]+)\)=\s*$", re.M)
LABEL = re.compile(r"^\((ch-[a-z0-9-]+)\)=", re.M)
TITLE = re.compile(r"^# (.+)$", re.M)
CLAIM = re.compile(r"\*\*(.+?)\*\*", re.S)  # the claim a wrong-answer paragraph opens with, in bold
SHORT = re.compile(r"```\{admonition\} Short answer\n(?::[^\n]*\n)*(.*?)\n```", re.S)
LATEX_UNNUMBERED = (
    "```{raw} latex\n% PDF only: back matter is unnumbered, as on the website.\n\\setcounter{secnumdepth}{-1}\n```\n"
)
GLUE = re.compile(r"\{glue:(text|)\}`([^`:]+)((?::[^`]*)?)`")


def notebooks():
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        md = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        yield path, md, nb.get("metadata", {})


def chapters():
    for path, md, _ in notebooks():
        yield path, md


def table_cell(text: str) -> str:
    """One line, with no bare "|" (it would end the table cell): in math ``\\|`` becomes ``\\Vert``
    and ``|`` becomes ``\\vert``; in text ``|`` is escaped."""
    parts = re.split(r"(\$[^$]*\$)", " ".join(text.split()))
    return "".join(
        p.replace("\\|", "\\Vert ").replace("|", "\\vert ") if p.startswith("$") else p.replace("|", "\\|")
        for p in parts
    )


def qualify_glue(text: str, path: Path) -> str:
    """Glue keys live in the chapter notebook; another page must name the document."""
    doc = path.relative_to(ROOT).as_posix()
    # myst-nb splits the role text at its last ":", so "doc::key" needs an explicit format (":s").
    return GLUE.sub(
        lambda m: f"{{glue:{m.group(1)}}}`{doc}::{m.group(2)}{m.group(3) or (':s' if m.group(1) else '')}`", text
    )


def global_citations(text: str) -> str:
    """Footnote citations belong to the chapter's own reference list; here cite the bibliography page."""
    return text.replace("{footcite}`", "{cite:p}`")


def number_of(path: Path) -> int:
    return int(path.stem.split("_", 1)[0])


# Notebook metadata "cheatsheet": the question in a few words, the answer in one line, the formula,
# the number to remember. tests/pages/test_book.py limits their length.
SHEET_KEYS = ("ask", "answer", "formula", "remember")


def cheatsheet() -> str:
    out = [
        # The table needs the width, and it must fit one laptop screen (tests/pages/test_site.py): neither
        # the chapter list nor the "Contents" column on this page.
        "---\nhtml_theme.sidebar_secondary.remove: true\n---\n",
        LATEX_UNNUMBERED,
        "# Cheat sheet · 速查表",
        "",
    ]
    after = [
        "Every question of the book in one table: the answer in one line, the formula and the number to",
        "remember, computed in the chapter. Each question links to its chapter, with the derivation, the",
        "checks and the figures. Below, each chapter's short answer in English and in Chinese.",
        "",
    ]
    rows = ["| Question | Answer | Formula | Remember |", "|---|---|---|---|"]
    shorts = []
    for path, md, meta in notebooks():
        sheet = meta.get("cheatsheet", {})
        label = LABEL.search(md).group(1)
        title = TITLE.search(md).group(1).strip()
        short = SHORT.search(md)
        if not short:
            raise SystemExit(f"{path.name}: no Short answer admonition")
        missing = set(SHEET_KEYS) - set(sheet)
        if missing:
            raise SystemExit(f"{path.name}: notebook metadata 'cheatsheet' lacks {sorted(missing)}")
        cells = [
            f"{{ref}}`{number_of(path)}. {table_cell(sheet['ask'])} <{label}>`",
            table_cell(sheet["answer"]),
            table_cell(sheet["formula"]),
            table_cell(sheet["remember"]),
        ]
        rows.append("| " + " | ".join(global_citations(qualify_glue(c, path)) for c in cells) + " |")
        shorts += [
            f"### {number_of(path)}. {{ref}}`{title} <{label}>`",
            "",
            global_citations(qualify_glue(short.group(1).strip(), path)),
            "",
        ]
    # PDF: fixed column widths, so LaTeX wraps every cell inside the text width;
    # ragged right (narrow justified columns leave holes) and a smaller font, so the table is one page.
    col = ">{{\\raggedright\\arraybackslash}}\\Y{{{}}}"
    widths = "```{tabularcolumns} |" + "|".join(col.format(w) for w in (0.18, 0.3, 0.25, 0.27)) + "|\n```"
    small = "```{raw} latex\n\\small\n```"
    normal = "```{raw} latex\n\\normalsize\n```"
    # A longtable, so that LaTeX can break the table across pages; on a phone reading.css stacks
    # each row into a card.
    table = ["```{table}", ":class: longtable cheatsheet-table", "", *rows, "```"]
    out += [small, "", widths, "", *table, "", normal, "", *after, "## The short answers · 简答", "", *shorts]
    return "\n".join(out).rstrip() + "\n"


def wrong_entries(path: Path, md: str, meta: dict):
    """(target, claim, correction) for each "(wrong-…)=" target of a chapter: the claim is the bold
    opening of the paragraph after the target (on one line, without the **), the correction the
    one sentence the notebook's metadata ``"wrong_answers"`` holds for that target."""
    shorts = meta.get("wrong_answers", {})
    targets = [m.group(1) for m in TARGET.finditer(md)]
    if set(shorts) - set(targets):
        raise SystemExit(f"{path.name}: metadata 'wrong_answers' names targets the chapter lacks")
    for match in TARGET.finditer(md):
        target = match.group(1)
        claim = CLAIM.match(md[match.end() :].lstrip("\n"))
        if not claim:
            raise SystemExit(f"{path.name}: {target} does not open with its claim in bold")
        if target not in shorts:
            raise SystemExit(f"{path.name}: metadata 'wrong_answers' has no correction for {target}")
        yield target, " ".join(claim.group(1).split()), shorts[target]


def wrong_answers() -> str:
    out = [
        LATEX_UNNUMBERED,
        "# Common wrong answers · 常见错误答案",
        "",
        "Each entry is a claim often heard in interviews (or made in the source notes) and its correction",
        "in one sentence, to rehearse before an interview. The link leads to the chapter's full argument",
        "and the check that fails if the correction is wrong.",
        "",
    ]
    count = 0
    for path, md, meta in notebooks():
        label = LABEL.search(md).group(1)
        title = TITLE.search(md).group(1).strip()
        entries = []
        for target, claim, short in wrong_entries(path, md, meta):
            stop = "" if re.search(r"[.?!]\"?$", claim) else "."  # a claim the chapter continues in parentheses
            short = global_citations(qualify_glue(short, path))
            entries.append(f"- **{claim}**{stop} {short} ({{ref}}`why <{target}>`)")
        if entries:
            count += len(entries)
            out += [f"## From chapter {number_of(path)}: {{ref}}`{title} <{label}>`", "", *entries, ""]
    out.insert(7, f"The catalogue holds {count} entries, grouped by chapter.\n")
    return "\n".join(out).rstrip() + "\n"


PAGES = {"cheatsheet.md": cheatsheet, "wrong_answers.md": wrong_answers}

GLANCE_START = "% at a glance: generated from the notebook's cheatsheet metadata (make summaries)"
GLANCE_END = "% end of at a glance"
GLANCE = re.compile(re.escape(GLANCE_START) + r".*?" + re.escape(GLANCE_END) + r"\n?", re.S)


def at_a_glance(sheet: dict) -> str:
    """The small table under a chapter's short answer: its formula and the number to remember."""
    return "\n".join(
        [
            GLANCE_START,
            # the class lets reading.css stack the two cells on a phone, where the formula left too
            # little width for the number
            "```{table}",
            ":class: at-a-glance",
            "",
            "| Formula | Number to remember |",
            "| --- | --- |",
            f"| {table_cell(sheet['formula'])} | {table_cell(sheet['remember'])} |",
            "```",
            GLANCE_END,
            "",
        ]
    )


def with_glance(path: Path) -> tuple[str, str]:
    """The notebook's text now, and with its at-a-glance table right after the short answer."""
    raw = path.read_text(encoding="utf-8")
    nb = json.loads(raw)
    cell = nb["cells"][0]
    text = GLANCE.sub("", "".join(cell["source"]))
    short = SHORT.search(text)
    if short is None:
        raise SystemExit(f"{path.name}: the short answer must be in the first cell")
    end = short.end()
    text = text[:end] + "\n\n" + at_a_glance(nb["metadata"]["cheatsheet"]) + text[end:].lstrip("\n")
    cell["source"] = text.rstrip("\n").splitlines(keepends=True)
    return raw, json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    check = "--check" in sys.argv[1:]
    stale = []
    for name, build in PAGES.items():
        text = build()
        path = ROOT / name
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {name}")
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        now, wanted = with_glance(path)
        if check:
            if now != wanted:
                stale.append(path.name)
        elif now != wanted:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote the at-a-glance table of {path.name}")
    if stale:
        sys.exit(f"out of date: {', '.join(stale)} (run: python tools/build_summaries.py)")
