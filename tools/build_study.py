"""Study tools generated from the chapters: an Anki deck, a one-page cheat sheet PDF, a self-test page.

Usage: python tools/build_study.py [selftest] [deck] [pdf] [--check] [--base-url URL] [--out DIR]

- selftest.md (committed, like cheatsheet.md): every chapter's question in English and Chinese,
  its answer folded; _static/selftest.js shuffles the questions. ``--check`` exits 1 if the
  committed page differs from what would be generated (used by the tests).
- DIR/attention-derived.apkg (default DIR: _build): an Anki deck. One note per chapter (the
  question; the one-line answer, the short answer in both languages, the formula, the number to
  remember, the chapter) and one note per common wrong answer (the claim; its correction).
- DIR/cheatsheet-a4.pdf and DIR/cheatsheet-letter.pdf: the cheat sheet's table on one page, by xelatex.

The chapters are read by tools/build_summaries.py's loader (notebook metadata "cheatsheet", the
title, the 中文 line, the Short answer box, the "(wrong-…)=" paragraphs), so these cannot drift from
the book. Numbers inserted with {glue:text} are taken from the notebooks' committed outputs.

Anki cards live outside the website, so a link on a card must be absolute: with ``--base-url``
(the address where the site is published; make: STUDY_BASE_URL) each card links to its chapter
(and a wrong answer to the paragraph that refutes it); without it, the card names the chapter and
its page in plain text instead of carrying a link that could not work.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from build_summaries import (
    LABEL,
    LATEX_UNNUMBERED,
    ROOT,
    SHORT,
    TITLE,
    global_citations,
    notebooks,
    number_of,
    qualify_glue,
    wrong_entries,
)

QUESTION_ZH = re.compile(r"^\*\*中文：(.+?)\*\*\s*$", re.M)
ZH_SUMMARY = "**中文要点：**"
ROLE = re.compile(r"\{([a-z:]*)\}`([^`]*)`")
# Inline markup, in the order it is tried: a role, math, bold, italic, code.
INLINE = re.compile(r"(\{[a-z:]*\}`[^`]*`)|\$([^$]+)\$|\*\*(.+?)\*\*|\*([^*\s][^*]*)\*|`([^`]+)`", re.S)
DECK_FILE = "attention-derived.apkg"
SHEET_FILES = {"a4": "cheatsheet-a4.pdf", "letter": "cheatsheet-letter.pdf"}


@dataclass
class Chapter:
    path: Path
    md: str
    sheet: dict
    glue: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # the notebook's metadata (its one-sentence wrong-answer corrections)

    @property
    def number(self) -> int:
        return number_of(self.path)

    @property
    def label(self) -> str:
        return LABEL.search(self.md).group(1)

    @property
    def title(self) -> str:
        return TITLE.search(self.md).group(1).strip()

    @property
    def question_zh(self) -> str:
        found = QUESTION_ZH.search(self.md)
        if not found:
            raise SystemExit(f"{self.path.name}: no **中文：…** question line")
        return found.group(1).strip()

    @property
    def first_question_zh(self) -> str:
        """The first question of the 中文 line (up to its first ？): what the one-page sheet has room for."""
        head, mark, _ = self.question_zh.partition("？")
        return head + mark

    @property
    def short(self) -> tuple[str, str]:
        """The Short answer box: the English text and the 中文要点."""
        en, _, zh = SHORT.search(self.md).group(1).partition(ZH_SUMMARY)
        return en.strip(), zh.strip()

    @property
    def page(self) -> str:
        return f"chapters/{self.path.stem}.html"

    def wrong(self):
        """(target, claim, one-sentence correction) for each common wrong answer."""
        yield from wrong_entries(self.path, self.md, self.meta)


CJK = "\u3000-\u30ff\u3400-\u9fff\uff00-\uffef"


def one_line(text: str) -> str:
    """The text on one line: a line break becomes a space, except between two Chinese characters."""
    text = re.sub(f"(?<=[{CJK}])\\s*\\n\\s*(?=[{CJK}])", "", text.strip())
    return " ".join(text.split())


def glue_values(nb: dict) -> dict:
    """Key -> text/plain of every glued output (what {glue:text} pastes), as myst-nb collects them."""
    values = {}
    for cell in nb["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            scrap = output.get("metadata", {}).get("scrapbook")
            if scrap:
                prefix = len(scrap.get("mime_prefix", ""))
                data = {k[prefix:]: v for k, v in output["data"].items()}
                values[scrap["name"]] = "".join(data["text/plain"])
    return values


def load() -> list[Chapter]:
    chapters = []
    for path, md, meta in notebooks():
        nb = json.loads(path.read_text(encoding="utf-8"))
        ch = Chapter(path, md, meta.get("cheatsheet", {}), glue_values(nb), meta=meta)
        chapters.append(ch)
    return chapters


def bib_short(key: str) -> str:
    """'Graves et al., 2014' for a references.bib key."""
    entry = re.search(r"@\w+\{" + re.escape(key) + r",(.*?)\n\}", (ROOT / "references.bib").read_text("utf-8"), re.S)
    if not entry:
        raise SystemExit(f"references.bib has no entry {key}")
    fields = dict(re.findall(r"(\w+)\s*=\s*\{(.*?)\},?\s*$", entry.group(1), re.M))
    authors = [a.split(",")[0].strip().strip("{}") for a in fields.get("author", key).split(" and ")]
    names = authors[0] + (" et al." if len(authors) > 2 else f" and {authors[1]}" if len(authors) == 2 else "")
    return f"{names}, {fields.get('year', 'n.d.')}"


def glue_text(ch: Chapter, spec: str) -> str:
    from myst_nb.core.variables import format_plain_text  # myst-nb's own formatting of {glue:text}

    key, _, fmt = spec.partition(":")
    if key not in ch.glue:
        raise SystemExit(f"{ch.path.name}: no glued output {key!r}")
    return format_plain_text(ch.glue[key], fmt or "s")


class Renderer:
    """MyST inline markup of one chapter -> Anki HTML (math as \\( \\)) or LaTeX."""

    def __init__(self, chapters: list[Chapter], base_url: str = ""):
        self.base_url = base_url

    def url(self, ch: Chapter, anchor: str = "") -> str:
        return f"{self.base_url}{ch.page}" + (f"#{anchor}" if anchor else "") if self.base_url else ""

    def link(self, text: str, ch: Chapter, anchor: str = "") -> str:
        href = self.url(ch, anchor)
        return f'<a href="{html.escape(href)}">{text}</a>' if href else text

    def role(self, ch: Chapter, name: str, content: str) -> str:
        if name in ("glue:text", "glue:", "glue"):
            return html.escape(glue_text(ch, content))
        if name in ("footcite", "cite:p", "cite"):
            return "(" + "; ".join(html.escape(bib_short(k.strip())) for k in content.split(",")) + ")"
        # A card stands alone: a cross-reference ("see (3.2)") would send the reader to a page they do not have open.
        raise SystemExit(f"{ch.path.name}: a card cannot show {{{name}}}`{content}` (only text, math, glue, citations)")

    def html(self, ch: Chapter, text: str) -> str:
        text = one_line(text)

        def one(m: re.Match) -> str:
            role, math, bold, italic, code = m.groups()
            if role:
                name, content = ROLE.fullmatch(role).groups()
                return self.role(ch, name, content)
            if math is not None:
                return "\\(" + html.escape(math, quote=False) + "\\)"
            if bold is not None:
                return f"<b>{self.html(ch, bold)}</b>"
            if italic is not None:
                return f"<i>{self.html(ch, italic)}</i>"
            return f"<code>{html.escape(code)}</code>"

        out, pos = [], 0
        for m in INLINE.finditer(text):
            out += [html.escape(text[pos : m.start()], quote=False), one(m)]
            pos = m.end()
        return "".join(out + [html.escape(text[pos:], quote=False)])

    def tex(self, ch: Chapter, text: str) -> str:
        """LaTeX for the cheat sheet's fields, which hold text, math and {glue:text} only."""
        specials = {c: "\\" + c for c in "&%#_{}$"} | {
            "~": r"\textasciitilde{}",
            "^": r"\^{}",
            "\\": r"\textbackslash{}",
        }

        def plain(s: str) -> str:
            return "".join(specials.get(c, c) for c in s)

        text = one_line(text)
        out, pos = [], 0
        for m in re.finditer(r"\{([a-z:]*)\}`([^`]*)`|\$([^$]+)\$", text):
            out.append(plain(text[pos : m.start()]))
            if m.group(3) is not None:
                out.append(f"${m.group(3)}$")
            elif m.group(1).startswith("glue"):
                out.append(plain(glue_text(ch, m.group(2))))
            else:
                raise SystemExit(f"{ch.path.name}: the cheat sheet PDF cannot show {m.group(0)}")
            pos = m.end()
        return "".join(out + [plain(text[pos:])])


