"""Structure of the book: every chapter is listed, executed cleanly, and follows the chapter contract.

These checks read files only; nbval (run with ``--nbval``) re-executes the notebooks.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
CJK = re.compile(r"[\u4e00-\u9fff]")


def toc_entries() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return [toc["root"], *files]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def markdown(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_there_are_chapters():
    assert CHAPTERS, "no chapter notebooks found in chapters/"


def test_toc_lists_every_chapter_and_only_existing_pages():
    entries = toc_entries()
    for nb in CHAPTERS:
        assert str(nb.relative_to(ROOT).with_suffix("")) in entries, f"{nb.name} is missing from _toc.yml"
    for entry in entries:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".ipynb", ".md")), f"_toc.yml lists missing {entry}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_downloaded_notebook_says_how_to_run_it(path):
    """Right under the title, a note for Jupyter only (removed from the site and the PDF): what the notebook
    needs and the command that installs it with MyST rendering."""
    cell = load(path)["cells"][1]
    text = "".join(cell["source"])
    assert cell["cell_type"] == "markdown" and "remove-cell" in cell["metadata"].get("tags", [])
    assert "Running this notebook" in text and "`make lab`" in text and "attn_utils" in text


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_set_up_and_plotting_code_stay_out_of_the_readers_way(path):
    """No set-up code (or its toggle) under the short answer; figures come before the code that draws them."""
    code = [c for c in load(path)["cells"] if c["cell_type"] == "code"]
    assert "remove-input" in code[0]["metadata"].get("tags", []), "the first code cell is set-up: tag it remove-input"
    for cell in code:
        if any("image/png" in out.get("data", {}) for out in cell.get("outputs", [])):
            tags = cell["metadata"].get("tags", [])
            hidden = "hide-input" in tags or "remove-input" in tags
            assert hidden, f"a figure cell shows its code first: {cell.get('id')}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_executed_top_to_bottom_without_errors(path):
    nb = load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), f"execution counts {counts}: restart and run all"
    for i, cell in enumerate(code):
        for out in cell["outputs"]:
            assert out["output_type"] != "error", f"code cell {i} has an error output"
            text = "".join(out.get("text", ""))
            assert "Traceback" not in text and "✗" not in text, f"code cell {i} printed a failure"
        # nbval executes without input history, so IPython cannot see a trailing ";" and the
        # suppressed value reappears as an output that differs from the committed one.
        last = "".join(cell["source"]).rstrip().splitlines()[-1]
        assert not last.rstrip().endswith(";"), f"code cell {i} ends with ';': assign to _ instead"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_contract(path):
    """The parts every chapter must have (BOOK_SPEC.md, "the chapter contract")."""
    nb = load(path)
    md = markdown(nb)
    first = "".join(nb["cells"][0]["source"])
    title = re.search(r"^# (.+)$", first, flags=re.M)
    assert title, "the first cell must hold the chapter title (the question)"
    assert re.search(r"^\(ch-[a-z0-9-]+\)=", first, flags=re.M), "the first cell needs a (ch-...)= label"
    assert CJK.search(first), "the question must also be stated in Chinese in the first cell"
    assert "Short answer" in md, "missing the Short answer admonition"
    assert re.search(r"\{prf:(theorem|proposition|lemma)\}", md) and "{prf:proof}" in md, "missing theorem + proof"
    assert re.search(r"\$\$ \(eq-[a-z0-9-]+\)", md), "missing a numbered equation"
    assert "## When it breaks" in md and "## Common wrong answers" in md
    assert len(re.findall(r"\{exercise\}", md)) >= 2, "need at least two follow-up exercises"
    assert len(re.findall(r"\{solution\}", md)) >= 2, "every exercise needs a solution"
    assert "{footbibliography}" in md and "{footcite}" in md, "missing citations / references section"
    figures = [c for c in nb["cells"] if c.get("metadata", {}).get("mystnb", {}).get("figure")]
    assert figures, "need at least one captioned figure (cell metadata mystnb.figure)"
    for cell in figures:
        name = cell["metadata"]["mystnb"]["figure"].get("name")
        assert name and cell["metadata"]["mystnb"]["figure"].get("caption"), "figures need a name and a caption"
        assert f"{{numref}}`{name}`" in md, f"figure {name} is never referenced from the text"
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert re.search(r"au\.check(_bound|_allclose)?\(", code), "a chapter must assert its claims with attn_utils checks"
    assert "au.rng(" in code, "randomness must come from the seed base: rng = au.rng(label) (CONTRIBUTING.md)"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_glue_keys_exist(path):
    """Every glued number the prose uses is produced by the same notebook."""
    nb = load(path)
    used = set(re.findall(r"\{glue:(?:text|)\}`([^`:]+)", markdown(nb)))
    produced = set()
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            key = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if key:
                produced.add(key)
    assert used <= produced, f"glue keys used but never produced: {sorted(used - produced)}"


def test_intro_question_index_links_every_chapter():
    intro = (ROOT / "intro.md").read_text(encoding="utf-8")
    for path in CHAPTERS:
        label = re.search(r"^\((ch-[a-z0-9-]+)\)=", "".join(load(path)["cells"][0]["source"]), flags=re.M).group(1)
        assert f"<{label}>" in intro, f"intro question index does not link {label}"
        # one title per chapter: the index may shorten it to its question, but not reword it
        title = re.search(r"^# (.+)$", "".join(load(path)["cells"][0]["source"]), flags=re.M).group(1)
        shown = re.search(rf"\{{ref\}}`([^`<]+?) <{label}>`", intro).group(1)
        assert title.startswith(shown), f"intro calls {label} {shown!r}; its title is {title!r}"
        # likewise in Chinese: the 问题 cell is the chapter's 中文 question, or its first questions
        zh = re.search(r"^\*\*中文：(.+?)\*\*$", "".join(load(path)["cells"][0]["source"]), flags=re.M).group(1)
        row = next(line for line in intro.splitlines() if f"<{label}>`" in line)
        asked = row.split("|")[3].strip()
        assert zh.startswith(asked) and asked.endswith("？"), f"intro asks {label} {asked!r} in Chinese; it asks {zh!r}"


def test_cheatsheet_and_wrong_answers_are_generated_from_the_chapters():
    """cheatsheet.md and wrong_answers.md must match what tools/build_summaries.py generates."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_summaries.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_wrong_answers_catalogue_has_at_least_12_entries():
    text = (ROOT / "wrong_answers.md").read_text(encoding="utf-8")
    assert text.count("`why <wrong-") >= 12


