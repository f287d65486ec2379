"""Finishing touches to the book's two outputs.

Both:

* Code cells are shown without their glue calls (:func:`without_glue_calls`): the statements that
  only put a computed number into the prose are for the notebook, not for the reader, and were
  about 500 lines of the site's code. A comment line says how many are not shown.
* An equation reference written in parentheses, "({eq}`label`)", prints "(1.1)", not "((1.1))":
  ``math_eqref_format`` already puts the number in parentheses.

Website:

* A figure's image gets the figure's caption as its alt text (myst-nb names output images by a
  hash, which a screen reader would read out).

PDF (LaTeX build only):

* Equations, figures, proofs and exercises are numbered as on the website (chapter.number), see
  :func:`keep_site_numbering`.
* The Bibliography page holds the bibliography: Sphinx gathers every citation into one list at the
  very end of the document (after the API reference); it is moved under the page's heading.
* A chapter's solutions follow all of its exercises, under their own heading, and each exercise
  says on which page its solution is: on paper, the answer is not printed right under the question.
* A proof (sphinx-proof's ``{prf:proof}``) becomes amsthm's ``proof`` environment: the heading
  "Proof." and a closing ∎, instead of an admonition box with an empty title bar.
* A chapter's "References" section is dropped when nothing in it prints: in the PDF its
  footnote citations already sit at the foot of the pages that cite them.
"""

from __future__ import annotations

import ast
import re

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx_proof.nodes import proof_node

BIBLIOGRAPHY_PAGE = "bibliography"  # the document with the {bibliography} directive
HASHLIKE = re.compile(r"[0-9a-f]{16,}|.*\.(png|svg|jpe?g)")
PROOF_PREFIX = "Proof. "  # added by sphinx-proof to the first paragraph; amsthm prints its own


class LatexProofs(SphinxPostTransform):
    default_priority = 900
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        for node in list(self.document.findall(proof_node)):
            body = node[0] if node.children and isinstance(node[0], nodes.admonition) else node
            first = next(iter(body.findall(nodes.paragraph)), None)
            if first is not None and first.children and isinstance(first[0], nodes.Text):
                text = first[0].astext()
                if text.startswith(PROOF_PREFIX):
                    first.replace(first[0], nodes.Text(text[len(PROOF_PREFIX) :]))
            node.replace_self(
                [
                    nodes.raw("", "\n\\begin{proof}\n", format="latex"),
                    *body.children,
                    nodes.raw("", "\n\\end{proof}\n", format="latex"),
                ]
            )


def _prints_nothing(node: nodes.Node) -> bool:
    if isinstance(node, (nodes.title, nodes.target, nodes.footnote, nodes.comment)):
        return True
    if isinstance(node, nodes.Element) and not node.astext().strip():
        return True
    return isinstance(node, nodes.Element) and all(_prints_nothing(c) for c in node.children) and bool(node.children)


class DropEmptyReferences(SphinxPostTransform):
    default_priority = 900
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        for section in list(self.document.findall(nodes.section)):
            title = section.next_node(nodes.title)
            if title is None or title.astext().strip() != "References":
                continue
            if all(_prints_nothing(child) for child in section.children):
                section.parent.remove(section)


class CaptionsAsAltText(SphinxPostTransform):
    default_priority = 900
    formats = ("html",)

    def run(self, **kwargs) -> None:
        for figure in self.document.findall(nodes.figure):
            caption = figure.next_node(nodes.caption)
            if caption is None:
                continue
            text = " ".join(caption.astext().split())
            for image in figure.findall(nodes.image):
                alt = image.get("alt", "")
                if not alt or HASHLIKE.fullmatch(alt) or alt == image.get("uri", ""):
                    image["alt"] = text


GLUE_FUNCTIONS = {"glue", "glue_text", "glue_number"}