# ---------------------------------------------------------------------------------------------
# Self-test page


def selftest(chapters: list[Chapter]) -> str:
    out = [
        LATEX_UNNUMBERED,
        "# Self-test · 自测",
        "",
        "```{raw} latex",
        "% PDF only: the self-test needs the website (its answers open on a click, its order is random).",
        "The self-test is on the book's website. On paper, the cheat sheet answers every question.",
        "```",
        "",
        "::::{only} html",
        "Every question of the book, in a random order. Answer it out loud, then open the answer to",
        "check yourself; **Shuffle** draws a new order. The page works offline.",
        "",
        "本书的全部问题，顺序随机。先自己作答，再展开查看答案；点击 **Shuffle · 换个顺序** 重新排列。",
        "",
        # Built next to the pages by make html (make study); plain HTML links, so that the site's
        # build does not need these files.
        f'To take along: the same questions as an Anki deck, <a href="{DECK_FILE}">{DECK_FILE}</a> (one card',
        "per question and one per common wrong answer; import it into Anki), and the cheat sheet on one",
        f'printable page, <a href="{SHEET_FILES["a4"]}">{SHEET_FILES["a4"]}</a> or'
        f' <a href="{SHEET_FILES["letter"]}">{SHEET_FILES["letter"]}</a>.',
        "",
        ":::{container} selftest",
        "",
    ]
    for ch in chapters:
        en, zh = ch.short
        sheet = ch.sheet

        def page_text(text: str, ch: Chapter = ch) -> str:
            return global_citations(qualify_glue(one_line(text), ch.path))

        out += [
            "````{container} selftest-item",
            f"**{page_text(ch.title)}**",
            "",
            f"{ch.question_zh}",
            "",
            "```{dropdown} Answer · 答案",
            f"**{page_text(sheet['answer'])}**",
            "",
            page_text(en),
            "",
            f"**中文要点：** {page_text(zh)}",
            "",
            f"Formula: {page_text(sheet['formula'])}",
            "",
            f"Remember: {page_text(sheet['remember'])}",
            "",
            f"Chapter {ch.number}: {{ref}}`{page_text(ch.title)} <{ch.label}>`",
            "```",
            "````",
            "",
        ]
    out += [":::", "::::"]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# Anki deck