APPROX_NUMBER = re.compile(r"≈(-?[0-9]|∞)")
TRAINS = re.compile(r"\btrain\w*\(")  # hz.train, train_per_parameter, train_variants, …


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for value in out.get("data", {}).values():
            if isinstance(value, str):
                parts.append(value)
            elif isinstance(value, list):
                parts.append("".join(value))
    return "\n".join(parts)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_approx_marks_only_trained_measurements(path):
    """The test suite does not compare digits after "≈" (tests/nbval_sanitize.cfg), so the mark is
    reserved for models trained in the notebook: a chapter that trains nothing must print and glue
    every number in full, where nbval compares it."""
    nb = load(path)
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    if TRAINS.search(code):
        return
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        text = _output_text(cell)
        assert not APPROX_NUMBER.search(text), (
            f"code cell {i} prints a number marked ≈ (not compared by nbval), but {path.name} trains no model"
        )


SHORT_ANSWER = re.compile(r"```\{admonition\} Short answer\n(?::[^\n]*\n)*(.*?)\n```", re.S)
ZH_POINTS = "**中文要点：**"


def english_words(text: str) -> int:
    """Words a reader says aloud: a formula ($…$) counts as one word, a role's target is dropped."""
    text = re.sub(r"\$[^$]+\$", " F ", text)
    text = re.sub(r"\{[a-z:]+\}`([^`<]*)(<[^`]*>)?`", r"\1", text)
    return len([w for w in text.split() if re.search(r"[A-Za-z0-9]", w)])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_short_answer_fits_30_seconds_in_both_languages(path):
    """The short answer is at most 80 English words, then a 中文要点 of the same content."""
    match = SHORT_ANSWER.search(markdown(load(path)))
    assert match, "missing the Short answer admonition"
    body = match.group(1)
    assert ZH_POINTS in body, f"the short answer needs a Chinese version after '{ZH_POINTS}'"
    english, chinese = body.split(ZH_POINTS, 1)
    assert english_words(english) <= 80, f"short answer has {english_words(english)} English words (at most 80)"
    # Counted the strict way too: every Latin-script token in the whole box, the Chinese summary's
    # English terms included, so that the box stays short to read aloud in either language.
    latin = [t for t in CJK.sub(" ", re.sub(r"\$[^$]+\$", " F ", body)).split() if re.search(r"[A-Za-z0-9]", t)]
    assert len(latin) <= 80, f"the short answer box holds {len(latin)} Latin-script words (at most 80)"
    assert len(CJK.findall(chinese)) >= 30, "the 中文要点 should carry the same content as the English"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_cheatsheet_row_fits_one_line(path):
    """The cheat sheet's row for a chapter is a few words of question and a one-line answer
    (notebook metadata "cheatsheet"), so that the whole table is read at a glance."""
    sheet = load(path).get("metadata", {}).get("cheatsheet", {})
    assert set(sheet) >= {"ask", "answer", "formula", "remember"}, f"cheatsheet metadata has only {sorted(sheet)}"
    assert "$" not in sheet["ask"], "the question is a link title: no math in it"
    assert english_words(sheet["ask"]) <= 8, f"question has {english_words(sheet['ask'])} words (at most 8)"
    assert english_words(sheet["answer"]) <= 16, f"answer has {english_words(sheet['answer'])} words (at most 16)"
    assert english_words(sheet["remember"]) <= 28, f"number to remember has {english_words(sheet['remember'])} words"