def _is_glue_statement(statement: ast.stmt) -> bool:
    """``glue_text(…)``, ``_ = glue_number(…)``, or a loop whose body only glues."""
    if isinstance(statement, ast.For):
        return all(_is_glue_statement(s) for s in statement.body) and not statement.orelse
    if isinstance(statement, ast.Assign):
        if not all(isinstance(t, ast.Name) and t.id == "_" for t in statement.targets):
            return False
    elif not isinstance(statement, ast.Expr):
        return False
    call = statement.value
    if not isinstance(call, ast.Call):
        return False
    name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
    return name in GLUE_FUNCTIONS


def without_glue_calls(source: str) -> str:
    """``source`` without its top-level glue statements, and one comment line where the first one
    was; unchanged when it has none (or does not parse)."""
    try:
        statements = ast.parse(source).body
    except SyntaxError:
        return source
    glued = [s for s in statements if _is_glue_statement(s)]
    if not glued:
        return source
    lines = source.split("\n")
    drop = {i for s in glued for i in range(s.lineno - 1, s.end_lineno)}
    note = f"# (not shown: {len(glued)} glue call{'s' if len(glued) > 1 else ''} that put numbers into the text)"
    kept = []
    for i, line in enumerate(lines):
        if i == glued[0].lineno - 1:
            kept.append(note)
        if i not in drop:
            kept.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n")
    return "" if text == note else text


class HideGlueCalls(SphinxPostTransform):
    default_priority = 900

    def run(self, **kwargs) -> None:
        for cell in list(self.document.findall(nodes.container)):
            if cell.get("nb_element") != "cell_code_source":
                continue
            block = cell.next_node(nodes.literal_block)
            if block is None:
                continue
            shown = without_glue_calls(block.astext())
            if not shown:
                cell.parent.remove(cell)
            elif shown != block.astext():
                block.children = []
                block += nodes.Text(shown)
                block.rawsource = shown  # Sphinx highlights a block only when rawsource matches its text


def _is_latex(app) -> bool:
    from sphinx.builders.latex import LaTeXBuilder

    return isinstance(app.builder, LaTeXBuilder)


def keep_site_numbering(app) -> None:
    """sphinx-jupyterbook-latex raises ``numfig_secnum_depth`` to 2 for a book with parts (at
    builder-inited). LaTeX needs that value: one level below the parts, its equation and figure
    counters then restart at each chapter and print "1.1". But Sphinx also numbers proofs and
    exercises itself with the same setting, which would then count per section ("Proposition
    3.4.1") where the website counts per chapter ("Proposition 3.5"). So Sphinx numbers with the
    website's depth, and only the LaTeX writer (see :func:`latex_depth_for_writer`) sees LaTeX's.

    The value must not depend on the order of builds: the PDF build reuses the website's pickled
    environment when nothing changed, and then neither reads nor checks a document."""
    if _is_latex(app):
        app.env.book_latex_secnum_depth = app.config["numfig_secnum_depth"]
        app.config["numfig_secnum_depth"] = app.book_site_secnum_depth


def remember_site_depth(app, config) -> None:
    app.book_site_secnum_depth = config["numfig_secnum_depth"]


def latex_depth_for_writer(app, doctree, docname) -> None:
    # The LaTeX builder resolves the assembled book (doctree-resolved) after every number is
    # assigned and the environment is pickled, and then writes it.
    if _is_latex(app) and hasattr(app.env, "book_latex_secnum_depth"):
        app.config["numfig_secnum_depth"] = app.env.book_latex_secnum_depth


class SingleParenthesesAroundEquationRefs(SphinxPostTransform):
    """ "({eq}`x`)" in the source would print "((1.1))" with ``math_eqref_format = "({number})"``."""

    default_priority = 4  # before the references are resolved (and, in LaTeX, rewritten)

    def run(self, **kwargs) -> None:
        if "(" not in (self.config.math_eqref_format or "("):
            return
        for ref in list(self.document.findall(addnodes.pending_xref)):
            if ref.get("refdomain") != "math" or ref.get("reftype") != "eq":
                continue
            before, after = ref.previous_sibling(), ref.next_node(descend=False, siblings=True)
            if not (isinstance(before, nodes.Text) and isinstance(after, nodes.Text)):
                continue
            if before.endswith("(") and after.startswith(")"):
                before.parent.replace(before, nodes.Text(before[:-1]))
                after.parent.replace(after, nodes.Text(after[1:]))