# Anki ids: fixed numbers, so that a new build of the deck updates the notes a reader imported.
DECK_ID = 1_718_203_941
QUESTION_MODEL_ID = 1_718_203_942
WRONG_MODEL_ID = 1_718_203_943
CARD_CSS = """.card { font-family: sans-serif; font-size: 18px; text-align: left; max-width: 40em; margin: auto; }
.zh { color: #555; margin-top: .4em; }
.answer { font-weight: bold; margin-bottom: .6em; }
.label { color: #777; font-size: 85%; }
.chapter { margin-top: .8em; font-size: 85%; color: #555; }
.claim::before { content: "Wrong: "; color: #b00; font-weight: bold; }
"""


def deck(chapters: list[Chapter], path: Path, base_url: str = "") -> tuple[int, int]:
    import genanki

    r = Renderer(chapters, base_url)
    question_model = genanki.Model(
        QUESTION_MODEL_ID,
        "Attention, Derived: question",
        fields=[
            {"name": n}
            for n in (
                "Question",
                "QuestionZh",
                "Answer",
                "ShortAnswer",
                "ShortAnswerZh",
                "Formula",
                "Remember",
                "Chapter",
            )
        ],
        templates=[
            {
                "name": "Question",
                "qfmt": '<div class="question">{{Question}}</div><div class="zh">{{QuestionZh}}</div>',
                "afmt": '{{FrontSide}}<hr id="answer"><div class="answer">{{Answer}}</div>'
                '<div>{{ShortAnswer}}</div><div class="zh">{{ShortAnswerZh}}</div>'
                '<p><span class="label">Formula</span> {{Formula}}<br>'
                '<span class="label">Remember</span> {{Remember}}</p><div class="chapter">{{Chapter}}</div>',
            }
        ],
        css=CARD_CSS,
    )
    wrong_model = genanki.Model(
        WRONG_MODEL_ID,
        "Attention, Derived: wrong answer",
        fields=[{"name": n} for n in ("Claim", "Correction", "Chapter")],
        templates=[
            {
                "name": "Wrong answer",
                "qfmt": '<div class="claim">{{Claim}}</div><p class="label">What is wrong with it?</p>',
                "afmt": '{{FrontSide}}<hr id="answer"><div>{{Correction}}</div><div class="chapter">{{Chapter}}</div>',
            }
        ],
        css=CARD_CSS,
    )
    anki = genanki.Deck(DECK_ID, "Attention, Derived")
    n_wrong = 0
    for ch in chapters:
        en, zh = ch.short
        where = f"Chapter {ch.number}: {html.escape(ch.title)}"
        chapter = r.link(where, ch) if base_url else f"{where} ({ch.page} on the book's website)"
        tags = [f"chapter{ch.number:02d}"]
        anki.add_note(
            genanki.Note(
                model=question_model,
                fields=[
                    html.escape(ch.title),
                    html.escape(ch.question_zh),
                    r.html(ch, ch.sheet["answer"]),
                    r.html(ch, en),
                    r.html(ch, zh),
                    r.html(ch, ch.sheet["formula"]),
                    r.html(ch, ch.sheet["remember"]),
                    chapter,
                ],
                tags=[*tags, "question"],
                guid=genanki.guid_for("attention-derived", ch.label),
            )
        )
        for target, claim, correction in ch.wrong():
            refuted = r.link("the check that refutes it", ch, target) if base_url else "the check that refutes it"
            anki.add_note(
                genanki.Note(
                    model=wrong_model,
                    fields=[
                        r.html(ch, claim),
                        r.html(ch, correction),
                        f"{chapter}; {refuted}" if base_url else chapter,
                    ],
                    tags=[*tags, "wrong-answer"],
                    guid=genanki.guid_for("attention-derived", target),
                )
            )
            n_wrong += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    genanki.Package(anki).write_to_file(str(path))
    return len(chapters), n_wrong