EXPERIMENT_IMPORT = re.compile(r"from attn_utils\.experiments import (ch\d\d_\w+) as ex")
SHOWN_CODE = re.compile(r"```\{literalinclude\} \.\./attn_utils/experiments/(ch\d\d_\w+)\.py\n:pyobject: (\w+)")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_shows_the_experiment_code_it_uses(path):
    """A chapter that calls its experiment module shows the functions behind its evidence
    (a collapsed literalinclude with :pyobject:), and every shown object exists."""
    import importlib

    nb = load(path)
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    module = EXPERIMENT_IMPORT.search(code)
    if not module:
        pytest.skip("this chapter has no experiment module")
    called = set(re.findall(r"\bex\.(\w+)\(", code))
    shown = SHOWN_CODE.findall(markdown(nb))
    assert shown, f"show at least one function of {module.group(1)} the chapter calls"
    mod = importlib.import_module(f"attn_utils.experiments.{module.group(1)}")
    for name, obj in shown:
        assert name == module.group(1) or name < module.group(1), f"shows code of a later chapter: {name}"
        target = importlib.import_module(f"attn_utils.experiments.{name}")
        assert hasattr(target, obj), f"{name}.{obj} does not exist"
    assert {obj for name, obj in shown if name == module.group(1)} & called, "show a function the chapter calls"
    del mod


CONTEXT_WORDS = re.compile(
    r"\((?:see )?above|\b(?:check|checks|runs?|cells?|figure|table|code|counted|measured|shown|trained|computed)"
    r" (?:right )?(?:above|below)\b|\bthis chapter\b|\bthe previous (?:section|cell|check)\b",
    re.I,
)