class BibliographyOnItsPage(SphinxPostTransform):
    """Sphinx's BibliographyTransform (and sphinx-jupyterbook-latex) put the list of citations at
    the end of the document. It belongs on the page that has the ``{bibliography}`` directive
    (the preamble drops the list's own ``\\chapter*`` heading, so the page's heading is its only
    heading and its only line in the contents)."""

    default_priority = 900
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        from sphinx.builders.latex.nodes import thebibliography

        lists = list(self.document.findall(thebibliography))
        page = next(
            (f for f in self.document.findall(addnodes.start_of_file) if f.get("docname") == BIBLIOGRAPHY_PAGE),
            None,
        )
        section = page.next_node(nodes.section) if page is not None else None
        if not lists or section is None:
            return
        for bib in lists:
            bib.parent.remove(bib)
            section += bib


class SolutionsAfterExercises(SphinxPostTransform):
    """In print, a solution right under its exercise is read before the exercise is tried. The
    chapter's solutions move to the end of the section that holds its last one (the chapter's
    "Follow-up questions"), under a heading of their own, and each exercise gets a line saying on
    which page its solution is. They stay in their chapter, where their footnotes are numbered."""

    default_priority = 910
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node, solution_node

        registry = getattr(self.env, "sphinx_exercise_registry", {})
        # By the exercise's document: in the assembled book, a chapter's top nodes still name their
        # own document as parent, not the start_of_file node that holds them.
        by_chapter: dict[str, list[nodes.Element]] = {}
        for solution in self.document.findall(solution_node):
            docname = registry.get(solution.get("target_label"), {}).get("docname")
            by_chapter.setdefault(docname, []).append(solution)
        exercises = {
            node.get("label"): node
            for node in self.document.findall(lambda n: isinstance(n, (exercise_node, exercise_enumerable_node)))
        }
        for solutions in by_chapter.values():
            home = solutions[-1].parent
            heading = nodes.raw("", "\n\\subsection*{Solutions}\n", format="latex")
            moved = []
            for solution in solutions:
                solution.parent.remove(solution)
                moved.append(solution)
                exercise = exercises.get(solution.get("target_label"))
                if exercise is None:
                    continue
                # A label of our own inside the box: sphinx-exercise's stands before it, and is on
                # the previous page when the box starts a new one.
                target = f"book-solution:{solution['label']}"
                first_body = next((i for i, c in enumerate(solution.children) if not isinstance(c, nodes.title)), 0)
                anchor = f"\\phantomsection\\label{{{target}}}\n"
                solution.insert(first_body, nodes.raw("", anchor, format="latex"))
                exercise += nodes.raw(
                    "",
                    f"\n\\par\\hfill{{\\small\\hyperref[{target}]{{Solution: p.~\\pageref*{{{target}}}}}}}\n",
                    format="latex",
                )
            home += [heading, *moved]


def setup(app):
    app.connect("config-inited", remember_site_depth)
    app.connect("builder-inited", keep_site_numbering, priority=900)  # after sphinx-jupyterbook-latex
    app.connect("doctree-resolved", latex_depth_for_writer)
    app.add_post_transform(SingleParenthesesAroundEquationRefs)
    app.add_post_transform(BibliographyOnItsPage)
    app.add_post_transform(SolutionsAfterExercises)
    app.add_post_transform(CaptionsAsAltText)
    app.add_post_transform(HideGlueCalls)
    app.add_post_transform(LatexProofs)
    app.add_post_transform(DropEmptyReferences)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