# ---------------------------------------------------------------------------------------------
# One-page cheat sheet (PDF)

PAPER = {"a4": "a4paper", "letter": "letterpaper"}
# The fonts of the book's PDF (_config.yml): DejaVu has the Greek letters and symbols (√ · × ≈) of
# the questions, Noto CJK the Chinese.
SHEET_PREAMBLE = r"""\documentclass[9pt]{extarticle}
\usepackage[<PAPER>,margin=9mm,top=8mm,bottom=8mm]{geometry}
\usepackage{amsmath,amssymb}
\usepackage{fontspec}
\setmainfont{DejaVu Sans}[Scale=0.92]
\usepackage{xeCJK}
\setCJKmainfont{Noto Sans CJK SC}
% Curly quotes and the middle dot of "q·k" are Latin punctuation here (DejaVu), not full-width CJK.
\xeCJKDeclareCharClass{Default}{"00B7, "2018, "2019, "201C, "201D}
\usepackage{array,tabularx,colortbl,xcolor}
\definecolor{rule}{gray}{0.75}
\definecolor{shade}{gray}{0.94}
\arrayrulecolor{rule}
\setlength{\parindent}{0pt}
% Nothing smaller than 6 pt, not even a subscript of a subscript (d_\text{model} in an exponent,
% set in the 0.92-scaled text font).
\DeclareMathSizes{9}{9}{7}{7}
\DeclareMathSizes{8}{8}{7}{7}
\pagestyle{empty}
\renewcommand{\arraystretch}{1.08}
\newcolumntype{L}[1]{>{\raggedright\arraybackslash\hsize=#1\hsize}X}
\begin{document}
"""


