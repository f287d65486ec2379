"""Generate the cheat sheet and the wrong-answers catalogue from the chapter notebooks.

Usage: python tools/build_summaries.py [--check]

- cheatsheet.md: every chapter's "Short answer" box, linking to the chapter.
- wrong_answers.md: every "(wrong-…)=" target in a chapter's "Common wrong answers" section, with
  the paragraph that states and corrects the claim, linking to the cell that refutes it.

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
SHORT = re.compile(r"```\{admonition\} Short answer\n(?::[^\n]*\n)*(.*?)\n```", re.S)
LATEX_UNNUMBERED = (
    "```{raw} latex\n% PDF only: back matter is unnumbered, as on the website.\n\\setcounter{secnumdepth}{-1}\n```\n"
)
GLUE = re.compile(r"\{glue:(text|)\}`([^`:]+)((?::[^`]*)?)`")


def chapters():
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        md = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        yield path, md


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


def cheatsheet() -> str:
    out = [
        "# Cheat sheet · 速查表",
        "",
        LATEX_UNNUMBERED,
        "Every chapter's short answer on one page. Each heading links to the chapter with the",
        "derivation, the checks and the figures.",
        "",
    ]
    for path, md in chapters():
        label = LABEL.search(md).group(1)
        title = TITLE.search(md).group(1).strip()
        short = SHORT.search(md)
        if not short:
            raise SystemExit(f"{path.name}: no Short answer admonition")
        out += [
            f"## {number_of(path)}. {{ref}}`{title} <{label}>`",
            "",
            global_citations(qualify_glue(short.group(1).strip(), path)),
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def wrong_answers() -> str:
    out = [
        "# Common wrong answers · 常见错误答案",
        "",
        LATEX_UNNUMBERED,
        "Each entry states a claim often heard in interviews (or made in the source notes), the",
        "correct statement, and a link to the code that refutes the claim: the check right below",
        "the linked paragraph fails if the correction is wrong.",
        "",
    ]
    count = 0
    for path, md in chapters():
        label = LABEL.search(md).group(1)
        title = TITLE.search(md).group(1).strip()
        entries = []
        for match in TARGET.finditer(md):
            rest = md[match.end() :].lstrip("\n")
            # The paragraph usually ends with ":" introducing its code cell; the link replaces the cell.
            paragraph = rest.split("\n\n", 1)[0].strip().rstrip(":").rstrip()
            entries.append(
                f"- {global_citations(qualify_glue(paragraph, path))} ({{ref}}`refuted here <{match.group(1)}>`)"
            )
        if entries:
            count += len(entries)
            out += [f"## From chapter {number_of(path)}: {{ref}}`{title} <{label}>`", "", *entries, ""]
    out.insert(6, f"The catalogue holds {count} entries, grouped by chapter.\n")
    return "\n".join(out).rstrip() + "\n"


PAGES = {"cheatsheet.md": cheatsheet, "wrong_answers.md": wrong_answers}

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
    if stale:
        sys.exit(f"out of date: {', '.join(stale)} (run: python tools/build_summaries.py)")