def test_wrong_answers_are_self_contained():
    """Each catalogue entry states the claim and its correction on its own; none points at
    checks, runs or figures "above" that are not on the catalogue page."""
    entries = [line for line in (ROOT / "wrong_answers.md").read_text(encoding="utf-8").split("\n- ")[1:]]
    bad = [e.split("**")[1] if "**" in e else e[:60] for e in entries if CONTEXT_WORDS.search(e)]
    assert not bad, f"entries that refer to context outside the catalogue: {bad}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_wrong_answer_corrections_fit_one_breath(path):
    """The catalogue is for rehearsing: each correction (notebook metadata "wrong_answers") is one
    finished statement of at most 30 words that needs no context from the chapter."""
    for target, text in load(path)["metadata"].get("wrong_answers", {}).items():
        words = len(text.split())
        assert words <= 30, f"{target}: {words} words; say it in at most 30 (the chapter keeps the argument)"
        assert text.rstrip().endswith("."), f"{target}: the correction should end as a sentence: {text!r}"
        assert not CONTEXT_WORDS.search(text), f"{target} refers to context the catalogue does not show: {text!r}"


def test_wrong_answers_catalogue_is_short_enough_to_cram():
    """Claim plus correction per entry, not the chapter's argument: a median entry of at most
    45 words (the full paragraphs had a median of 93)."""
    entries = (ROOT / "wrong_answers.md").read_text(encoding="utf-8").split("\n- ")[1:]
    words = sorted(len(e.split("({ref}`why")[0].split()) for e in entries)
    assert words[len(words) // 2] <= 45, f"median entry {words[len(words) // 2]} words"


BACKTICK_FENCE_WITH_BACKTICKS = re.compile(r"^`{3,}\{[^}]+\}[^\n]*`", re.M)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_directive_titles_do_not_break_their_fence(path):
    """CommonMark: a backtick fence's info string may not contain a backtick, so
    "````{admonition} Code: `f`" is not a directive at all: the title prints as text and the
    closing fence opens a code block that swallows the rest of the cell. Use a colon fence."""
    bad = BACKTICK_FENCE_WITH_BACKTICKS.findall(markdown(load(path)))
    assert not bad, f"use ':::{{admonition}} …' for titles with code: {bad}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_glue_keys_are_produced_once(path):
    """A key glued twice warns in the build (and the prose would show whichever came last)."""
    names = [
        out.get("metadata", {}).get("scrapbook", {}).get("name")
        for cell in load(path)["cells"]
        for out in cell.get("outputs", [])
    ]
    names = [n for n in names if n]
    assert len(names) == len(set(names)), f"glued twice: {sorted({n for n in names if names.count(n) > 1})}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_bare_display_outputs(path):
    """A cell ending in an expression (e.g. a glue call) prints its value on the page: a stray
    "'16.01'" under a check. End such cells with an assignment (``_ = ...``)."""
    bare = [
        i
        for i, cell in enumerate(load(path)["cells"])
        if any(out.get("output_type") == "execute_result" for out in cell.get("outputs", []))
    ]
    assert not bare, f"cells with a bare display output: {bare}"


# Letters the notation page reserves for one meaning, and the chapters where that meaning is
# used. A chapter that needs such a letter for something else renames it (the notation page says so).
MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$", re.S)
RESERVED = {
    "rho (correlation of a key with its query)": (re.compile(r"\\rho(?![A-Za-z])"), {"01", "04", "14"}),
    "T (softmax temperature)": (re.compile(r"(?<![\\A-Za-z{])T(?![A-Za-z])"), {"02", "03", "16"}),
    "I written as arithmetic intensity (it is the identity)": (
        re.compile(r"(?<!\\mathcal )(?<![\\A-Za-z])I(\^\*|_\\infty)"),
        set(),
    ),
    "d defined as d_model (bare d is d_k only)": (re.compile(r"d\s*=\s*d_\\text\{model\}"), set()),
}


def math_of(nb: dict) -> str:
    cells = [c for c in nb["cells"] if c["cell_type"] == "markdown"]
    text = "\n".join("".join(c["source"]) for c in cells)
    text += "\n" + json.dumps(nb.get("metadata", {}).get("cheatsheet", {}))
    return "\n".join(m.group(1) or m.group(2) for m in MATH.finditer(text))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_reserved_symbols_keep_their_meaning(path):
    """One meaning per symbol. The letters the notation page reserves appear in a
    chapter's mathematics only where they carry that meaning."""
    maths = math_of(load(path))
    for meaning, (pattern, allowed) in RESERVED.items():
        found = pattern.search(maths)
        if path.name[:2] not in allowed:
            assert found is None, (
                f"{meaning}: used in {path.name}: …{maths[max(found.start() - 40, 0) : found.end() + 40]}…"
            )


UNSEEDED_DRAW = re.compile(
    r"np\.random\.(default_rng|seed|RandomState|rand|randn|normal|standard_normal|uniform)\b"
    r"|\bseeds\s*=\s*(range|np\.arange|\[\s*\d)"  # training seeds typed as plain labels, not au.seeds(...)
)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_draw_derives_from_the_seed_base(path):
    """A chapter draws only through ``au.rng(label)`` and ``au.seeds(labels)``, which read ATTN_SEED
    (attn_utils/book/seeding.py): a generator made directly would keep its draw under every base, and
    make test-reseed could not show that the chapter's claims hold for other draws."""
    nb = load(path)
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        found = UNSEEDED_DRAW.search("".join(cell["source"]))
        assert not found, f"code cell {i} of {path.name} draws with {found.group(0)}: use au.rng / au.seeds"


def _is_exact(call) -> bool:
    """``au.check(..., tol=<literal ≤ 1e-9>)``: a comparison at rounding level, which needs no wrong answer."""
    tol = call.args[3] if len(call.args) >= 4 else next((k.value for k in call.keywords if k.arg == "tol"), None)
    return isinstance(tol, ast.Constant) and isinstance(tol.value, (int, float)) and tol.value <= 1e-9


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_check_names_the_wrong_answer_it_rules_out(path):
    """A check that compares with theory under a tolerance or a bound says which wrong answer it
    excludes (``rules_out=``; the check refuses a tolerance that would accept it). Exempt: a comparison
    at rounding level (``au.check`` with a literal tol ≤ 1e-9) and ``au.check_allclose``, which compare
    two independent computations exactly (CONTRIBUTING.md, "What a check rules out")."""
    nb = load(path)
    missing = []
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if getattr(node.func.value, "id", "") != "au" or node.func.attr not in (
                "check",
                "check_bound",
                "check_seeds",
                "check_count",
            ):
                continue
            if any(k.arg == "rules_out" for k in node.keywords):
                continue
            if node.func.attr == "check" and _is_exact(node):
                continue
            missing.append(f"code cell {i}: {ast.get_source_segment(source, node)[:80]}")
    assert not missing, f"{path.name}: checks without rules_out=\n" + "\n".join(missing)


def test_code_cells_are_shown_without_glue_calls():
    """The site and the PDF show a code cell without the statements that only glue numbers into
    the prose (_ext/book_polish.py); everything else, including a glue call whose value is used,
    stays, and a cell of glue calls alone disappears."""
    import sys

    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        from book_polish import without_glue_calls
    finally:
        sys.path.pop(0)
    source = (
        'x = f(1)\nglue_text("a", "b")\n_ = glue_number("c", x,\n    ".2f")\n'
        'for k in (1, 2):\n    glue_text(f"k{k}", str(k))\ny = glue_text("d", "e")\nprint(x, y)'
    )
    assert without_glue_calls(source) == (
        'x = f(1)\n# (not shown: 3 glue calls that put numbers into the text)\ny = glue_text("d", "e")\nprint(x, y)'
    )
    assert without_glue_calls('glue_text("a", "b")\n_ = glue_number("c", 1)') == ""
    unchanged = "for k in (1, 2):\n    glue_text(str(k), str(k))\n    print(k)"
    assert without_glue_calls(unchanged) == unchanged
    assert without_glue_calls("not python (") == "not python ("