def sheet_tex(chapters: list[Chapter], paper: str) -> str:
    r = Renderer(chapters)
    rows = []
    for ch in chapters:
        s = ch.sheet
        shade = r"\rowcolor{shade}" if ch.number % 2 == 0 else ""
        rows.append(
            f"{shade}\\textbf{{{ch.number}}} & \\textbf{{{r.tex(ch, s['ask'])}}}\\newline "
            f"{{\\footnotesize {r.tex(ch, ch.first_question_zh)}}} & {r.tex(ch, s['answer'])} & "
            f"{r.tex(ch, s['formula'])} & {r.tex(ch, s['remember'])} \\\\ \\hline"
        )
    return (
        SHEET_PREAMBLE.replace("<PAPER>", PAPER[paper])
        + r"{\Large\textbf{Attention, Derived}\quad cheat sheet · 速查表}\hfill"
        + r"{\footnotesize every question of the book: the answer, the formula, the number to remember}"
        + "\n\n\\smallskip\n\\begin{tabularx}{\\linewidth}{@{}r L{1.05} L{1.0} L{1.0} L{0.95}@{}}\n\\hline\n"
        + r"& \textbf{Question · 问题} & \textbf{Answer} & \textbf{Formula} & \textbf{Number to remember} \\ \hline"
        + "\n"
        + "\n".join(rows)
        + "\n\\end{tabularx}\n\n{\\footnotesize Numbers are computed in the chapters "
        + "(run on the committed notebooks); each chapter derives its answer and checks it by running code.}\n"
        + "\\end{document}\n"
    )


def sheet_pdfs(chapters: list[Chapter], out: Path) -> list[Path]:
    if shutil.which("xelatex") is None:
        raise SystemExit("xelatex is needed for the cheat sheet PDF (see the README's TeX packages)")
    made = []
    out.mkdir(parents=True, exist_ok=True)
    for paper, name in SHEET_FILES.items():
        with tempfile.TemporaryDirectory() as tmp:
            tex = Path(tmp) / "cheatsheet.tex"
            tex.write_text(sheet_tex(chapters, paper), encoding="utf-8")
            run = subprocess.run(
                ["xelatex", "-interaction=nonstopmode", "-halt-on-error", tex.name],
                cwd=tmp,
                capture_output=True,
                text=True,
            )
            log = (Path(tmp) / "cheatsheet.log").read_text(encoding="utf-8", errors="replace")
            if run.returncode != 0:
                raise SystemExit(f"xelatex failed on the {paper} cheat sheet:\n{run.stdout[-3000:]}")
            if "Missing character" in log:
                raise SystemExit(
                    f"the {paper} cheat sheet dropped glyphs:\n"
                    + "\n".join(line for line in log.splitlines() if "Missing character" in line)
                )
            shutil.copy(Path(tmp) / "cheatsheet.pdf", out / name)
            made.append(out / name)
    return made


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="*", help="selftest, deck, pdf (default: all three)")
    parser.add_argument("--check", action="store_true", help="selftest.md is up to date (exit 1 if not)")
    parser.add_argument("--base-url", default="", help="address of the published site, for the Anki cards' links")
    parser.add_argument("--out", type=Path, default=ROOT / "_build", help="where the deck and the PDFs go")
    args = parser.parse_args(argv)
    what = args.what or ["selftest", "deck", "pdf"]
    if set(what) - {"selftest", "deck", "pdf"}:
        parser.error(f"unknown: {sorted(set(what) - {'selftest', 'deck', 'pdf'})}")
    if args.base_url and not args.base_url.endswith("/"):
        args.base_url += "/"
    chapters = load()
    if args.check:
        page = ROOT / "selftest.md"
        if not page.exists() or page.read_text(encoding="utf-8") != selftest(chapters):
            sys.exit("out of date: selftest.md (run: python tools/build_study.py selftest)")
        return
    if "selftest" in what:
        (ROOT / "selftest.md").write_text(selftest(chapters), encoding="utf-8")
        print("wrote selftest.md")
    if "deck" in what:
        n_q, n_w = deck(chapters, args.out / DECK_FILE, args.base_url)
        print(f"wrote {args.out / DECK_FILE}: {n_q} questions, {n_w} wrong answers")
    if "pdf" in what:
        for path in sheet_pdfs(chapters, args.out):
            print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
